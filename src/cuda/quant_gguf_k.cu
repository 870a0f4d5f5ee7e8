// GEMV over the GGUF k-quant blocks Q4_K (144 B / 256 weights) and Q6_K (210 B / 256
// weights) on the tensor cores, read directly from the file's blocks (ops/gguf_blocks.h),
// with few instructions per weight (session 4; the staged kernel of quant_gguf_st.cu is the default
// since session 5, this one serves Q6_K rows it cannot take and variant 3). A warp owns MT
// m-tiles of 16 rows and a contiguous run of tiles, copied into its own ring of D stages
// in shared memory (Q4_K: tiles of one block, 16-byte cp.async, lane l copies the chunks of
// parity l % 2 of row l / 2; Q6_K: tiles of two blocks, 4-byte cp.async, the words of
// parity l % 2 of row l / 2), D - 1 tiles ahead; lane (g, t) decodes rows g and g + 8.
//
// Q4_K: per row the 8 sub-block scales and mins are decoded once per block (6-bit fields
// by masks and shifts, four at a time; a byte b becomes d * b as fma(d, 2^23 + b, -d 2^23),
// one rounding); sub-block s = 2c + hi reads the low (hi = 0) / high nibbles of qs bytes
// 32c + 4t.. (k-step 0) and 32c + 16 + 4t.. (k-step 1) as exact (q) pairs; its fp32 mma
// sum times d sc minus dmin m times the sub-block's sum of x (an mma with ones, shared by
// the m-tiles) goes to the accumulators.
// Q6_K: k-step = one 16-weight sub-block i = 8h + 2s + q (one int8 scale): lane t's 4
// weights j = 4t..4t+3 are ql[64h + 32 (s & 1) + 16q + j] >> 4 (s >> 1) (low 4 bits) and
// qh[32h + 16q + j] >> 2s (high 2 bits), put together by masks and shifts, minus 32
// exactly; the sum times d * scale[i] (the int8 scale made exact in fp32 by the 2^23
// trick, times d: one rounding).
// Warps' sums in warp order, split-K by the second pass: the same bits every run and for
// every M. Needs K % 256 == 0 and 16-byte aligned rows (Q4_K), K % 512 == 0 and 4-byte
// aligned rows (Q6_K).
#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "core/cuda_util.h"

