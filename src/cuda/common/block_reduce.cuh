// Block-wide reductions of the sampling kernels with fixed shuffle trees (the same bits
// whichever CTA runs them, no float atomics): arg-max with ties to the lower index, the
// sum and the exclusive prefix (thread order) of 64-bit integers. W: warps per block; the
// callers pass W shared slots of their scratch (the functions synchronize the block
// before writing them and after reading them).
#pragma once
#include <cuda_runtime.h>

namespace gk::cuda::blk {

// a better than b: larger value, ties -> lower index.
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// The block's best (v, i), left in every thread.
template <int W>
__device__ __forceinline__ void argmax(float* fv, int* fi, float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) fv[threadIdx.x >> 5] = v, fi[threadIdx.x >> 5] = i;
  __syncthreads();
  v = fv[0], i = fi[0];
#pragma unroll
  for (int k = 1; k < W; ++k)
    if (better(fv[k], fi[k], v, i)) v = fv[k], i = fi[k];
  __syncthreads();
}

template <int W>
__device__ __forceinline__ unsigned long long sum_u64(unsigned long long* ws, unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned long long t = 0;
#pragma unroll
  for (int k = 0; k < W; ++k) t += ws[k];
  __syncthreads();
  return t;
}

// Exclusive prefix of v over the threads in thread order; *total gets the block sum.
template <int W>
__device__ __forceinline__ unsigned long long excl_scan_u64(unsigned long long* ws, unsigned long long v,
                                                            unsigned long long* total) {
  const int l = threadIdx.x & 31, w = threadIdx.x >> 5;
  unsigned long long inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xffffffffu, inc, o);
    if (l >= o) inc += n;
  }
  __syncthreads();
  if (l == 31) ws[w] = inc;
  __syncthreads();
  unsigned long long before = 0, all = 0;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    if (k < w) before += ws[k];
    all += ws[k];
  }
  __syncthreads();
  *total = all;
  return before + inc - v;
}

}  // namespace gk::cuda::blk
