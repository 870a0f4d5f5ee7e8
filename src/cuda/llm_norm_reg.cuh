// The row-in-registers pieces shared by the engine's RMSNorm kernels (k_embed_norm in
// llm_step.cu, k_add_rms_norm_reg in llm_small.cu): thread t holds the 16-byte vectors
// t * N + k * blockDim * N, k < NV, of a row of H elements (those below H).
#pragma once
#include <cstdint>

#include "cuda/common/rows.cuh"

namespace gk::cuda::llmk {

// v[k] = the row p's vector k of this thread (the norm's weights, read before the PDL wait).
template <class T, int N, int NV>
__device__ __forceinline__ void load_row_reg(Vec<T, N> (&v)[NV], const T* p, int64_t H) {
  const int64_t step = int64_t(blockDim.x) * N;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t i = int64_t(threadIdx.x) * N + k * step;
    if (i < H) v[k] = *reinterpret_cast<const Vec<T, N>*>(p + i);
  }
}

// out = x * inv * w, rounded to T once per element (the order of k_add_rms_norm).
template <class T, int N, int NV>
__device__ __forceinline__ void store_norm_reg(T* out, const Vec<T, N> (&xv)[NV], const Vec<T, N> (&wv)[NV], float inv,
                                               int64_t H) {
  const int64_t step = int64_t(blockDim.x) * N;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t i = int64_t(threadIdx.x) * N + k * step;
    if (i < H) {
      Vec<T, N> o;
#pragma unroll
      for (int j = 0; j < N; ++j) o.v[j] = convert<T>(float(xv[k].v[j]) * inv * float(wv[k].v[j]));
      *reinterpret_cast<Vec<T, N>*>(out + i) = o;
    }
  }
}

}  // namespace gk::cuda::llmk