namespace gk::cuda {

namespace {

using namespace gemv_detail;

constexpr int kMaxW = 16;

template <int F>
struct BK;
template <>
struct BK<int(QFormat::q4_k)> {  // RS = 16 mod 128: conflict-free word reads of rows g = 0..7
  static constexpr int TW = 256, TB = gguf::kQ4_KBytes, CB = 16, RS = 144, D = 4;
};
template <>
struct BK<int(QFormat::q6_k)> {  // RS: 432 = 48 mod 128; D = 2: more resident warps (H200, session 4
  // checkpoint B, M = 1: 35 / 37 / 44% of copy against 28 / 34 / 39% with 3 stages)
  static constexpr int TW = 512, TB = 2 * gguf::kQ6_KBytes, CB = 4, RS = 432, D = 2;
};

// d * b for the 4 bytes of v (each 0..255), as fma(d, 2^23 + b, -d 2^23): exact product, one rounding.
__device__ __forceinline__ void scale_bytes(uint32_t v, float d, float dneg, float (&o)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = uint32_t(i) | (4u << 4) | (4u << 8) | (7u << 12);
    o[i] = fmaf(d, __uint_as_float(__byte_perm(v, 0x4B000000u, sel)), dneg);
  }
}

template <class T, int F, int MT, int D>
__global__ void __launch_bounds__(kMaxW * 32, 1) k_gguf_k(const QGemvArgs p) {
  using B = BK<F>;
  constexpr bool kQ6 = F == int(QFormat::q6_k);
  constexpr int RS = B::RS, TB = B::TB, CB = B::CB, NC = TB / CB;  // copies per tile row
  constexpr int STAGE = 16 * MT * RS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16 * MT;
  const int64_t ntile = p.k / B::TW;
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t per_s = (ntile + S - 1) / S;
  const int64_t s0 = std::min(ntile, int64_t(s) * per_s), s1 = std::min(ntile, s0 + per_s);
  const int64_t per_w = (s1 - s0 + nw - 1) / nw;
  const int64_t j0 = std::min(s1, s0 + warp * per_w), j1 = std::min(s1, j0 + per_w);
  const int64_t cnt = j1 - j0;

  const int cr = lane >> 1, cpar = lane & 1;
  const uint8_t* src[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    int64_t row = row0 + 16 * i + cr;
    row = row < p.n ? row : p.n - 1;
    src[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + j0 * TB + cpar * CB;
  }
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + j0 * B::TW;

  extern __shared__ uint4 ring[];
  const uint32_t wbase = smem_addr(ring) + uint32_t(warp) * uint32_t(D * STAGE);
  const uint32_t cdst = wbase + uint32_t(cr * RS + cpar * CB);
  auto issue = [&](int st, int64_t j) {
    if (j < cnt) {
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const uint8_t* sp = src[i] + j * TB;
#pragma unroll
        for (int c = 0; c < (NC + 1) / 2; ++c) {
          if (2 * c + cpar < NC) {
            const uint32_t dst = cdst + uint32_t(st * STAGE + i * 16 * RS + 2 * CB * c);
            if constexpr (CB == 16) cp_async16(dst, sp + 2 * CB * c);
            else cp_async4(dst, sp + 2 * CB * c);
          }
        }
      }
    }
    cp_commit();
  };

  uint32_t magic = std::is_same_v<T, bf16> ? 0x43434343u : 0x64646464u;
  asm volatile("" : "+r"(magic));
  constexpr uint32_t kM0 = std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u;    // magic: q
  constexpr uint32_t kM32 = std::is_same_v<T, bf16> ? 0x43204320u : 0x64206420u;   // magic + 32
  const uint32_t ones = splat<T>(1.0f);
  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  auto pair = [&](uint32_t v, uint32_t sel, uint32_t sub) { return hsub2u<T>(__byte_perm(v, magic, sel), sub); };

  auto consume_q4k = [&](int st, int64_t j) {
    const uint32_t base = wbase + uint32_t(st * STAGE + g * RS);
    const T* xj = xr + j * 256;
    float d1[MT][2][8], m1[MT][2][8];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint4 hv = lds16(base + uint32_t(i * 16 * RS + r * 8 * RS));
        const float d = f16f(hv.x & 0xffffu), dm = f16f(hv.x >> 16);
        const uint32_t sc0 = hv.y & 0x3f3f3f3fu, mn0 = hv.z & 0x3f3f3f3fu;
        const uint32_t sc1 = (hv.w & 0x0f0f0f0fu) | ((hv.y >> 2) & 0x30303030u);
        const uint32_t mn1 = ((hv.w >> 4) & 0x0f0f0f0fu) | ((hv.z >> 2) & 0x30303030u);
        float o[4];
        scale_bytes(sc0, d, d * -8388608.0f, o);
        for (int e = 0; e < 4; ++e) d1[i][r][e] = o[e];
        scale_bytes(sc1, d, d * -8388608.0f, o);
        for (int e = 0; e < 4; ++e) d1[i][r][4 + e] = o[e];
        scale_bytes(mn0, dm, dm * -8388608.0f, o);
        for (int e = 0; e < 4; ++e) m1[i][r][e] = o[e];
        scale_bytes(mn1, dm, dm * -8388608.0f, o);
        for (int e = 0; e < 4; ++e) m1[i][r][4 + e] = o[e];
      }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t w[MT][2][2];  // [m-tile][row][step]
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t a = base + uint32_t(i * 16 * RS + r * 8 * RS + 16 + 32 * c + 4 * t);
          w[i][r][0] = lds_u32(a);
          w[i][r][1] = lds_u32(a + 16);
        }
#pragma unroll
      for (int hi = 0; hi < 2; ++hi) {  // sub-block 2c + hi
        const int sb = 2 * c + hi;
        const uint2 x0 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * sb + 4 * t));
        const uint2 x1 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * sb + 16 + 4 * t));
        float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const uint32_t o4[4] = {ones, ones, ones, ones};
        mma16816<T>(xs, o4, x0.x, x0.y);
        mma16816<T>(xs, o4, x1.x, x1.y);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          uint32_t v[2][2];
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int k = 0; k < 2; ++k) v[r][k] = (hi ? (w[i][r][k] >> 4) : w[i][r][k]) & 0x0f0f0f0fu;
          const uint32_t A0[4] = {pair(v[0][0], 0x4140u, kM0), pair(v[1][0], 0x4140u, kM0), pair(v[0][0], 0x4342u, kM0),
                                  pair(v[1][0], 0x4342u, kM0)};
          const uint32_t A1[4] = {pair(v[0][1], 0x4140u, kM0), pair(v[1][1], 0x4140u, kM0), pair(v[0][1], 0x4342u, kM0),
                                  pair(v[1][1], 0x4342u, kM0)};
          float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma16816<T>(cc, A0, x0.x, x0.y);
          mma16816<T>(cc, A1, x1.x, x1.y);
          acc[i][0] = fmaf(d1[i][0][sb], cc[0], acc[i][0]);
          acc[i][1] = fmaf(d1[i][0][sb], cc[1], acc[i][1]);
          acc[i][2] = fmaf(d1[i][1][sb], cc[2], acc[i][2]);
          acc[i][3] = fmaf(d1[i][1][sb], cc[3], acc[i][3]);
          acc[i][0] = fmaf(-m1[i][0][sb], xs[0], acc[i][0]);
          acc[i][1] = fmaf(-m1[i][0][sb], xs[1], acc[i][1]);
          acc[i][2] = fmaf(-m1[i][1][sb], xs[2], acc[i][2]);
          acc[i][3] = fmaf(-m1[i][1][sb], xs[3], acc[i][3]);
        }
      }
    }
  };

  auto consume_q6k = [&](int st, int64_t j) {
    const T* xj = xr + j * 512;
#pragma unroll
    for (int b = 0; b < 2; ++b) {  // block b of the tile: bytes 210 b ..
      // d * scale[i] for the 16 sub-blocks of rows g, g + 8 of each m-tile: scales at 192
      // (2-byte aligned: 210 b + 192), d at 208
      float ds[MT][2][16];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t a = wbase + uint32_t(st * STAGE + (16 * i + g + 8 * r) * RS + 210 * b);
          const float d = f16f(lds_u16(a + 208));
#pragma unroll
          for (int q4 = 0; q4 < 4; ++q4) {  // int8 scale b: (2^23 + 128 + b) - (2^23 + 128) exactly, times d
            const uint32_t sv = (lds_u16(a + 192 + 4 * q4) | (lds_u16(a + 194 + 4 * q4) << 16)) ^ 0x80808080u;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const uint32_t sel = uint32_t(e) | (4u << 4) | (4u << 8) | (7u << 12);
              ds[i][r][4 * q4 + e] = d * (__uint_as_float(__byte_perm(sv, 0x4B000000u, sel)) - 8388736.0f);
            }
          }
        }
