// The GGUF (ggml) block formats: one definition shared by the file reader's
// dequantization (src/io/dequant.cpp), the CPU reference GEMV (src/cpu/quant.cpp) and
// the CUDA GEMV (src/cuda/quant.cu). Little-endian, no padding:
//   Q4_0 (32 w, 18 B): f16 d, u8 qs[16]            w[j] = d * ((qs[j] & 15) - 8), w[j+16]: qs[j] >> 4
//   Q4_1 (32 w, 20 B): f16 d, f16 m, u8 qs[16]     w[j] = d * (qs[j] & 15) + m,   w[j+16]: qs[j] >> 4
//   Q5_0 (32 w, 22 B): f16 d, u32 qh, u8 qs[16]    w = d * ((lo | hbit << 4) - 16)
//   Q5_1 (32 w, 24 B): f16 d, f16 m, u32 qh, qs[16] w = d * (lo | hbit << 4) + m
//   Q8_0 (32 w, 34 B): f16 d, i8 qs[32]            w[j] = qs[j] * d
//   Q2_K, Q3_K, Q5_K (256 w): see the block functions below
//   Q4_K (256 w, 144 B): f16 d, f16 dmin, u8 scales[12] (8 x 6-bit scale, 8 x 6-bit min),
//        u8 qs[128]: sub-block s (32 w) reads the low (s even) / high (s odd) nibbles of
//        qs[32 (s / 2) .. + 32]; w = (d * sc_s) * q - (dmin * m_s)
//   Q6_K (256 w, 210 B): u8 ql[128], u8 qh[64], i8 scales[16], f16 d; element e:
//        h = e / 128, r = e % 128, lo = ql[64h + r % 64] >> 4 (r / 64) & 15,
//        hi = qh[32h + r % 32] >> 2 (r / 32) & 3, w = (d * scales[e / 16]) * ((lo | hi << 4) - 32)
// Every block function forms the scales first (d * sc), then applies them, each step
// rounded to float32, in the order of the reference (the `gguf` Python package); the
// file reader compiles them with contraction off to match it bit for bit.
#pragma once
#include <cstdint>

#include "gpukit/numeric.h"

namespace gk::gguf {

constexpr int kBlock = 32;   // weights per block of the 32-weight formats
constexpr int kBlockK = 256; // weights per k-quant super-block
constexpr int kQ4_0Bytes = 18, kQ4_1Bytes = 20, kQ5_0Bytes = 22, kQ5_1Bytes = 24, kQ8_0Bytes = 34;
constexpr int kQ2_KBytes = 84, kQ3_KBytes = 110, kQ4_KBytes = 144, kQ5_KBytes = 176, kQ6_KBytes = 210;

GK_HD uint16_t le16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }
GK_HD uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
GK_HD float h2f(const uint8_t* p) { return float(f16::from_bits(le16(p))); }

// ---- 32-weight formats ----
GK_HD void q4_0(const uint8_t* b, float* y) {
  float d = h2f(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(b[2 + j] & 0x0F) - 8);
    y[j + 16] = d * float(int(b[2 + j] >> 4) - 8);
  }
}
GK_HD void q4_1(const uint8_t* b, float* y) {
  float d = h2f(b), m = h2f(b + 2);
  for (int j = 0; j < 16; ++j) {
    float p0 = d * float(b[4 + j] & 0x0F), p1 = d * float(b[4 + j] >> 4);
    y[j] = p0 + m;
    y[j + 16] = p1 + m;
  }
}
GK_HD void q5_0(const uint8_t* b, float* y) {
  float d = h2f(b);
  uint32_t qh = le32(b + 2);
  for (int j = 0; j < 32; ++j) {
    int lo = j < 16 ? (b[6 + j] & 0x0F) : (b[6 + j - 16] >> 4);
    int q = lo | int((qh >> j) & 1u) << 4;
    y[j] = d * float(q - 16);
  }
}
GK_HD void q5_1(const uint8_t* b, float* y) {
  float d = h2f(b), m = h2f(b + 2);
  uint32_t qh = le32(b + 4);
  for (int j = 0; j < 32; ++j) {
    int lo = j < 16 ? (b[8 + j] & 0x0F) : (b[8 + j - 16] >> 4);
    int q = lo | int((qh >> j) & 1u) << 4;
    float p = d * float(q);
    y[j] = p + m;
  }
}
GK_HD void q8_0(const uint8_t* b, float* y) {
  float d = h2f(b);
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

// ---- 256-weight (k-quant) formats ----
GK_HD void q2_k(const uint8_t* b, float* y) {  // scales[16], qs[64], d, dmin
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
GK_HD void q3_k(const uint8_t* b, float* y) {  // hmask[32], qs[64], scales[12], d
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
// The 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K from their 12 bytes
// (s: a byte pointer or anything with s[i] giving byte i).
template <class B>
GK_HD void k_scale_min(const B& s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 0x3F;
    *m = s[j + 4] & 0x3F;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
    *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
  }
}
GK_HD void q4_k(const uint8_t* b, float* y) {  // d, dmin, scales[12], qs[128]
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
GK_HD void q5_k(const uint8_t* b, float* y) {  // d, dmin, scales[12], qh[32], qs[128]
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
// The signed 6-bit code of Q6_K element r (0..127) of half h, from its ql and qh bytes
// (ql[64h + r % 64], qh[32h + r % 32]).
GK_HD int q6_k_code(uint8_t ql, uint8_t qh, int r) {
  int lo = (ql >> (4 * (r / 64))) & 0x0F;
  int hi = (qh >> (2 * (r / 32))) & 3;
  return (lo | (hi << 4)) - 32;
}
// Weights 16i .. 16i + 15 of a Q6_K block (i = 0..15); q6_k() is all 16 of them.
GK_HD void q6_k16(const uint8_t* b, int i, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  float d = h2f(b + 208);
  float ds = d * float(int8_t(b[192 + i]));
  for (int j = 0; j < 16; ++j) {
    int e = 16 * i + j, h = e / 128, r = e % 128;
    int q = q6_k_code(ql[h * 64 + r % 64], qh[h * 32 + r % 32], r);
    y[j] = ds * float(q);
  }
}
GK_HD void q6_k(const uint8_t* b, float* y) {
  for (int i = 0; i < 16; ++i) q6_k16(b, i, y + 16 * i);
}

}  // namespace gk::gguf
