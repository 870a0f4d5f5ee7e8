// CPU quantization of float weights (deterministic: round half to even, fixed
// scale rules), exact dequantization, and the reference quantized GEMV
// (y = sum over k in order of float(x) * dequantized w, fp32, rounded once).
//   fp8:  s = max|w_row| / 448, q = e4m3(w / s) (round to nearest even, saturating)
//   int8: s = max|w_row| / 127, q = clamp(rne(w / s), -127, 127)
//   int4: per group lo = min(w, 0), hi = max(w, 0), s = (hi - lo) / 15,
//         z = clamp(rne(-lo / s), 0, 15), q = clamp(rne(w / s) + z, 0, 15)
//   nvf4: ts = max|w| / (6 * 448); per 16-weight block b = e4m3(max|w_block| / 6 / ts)
//         (rne, saturating), q = e2m1(w / (float(b) * ts)) (rne, saturating at +-6;
//         e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6); w = (e2m1(q) * float(b)) * ts
//   GGUF blocks: src/cpu/quant_gguf.cpp.
// A zero row / group / tensor gets s = 1 (all codes 0, resp. z).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/backend.h"
#include "ops/quant_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("gemv_fp8", "gemv_int8", "gemv_int4", "gemv_nvf4", "gemv_q8_0", "gemv_q4_0", "gemv_q4_1",
                    "gemv_q4_k", "gemv_q6_k");

namespace {
float rne(float v) { return std::nearbyint(v); }  // the default rounding mode: to nearest even
float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

bool is_gguf(QFormat f) { return gguf_block_bytes(f) != 0; }

constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
float e2m1(int code) { return (code & 8) ? -kE2m1[code & 7] : kE2m1[code & 7]; }
// Round to nearest e2m1 magnitude, ties to the even code; saturates at 6.
int e2m1_code(float v) {
  const float a = std::fabs(v);
  int c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return (c != 0 && v < 0.0f) ? (c | 8) : c;
}

// Row j of the exact dequantized weight.
void deq_row(const QuantArgs& a, int64_t j, float* out) {
  if (is_gguf(a.fmt)) return dequantize_gguf_row(a, j, out);
  // row j's bytes (q_rs apart when given: a strided view of the weight)
  const int64_t row_bytes = (a.fmt == QFormat::fp8 || a.fmt == QFormat::int8) ? a.k : a.k / 2;
  const uint8_t* qr = static_cast<const uint8_t*>(a.q) + j * (a.q_rs ? a.q_rs : row_bytes);
  switch (a.fmt) {
    case QFormat::fp8:
      for (int64_t kk = 0; kk < a.k; ++kk) out[kk] = float(f8e4m3::from_bits(qr[kk])) * a.scales[j];
      return;
    case QFormat::int8:
      for (int64_t kk = 0; kk < a.k; ++kk) out[kk] = float(int8_t(qr[kk])) * a.scales[j];
      return;
    case QFormat::int4:
      for (int64_t kk = 0; kk < a.k; ++kk) {
        uint8_t b = qr[kk / 2];
        int q = (kk & 1) ? (b >> 4) : (b & 0xf);
        int64_t g = j * (a.k / a.group) + kk / a.group;
        out[kk] = float(q - int(a.zeros[g])) * a.scales[g];
      }
      return;
    case QFormat::nvf4: {
      const float ts = a.tensor_scale[0];
      for (int64_t kk = 0; kk < a.k; ++kk) {
        uint8_t b = qr[kk / 2];
        int q = (kk & 1) ? (b >> 4) : (b & 0xf);
        float bs = float(f8e4m3::from_bits(a.zeros[j * (a.k / 16) + kk / 16]));
        out[kk] = (e2m1(q) * bs) * ts;
      }
      return;
    }
    default: throw ValueError("dequantize: unknown format");
  }
}

void quantize_nvf4(const QuantArgs& a) {
  float amax = 0.0f;
  for (int64_t i = 0; i < a.n * a.k; ++i) amax = std::fmax(amax, std::fabs(a.w[i]));
  float ts = amax / (6.0f * 448.0f);
  if (!(ts > 0.0f) || !std::isfinite(ts)) ts = 1.0f;
  a.tensor_scale[0] = ts;
  uint8_t* q = static_cast<uint8_t*>(a.q);
  for (int64_t j = 0; j < a.n; ++j)
    for (int64_t b = 0; b < a.k / 16; ++b) {
      const float* w = a.w + j * a.k + b * 16;
      float bmax = 0.0f;
      for (int i = 0; i < 16; ++i) bmax = std::fmax(bmax, std::fabs(w[i]));
      f8e4m3 bs(bmax / 6.0f / ts);
      bs.bits &= 0x7f;  // a non-negative scale
      a.zeros[j * (a.k / 16) + b] = bs.bits;
      const float s = float(bs) * ts;
      for (int i = 0; i < 16; i += 2) {
        int c0 = s > 0.0f ? e2m1_code(w[i] / s) : 0;
        int c1 = s > 0.0f ? e2m1_code(w[i + 1] / s) : 0;
        q[j * (a.k / 2) + (b * 16 + i) / 2] = uint8_t(c0 | (c1 << 4));
      }
    }
}
}  // namespace

