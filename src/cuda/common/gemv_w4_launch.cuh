// The staged 4-bit decode GEMV (int4, NVF4; src/cuda/gemv_w4_staged.cu, kernel in
// common/gemv_w4.cuh): whether it takes these arguments, its launch, its split-K.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/quant_args.h"

namespace gk::cuda {
// int4 (groups of 32 / 64 / 128) or NVF4 with K % 128 == 0, 16-byte aligned code rows and x
// rows, 4-byte aligned int4 scales (8-byte NVF4 block scales); K % 512 == 0 with 16-byte
// aligned rows of scales / zero points takes the wide meta copies (and the variants).
bool w4_staged_applies(const QGemvArgs& p);
template <class T>
void launch_w4_staged(const QGemvArgs& p, cudaStream_t st);
// Its split-K factor for (n, k): a function of the shape only (every int4 / NVF4 kernel takes any split).
int w4_staged_split(int64_t n, int64_t k);
}  // namespace gk::cuda
