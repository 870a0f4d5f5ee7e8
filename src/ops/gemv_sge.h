// The quantized gate/up GEMV with the SwiGLU epilogue (EngineOptions::quantized_swiglu_epi; device
// code: src/cuda/common/gemv_sge.cuh): QGemvArgs as gemv_quantized makes them for w = [gate; up]
// (n = 2 I rows), y = act [m, I] = SwiGLU of the GEMV's output rounded to out_dtype. The bits of
// the GEMV followed by the engine's SwiGLU launch.
#pragma once
#include <cstdint>

#include "ops/quant_args.h"

namespace gk::cuda {
// fp8 / int8 on the staged kernel (src/cuda/gemv_w8.cu): where gemv_quantized takes k_w8 with 4
// blocks per stage, a ring of 2, one row tile, no XP, no full ring (bf16 x: the default, codes
// decoded to bf16; fp16 x: the scaled copy of quantized_x_prep or plain fp16 x), no split-K,
// I % 8 == 0.
bool gemv_w8_swiglu_epi_applies(const QGemvArgs& a);
void gemv_w8_quant_swiglu_epi(const QGemvArgs& a, void* stream);
// int4 (groups of 128 / 64 / 32, bf16 x, M = 1) on the staged 4-bit kernel (src/cuda/gemv_w4_staged.cu):
// where the unfused GEMV runs k_w4 MODE 11 (variants 48 / 52, the defaults) or MODE 15 (variant 62) with
// a ring of 2 on the wide layout, no split-K, I % 8 == 0.
bool gemv_w4_swiglu_epi_applies(const QGemvArgs& a);
void gemv_w4_swiglu_epi(const QGemvArgs& a, void* stream);
}  // namespace gk::cuda
