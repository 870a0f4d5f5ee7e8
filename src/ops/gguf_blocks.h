// GGUF (ggml) block formats read by the quantized GEMV, shared by the CPU reference
// and the CUDA kernel. Blocks of 32 weights, little-endian, no padding:
//   Q8_0 (34 bytes): f16 d, int8 qs[32];            w[j] = qs[j] * d
//   Q4_0 (18 bytes): f16 d, uint8 qs[16];           w[j] = d * ((qs[j] & 15) - 8),
//                                                   w[j + 16] = d * ((qs[j] >> 4) - 8), j < 16
// A row of K weights is K / 32 consecutive blocks. Quantization follows ggml's
// reference rules (quantize_row_q8_0_ref / quantize_row_q4_0_ref).
#pragma once
#include <cstdint>

#include "gpukit/numeric.h"

namespace gk::gguf {

constexpr int kBlock = 32;
constexpr int kQ8_0Bytes = 34;
constexpr int kQ4_0Bytes = 18;

GK_HD float block_scale(const uint8_t* b) {
  return float(f16::from_bits(uint16_t(b[0] | (uint16_t(b[1]) << 8))));
}
// The integer code of weight j (0..31) of a block: w = code * d.
GK_HD int q8_0_code(const uint8_t* b, int j) { return int(int8_t(b[2 + j])); }
GK_HD int q4_0_code(const uint8_t* b, int j) {
  return j < 16 ? int(b[2 + j] & 0x0F) - 8 : int(b[2 + j - 16] >> 4) - 8;
}

}  // namespace gk::gguf
