// The GEMV kernels of the GGUF blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) and of int4 / NVF4
// (their declarations; the dispatch is in src/cuda/quant.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/quant_args.h"

namespace gk::cuda {
template <class T>
void launch_gguf(const QGemvArgs& p, cudaStream_t st);
// The split-K factor of these kernels: a function of (N, K, format) only.
int gguf_split(int64_t n, int64_t k, QFormat f);
// The staged kernel of all five GGUF formats (src/cuda/quant_gguf_st.cu, the default):
// whether K suits it (K % 256 == 0; Q6_K K % 2048 == 0, rows of whole 16-byte chunks),
// whether it takes these arguments (also 16-byte aligned rows of q and x), the launch, its
// split-K (a function of N, K and the format; the kernel takes any split).
bool gguf_st_shape(int64_t k, QFormat f);
bool gguf_st_applies(const QGemvArgs& p);
template <class T>
void launch_gguf_st(const QGemvArgs& p, cudaStream_t st);
int gguf_st_split(int64_t n, int64_t k, QFormat f);
// Q4_0 / Q4_1 / Q8_0 with bf16 x on the integer tensor cores (src/cuda/quant_gguf_imma.cu; GPUKIT_GGUF_IMMA):
// whether the call runs it (format, bf16 x, M <= 8, K % 512 == 0, aligned rows, the switch), the x workspace it
// needs at M > 1 (QGemvArgs::w4x; 0: none), the launch.
bool gguf_imma_runs(const QGemvArgs& p);
int64_t gguf_imma_workspace(const QGemvArgs& p);
void launch_gguf_imma(const QGemvArgs& p, cudaStream_t st);
// int4 with every mma k-step in one group (src/cuda/quant_int4_mma.cu): K % 256 == 0,
// groups of 32 / 64 / 128, aligned rows.
bool int4_mma_applies(const QGemvArgs& p);
template <class T>
void launch_int4_mma(const QGemvArgs& p, cudaStream_t st);
// Q4_K (16-byte aligned rows, K % 256 == 0) and Q6_K (4-byte aligned rows, K % 512 == 0)
// (src/cuda/quant_gguf_k.cu); takes any split.
bool gguf_k_applies(const QGemvArgs& p);
// NVF4 with the per-lane layout of the int4 kernel (src/cuda/quant_nvf4_lane.cu): K % 128 == 0,
// 16-byte aligned rows; takes any split.
bool nvf4_lane_applies(const QGemvArgs& p);
template <class T>
void launch_nvf4_lane(const QGemvArgs& p, cudaStream_t st);
template <class T>
void launch_gguf_k(const QGemvArgs& p, cudaStream_t st);
}  // namespace gk::cuda
