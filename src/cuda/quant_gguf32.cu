// GEMV over the 32-weight GGUF blocks Q4_0 (18 B), Q4_1 (20 B), Q8_0 (34 B) on the tensor
// cores, read directly from the file's blocks (layouts: ops/gguf_blocks.h), with few
// instructions per weight (the issue / integer-pipe budget at the H200's bandwidth).
//
// A warp owns MT m-tiles of 16 rows and a contiguous run of tiles of 8 blocks (256
// weights; 8 * BB bytes per row, a multiple of 16). It copies each tile (16 MT rows) into
// its own ring of D stages in shared memory with 16-byte cp.async, D - 1 tiles ahead: lane
// l copies the even (l even) or odd 16-byte chunks of row l / 2 of each m-tile, so one
// instruction reads 32 contiguous bytes of 16 rows and the source addresses are a row
// pointer plus constants. Lane (g, t) then takes rows g and g + 8 of every m-tile and, of
// each block, the 8 weights of two mma.sync.m16n8k16 k-steps (4-bit: code bytes 4t..4t+3,
// low nibbles = weights 4t..4t+3 in step 0, high nibbles = 16 + 4t.. in step 1; 8-bit:
// bytes 8t..8t+7); block b's byte offset is a compile-time constant, so its 2-byte
// alignment is known. Codes become exact bf16/fp16 pairs by byte permutes under a magic
// exponent byte and one packed subtraction (Q4_0: q - 8, Q4_1: q, Q8_0: the int8);
// x rows g < M at the same k are the B operand (rows g >= M read row M - 1: their output
// columns are dropped). Per block: the fp32 mma sum times the block's d, plus for Q4_1
// m times the block's sum of x (an mma with ones, shared by the m-tiles). The warps' sums
// are added in warp order, split-K slices by the second pass: the same bits every run and
// for a row alone or in a batch. Needs 16-byte aligned rows and K % 256 == 0.
#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "core/cuda_util.h"

