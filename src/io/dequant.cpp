// Dequantization of ggml block formats to float32 / bfloat16.
//
// Each block function turns one block into float32 with exactly the operation
// order of the reference dequantization (the `gguf` Python package): scales are
// formed first (d * sc), then applied (scale * q - min), each step rounded to
// float32. Fused multiply-add is disabled so the results match bit for bit.
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

namespace gk::io {
namespace {

using detail::load_le;

inline float h2f(const uint8_t* p) { return float(f16::from_bits(load_le<uint16_t>(p))); }

// ---- 32-element formats ----
void q4_0(const uint8_t* b, float* y) {  // d, qs[16]
  float d = h2f(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(b[2 + j] & 0x0F) - 8);
    y[j + 16] = d * float(int(b[2 + j] >> 4) - 8);
  }
}
void q4_1(const uint8_t* b, float* y) {  // d, m, qs[16]
  float d = h2f(b), m = h2f(b + 2);
  for (int j = 0; j < 16; ++j) {
    float p0 = d * float(b[4 + j] & 0x0F), p1 = d * float(b[4 + j] >> 4);
    y[j] = p0 + m;
    y[j + 16] = p1 + m;
  }
}
void q5_0(const uint8_t* b, float* y) {  // d, qh (u32), qs[16]
  float d = h2f(b);
  uint32_t qh = load_le<uint32_t>(b + 2);
  for (int j = 0; j < 32; ++j) {
    int lo = j < 16 ? (b[6 + j] & 0x0F) : (b[6 + j - 16] >> 4);
    int q = lo | int((qh >> j) & 1u) << 4;
    y[j] = d * float(q - 16);
  }
}
void q5_1(const uint8_t* b, float* y) {  // d, m, qh (u32), qs[16]
  float d = h2f(b), m = h2f(b + 2);
  uint32_t qh = load_le<uint32_t>(b + 4);
  for (int j = 0; j < 32; ++j) {
    int lo = j < 16 ? (b[8 + j] & 0x0F) : (b[8 + j - 16] >> 4);
    int q = lo | int((qh >> j) & 1u) << 4;
    float p = d * float(q);
    y[j] = p + m;
  }
}
void q8_0(const uint8_t* b, float* y) {  // d, qs[32] (int8)
  float d = h2f(b);
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

// ---- 256-element (k-quant) formats ----
void q2_k(const uint8_t* b, float* y) {  // scales[16], qs[64], d, dmin
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  float d = h2f(b + 80), dmin = h2f(b + 82);
  for (int e = 0; e < 256; ++e) {
    int h = e / 128, s = (e / 32) % 4, l = e % 32;
    int q = (qs[h * 32 + l] >> (2 * s)) & 3;
    int g = e / 16;
    float dl = d * float(sc[g] & 0x0F), ml = dmin * float(sc[g] >> 4);
    float p = dl * float(q);
    y[e] = p - ml;
  }
}
void q3_k(const uint8_t* b, float* y) {  // hmask[32], qs[64], scales[12], d
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  float d = h2f(b + 108);
  float dl[16];
  for (int i = 0; i < 16; ++i) {
    int lo = i < 8 ? (sc[i] & 0x0F) : (sc[i - 8] >> 4);
    int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    dl[i] = d * float((lo | (hi << 4)) - 32);
  }
  for (int e = 0; e < 256; ++e) {
    int h = e / 128, s = (e / 32) % 4, l = e % 32;
    int ql = (qs[h * 32 + l] >> (2 * s)) & 3;
    int hbit = (hm[l] >> (e / 32)) & 1;
    int q = ql - (hbit ? 0 : 4);
    y[e] = dl[e / 16] * float(q);
  }
}
// The 6-bit scales and mins of Q4_K / Q5_K (12 bytes for 8 sub-blocks).
void k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 0x3F;
    *m = s[j + 4] & 0x3F;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}
void q4_k(const uint8_t* b, float* y) {  // d, dmin, scales[12], qs[128]
  float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* qs = b + 16;
  for (int sb = 0; sb < 8; ++sb) {
    int sc, m;
    k_scale_min(b + 4, sb, &sc, &m);
    float d1 = d * float(sc), m1 = dmin * float(m);
    int c = sb / 2, shift = 4 * (sb % 2);
    for (int l = 0; l < 32; ++l) {
      float p = d1 * float((qs[c * 32 + l] >> shift) & 0x0F);
      y[sb * 32 + l] = p - m1;
    }
  }
}
void q5_k(const uint8_t* b, float* y) {  // d, dmin, scales[12], qh[32], qs[128]
  float d = h2f(b), dmin = h2f(b + 2);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int sb = 0; sb < 8; ++sb) {
    int sc, m;
    k_scale_min(b + 4, sb, &sc, &m);
    float d1 = d * float(sc), m1 = dmin * float(m);
    int c = sb / 2, shift = 4 * (sb % 2);
    for (int l = 0; l < 32; ++l) {
      int q = ((qs[c * 32 + l] >> shift) & 0x0F) | (((qh[l] >> sb) & 1) << 4);
      float p = d1 * float(q);
      y[sb * 32 + l] = p - m1;
    }
  }
}
void q6_k(const uint8_t* b, float* y) {  // ql[128], qh[64], scales[16] (int8), d
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = h2f(b + 208);
  for (int e = 0; e < 256; ++e) {
    int h = e / 128, r = e % 128;
    int lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0x0F;
    int hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
    int q = (lo | (hi << 4)) - 32;
    float ds = d * float(sc[e / 16]);
    y[e] = ds * float(q);
  }
}

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
