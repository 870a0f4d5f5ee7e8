// NVF4 (e2m1 codes, an e4m3 scale per 16 weights, an fp32 tensor scale; emulated on
// Hopper) decode GEMV on the tensor cores with the per-lane layout of session 4's int4 kernel:
// lane (g, t) owns rows g and g + 8 of each of the warp's MT m-tiles and, of every span of
// 128 weights of a row, weights 32t .. 32t + 31 (16 bytes, blocks 2t and 2t + 1 of the
// span), copied by one 16-byte cp.async per row into its own ring slots (D - 1 spans
// ahead); the two block scale bytes per row go to registers at the same time.
//
// Decode of a 32-bit word u (8 codes, weights 8w .. 8w + 7 of the lane's piece, one block):
// the pair of codes (p, p + 4) sits at bits 4p and 16 + 4p. Its magnitude bits (e1 e0 m)
// are moved to bits 6..8 of each bf16 half (fp16: 9..11), i.e. the exponent field's low
// bits and the mantissa's top bit: the bf16 number is e2m1 * 2^-126 (fp16: 2^-14), a
// subnormal for e = 0, which has the same scale. The pair is multiplied by the block scale
// times 2^118 (fp16: 2^7) as a bf16 pair whose sign bits are xor-ed with the codes' sign
// bits: e2m1 * scale * 2^-8 (fp16: 2^-7), exact (at most 6 significant bits, normal
// range). The mma sums these with x in fp32; the result is multiplied by 2^8 (2^7) times
// the tensor scale once. x pairs by byte permutes.
// Same bits on every run and for every M. Needs K % 128 == 0 and aligned rows.
#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "core/cuda_util.h"

namespace gk::cuda {

namespace {

using namespace gemv_detail;

constexpr int kMaxWarps = 16;

template <class T>
struct NvfBits {
  static constexpr int kMagShift = std::is_same_v<T, bf16> ? 6 : 9;  // where e1 e0 m go
  static constexpr uint32_t kMagMask = 0x7u << kMagShift | 0x7u << (16 + kMagShift);
  static constexpr float kScaleUp = std::is_same_v<T, bf16> ? 0x1p118f : 0x1p7f;
  static constexpr float kRowScale = std::is_same_v<T, bf16> ? 256.0f : 128.0f;
};

template <int S, bool HI = false>  // u << S (S >= 0) or u >> -S (HI: as mul.hi, on the FMA pipe)
__device__ __forceinline__ uint32_t shl(uint32_t u) {
  if constexpr (S >= 0) {
    return u << S;
  } else if constexpr (HI) {
    uint32_t r;
    asm("mul.hi.u32 %0, %1, %2;" : "=r"(r) : "r"(u), "n"(1u << (32 + S)));
    return r;
  } else {
    return u >> (-S);
  }
}

template <class T>
__device__ __forceinline__ uint32_t scale_pair(uint32_t byte) {  // e4m3 byte * kScaleUp, twice, as T
  return splat<T>(FNvf4::e4m3(byte) * NvfBits<T>::kScaleUp);
}

template <class T, int MT, int D, bool HI = false>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) k_nvf4_lane(const QGemvArgs p) {
  using NB = NvfBits<T>;
  constexpr int LANE = 32;  // shared bytes per lane, stage and m-tile: codes of rows a, b
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16 * MT;
  const int64_t nspan = p.k / 128, nbs = p.k / 16;
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t per_s = (nspan + S - 1) / S;
  const int64_t s0 = std::min(nspan, int64_t(s) * per_s), s1 = std::min(nspan, s0 + per_s);
  const int64_t per_w = (s1 - s0 + nw - 1) / nw;
  const int64_t j0 = std::min(s1, s0 + warp * per_w), j1 = std::min(s1, j0 + per_w);
  const int64_t cnt = j1 - j0;

  const uint8_t* qp[MT][2];
  const uint8_t* bp[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      int64_t row = row0 + 16 * i + g + 8 * r;
      row = row < p.n ? row : p.n - 1;
      qp[i][r] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + j0 * 64 + t * 16;
      bp[i][r] = p.zeros + row * nbs + j0 * 8 + t * 2;
    }
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + j0 * 128 + t * 32;

  extern __shared__ uint4 ring[];
  const uint32_t wbase = smem_addr(ring) + uint32_t(warp) * uint32_t(D * MT * 32 * LANE);
  auto slot = [&](int st, int i, int r) { return wbase + uint32_t(((st * MT + i) * 2 + r) * 512 + lane * 16); };
  uint32_t bs[D][MT][2];  // the two block scale bytes of the lane's piece, per row

  auto issue = [&](int st, int64_t j) {
    if (j < cnt) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          cp_async16(slot(st, i, r), qp[i][r] + j * 64);
          bs[st][i][r] = __ldg(reinterpret_cast<const uint16_t*>(bp[i][r] + j * 8));
        }
    }
    cp_commit();
  };

  float acc[MT][4], acc2[MT][4];  // k-steps A / B: two mma chains, added at the end
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    acc2[i][0] = acc2[i][1] = acc2[i][2] = acc2[i][3] = 0.0f;
  }

  auto consume = [&](int st, int64_t j) {
    uint4 wv[MT][2];
    uint32_t sc[MT][2][2];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        wv[i][r] = lds16(slot(st, i, r));
        sc[i][r][0] = scale_pair<T>(bs[st][i][r] & 0xffu);
        sc[i][r][1] = scale_pair<T>(bs[st][i][r] >> 8);
      }
    const T* xj = xr + j * 128;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xj + 8 * w));
      const uint32_t bA0 = __byte_perm(xv.x, xv.z, 0x5410u), bA1 = __byte_perm(xv.x, xv.z, 0x7632u);
      const uint32_t bB0 = __byte_perm(xv.y, xv.w, 0x5410u), bB1 = __byte_perm(xv.y, xv.w, 0x7632u);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        uint32_t pr[2][4];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t u = word(wv[i][r], w), s2 = sc[i][r][w >> 1];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            uint32_t mag, sg;
            if (q == 0) mag = shl<NB::kMagShift>(u), sg = shl<12>(u);
            else if (q == 1) mag = shl<NB::kMagShift - 4>(u), sg = shl<8>(u);
            else if (q == 2) mag = shl<NB::kMagShift - 8, HI>(u), sg = shl<4>(u);
            else mag = shl<NB::kMagShift - 12, HI>(u), sg = u;
            mag &= NB::kMagMask;
            const uint32_t ss = s2 ^ (sg & 0x80008000u);
            pr[r][q] = hmul2u<T>(mag, ss);
          }
        }
        const uint32_t aA[4] = {pr[0][0], pr[1][0], pr[0][1], pr[1][1]};
        const uint32_t aB[4] = {pr[0][2], pr[1][2], pr[0][3], pr[1][3]};
        mma16816<T>(acc[i], aA, bA0, bA1);
        mma16816<T>(acc2[i], aB, bB0, bB1);
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
      issue((st + D - 1) % D, jb + st + D - 1);
      cp_wait<D - 1>();
      if (jb + st < cnt) consume(st, jb + st);
    }
  }
  cp_wait<0>();
  __syncthreads();  // the ring is reused for the warps' sums
  float* red = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * MT * 4 + i * 4 + e) * 32 + lane] = acc[i][e] + acc2[i][e];
  __syncthreads();
  for (int i = warp; i < MT; i += nw) {  // warp i % nw sums m-tile i over the warps, in warp order
    const float rs = NB::kRowScale * __ldg(p.tensor_scale);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = red[(i * 4 + e) * 32 + lane];
      for (int w = 1; w < nw; ++w) v += red[(w * MT * 4 + i * 4 + e) * 32 + lane];
      const int m = 2 * t + (e & 1);
      const int64_t row = row0 + 16 * i + g + (e >= 2 ? 8 : 0);
      if (m < p.m && row < p.n) {
        v *= rs;
        if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
        else p.part[(int64_t(s) * p.m + m) * p.n + row] = v;
      }
    }
  }
}