#pragma unroll
      for (int hq = 0; hq < 4; ++hq) {
        const int h = hq >> 1, q = hq & 1;
        uint32_t l0[MT][2], l1[MT][2], lh[MT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t a = wbase + uint32_t(st * STAGE + (16 * i + g + 8 * r) * RS + 210 * b);
            const uint32_t ol = uint32_t(64 * h + 16 * q + 4 * t), oh = uint32_t(128 + 32 * h + 16 * q + 4 * t);
            // 210 b + even offsets: 4-byte aligned when b == 0, 2 mod 4 when b == 1
            if (b == 0) {
              l0[i][r] = lds_u32(a + ol), l1[i][r] = lds_u32(a + ol + 32), lh[i][r] = lds_u32(a + oh);
            } else {
              l0[i][r] = __byte_perm(lds_u16(a + ol), lds_u16(a + ol + 2), 0x5410u);
              l1[i][r] = __byte_perm(lds_u16(a + ol + 32), lds_u16(a + ol + 34), 0x5410u);
              lh[i][r] = __byte_perm(lds_u16(a + oh), lds_u16(a + oh + 2), 0x5410u);
            }
          }
#pragma unroll
        for (int sb = 0; sb < 4; ++sb) {
          const int si = 8 * h + 2 * sb + q;  // sub-block: one k-step, one scale
          const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xj + 256 * b + 16 * si + 4 * t));
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            uint32_t cv[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const uint32_t lo = ((sb & 1) ? l1[i][r] : l0[i][r]) >> (4 * (sb >> 1));
              const uint32_t hb = 2 * sb <= 4 ? (lh[i][r] << (4 - 2 * sb)) : (lh[i][r] >> (2 * sb - 4));
              cv[r] = (lo & 0x0f0f0f0fu) | (hb & 0x30303030u);
            }
            const uint32_t a4[4] = {pair(cv[0], 0x4140u, kM32), pair(cv[1], 0x4140u, kM32), pair(cv[0], 0x4342u, kM32),
                                    pair(cv[1], 0x4342u, kM32)};
            float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma16816<T>(cc, a4, xv.x, xv.y);
            acc[i][0] = fmaf(ds[i][0][si], cc[0], acc[i][0]);
            acc[i][1] = fmaf(ds[i][0][si], cc[1], acc[i][1]);
            acc[i][2] = fmaf(ds[i][1][si], cc[2], acc[i][2]);
            acc[i][3] = fmaf(ds[i][1][si], cc[3], acc[i][3]);
          }
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
      if (jb + st < cnt) {
        if constexpr (kQ6) consume_q6k(st, jb + st);
        else consume_q4k(st, jb + st);
      }
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
  constexpr int per_warp = D * 16 * MT * BK<F>::RS;
  const int64_t blocks = (p.n + 16 * MT - 1) / (16 * MT);
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  const int64_t tiles = (p.k / BK<F>::TW + S - 1) / S;
  const int smem_warps = std::max(1, (227 * 1024) / per_warp);
  const int64_t cap = std::min<int64_t>(kMaxW, std::min(kWarpsPerSM, smem_warps));
  int64_t nw = (int64_t(kSMs) * cap) / (blocks * S);
  nw = std::max<int64_t>(1, std::min<int64_t>({nw, cap, std::max<int64_t>(1, tiles / 2)}));
  const int smem = std::max<int>(int(nw) * per_warp, int(nw) * MT * 4 * 32 * 4);
  smem_limit<k_gguf_k<T, F, MT, D>>(std::max(int(cap) * per_warp, kMaxW * MT * 4 * 32 * 4));
  launch_ex(k_gguf_k<T, F, MT, D>, dim3(unsigned(blocks), unsigned(S)), int(nw) * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_gguf_k");
}

