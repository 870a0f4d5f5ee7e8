// Decode GEMV with bf16/fp16 weights (M = 1..8): the kernel family of
// src/cuda/common/gemv.cuh with the dense functor when rows of x and w are 16-byte
// aligned and K % 8 == 0 (or the tensor-core kernel of gemv_mma.cuh when chosen, see
// gemv_set_dense_path); otherwise a plain kernel reading single elements (one warp
// per row, lane-strided k, the same xor-butterfly). Also the split-K second pass
// shared by every format.
#include "common/gemv.cuh"
#include "common/gemv_mma.cuh"
#include "core/cuda_util.h"
#include "ops/backend.h"
#include "ops/gemv_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("gemv");

namespace gemv_detail {

namespace {
__global__ void k_gemv_sum(const float* __restrict__ part, void* y, DType out, int64_t mn, int S) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < mn; i += int64_t(gridDim.x) * blockDim.x) {
    float v = part[i];
    for (int s = 1; s < S; ++s) v += part[int64_t(s) * mn + i];
    store_out(y, out, i, v);
  }
}
}  // namespace

void launch_sum(const KArgs& p, int split, cudaStream_t st) {
  const int64_t mn = p.m * p.n;
  const int64_t blocks = std::min<int64_t>((mn + 255) / 256, 132 * 8);
  launch_ex(k_gemv_sum, dim3(unsigned(blocks)), 256, 0, st, p.variant != 2, p.part, p.y, p.out, mn, split);
  GK_LAUNCH_CHECK("gemv_sum");
}

}  // namespace gemv_detail

namespace {

using namespace gemv_detail;

// Unaligned rows or K % 8 != 0: one warp per output row, lane-strided elements.
template <class T>
__global__ void __launch_bounds__(256) k_gemv_scalar(GemvArgs p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (row >= p.n) return;
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w) + row * p.w_rs;
  float acc[8] = {};
  for (int64_t e = lane; e < p.k; e += 32) {
    const float wf = float(w[e]);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < p.m) acc[i] = fmaf(float(x[i * p.x_rs + e]), wf, acc[i]);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float v = acc[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && i < p.m) store_out(p.y, p.out_dtype, i * p.n + row, v);
  }
}

template <class T>
void launch(const GemvArgs& a, cudaStream_t st) {
  if (!a.vec) {
    const int64_t blocks = (a.n + 7) / 8;
    if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
    k_gemv_scalar<T><<<unsigned(blocks), 256, 0, st>>>(a);
    GK_LAUNCH_CHECK("gemv_scalar");
    return;
  }
  KArgs p;
  p.x = a.x;
  p.x_rs = a.x_rs;
  p.q = static_cast<const uint8_t*>(a.w);
  p.q_rs = a.w_rs * int64_t(sizeof(T));
  p.y = a.y;
  p.part = a.part;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.out = a.out_dtype;
  p.variant = a.variant;
  if (a.mma) launch_mma<MDense<T>, T>(p, a.split, st);
  else launch_family<FDense<T>, T>(p, a.split, st);
}

}  // namespace

int gemv_split(int64_t n, int64_t k, bool mma) {
  return mma ? split_mma(n, k / 32) : split_for(n, chunks_per_row<FDense<bf16>>(k));
}

void gemv(const GemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.m > 8) throw ValueError("gemv: the kernel takes at most 8 rows of x");
  if (a.vec && a.k % 8 != 0) throw ValueError("gemv: the vector path needs K % 8 == 0");
  if (a.mma && (!a.vec || a.k % 32 != 0)) throw ValueError("gemv: the tensor-core path needs K % 32 == 0");
  auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case DType::f16: return launch<f16>(a, s);
    case DType::bf16: return launch<bf16>(a, s);
    default: throw TypeError(cat("gemv: unsupported weight dtype ", dtype_name(a.dtype)));
  }
}

}  // namespace gk::cuda