constexpr int kWarpsPerSM = 16, kSMs = 132;

template <class T, int MT, int D, bool HI = false>
void launch_cfg(const QGemvArgs& p, cudaStream_t st) {
  constexpr int per_warp = D * MT * 32 * 32;
  const int64_t blocks = (p.n + 16 * MT - 1) / (16 * MT);
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  const int64_t spans = (p.k / 128 + S - 1) / S;
  const int smem_warps = std::max(1, (227 * 1024) / per_warp);
  const int64_t cap = std::min<int64_t>(kMaxWarps, std::min(kWarpsPerSM, smem_warps));
  int64_t nw = (int64_t(kSMs) * cap) / (blocks * S);
  nw = std::max<int64_t>(1, std::min<int64_t>({nw, cap, std::max<int64_t>(1, spans / 2)}));
  const int smem = std::max<int>(int(nw) * per_warp, int(nw) * MT * 4 * 32 * 4);
  smem_limit<k_nvf4_lane<T, MT, D, HI>>(std::max(int(cap) * per_warp, kMaxWarps * MT * 4 * 32 * 4));
  launch_ex(k_nvf4_lane<T, MT, D, HI>, dim3(unsigned(blocks), unsigned(S)), int(nw) * 32, smem, st, p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_nvf4_lane");
}

}  // namespace

bool nvf4_lane_applies(const QGemvArgs& p) {
  return p.fmt == QFormat::nvf4 && p.k % 128 == 0 && reinterpret_cast<uintptr_t>(p.q) % 16 == 0 &&
         p.q_rs % 16 == 0 && reinterpret_cast<uintptr_t>(p.zeros) % 2 == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_rs % 8 == 0 && p.tensor_scale != nullptr;
}

template <class T>
void launch_nvf4_lane(const QGemvArgs& p, cudaStream_t st) {
  // default: 4 stages (H200, session 4 checkpoint B, M = 1: 51 / 52 / 68% of copy against
  // 48 / 47 / 65% with 8). Variants (benchmarking): 4: two m-tiles per warp; 5: 8 stages;
  // 8: right shifts as mul.hi
  switch (p.variant) {
    case 8: launch_cfg<T, 1, 4, true>(p, st); break;
    case 4: launch_cfg<T, 2, 4>(p, st); break;
    case 5: launch_cfg<T, 1, 8>(p, st); break;
    default: launch_cfg<T, 1, 4>(p, st); break;
  }
  if (p.split > 1) launch_sum_q(p, st);
}
template void launch_nvf4_lane<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_nvf4_lane<f16>(const QGemvArgs&, cudaStream_t);

}  // namespace gk::cuda