template <class T, int F>
void launch_f(const QGemvArgs& p, cudaStream_t st) {
  // variants (benchmarking): 4: two m-tiles per warp; 5: Q4_K a 6-stage ring, Q6_K 3 stages
  switch (p.variant) {
    case 4: launch_cfg<T, F, 2, BK<F>::D>(p, st); break;
    case 5: launch_cfg<T, F, 1, F == int(QFormat::q6_k) ? 3 : 6>(p, st); break;
    default: launch_cfg<T, F, 1, BK<F>::D>(p, st); break;
  }
  if (p.split > 1) launch_sum_q(p, st);
}

}  // namespace

bool gguf_k_applies(const QGemvArgs& p) {
  const bool al_x = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_rs % 8 == 0;
  if (p.fmt == QFormat::q4_k)
    return reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_rs % 16 == 0 && p.k % 256 == 0 && al_x;
  if (p.fmt == QFormat::q6_k)
    return reinterpret_cast<uintptr_t>(p.q) % 4 == 0 && p.q_rs % 4 == 0 && p.k % 512 == 0 && al_x;
  return false;
}

template <class T>
void launch_gguf_k(const QGemvArgs& p, cudaStream_t st) {
  if (p.fmt == QFormat::q4_k) return launch_f<T, int(QFormat::q4_k)>(p, st);
  if (p.fmt == QFormat::q6_k) return launch_f<T, int(QFormat::q6_k)>(p, st);
  throw ValueError("gemv: not a k-quant format");
}
template void launch_gguf_k<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_gguf_k<f16>(const QGemvArgs&, cudaStream_t);

}  // namespace gk::cuda