void quantize(const QuantArgs& a) {
  if (is_gguf(a.fmt)) return quantize_gguf(a);
  if (a.fmt == QFormat::nvf4) return quantize_nvf4(a);
  for (int64_t j = 0; j < a.n; ++j) {
    const float* w = a.w + j * a.k;
    if (a.fmt != QFormat::int4) {
      float amax = 0.0f;
      for (int64_t kk = 0; kk < a.k; ++kk) amax = std::fmax(amax, std::fabs(w[kk]));
      float s = amax / (a.fmt == QFormat::fp8 ? 448.0f : 127.0f);
      if (!(s > 0.0f) || !std::isfinite(s)) s = 1.0f;
      a.scales[j] = s;
      for (int64_t kk = 0; kk < a.k; ++kk) {
        float v = w[kk] / s;
        if (a.fmt == QFormat::fp8) static_cast<uint8_t*>(a.q)[j * a.k + kk] = f8e4m3(v).bits;
        else static_cast<int8_t*>(a.q)[j * a.k + kk] = int8_t(clampf(rne(v), -127.0f, 127.0f));
      }
      continue;
    }
    const int64_t ng = a.k / a.group;
    uint8_t* qrow = static_cast<uint8_t*>(a.q) + j * (a.k / 2);
    for (int64_t g = 0; g < ng; ++g) {
      const float* wg = w + g * a.group;
      float lo = 0.0f, hi = 0.0f;
      for (int64_t i = 0; i < a.group; ++i) {
        lo = std::fmin(lo, wg[i]);
        hi = std::fmax(hi, wg[i]);
      }
      float s = (hi - lo) / 15.0f;
      if (!(s > 0.0f) || !std::isfinite(s)) s = 1.0f;
      float z = clampf(rne(-lo / s), 0.0f, 15.0f);
      a.scales[j * ng + g] = s;
      a.zeros[j * ng + g] = uint8_t(z);
      for (int64_t i = 0; i < a.group; i += 2) {
        int q0 = int(clampf(rne(wg[i] / s) + z, 0.0f, 15.0f));
        int q1 = int(clampf(rne(wg[i + 1] / s) + z, 0.0f, 15.0f));
        qrow[(g * a.group + i) / 2] = uint8_t(q0 | (q1 << 4));
      }
    }
  }
}

void dequantize(const QuantArgs& a) {
  for (int64_t j = 0; j < a.n; ++j) deq_row(a, j, a.w + j * a.k);
}

namespace {
template <class T, class O>
void qgemv_t(const QGemvArgs& p) {
  QuantArgs a;
  a.q = const_cast<void*>(p.q);
  a.scales = const_cast<float*>(p.scales);
  a.zeros = const_cast<uint8_t*>(p.zeros);
  a.tensor_scale = const_cast<float*>(p.tensor_scale);
  a.n = p.n;
  a.k = p.k;
  a.group = p.group;
  a.q_rs = p.q_rs;
  a.fmt = p.fmt;
  const T* x = static_cast<const T*>(p.x);
  O* y = static_cast<O*>(p.y);
  std::vector<float> w(size_t(std::max<int64_t>(p.k, 1)));
  for (int64_t j = 0; j < p.n; ++j) {
    deq_row(a, j, w.data());
    for (int64_t i = 0; i < p.m; ++i) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < p.k; ++kk) acc += float(x[i * p.x_rs + kk]) * w[size_t(kk)];
      y[i * p.n + j] = convert<O>(acc);
    }
  }
}
template <class T>
void qgemv_out(const QGemvArgs& p) {
  switch (p.out_dtype) {
    case DType::f32: return qgemv_t<T, float>(p);
    case DType::f16: return qgemv_t<T, f16>(p);
    case DType::bf16: return qgemv_t<T, bf16>(p);
    default: throw TypeError(cat("gemv: unsupported output dtype ", dtype_name(p.out_dtype)));
  }
}
}  // namespace

void qgemv(const QGemvArgs& p) {
  if (p.m <= 0 || p.n <= 0) return;
  if (p.x_dtype == DType::bf16) return qgemv_out<bf16>(p);
  if (p.x_dtype == DType::f16) return qgemv_out<f16>(p);
  throw TypeError(cat("gemv: unsupported activation dtype ", dtype_name(p.x_dtype)));
}

}  // namespace gk::cpu
