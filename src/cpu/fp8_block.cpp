// CPU reference of the block-scaled FP8 GEMM and of the fp8 block quantizer (see
// src/ops/fp8_block_args.h for the exact arithmetic both backends follow).
#include <algorithm>
#include <cmath>

#include "gpukit/errors.h"
#include "gpukit/numeric.h"
#include "ops/fp8_block_args.h"
#include "ops/registry.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("fp8_block_linear", "quantize_fp8_blocks");

namespace {

template <class O>
void gemm_t(const Fp8BlockArgs& p) {
  const int64_t nb = (p.k + kFp8Block - 1) / kFp8Block;
  float lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = float(f8e4m3::from_bits(uint8_t(c)));
  const O* bias = static_cast<const O*>(p.bias);
  O* out = static_cast<O*>(p.out);
  for (int64_t i = 0; i < p.m; ++i) {
    const uint8_t* x = p.x + i * p.x_rs;
    for (int64_t j = 0; j < p.n; ++j) {
      const uint8_t* w = p.w + j * p.w_rs;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        float part = 0.0f;
        const int64_t l1 = std::min(p.k, (b + 1) * kFp8Block);
        for (int64_t l = b * kFp8Block; l < l1; ++l) part += lut[x[l]] * lut[w[l]];  // products exact
        float sc = p.xs[i * nb + b] * p.ws[(j / kFp8Block) * nb + b];
        acc += sc * part;
      }
      if (bias) acc += float(bias[j]);
      out[i * p.n + j] = convert<O>(acc);
    }
  }
}

template <class T>
void quant_t(const Fp8QuantArgs& p) {
  const T* in = static_cast<const T*>(p.in);
  const int64_t nbc = (p.cols + kFp8Block - 1) / kFp8Block;
  for (int64_t r0 = 0; r0 < p.rows; r0 += p.block_rows) {
    const int64_t r1 = std::min(p.rows, r0 + p.block_rows);
    for (int64_t cb = 0; cb < nbc; ++cb) {
      const int64_t c0 = cb * kFp8Block, c1 = std::min(p.cols, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(float(in[r * p.in_rs + c])));
      float s = amax / 448.0f;
      if (!(s > 0.0f) || !std::isfinite(s)) s = 1.0f;
      p.s[(r0 / p.block_rows) * nbc + cb] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) p.q[r * p.cols + c] = f8e4m3(float(in[r * p.in_rs + c]) / s).bits;
    }
  }
}

}  // namespace

void fp8_block_gemm(const Fp8BlockArgs& a) {
  if (a.m <= 0 || a.n <= 0) return;
  switch (a.out_dtype) {
    case DType::f32: return gemm_t<float>(a);
    case DType::f16: return gemm_t<f16>(a);
    case DType::bf16: return gemm_t<bf16>(a);
    default: throw ValueError(cat("fp8_block_linear: unsupported output dtype ", dtype_name(a.out_dtype)));
  }
}

void quantize_fp8_blocks(const Fp8QuantArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  switch (a.in_dtype) {
    case DType::f32: return quant_t<float>(a);
    case DType::f16: return quant_t<f16>(a);
    case DType::bf16: return quant_t<bf16>(a);
    default: throw TypeError(cat("quantize_fp8_blocks: unsupported input dtype ", dtype_name(a.in_dtype)));
  }
}

}  // namespace gk::cpu
