// Helpers of the GEMV kernels that stage a warp's tile of 16 weight rows in shared memory
// and feed mma.sync.m16n8k16 from there (quant_gguf_mma.cu, quant_int4_mma.cu): shared
// loads at 2-byte aligned addresses, exact small integers as bf16/fp16 by byte permutes,
// and the fixed-order sum of the warps' accumulators.
#pragma once
#include "gemv_mma.cuh"
#include "ops/quant_args.h"

namespace gk::cuda::gemv_detail {

__device__ __forceinline__ uint32_t lds_u16(uint32_t a) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds_u8(uint32_t a) {
  uint16_t v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(a));
  return v & 0xffu;
}
__device__ __forceinline__ uint32_t lds_u32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}
// 4 bytes at a 2-byte aligned shared address (a & 2 is the same for the whole warp).
__device__ __forceinline__ uint32_t lds32_2(uint32_t a) {
  if (a & 2u) return lds_u16(a) | (lds_u16(a + 2) << 16);
  return lds_u32(a);
}
__device__ __forceinline__ float f16f(uint32_t h) { return __half2float(__ushort_as_half(uint16_t(h))); }

template <class T>
constexpr uint32_t kMagicByte = std::is_same_v<T, bf16> ? 0x43434343u : 0x64646464u;  // 128.0 / 1024.0 high bytes

// Bytes i and i + 1 of v (each < 128 for bf16, < 1024 for fp16) as (magic + v) twice, minus sub2.
template <class T>
__device__ __forceinline__ uint32_t byte_pair(uint32_t v, int i, uint32_t sub2) {
  const uint32_t sel = uint32_t(i) | (4u << 4) | (uint32_t(i + 1) << 8) | (4u << 12);
  return hsub2u<T>(__byte_perm(v, kMagicByte<T>, sel), sub2);
}

// The int8 codes i, i + 1 of u (raw Q8_0 bytes) as exact T values.
template <class T>
__device__ __forceinline__ uint32_t int8_pair(uint32_t u, int i) {
  const uint32_t v = u ^ 0x80808080u;  // b + 128
  if constexpr (std::is_same_v<T, f16>) {
    return byte_pair<T>(v, i, 0x64806480u);  // (1024 + 128 + b) - 1152
  } else {
    const float a = __uint_as_float(__byte_perm(v, 0x4B00u, 0x5440u + i)) - 8388736.0f;  // 2^23 + 128
    const float b = __uint_as_float(__byte_perm(v, 0x4B00u, 0x5440u + i + 1)) - 8388736.0f;
    __nv_bfloat162 r = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&r);
  }
}

// acc of lane (g, t) of each of the warps of the CTA (at most NW): (row g, m = 2t), (row g, m = 2t + 1),
// (row g + 8, m = 2t), (row g + 8, m = 2t + 1); summed in warp order, stored (or written
// as split-K slice s of S).
template <int NW>
__device__ __forceinline__ void store_quad_sums(const QGemvArgs& p, const float (&acc)[4], int64_t row0, int s, int S) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;  // nw <= NW
  const int g = lane >> 2, t = lane & 3;
  __shared__ float red[NW][32][4];
#pragma unroll
  for (int e = 0; e < 4; ++e) red[warp][lane][e] = acc[e];
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = red[0][lane][e];
#pragma unroll
      for (int w = 1; w < nw; ++w) v += red[w][lane][e];
      const int m = 2 * t + (e & 1);
      const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
      if (m < p.m && row < p.n) {
        if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
        else p.part[(int64_t(s) * p.m + m) * p.n + row] = v;
      }
    }
  }
}

// The split-K second pass for a QGemvArgs launch (gemv.cu's k_gemv_sum).
inline void launch_sum_q(const QGemvArgs& p, cudaStream_t st) {
  KArgs k;
  k.part = p.part;
  k.y = p.y;
  k.m = p.m;
  k.n = p.n;
  k.out = p.out_dtype;
  k.variant = p.variant;
  launch_sum(k, p.split, st);
}

}  // namespace gk::cuda::gemv_detail
