// gemv_quantized with the residual add + RMSNorm epilogue (ops/norm_epi_args.h; the engine's
// EngineOptions::fused_norm_epilogue, src/llm/fused_norm_epi.cpp).
#pragma once
#include "gpukit/array.h"
#include "gpukit/quant.h"
#include "gpukit/stream.h"
#include "ops/norm_epi_args.h"

namespace gk {
// y = gemv_quantized(x, qw, x's dtype) on CUDA for x [M <= 8, K] (bf16 / f16), then the epilogue
// epi on y (its pointers, nt and counter filled and checked by the caller; in the GEMV's last
// CTA where the kernel takes it, else as its own launch after it). Returns y.
Array gemv_quantized_norm_epi(const Array& x, const QuantizedWeight& qw, const NormEpi& epi,
                              const Stream* s = nullptr);
}  // namespace gk
