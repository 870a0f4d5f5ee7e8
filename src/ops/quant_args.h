// Argument blocks of weight quantization and the quantized decode GEMV
// (src/cpu/quant.cpp, src/cuda/quant.cu). Formats (row j of w [N, K]):
//   fp8:  q [N, K] float8_e4m3fn, scales [N] f32:  w = float(q) * s[j]
//   int8: q [N, K] int8,          scales [N] f32:  w = q * s[j]
//   int4: q [N, K/2] uint8 (element 2i in the low nibble of byte i, 2i+1 in the high),
//         scales [N, K/G] f32, zeros [N, K/G] uint8 (0..15): w = (q - z[j, g]) * s[j, g], g = k / G
//   nvf4: q [N, K/2] uint8 e2m1 codes (element 2i low nibble), scales [N, K/16] e4m3 block
//         scales, tensor_scale [1] f32: w = e2m1(q) * float(b[j, k / 16]) * ts
//   q8_0 / q4_0 / q4_1 / q4_k / q6_k: q [N, K/QK * block bytes] uint8, the GGUF blocks
//         (no scales arrays; layouts in ops/gguf_blocks.h)
#pragma once
#include <cstdint>

#include "gpukit/dtype.h"
#include "ops/gguf_blocks.h"

namespace gk {

enum class QFormat : int { fp8 = 0, int8 = 1, int4 = 2, q8_0 = 3, q4_0 = 4, q4_1 = 5, q4_k = 6, q6_k = 7, nvf4 = 8 };  // GGUF blocks: ops/gguf_blocks.h

// Bytes and weights of one GGUF block (0 bytes: not a GGUF format).
inline int64_t gguf_block_bytes(QFormat f) {
  switch (f) {
    case QFormat::q8_0: return gguf::kQ8_0Bytes;
    case QFormat::q4_0: return gguf::kQ4_0Bytes;
    case QFormat::q4_1: return gguf::kQ4_1Bytes;
    case QFormat::q4_k: return gguf::kQ4_KBytes;
    case QFormat::q6_k: return gguf::kQ6_KBytes;
    default: return 0;
  }
}
inline int64_t gguf_block_weights(QFormat f) {
  return f == QFormat::q4_k || f == QFormat::q6_k ? gguf::kBlockK : gguf::kBlock;
}

struct QuantArgs {
  float* w = nullptr;  // [n, k] contiguous float32: input of quantize, output of dequantize
  void* q = nullptr;
  float* scales = nullptr;     // fp8/int8 [n], int4 [n, k/group]
  uint8_t* zeros = nullptr;    // int4 [n, k/group]; nvf4: e4m3 block scales [n, k/16]
  float* tensor_scale = nullptr;  // nvf4 [1]
  int64_t n = 0, k = 0, group = 0;
  int64_t q_rs = 0;  // bytes between q's rows (dequantize / the CPU GEMV); 0: contiguous rows
  QFormat fmt = QFormat::int8;
};

struct QGemvArgs {
  const void* x = nullptr;  // [m, k] x_dtype, rows x_rs elements apart
  const void* q = nullptr;  // rows q_rs bytes apart
  const float* scales = nullptr;
  const uint8_t* zeros = nullptr;  // int4 zero points; nvf4 e4m3 block scales
  const float* tensor_scale = nullptr;  // nvf4
  void* y = nullptr;        // [m, n] contiguous out_dtype
  float* part = nullptr;    // CUDA split-K partial sums [split, m, n]
  int64_t m = 0, n = 0, k = 0, x_rs = 0, q_rs = 0, group = 0;
  DType x_dtype = DType::bf16, out_dtype = DType::bf16;
  QFormat fmt = QFormat::int8;
  int split = 1;
  int variant = 0;   // CUDA kernel variant (gemv_set_variant in ops/gemv_args.h)
  bool mma = false;  // CUDA fp8 / int8: the tensor-core kernel (gemv_set_dense_path(1), K % 64 == 0)
  bool w8 = false;   // CUDA fp8 / int8: the staged tensor-core kernel (src/cuda/gemv_w8.cu, K % 64 == 0)
  int w8_full = 0;   // its full ring where it fits (gemv_w8_full_ring(): bit 1 N > K, bit 2 N <= K)
  void* xh = nullptr;     // its workspace for bf16 x: [m, k] fp16 (x scaled per row)
  float* xinv = nullptr;  // and [m] f32 (the inverse scales)
  // gemv_quantized_prepared: x is already that scaled fp16 copy (x_dtype f16), these its [m]
  // inverse scales 2^-c (the staged kernel only)
  const float* xprep_inv = nullptr;
  // int4 g128 on the integer tensor cores at 1 < M <= 8 (src/cuda/common/gemv_w4i.cuh): x's planes, block exponents
  // and sums, cuda::gemv_w4i_workspace(a) bytes (0: not needed); the same for the GGUF integer kernel at 1 < M <= 8
  // (cuda::gguf_imma_workspace(a))
  void* w4x = nullptr;
  // gemv_quantized_swiglu: q is [gate; up] (n = 2 I rows) and y [m, I] = silu(g) * u with g, u rounded to out_dtype
  // (the GEMV then the SwiGLU, their bits) in the GEMV's epilogue; only where cuda::gemv_w4i_swiglu_applies(a)
  bool swiglu = false;
};

namespace cpu {
void quantize(const QuantArgs& a);
void dequantize(const QuantArgs& a);
void qgemv(const QGemvArgs& a);
void quantize_gguf(const QuantArgs& a);                          // src/cpu/quant_gguf.cpp
void dequantize_gguf_row(const QuantArgs& a, int64_t j, float* out);
}  // namespace cpu
namespace cuda {
void qgemv(const QGemvArgs& a, void* stream);
int64_t gemv_w4i_workspace(const QGemvArgs& a);  // src/cuda/gemv_w4_staged.cu
int64_t gguf_imma_workspace(const QGemvArgs& a);  // src/cuda/quant_gguf_imma.cu (the same field, w4x)
// Whether the int4 GEMV of a (its x, formats, plan; a.split set) can take the SwiGLU epilogue: k_w4i with a ring of 2
// and registers for 2 CTAs (the default's kernel, variants 63 / 66), no split-K, n even.
bool gemv_w4i_swiglu_applies(const QGemvArgs& a);
int qgemv_split(int64_t n, int64_t k, QFormat f, bool mma = false);
// fp8 / int8 / int4 quantization on the device, bit-identical to cpu::quantize (a.w, a.q,
// a.scales, a.zeros are device pointers).
void quantize(const QuantArgs& a, void* stream);
// fp8 / int8 / int4 / nvf4 exact dequantization on the device (the CPU's values).
void dequantize(const QuantArgs& a, void* stream);
}  // namespace cuda

}  // namespace gk