namespace gk::cuda {

namespace {

using namespace gemv_detail;

constexpr int kMaxW = 16;  // warps per CTA at most

template <int F>
struct B32;
template <>
struct B32<int(QFormat::q4_0)> {
  // RS: shared bytes per row, = 16, 48, 80 or 112 mod 128: lanes (g, t) reading word t of
  // rows g = 0..7 hit 32 different banks
  // D = 6: H200 session 4 checkpoint B, M = 1: 40 / 39 / 54% of copy against 37 / 39 / 55% with 4
  static constexpr int BB = gguf::kQ4_0Bytes, QOFF = 2, RS = 144, D = 6;
  static constexpr bool k4 = true, kMin = false;
};
template <>
struct B32<int(QFormat::q4_1)> {
  static constexpr int BB = gguf::kQ4_1Bytes, QOFF = 4, RS = 176, D = 4;
  static constexpr bool k4 = true, kMin = true;
};
template <>
struct B32<int(QFormat::q8_0)> {
  static constexpr int BB = gguf::kQ8_0Bytes, QOFF = 2, RS = 272, D = 3;
  static constexpr bool k4 = false, kMin = false;
};

// 4 bytes at shared address a whose 2-byte alignment (a % 4 == 2) is known at compile time.
template <bool ODD>
__device__ __forceinline__ uint32_t lds32_at(uint32_t a) {
  if constexpr (ODD) return __byte_perm(lds_u16(a), lds_u16(a + 2), 0x5410u);
  else return lds_u32(a);
}

template <class T, int F, int MT, int D>
__global__ void __launch_bounds__(kMaxW * 32, 1) k_gguf32(const QGemvArgs p) {
  using B = B32<F>;
  constexpr int BB = B::BB, RS = B::RS, TB = 8 * BB, C = TB / 16;  // tile bytes / chunks per row
  constexpr int STAGE = 16 * MT * RS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16 * MT;
  const int64_t ntile = p.k / 256;
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t per_s = (ntile + S - 1) / S;
  const int64_t s0 = std::min(ntile, int64_t(s) * per_s), s1 = std::min(ntile, s0 + per_s);
  const int64_t per_w = (s1 - s0 + nw - 1) / nw;
  const int64_t j0 = std::min(s1, s0 + warp * per_w), j1 = std::min(s1, j0 + per_w);
  const int64_t cnt = j1 - j0;

  // copy roles: row lane / 2 of each m-tile, chunks of parity lane % 2
  const int cr = lane >> 1, cp = lane & 1;
  const uint8_t* src[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    int64_t row = row0 + 16 * i + cr;
    row = row < p.n ? row : p.n - 1;
    src[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + j0 * TB + cp * 16;
  }
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + j0 * 256;

  extern __shared__ uint4 ring[];
  const uint32_t wbase = smem_addr(ring) + uint32_t(warp) * uint32_t(D * STAGE);
  const uint32_t cdst = wbase + uint32_t(cr * RS + cp * 16);
  auto issue = [&](int st, int64_t j) {
    if (j < cnt) {
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const uint8_t* sp = src[i] + j * TB;
#pragma unroll
        for (int c = 0; c < (C + 1) / 2; ++c)
          if (2 * c + cp < C) cp_async16(cdst + uint32_t(st * STAGE + i * 16 * RS + 32 * c), sp + 32 * c);
      }
    }
    cp_commit();
  };

  constexpr uint32_t kMagB = std::is_same_v<T, bf16> ? 0x43434343u : 0x64646464u;
  // (magic + 8) twice for Q4_0, magic twice for Q4_1
  constexpr uint32_t kSub4 = B::kMin ? (std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u)
                                     : (std::is_same_v<T, bf16> ? 0x43084308u : 0x64086408u);
  uint32_t magic = kMagB;
  asm volatile("" : "+r"(magic));  // a register: the byte permutes take it as their second source
  const uint32_t ones = splat<T>(1.0f);
  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  auto consume = [&](int st, int64_t j) {
    const uint32_t base = wbase + uint32_t(st * STAGE + g * RS);
    const T* xj = xr + j * 256;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      uint32_t x0[2], x1[2];
      if constexpr (B::k4) {
        const uint2 xa = __ldg(reinterpret_cast<const uint2*>(xj + 32 * b + 4 * t));
        const uint2 xb = __ldg(reinterpret_cast<const uint2*>(xj + 32 * b + 16 + 4 * t));
        x0[0] = xa.x, x0[1] = xa.y, x1[0] = xb.x, x1[1] = xb.y;
      } else {
        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xj + 32 * b + 8 * t));
        x0[0] = xv.x, x0[1] = xv.y, x1[0] = xv.z, x1[1] = xv.w;
      }
      float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if constexpr (B::kMin) {
        const uint32_t o[4] = {ones, ones, ones, ones};
        mma16816<T>(xs, o, x0[0], x0[1]);
        mma16816<T>(xs, o, x1[0], x1[1]);
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const uint32_t ba = base + uint32_t(i * 16 * RS + b * BB), bbk = ba + 8 * RS;
        uint32_t a0[4], a1[4];
        if constexpr (B::k4) {
          uint32_t ua, ub;
          if (((b * BB + B::QOFF) & 2) != 0) {
            ua = lds32_at<true>(ba + B::QOFF + 4 * t);
            ub = lds32_at<true>(bbk + B::QOFF + 4 * t);
          } else {
            ua = lds32_at<false>(ba + B::QOFF + 4 * t);
            ub = lds32_at<false>(bbk + B::QOFF + 4 * t);
          }
          const uint32_t La = ua & 0x0f0f0f0fu, Ha = (ua >> 4) & 0x0f0f0f0fu;
          const uint32_t Lb = ub & 0x0f0f0f0fu, Hb = (ub >> 4) & 0x0f0f0f0fu;
          a0[0] = hsub2u<T>(__byte_perm(La, magic, 0x4140u), kSub4);
          a0[1] = hsub2u<T>(__byte_perm(Lb, magic, 0x4140u), kSub4);
          a0[2] = hsub2u<T>(__byte_perm(La, magic, 0x4342u), kSub4);
          a0[3] = hsub2u<T>(__byte_perm(Lb, magic, 0x4342u), kSub4);
          a1[0] = hsub2u<T>(__byte_perm(Ha, magic, 0x4140u), kSub4);
          a1[1] = hsub2u<T>(__byte_perm(Hb, magic, 0x4140u), kSub4);
          a1[2] = hsub2u<T>(__byte_perm(Ha, magic, 0x4342u), kSub4);
          a1[3] = hsub2u<T>(__byte_perm(Hb, magic, 0x4342u), kSub4);
        } else {
          uint32_t ua0, ua1, ub0, ub1;
          if (((b * BB + B::QOFF) & 2) != 0) {
            ua0 = lds32_at<true>(ba + B::QOFF + 8 * t), ua1 = lds32_at<true>(ba + B::QOFF + 4 + 8 * t);
            ub0 = lds32_at<true>(bbk + B::QOFF + 8 * t), ub1 = lds32_at<true>(bbk + B::QOFF + 4 + 8 * t);
          } else {
            ua0 = lds32_at<false>(ba + B::QOFF + 8 * t), ua1 = lds32_at<false>(ba + B::QOFF + 4 + 8 * t);
            ub0 = lds32_at<false>(bbk + B::QOFF + 8 * t), ub1 = lds32_at<false>(bbk + B::QOFF + 4 + 8 * t);
          }
          a0[0] = int8_pair<T>(ua0, 0);
          a0[1] = int8_pair<T>(ub0, 0);
          a0[2] = int8_pair<T>(ua0, 2);
          a0[3] = int8_pair<T>(ub0, 2);
          a1[0] = int8_pair<T>(ua1, 0);
          a1[1] = int8_pair<T>(ub1, 0);
          a1[2] = int8_pair<T>(ua1, 2);
          a1[3] = int8_pair<T>(ub1, 2);
        }
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16816<T>(c, a0, x0[0], x0[1]);
        mma16816<T>(c, a1, x1[0], x1[1]);
        float da, db, ma = 0.0f, mb = 0.0f;
        if constexpr (B::kMin) {  // d, m: one aligned 4-byte load (20-byte blocks)
          const uint32_t hva = lds_u32(ba), hvb = lds_u32(bbk);
          da = f16f(hva & 0xffffu), ma = f16f(hva >> 16), db = f16f(hvb & 0xffffu), mb = f16f(hvb >> 16);
        } else {
          da = f16f(lds_u16(ba)), db = f16f(lds_u16(bbk));
        }
        acc[i][0] = fmaf(da, c[0], acc[i][0]);
        acc[i][1] = fmaf(da, c[1], acc[i][1]);
        acc[i][2] = fmaf(db, c[2], acc[i][2]);
        acc[i][3] = fmaf(db, c[3], acc[i][3]);
        if constexpr (B::kMin) {
          acc[i][0] = fmaf(ma, xs[0], acc[i][0]);
          acc[i][1] = fmaf(ma, xs[1], acc[i][1]);
          acc[i][2] = fmaf(mb, xs[2], acc[i][2]);
          acc[i][3] = fmaf(mb, xs[3], acc[i][3]);
        }
      }
    }
  };

  pdl_trigger();
