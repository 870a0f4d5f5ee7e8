// EngineOptions::fused_swiglu_x: the down projection's quantized GEMV makes its x = silu(gate) * up
// from the gate/up GEMV's output itself, so the engine's SwiGLU launch (fused::swiglu) goes away.
// The kernels compute each element with the SwiGLU kernel's arithmetic and rounding, so the result
// is the bits of gemv_quantized(fused::swiglu(gu), qw) (src/cuda/common/gemv_swiglu_x.cuh).
#pragma once
#include <cstdint>
#include <optional>

#include "gpukit/array.h"
#include "gpukit/quant.h"
#include "gpukit/stream.h"

namespace gk::llm::fused {

// Whether the fused kernel takes (gu, qw): CUDA, gu bf16 [1, 2 K] or [2 K] (gate then up, dense
// last dimension, 16-byte aligned), qw fp8 / int8 (the staged kernel's default configuration, the
// full ring not taken) or int4 g128 (the staged 4-bit kernel's default, variant 48) of [N, K].
bool swiglu_x_applies(const Array& gu, const QuantizedWeight& qw);
// gemv_quantized(swiglu(gu), qw, out_dtype) for gu [M, 2 I] or [2 I] (gate then up): the fused
// kernel where swiglu_x_applies, else the engine's SwiGLU (fused::swiglu: its CPU reference on the
// CPU) followed by gemv_quantized. out_dtype: gu's dtype by default (float32 gu: float32).
Array swiglu_gemv_quantized(const Array& gu, const QuantizedWeight& qw, std::optional<DType> out_dtype = std::nullopt,
                            const Stream* s = nullptr);
// How many swiglu_gemv_quantized calls took the fused kernel so far (tests).
int64_t swiglu_x_calls();

}  // namespace gk::llm::fused
