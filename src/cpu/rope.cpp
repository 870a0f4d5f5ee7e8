// CPU reference of rope, sinusoidal positions and the ALiBi bias. The angle is
// the fp32 product position * inv_freq (as on the GPU); cos and sin of it are
// taken in double.
#include <cmath>
#include <vector>

#include "ops/nn_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("rope", "sinusoidal_positions", "alibi_bias");

namespace {
int64_t pos_at(const void* p, bool p64, int64_t t) {
  return p64 ? static_cast<const int64_t*>(p)[t] : int64_t(static_cast<const int32_t*>(p)[t]);
}

template <class T>
void rotate(const T* x, T* o, const RopeArgs& a, const std::vector<double>& c, const std::vector<double>& s) {
  const int n = a.rd / 2;
  // Read the whole rotary part first: in place, x and o alias.
  std::vector<double> v(size_t(a.rd));
  for (int i = 0; i < a.rd; ++i) v[i] = double(convert<float>(x[i]));
  for (int i = 0; i < n; ++i) {
    int i1 = a.interleaved ? 2 * i : i, i2 = a.interleaved ? 2 * i + 1 : i + n;
    o[i1] = convert<T>(float(v[i1] * c[i] - v[i2] * s[i]));
    o[i2] = convert<T>(float(v[i2] * c[i] + v[i1] * s[i]));
  }
  if (a.copy_tail)
    for (int i = a.rd; i < a.D; ++i) o[i] = x[i];
}

template <class T>
void rope_t(const RopeArgs& a) {
  const int n = a.rd / 2;
  std::vector<double> c(n), s(n);
  for (int64_t t = 0; t < a.T; ++t) {
    float p = float(pos_at(a.pos, a.pos64, t));
    for (int i = 0; i < n; ++i) {
      double ang = double(p * a.inv_freq[i]);  // fp32 product, as on the GPU
      c[i] = std::cos(ang) * double(a.mscale);
      s[i] = std::sin(ang) * double(a.mscale);
    }
    for (int h = 0; h < a.hq; ++h)
      rotate(static_cast<const T*>(a.q) + t * a.q_ts + h * a.q_hs, static_cast<T*>(a.q_out) + t * a.qo_ts + h * a.qo_hs,
             a, c, s);
    for (int h = 0; h < a.hk; ++h)
      rotate(static_cast<const T*>(a.k) + t * a.k_ts + h * a.k_hs, static_cast<T*>(a.k_out) + t * a.ko_ts + h * a.ko_hs,
             a, c, s);
  }
}
}  // namespace

void rope(const RopeArgs& a) {
  dispatch_float(a.dtype, [&](auto t) { rope_t<decltype(t)>(a); });
}

void sinusoidal(const SinusoidArgs& a) {
  dispatch_float(a.dtype, [&](auto tt) {
    using T = decltype(tt);
    T* out = static_cast<T*>(a.out);
    for (int64_t t = 0; t < a.T; ++t) {
      float p = float(pos_at(a.pos, a.pos64, t));
      for (int i = 0; i < a.dim / 2; ++i) {
        double ang = double(p * a.inv_freq[i]);
        out[t * a.dim + 2 * i] = convert<T>(float(std::sin(ang)));
        out[t * a.dim + 2 * i + 1] = convert<T>(float(std::cos(ang)));
      }
    }
  });
}

void alibi_bias(const AlibiArgs& a) {
  dispatch_float(a.dtype, [&](auto tt) {
    using T = decltype(tt);
    T* out = static_cast<T*>(a.out);
    for (int h = 0; h < a.H; ++h)
      for (int64_t i = 0; i < a.Lq; ++i)
        for (int64_t j = 0; j < a.Lk; ++j)
          out[(h * a.Lq + i) * a.Lk + j] =
              convert<T>(float(double(a.slopes[h]) * double(j - (i + a.Lk - a.Lq))));
  });
}

}  // namespace gk::cpu
