// CPU quantizers of the GGUF block formats read by the quantized GEMV (layouts in
// ops/gguf_blocks.h). Deterministic float32 arithmetic, no fused multiply-add.
//   Q8_0, Q4_0, Q4_1: ggml's reference rules (quantize_row_q*_ref), bit-identical to the
//     `gguf` package: Q8_0 d = amax / 127, q = roundf(x / d); Q4_0 d = m / -8 (m the value of
//     largest magnitude, first on ties), q = min(15, trunc(x / d + 8.5)); Q4_1 d = (max - min)
//     / 15, q = min(15, trunc((x - min) / d + 0.5)), m = min. Codes use the float32 d.
//   Q4_K (a plain rule, not ggml's iterative search): per 32-weight sub-block lo = min(w, 0),
//     scale = (max(w) - lo) / 15, min = -lo; d = f16(max scale / 63), dmin = f16(max min / 63);
//     sc = clamp(rne(scale / d), 0, 63), m = clamp(rne(min / dmin), 0, 63); then with the
//     stored d1 = d * sc, m1 = dmin * m: q = clamp(rne((w + m1) / d1), 0, 15).
//   Q6_K (plain rule): per 16-weight sub-block scale = amax / 31; d = f16(max scale / 127),
//     sc = clamp(rne(scale / d), 0, 127); with ds = d * sc: q = clamp(rne(w / ds), -32, 31) + 32.
//   A zero scale gives code 0 (resp. the code of 0).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/backend.h"
#include "ops/gguf_blocks.h"
#include "ops/quant_args.h"

namespace gk::cpu {

namespace {

float rne(float v) { return std::nearbyint(v); }
void put16(uint8_t* p, float v) {
  uint16_t h = f16(v).bits;
  p[0] = uint8_t(h & 0xff);
  p[1] = uint8_t(h >> 8);
}
float f16r(float v) { return float(f16(v)); }

void q8_0_block(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  float d = amax / 127.0f;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 32; ++i) b[2 + i] = uint8_t(int8_t(std::roundf(x[i] * id)));
  put16(b, d);
}

void q4_0_block(const float* x, uint8_t* b) {
  float amax = 0.0f, mx = 0.0f;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      mx = x[i];
    }
  float d = mx / -8.0f;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 16; ++i) {
    int q0 = std::min(15, int(int8_t(x[i] * id + 8.5f)));
    int q1 = std::min(15, int(int8_t(x[i + 16] * id + 8.5f)));
    b[2 + i] = uint8_t(q0 | (q1 << 4));
  }
  put16(b, d);
}

void q4_1_block(const float* x, uint8_t* b) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < 32; ++i) {
    mn = std::fmin(mn, x[i]);
    mx = std::fmax(mx, x[i]);
  }
  float d = (mx - mn) / 15.0f;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < 16; ++i) {
    int q0 = std::min(15, int(uint8_t(int8_t((x[i] - mn) * id + 0.5f))));
    int q1 = std::min(15, int(uint8_t(int8_t((x[i + 16] - mn) * id + 0.5f))));
    b[4 + i] = uint8_t(q0 | (q1 << 4));
  }
  put16(b, d);
  put16(b + 2, mn);
}

