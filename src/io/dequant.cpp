// Dequantization of ggml block formats to float32 / bfloat16.
//
// Each block function (ops/gguf_blocks.h) turns one block into float32 with exactly
// the operation order of the reference dequantization (the `gguf` Python package):
// scales are formed first (d * sc), then applied (scale * q - min), each step rounded
// to float32. Fused multiply-add is disabled in this file (the pragma below applies to
// the header's inline functions included after it) so the results match bit for bit.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cstring>

#include "gpukit/errors.h"
#include "gpukit/io.h"
#include "gpukit/numeric.h"
#include "io/reader.h"
#include "ops/gguf_blocks.h"

namespace gk::io {
namespace {

using detail::load_le;

inline float h2f(const uint8_t* p) { return float(f16::from_bits(load_le<uint16_t>(p))); }

// The block formats themselves: ops/gguf_blocks.h (shared with the GEMV kernels).
using gguf::q2_k, gguf::q3_k, gguf::q4_0, gguf::q4_1, gguf::q4_k, gguf::q5_0, gguf::q5_1, gguf::q5_k,
    gguf::q6_k, gguf::q8_0;

// ---- plain float formats (one element per "block") ----
void f32e(const uint8_t* b, float* y) { *y = load_le<float>(b); }
void f16e(const uint8_t* b, float* y) { *y = h2f(b); }
void bf16e(const uint8_t* b, float* y) { *y = float(bf16::from_bits(load_le<uint16_t>(b))); }
void f64e(const uint8_t* b, float* y) { *y = float(load_le<double>(b)); }

using BlockFn = void (*)(const uint8_t*, float*);

struct Format {
  GGMLType type;
  BlockFn fn;
};
constexpr Format kFormats[] = {
    {GGMLType::F32, f32e},   {GGMLType::F16, f16e},   {GGMLType::BF16, bf16e}, {GGMLType::F64, f64e},
    {GGMLType::Q4_0, q4_0},  {GGMLType::Q4_1, q4_1},  {GGMLType::Q5_0, q5_0},  {GGMLType::Q5_1, q5_1},
    {GGMLType::Q8_0, q8_0},  {GGMLType::Q2_K, q2_k},  {GGMLType::Q3_K, q3_k},  {GGMLType::Q4_K, q4_k},
    {GGMLType::Q5_K, q5_k},  {GGMLType::Q6_K, q6_k},
};

BlockFn find_fn(GGMLType t) {
  for (auto& f : kFormats)
    if (f.type == t) return f.fn;
  return nullptr;
}

}  // namespace

bool ggml_can_dequantize(GGMLType t) { return find_fn(t) != nullptr; }

void dequantize_blocks(GGMLType type, const uint8_t* src, int64_t n_elems, DType out, void* dst) {
  BlockFn fn = find_fn(type);
  uint32_t be = 0, bb = 0;
  if (!fn || !ggml_type_size(uint32_t(type), &be, &bb))
    throw ValueError(cat("dequantize: unsupported type ", ggml_type_name(type)));
  if (out != DType::f32 && out != DType::bf16)
    throw ValueError(cat("dequantize: output dtype must be float32 or bfloat16, not ", dtype_name(out)));
  if (n_elems < 0 || n_elems % be != 0)
    throw ValueError(cat("dequantize: ", n_elems, " elements is not a multiple of the block size ", be));
  int64_t nb = n_elems / be;
  float tmp[256];
  for (int64_t k = 0; k < nb; ++k) {
    fn(src + k * int64_t(bb), tmp);
    if (out == DType::f32) {
      std::memcpy(static_cast<float*>(dst) + k * be, tmp, be * sizeof(float));
    } else {
      bf16* o = static_cast<bf16*>(dst) + k * be;
      for (uint32_t j = 0; j < be; ++j) o[j] = bf16(tmp[j]);
    }
  }
}

}  // namespace gk::io
