// Argument blocks of weight quantization and the quantized decode GEMV
// (src/cpu/quant.cpp, src/cuda/quant.cu). Formats (row j of w [N, K]):
//   fp8:  q [N, K] float8_e4m3fn, scales [N] f32:  w = float(q) * s[j]
//   int8: q [N, K] int8,          scales [N] f32:  w = q * s[j]
//   int4: q [N, K/2] uint8 (element 2i in the low nibble of byte i, 2i+1 in the high),
//         scales [N, K/G] f32, zeros [N, K/G] uint8 (0..15): w = (q - z[j, g]) * s[j, g], g = k / G
//   q8_0 / q4_0: q [N, K/32 * 34 or 18] uint8, the GGUF blocks (no scales arrays)
#pragma once
#include <cstdint>

#include "gpukit/dtype.h"

namespace gk {

enum class QFormat : int { fp8 = 0, int8 = 1, int4 = 2, q8_0 = 3, q4_0 = 4 };  // GGUF blocks: ops/gguf_blocks.h

struct QuantArgs {
  float* w = nullptr;  // [n, k] contiguous float32: input of quantize, output of dequantize
  void* q = nullptr;
  float* scales = nullptr;
  uint8_t* zeros = nullptr;
  int64_t n = 0, k = 0, group = 0;
  QFormat fmt = QFormat::int8;
};

struct QGemvArgs {
  const void* x = nullptr;  // [m, k] x_dtype, rows x_rs elements apart
  const void* q = nullptr;  // rows q_rs bytes apart
  const float* scales = nullptr;
  const uint8_t* zeros = nullptr;
  void* y = nullptr;        // [m, n] contiguous out_dtype
  float* part = nullptr;    // CUDA split-K partial sums [split, m, n]
  int64_t m = 0, n = 0, k = 0, x_rs = 0, q_rs = 0, group = 0;
  DType x_dtype = DType::bf16, out_dtype = DType::bf16;
  QFormat fmt = QFormat::int8;
  int split = 1;
};

namespace cpu {
void quantize(const QuantArgs& a);
void dequantize(const QuantArgs& a);
void qgemv(const QGemvArgs& a);
}  // namespace cpu
namespace cuda {
void qgemv(const QGemvArgs& a, void* stream);
int qgemv_split(int64_t n, int64_t k);
}  // namespace cuda

}  // namespace gk