void q4_k_block(const float* x, uint8_t* b) {
  float scale[8], mins[8];
  float smax = 0.0f, mmax = 0.0f;
  for (int s = 0; s < 8; ++s) {
    float lo = 0.0f, hi = -INFINITY;
    for (int l = 0; l < 32; ++l) {
      lo = std::fmin(lo, x[32 * s + l]);
      hi = std::fmax(hi, x[32 * s + l]);
    }
    scale[s] = (hi - lo) / 15.0f;
    mins[s] = -lo;
    smax = std::fmax(smax, scale[s]);
    mmax = std::fmax(mmax, mins[s]);
  }
  const float d = f16r(smax / 63.0f), dmin = f16r(mmax / 63.0f);
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d > 0.0f ? int(std::clamp(rne(scale[s] / d), 0.0f, 63.0f)) : 0;
    m[s] = dmin > 0.0f ? int(std::clamp(rne(mins[s] / dmin), 0.0f, 63.0f)) : 0;
  }
  put16(b, d);
  put16(b + 2, dmin);
  uint8_t* sb = b + 4;
  for (int j = 0; j < 4; ++j) {
    sb[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    sb[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    sb[j + 8] = uint8_t((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
  uint8_t* qs = b + 16;
  std::memset(qs, 0, 128);
  for (int s = 0; s < 8; ++s) {
    const float d1 = d * float(sc[s]), m1 = dmin * float(m[s]);
    for (int l = 0; l < 32; ++l) {
      int q = d1 > 0.0f ? int(std::clamp(rne((x[32 * s + l] + m1) / d1), 0.0f, 15.0f)) : 0;
      qs[32 * (s / 2) + l] |= uint8_t(q << (4 * (s % 2)));
    }
  }
}

void q6_k_block(const float* x, uint8_t* b) {
  float scale[16], smax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < 16; ++j) amax = std::fmax(amax, std::fabs(x[16 * i + j]));
    scale[i] = amax / 31.0f;
    smax = std::fmax(smax, scale[i]);
  }
  const float d = f16r(smax / 127.0f);
  std::memset(b, 0, gguf::kQ6_KBytes);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int i = 0; i < 16; ++i) {
    const int sc = d > 0.0f ? int(std::clamp(rne(scale[i] / d), 0.0f, 127.0f)) : 0;
    b[192 + i] = uint8_t(int8_t(sc));
    const float ds = d * float(sc);
    for (int j = 0; j < 16; ++j) {
      const int e = 16 * i + j, h = e / 128, r = e % 128;
      const int q = (ds > 0.0f ? int(std::clamp(rne(x[e] / ds), -32.0f, 31.0f)) : 0) + 32;
      ql[64 * h + r % 64] |= uint8_t((q & 15) << (4 * (r / 64)));
      qh[32 * h + r % 32] |= uint8_t((q >> 4) << (2 * (r / 32)));
    }
  }
  put16(b + 208, d);
}

}  // namespace

void quantize_gguf(const QuantArgs& a) {
  const int64_t bb = gguf_block_bytes(a.fmt), qk = gguf_block_weights(a.fmt), nb = a.k / qk;
  void (*fn)(const float*, uint8_t*) = a.fmt == QFormat::q8_0   ? q8_0_block
                                       : a.fmt == QFormat::q4_0 ? q4_0_block
                                       : a.fmt == QFormat::q4_1 ? q4_1_block
                                       : a.fmt == QFormat::q4_k ? q4_k_block
                                                                : q6_k_block;
  for (int64_t j = 0; j < a.n; ++j)
    for (int64_t i = 0; i < nb; ++i) fn(a.w + j * a.k + i * qk, static_cast<uint8_t*>(a.q) + (j * nb + i) * bb);
}

void dequantize_gguf_row(const QuantArgs& a, int64_t j, float* out) {
  const int64_t bb = gguf_block_bytes(a.fmt), qk = gguf_block_weights(a.fmt), nb = a.k / qk;
  const uint8_t* row = static_cast<const uint8_t*>(a.q) + j * (a.q_rs ? a.q_rs : nb * bb);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = row + i * bb;
    float* y = out + i * qk;
    switch (a.fmt) {
      case QFormat::q8_0: gguf::q8_0(b, y); break;
      case QFormat::q4_0: gguf::q4_0(b, y); break;
      case QFormat::q4_1: gguf::q4_1(b, y); break;
      case QFormat::q4_k: gguf::q4_k(b, y); break;
      default: gguf::q6_k(b, y); break;
    }
  }
}

}  // namespace gk::cpu
