// Internal: argument blocks of the block-scaled FP8 GEMM and of the block quantizer
// (see fp8_block_linear / quantize_fp8_blocks in include/gpukit/gemm.h).
#pragma once
#include <cstdint>

#include "gpukit/dtype.h"

namespace gk {

constexpr int64_t kFp8Block = 128;

// y[i, j] = round_out( sum_b (xs[i, b] * ws[j / 128, b]) * P_b(i, j)  (+ bias[j]) ),
// P_b = fp32 sum over l in block b (increasing l) of x[i, l] * w[j, l] (products of
// e4m3 values are exact in fp32); the blocks are added in increasing b, in fp32.
// x [m, k] rows x_rs apart, w [n, k] rows w_rs apart (elements contiguous in a row);
// xs [m, L] and ws [ceil(n/128), L] row-major with L = ceil(k/128); bias of out_dtype
// or null; out [m, n] contiguous.
struct Fp8BlockArgs {
  const uint8_t* x = nullptr;
  const uint8_t* w = nullptr;
  const float* xs = nullptr;
  const float* ws = nullptr;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t m = 0, n = 0, k = 0, x_rs = 0, w_rs = 0;
  DType out_dtype = DType::bf16;
};

// Quantizes in [rows, cols] (row stride in_rs, elements contiguous; f32/f16/bf16) in
// blocks of block_rows x 128 (block_rows 1 or 128): s = amax(block) / 448 (1 when the
// block is all zeros or not finite), q = e4m3(float(v) / s), round to nearest even,
// saturating. q [rows, cols] contiguous; s [ceil(rows/block_rows), ceil(cols/128)].
struct Fp8QuantArgs {
  const void* in = nullptr;
  DType in_dtype = DType::f32;
  int64_t rows = 0, cols = 0, in_rs = 0;
  int64_t block_rows = 1;
  uint8_t* q = nullptr;
  float* s = nullptr;
};

namespace cpu {
void fp8_block_gemm(const Fp8BlockArgs& a);
void quantize_fp8_blocks(const Fp8QuantArgs& a);
}  // namespace cpu
namespace cuda {
void fp8_block_gemm(const Fp8BlockArgs& a, void* stream);
void quantize_fp8_blocks(const Fp8QuantArgs& a, void* stream);
}  // namespace cuda

}  // namespace gk
