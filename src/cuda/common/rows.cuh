// Shared pieces of the row-wise fused kernels: 16-byte vectors, a deterministic
// warp + block sum, and the launch shape for "one warp or one block per row".
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/ew.cuh"

namespace gk::cuda {

// Butterfly sum over a warp: every lane ends with the same value, in a fixed order.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the blockDim.x threads of one row (blockDim.x a multiple of 32). When
// blockDim.x == 32 this is a warp sum (several rows may share the block);
// otherwise the block holds one row and `sh` (32 floats) is used. Every thread
// gets the same value; the order is fixed, so results are bitwise reproducible.
__device__ __forceinline__ float row_sum(float v, float* sh) {
  v = warp_sum(v);
  if (blockDim.x == 32) return v;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();  // sh may still be read by a previous row_sum
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < nw; ++i) t += sh[i];
  return t;
}

template <class T>
__device__ __forceinline__ float ld(const T& v) {
  return float(v);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace gk::cuda
