// EngineOptions::quantized_swiglu_epi: the gate/up GEMV of quantized decode (w = [gate; up], 2 I rows)
// writes act = SwiGLU(gate, up) itself (its epilogue; src/cuda/common/gemv_sge.cuh), so the engine's
// SwiGLU launch (fused::swiglu) goes away. The bits of fused::swiglu(gemv_quantized(x, qw, out_dtype)).
#pragma once
#include <cstdint>
#include <optional>

#include "gpukit/array.h"
#include "gpukit/quant.h"
#include "gpukit/stream.h"

namespace gk::llm::fused {

// Whether gemv_quantized_swiglu takes the fused kernel for these arguments: CUDA, x bf16 [M, K] or [K]
// (M <= 8; int4: M = 1), dense, 16-byte aligned (or with xh / xinv: gemv_quantized_prepared's scaled fp16
// copy, fp8 / int8), qw fp8 / int8 (the staged kernel's default configuration: ring of 2, one row tile, no
// full ring, no split-K) or int4 g128 / g64 / g32 (k_w4 MODE 11 or 15: variants 48 / 52 / 62), 2 I rows
// with I % 8 == 0.
bool swiglu_gemv_epi_applies(const Array& x, const QuantizedWeight& qw, const Array* xh = nullptr,
                             const Array* xinv = nullptr);
// fused::swiglu(gemv_quantized(x, qw, out_dtype)) (with xh / xinv: gemv_quantized_prepared(x, xh, xinv, qw,
// out_dtype)): [M, I] ([I] for x [K]). One launch where swiglu_gemv_epi_applies, else exactly that composition
// (on the CPU: the CPU references). out_dtype as gemv_quantized's (bf16 x: bf16).
Array gemv_quantized_swiglu(const Array& x, const QuantizedWeight& qw, std::optional<DType> out_dtype = std::nullopt,
                            const Array* xh = nullptr, const Array* xinv = nullptr, const Stream* s = nullptr);
// How many gemv_quantized_swiglu calls took the fused kernel so far (tests).
int64_t swiglu_epi_calls();

}  // namespace gk::llm::fused
