// CPU reference of attention_decode: per (sequence, query head), double math.
#include <cmath>
#include <limits>
#include <vector>

#include "ops/nn_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("attention_decode", "attention_prefill");

namespace {
template <class T, class C>
void decode_t(const DecodeArgs& a) {
  const int G = a.hq / a.hkv;
  const C* kc = static_cast<const C*>(a.kc);
  const C* vc = static_cast<const C*>(a.vc);
  std::vector<double> s, acc(size_t(a.D));
  for (int b = 0; b < a.B; ++b) {
    int64_t L = std::min<int64_t>(std::max<int64_t>(a.seq_lens[b], 0), a.capacity);
    int64_t start = a.window > 0 ? std::max<int64_t>(0, L - a.window) : 0;
    for (int h = 0; h < a.hq; ++h) {
      const T* q = static_cast<const T*>(a.q) + b * a.q_bs + h * a.q_hs;
      const int kvh = h / G;
      const double ksc = a.k_scale ? double(a.k_scale[kvh]) : 1.0, vsc = a.v_scale ? double(a.v_scale[kvh]) : 1.0;
      s.assign(size_t(L - start), -std::numeric_limits<double>::infinity());
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = start; j < L; ++j) {
        int64_t row = decode_row(a, b, j);
        if (row < 0) continue;
        const C* k = kc + (row * a.hkv + kvh) * a.D;
        double dot = 0;
        for (int e = 0; e < a.D; ++e) dot += double(convert<float>(q[e])) * double(convert<float>(k[e])) * ksc;
        dot *= double(a.scale);
        if (a.softcap > 0) dot = double(a.softcap) * std::tanh(dot / double(a.softcap));
        s[j - start] = dot;
        m = std::max(m, dot);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double l = 0;
      if (m > -std::numeric_limits<double>::infinity()) {
        for (int64_t j = start; j < L; ++j) {
          int64_t row = decode_row(a, b, j);
          if (row < 0) continue;
          double p = std::exp(s[j - start] - m);
          l += p;
          const C* v = vc + (row * a.hkv + kvh) * a.D;
          for (int e = 0; e < a.D; ++e) acc[e] += p * double(convert<float>(v[e])) * vsc;
        }
      }
      T* o = static_cast<T*>(a.out) + (int64_t(b) * a.hq + h) * a.D;
      for (int e = 0; e < a.D; ++e) o[e] = convert<T>(float(l > 0 ? acc[e] / l : 0.0));
    }
  }
}
template <class T>
void prefill_t(const PrefillArgs& a) {
  const int G = a.hq / a.hkv;
  std::vector<double> s, acc(size_t(a.D));
  for (int64_t t = 0; t < a.Tq; ++t) {
    int64_t k0 = 0, lo = 0, hi = 0;
    bool any = prefill_range(a, t, k0, lo, hi);
    for (int h = 0; h < a.hq; ++h) {
      T* o = static_cast<T*>(a.out) + (t * a.hq + h) * a.D;
      std::fill(acc.begin(), acc.end(), 0.0);
      double l = 0;
      if (any) {
        const T* q = static_cast<const T*>(a.q) + t * a.q_ts + h * a.q_hs;
        const int kvh = h / G;
        s.resize(size_t(hi - lo));
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = lo; j < hi; ++j) {
          const T* k = static_cast<const T*>(a.k) + (k0 + j) * a.k_ts + kvh * a.k_hs;
          double dot = 0;
          for (int e = 0; e < a.D; ++e) dot += double(convert<float>(q[e])) * double(convert<float>(k[e]));
          dot *= double(a.scale);
          if (a.softcap > 0) dot = double(a.softcap) * std::tanh(dot / double(a.softcap));
          s[j - lo] = dot;
          m = std::max(m, dot);
        }
        for (int64_t j = lo; j < hi; ++j) {
          double p = std::exp(s[j - lo] - m);
          l += p;
          const T* v = static_cast<const T*>(a.v) + (k0 + j) * a.v_ts + kvh * a.v_hs;
          for (int e = 0; e < a.D; ++e) acc[e] += p * double(convert<float>(v[e]));
        }
      }
      for (int e = 0; e < a.D; ++e) o[e] = convert<T>(float(l > 0 ? acc[e] / l : 0.0));
    }
  }
}
}  // namespace

void attention_prefill(const PrefillArgs& a) {
  dispatch_float(a.dtype, [&](auto t) { prefill_t<decltype(t)>(a); });
}

void attention_decode(const DecodeArgs& a) {
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    if (a.cache_dtype == DType::f8e4m3) decode_t<T, f8e4m3>(a);
    else decode_t<T, T>(a);
  });
}

}  // namespace gk::cpu
