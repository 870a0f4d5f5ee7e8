// Pieces of the row-wise softmax kernels shared by src/cuda/reduce.cu (rows in
// registers) and src/cuda/rows_pipe.cu (rows staged in shared memory by TMA):
// the (max, sum of exponentials) pair, its combination and its warp reduction.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "gpukit/dtype.h"

namespace gk::cuda {

// (max, sum of exp(x - max)) of a set of values; combining rescales the smaller
// side's sum. A max of -inf comes with a sum of 0 (or NaN).
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(const MaxSum& a, const MaxSum& b) {
  const float m = fmaxf(a.m, b.m);
  const float sa = a.m == m ? a.s : a.s * ::expf(a.m - m);
  const float sb = b.m == m ? b.s : b.s * ::expf(b.m - m);
  return {m, sa + sb};
}

// Fixed shuffle tree over a warp; every lane gets lane 0's result.
__device__ __forceinline__ MaxSum warp_maxsum(MaxSum v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = combine(v, MaxSum{__shfl_down_sync(0xffffffffu, v.m, o), __shfl_down_sync(0xffffffffu, v.s, o)});
  return {__shfl_sync(0xffffffffu, v.m, 0), __shfl_sync(0xffffffffu, v.s, 0)};
}

// 16-bit storage: the hardware exp (a few fp32 ulps, far below half a bf16/f16 ulp).
template <class T>
__device__ __forceinline__ float exp_t(float x) {
  if constexpr (std::is_same_v<T, float>) return ::expf(x);
  else return __expf(x);
}

}  // namespace gk::cuda
