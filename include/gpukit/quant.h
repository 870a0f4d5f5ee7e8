// Weight quantization for decode GEMV (W8A16 fp8-e4m3 / int8 per output channel,
// W4A16 int4 with group scales and zero points, NVF4, the GGUF blocks Q8_0, Q4_0,
// Q4_1, Q4_K, Q6_K) and the GEMV that reads them.
// Byte layouts and rounding rules: src/ops/quant_args.h and src/cpu/quant.cpp.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "gpukit/array.h"
#include "gpukit/stream.h"

namespace gk {

struct QuantizedWeight {
  std::string format;  // "fp8", "int8", "int4", "nvf4", "q8_0", "q4_0", "q4_1", "q4_k" or "q6_k"
  Array q;             // fp8: float8_e4m3fn [N, K]; int8: int8 [N, K]; int4, nvf4: uint8 [N, K/2];
                       // GGUF: uint8 [N, K/QK * block bytes] (QK = 32, or 256 for q4_k / q6_k)
  Array scales;        // float32 [N] (fp8, int8), [N, K/group] (int4); nvf4: float8_e4m3fn [N, K/16]
  Array zeros;         // int4: uint8 [N, K/group] in 0..15; undefined otherwise
  int64_t group = 0;   // int4 group size (32, 64 or 128)
  Array tensor_scale;  // nvf4: float32 [1]; undefined otherwise
};

// Quantizes float weights w [N, K] (computed on the CPU, deterministic; the
// result lives on w's device).
QuantizedWeight quantize_weight(const Array& w, const std::string& format, int64_t group = 128);
// The exact float32 values the quantized weight stands for, [N, K].
Array dequantize_weight(const QuantizedWeight& qw);
// y = x @ dequantize(qw)^T for x [M, K] (M <= 8; more rows: dequantize + linear) or [K]
// in bfloat16/float16 (float32 x is converted to bfloat16); out_dtype: x's dtype or float32.
Array gemv_quantized(const Array& x, const QuantizedWeight& qw, std::optional<DType> out_dtype = std::nullopt,
                     const Stream* s = nullptr);
// gemv_quantized(x, qw, out_dtype) for bf16 x [M <= 8, K] given xh = x * 2^c_m as float16 and
// xinv[m] = 2^-c_m, the fp8 / int8 staged kernel's scaled x (EngineOptions::quantized_x_prep:
// written by the engine's add_rms_norm): fp8 / int8 weights then take the staged kernel with
// xh (fp16 products; the bits of its bf16-x kernel). Anywhere else (other formats, the CPU,
// another kernel, xh / xinv undefined or not matching x) it is gemv_quantized(x, qw, out_dtype).
// out_dtype: bfloat16 by default.
Array gemv_quantized_prepared(const Array& x, const Array& xh, const Array& xinv, const QuantizedWeight& qw,
                              std::optional<DType> out_dtype = std::nullopt, const Stream* s = nullptr);
// y [M, I] = silu(x g^T) * (x u^T) for a quantized weight qw = [gate; up] (2 I rows) and x [M <= 8, K] (or [K]), with
// g and u rounded to out_dtype first: the bits of gemv_quantized(x, qw, out_dtype) followed by the SwiGLU, in one
// launch (the SwiGLU in the GEMV's epilogue). Only where that kernel runs: CUDA, int4 with groups of 128 and bf16 x on
// the integer tensor cores (K % 512 == 0, no split-K, the default kernel). Anywhere else it returns an undefined
// Array, and the caller runs the GEMV and the SwiGLU itself.
Array gemv_quantized_swiglu(const Array& x, const QuantizedWeight& qw, std::optional<DType> out_dtype = std::nullopt,
                            const Stream* s = nullptr);

}  // namespace gk