#pragma unroll
  for (int st = 0; st < D - 1; ++st) issue(st, st);
  pdl_wait();
  for (int64_t jb = 0; jb < cnt; jb += D) {
#pragma unroll
    for (int st = 0; st < D; ++st) {
      __syncwarp();  // every lane is done with the stage the next copy overwrites
      issue((st + D - 1) % D, jb + st + D - 1);
      cp_wait<D - 1>();
      __syncwarp();  // every lane's copies of this stage are visible to the warp
      if (jb + st < cnt) consume(st, jb + st);
    }
  }
  cp_wait<0>();
  __syncthreads();  // the ring is reused for the warps' sums
  float* red = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * MT * 4 + i * 4 + e) * 32 + lane] = acc[i][e];
  __syncthreads();
  for (int i = warp; i < MT; i += nw) {  // warp i % nw sums m-tile i over the warps, in warp order
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = red[(i * 4 + e) * 32 + lane];
      for (int w = 1; w < nw; ++w) v += red[(w * MT * 4 + i * 4 + e) * 32 + lane];
      const int m = 2 * t + (e & 1);
      const int64_t row = row0 + 16 * i + g + (e >= 2 ? 8 : 0);
      if (m < p.m && row < p.n) {
        if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
        else p.part[(int64_t(s) * p.m + m) * p.n + row] = v;
      }
    }
  }
}

constexpr int kSMs = 132, kWarpsPerSM = 16;

template <class T, int F, int MT, int D>
void launch_cfg(const QGemvArgs& p, cudaStream_t st) {
  constexpr int per_warp = D * 16 * MT * B32<F>::RS;
  const int64_t blocks = (p.n + 16 * MT - 1) / (16 * MT);
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  const int64_t tiles = (p.k / 256 + S - 1) / S;
  const int smem_warps = std::max(1, (227 * 1024) / per_warp);
  const int64_t cap = std::min<int64_t>(kMaxW, std::min(kWarpsPerSM, smem_warps));
  int64_t nw = (int64_t(kSMs) * cap) / (blocks * S);
  nw = std::max<int64_t>(1, std::min<int64_t>({nw, cap, std::max<int64_t>(1, tiles / 2)}));
  const int smem = std::max<int>(int(nw) * per_warp, int(nw) * MT * 4 * 32 * 4);
  smem_limit<k_gguf32<T, F, MT, D>>(std::max(int(cap) * per_warp, kMaxW * MT * 4 * 32 * 4));
  launch_ex(k_gguf32<T, F, MT, D>, dim3(unsigned(blocks), unsigned(S)), int(nw) * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_gguf32");
}

template <class T, int F>
void launch_f(const QGemvArgs& p, cudaStream_t st) {
  // variants (benchmarking): 4: two m-tiles per warp; 5: a 6-stage ring (default: Q4_0 6, Q4_1 4, Q8_0 3)
  switch (p.variant) {
    case 4: launch_cfg<T, F, 2, B32<F>::D>(p, st); break;
    case 5: launch_cfg<T, F, 1, 6>(p, st); break;
    default: launch_cfg<T, F, 1, B32<F>::D>(p, st); break;
  }
  if (p.split > 1) launch_sum_q(p, st);
}

}  // namespace

bool gguf32_applies(const QGemvArgs& p) {
  if (p.fmt != QFormat::q4_0 && p.fmt != QFormat::q4_1 && p.fmt != QFormat::q8_0) return false;
  return reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_rs % 16 == 0 && p.k % 256 == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_rs % 8 == 0;
}

template <class T>
void launch_gguf32(const QGemvArgs& p, cudaStream_t st) {
  switch (p.fmt) {
    case QFormat::q4_0: return launch_f<T, int(QFormat::q4_0)>(p, st);
    case QFormat::q4_1: return launch_f<T, int(QFormat::q4_1)>(p, st);
    case QFormat::q8_0: return launch_f<T, int(QFormat::q8_0)>(p, st);
    default: throw ValueError("gemv: not a 32-weight GGUF format");
  }
}
template void launch_gguf32<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_gguf32<f16>(const QGemvArgs&, cudaStream_t);

}  // namespace gk::cuda
