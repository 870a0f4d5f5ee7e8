// The quantized decode GEMV whose x is silu(gate) * up of a gate/up product, made inside the
// kernel (EngineOptions::fused_swiglu_x; device code in src/cuda/common/gemv_swiglu_x.cuh):
// QGemvArgs with x = the gate/up row [1, 2 K] bf16 (gate at element j, up at K + j, 16-byte
// aligned), k = K, m = 1. The bits of the engine's SwiGLU launch followed by the same GEMV.
#pragma once
#include <cstdint>

#include "ops/quant_args.h"

namespace gk::cuda {
// fp8 / int8 on the staged kernel (src/cuda/gemv_w8.cu): where the unfused GEMV of bf16 x would
// take the default kernel (codes decoded to bf16, no full ring with `full_mask`) at M = 1.
bool gemv_w8_swiglu_x_applies(int64_t m, int64_t n, int64_t k, QFormat f, int full_mask);
void gemv_w8_quant_swiglu_x(const QGemvArgs& a, void* stream);
// int4 g128 on the staged 4-bit kernel (src/cuda/gemv_w4_staged.cu): where the unfused GEMV of
// bf16 x would run variant 48's kernel (k_w4 MODE 11, the default) at M = 1.
bool gemv_w4_swiglu_x_applies(const QGemvArgs& a);
void gemv_w4_swiglu_x(const QGemvArgs& a, void* stream);
}  // namespace gk::cuda
