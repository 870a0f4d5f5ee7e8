// Host entry points of the quantized GEMVs' residual add + RMSNorm epilogue (ops/norm_epi_args.h;
// src/cuda/gemv_norm_epi.cu, gemv_w8.cu, gemv_w4_staged.cu). A host-only header: gemv_w8.cu includes it
// instead of common/gemv_norm_epi.cuh so that its kernels' code does not change.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "gpukit/dtype.h"
#include "ops/norm_epi_args.h"
#include "ops/quant_args.h"

namespace gk::cuda {
// the epilogue as its own launch (one CTA of e.nt threads) on y [m, n] of dtype out
void norm_epi_launch(const NormEpi& e, DType out, const void* y, int64_t m, int64_t n, cudaStream_t st);
// gemv_w8_quant with the epilogue (fused where launch_w8_epi has the kernel, else launched after)
void gemv_w8_quant_epi(const QGemvArgs& a, const NormEpi& e, void* stream);
// launch_w4_staged with the epilogue (fused where launch_f_epi has the kernel, else launched after)
template <class T>
void launch_w4_staged_epi(const QGemvArgs& p, const NormEpi& e, cudaStream_t st);
}  // namespace gk::cuda
