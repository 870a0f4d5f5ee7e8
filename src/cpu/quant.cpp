// CPU quantization of float weights (deterministic: round half to even, fixed
// scale rules), exact dequantization, and the reference quantized GEMV
// (y = sum over k in order of float(x) * dequantized w, fp32, rounded once).
//   fp8:  s = max|w_row| / 448, q = e4m3(w / s) (round to nearest even, saturating)
//   int8: s = max|w_row| / 127, q = clamp(rne(w / s), -127, 127)
//   int4: per group lo = min(w, 0), hi = max(w, 0), s = (hi - lo) / 15,
//         z = clamp(rne(-lo / s), 0, 15), q = clamp(rne(w / s) + z, 0, 15)
// A zero row / group gets s = 1 (all codes 0, resp. z).
#include <algorithm>
#include <cmath>

#include "ops/backend.h"
#include "ops/gguf_blocks.h"
#include "ops/quant_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("gemv_fp8", "gemv_int8", "gemv_int4", "gemv_q8_0", "gemv_q4_0");

namespace {
float rne(float v) { return std::nearbyint(v); }  // the default rounding mode: to nearest even
float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

int64_t block_bytes(QFormat f) { return f == QFormat::q8_0 ? gguf::kQ8_0Bytes : gguf::kQ4_0Bytes; }

float deq(const QuantArgs& a, int64_t j, int64_t kk) {
  if (a.fmt == QFormat::q8_0 || a.fmt == QFormat::q4_0) {
    const int64_t bb = block_bytes(a.fmt);
    const uint8_t* b = static_cast<const uint8_t*>(a.q) + j * (a.k / 32) * bb + (kk / 32) * bb;
    int code = a.fmt == QFormat::q8_0 ? gguf::q8_0_code(b, int(kk % 32)) : gguf::q4_0_code(b, int(kk % 32));
    float d = gguf::block_scale(b);
    return a.fmt == QFormat::q8_0 ? float(code) * d : d * float(code);
  }
  if (a.fmt == QFormat::fp8)
    return float(f8e4m3::from_bits(static_cast<const uint8_t*>(a.q)[j * a.k + kk])) * a.scales[j];
  if (a.fmt == QFormat::int8) return float(static_cast<const int8_t*>(a.q)[j * a.k + kk]) * a.scales[j];
  uint8_t b = static_cast<const uint8_t*>(a.q)[j * (a.k / 2) + kk / 2];
  int q = (kk & 1) ? (b >> 4) : (b & 0xf);
  int64_t g = j * (a.k / a.group) + kk / a.group;
  return float(q - int(a.zeros[g])) * a.scales[g];
}
}  // namespace

// ggml's reference block quantizers: Q8_0 d = amax / 127, q = roundf(x / d) (half away
// from zero); Q4_0 d = m / -8 with m the value of largest magnitude (first one on ties),
// q = min(15, int(x / d + 8.5)) truncated. d is stored as f16 and the codes use the
// float32 d before that rounding, as ggml does.
static void quantize_block(QFormat f, const float* x, uint8_t* b) {
  float d;
  if (f == QFormat::q8_0) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 32; ++i) b[2 + i] = uint8_t(int8_t(std::roundf(x[i] * id)));
  } else {
    float amax = 0.0f, mx = 0.0f;
    for (int i = 0; i < 32; ++i)
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        mx = x[i];
      }
    d = mx / -8.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 16; ++i) {
      int q0 = std::min(15, int(int8_t(x[i] * id + 8.5f)));
      int q1 = std::min(15, int(int8_t(x[i + 16] * id + 8.5f)));
      b[2 + i] = uint8_t(q0 | (q1 << 4));
    }
  }
  uint16_t h = f16(d).bits;
  b[0] = uint8_t(h & 0xff);
  b[1] = uint8_t(h >> 8);
}

void quantize(const QuantArgs& a) {
  if (a.fmt == QFormat::q8_0 || a.fmt == QFormat::q4_0) {
    const int64_t bb = block_bytes(a.fmt), nb = a.k / 32;
    for (int64_t j = 0; j < a.n; ++j)
      for (int64_t i = 0; i < nb; ++i)
        quantize_block(a.fmt, a.w + j * a.k + i * 32, static_cast<uint8_t*>(a.q) + (j * nb + i) * bb);
    return;
  }
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
  for (int64_t j = 0; j < a.n; ++j)
    for (int64_t kk = 0; kk < a.k; ++kk) a.w[j * a.k + kk] = deq(a, j, kk);
}

namespace {
template <class T, class O>
void qgemv_t(const QGemvArgs& p) {
  QuantArgs a;
  a.q = const_cast<void*>(p.q);
  a.scales = const_cast<float*>(p.scales);
  a.zeros = const_cast<uint8_t*>(p.zeros);
  a.n = p.n;
  a.k = p.k;
  a.group = p.group;
  a.fmt = p.fmt;
  const T* x = static_cast<const T*>(p.x);
  O* y = static_cast<O*>(p.y);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < p.k; ++kk) acc += float(x[i * p.x_rs + kk]) * deq(a, j, kk);
      y[i * p.n + j] = convert<O>(acc);
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
