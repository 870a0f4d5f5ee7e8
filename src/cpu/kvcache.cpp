// CPU reference of kv_append: token by token, with the shared destination rule.
// With fused RoPE, k is rotated as the CPU rope does (double cos/sin of the fp32
// angle, the result rounded to k's dtype), then stored like an unrotated key.
#include <cmath>
#include <vector>

#include "ops/nn_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("kv_append");

namespace {
template <class T, class C>
C to_cache(T x, const float* scale, int h) {
  if constexpr (std::is_same_v<C, f8e4m3>) return f8e4m3(convert<float>(x) / scale[h]);
  else return x;
}

// The rotated k row of head h (rope_rd > 0): dims [0, rd) rotated, the rest copied.
template <class T>
void rotate_row(const KvAppendArgs& a, const T* k, T* out, const std::vector<double>& c,
                const std::vector<double>& s) {
  const int n = a.rope_rd / 2;
  for (int i = 0; i < n; ++i) {
    const int i1 = a.rope_il ? 2 * i : i, i2 = a.rope_il ? 2 * i + 1 : i + n;
    const double x1 = double(convert<float>(k[i1])), x2 = double(convert<float>(k[i2]));
    out[i1] = convert<T>(float(x1 * c[i] - x2 * s[i]));
    out[i2] = convert<T>(float(x2 * c[i] + x1 * s[i]));
  }
  for (int i = a.rope_rd; i < a.D; ++i) out[i] = k[i];
}

template <class T, class C>
void run(const KvAppendArgs& a) {
  const int n = a.rope_rd / 2;
  std::vector<double> cs(static_cast<size_t>(n)), sn(static_cast<size_t>(n));
  std::vector<T> rk(static_cast<size_t>(a.D));
  for (int64_t t = 0; t < a.T; ++t) {
    int64_t blk, off, pos;
    const bool dest = kv_dest(a, t, blk, off, pos);
    if (!dest && !a.k_out) continue;
    if (a.rope_rd > 0) {
      const float p = float(kv_rope_pos(a, t, pos));
      for (int i = 0; i < n; ++i) {
        const double ang = double(p * a.inv_freq[i]);  // fp32 product, as on the GPU
        cs[i] = std::cos(ang) * double(a.rope_mscale);
        sn[i] = std::sin(ang) * double(a.rope_mscale);
      }
    }
    for (int h = 0; h < a.hkv; ++h) {
      const T* k = static_cast<const T*>(a.k) + t * a.k_ts + h * a.k_hs;
      const T* v = static_cast<const T*>(a.v) + t * a.v_ts + h * a.v_hs;
      if (a.rope_rd > 0) {
        rotate_row(a, k, rk.data(), cs, sn);
        k = rk.data();
        if (a.k_out) {
          T* ko = static_cast<T*>(a.k_out) + t * a.ko_ts + h * a.ko_hs;
          for (int i = 0; i < a.D; ++i) ko[i] = rk[size_t(i)];
        }
      }
      if (!dest) continue;
      const int64_t dst = ((blk * a.bs + off) * a.hkv + h) * a.D;
      C* kc = static_cast<C*>(a.kc) + dst;
      C* vc = static_cast<C*>(a.vc) + dst;
      for (int i = 0; i < a.D; ++i) {
        kc[i] = to_cache<T, C>(k[i], a.k_scale, h);
        vc[i] = to_cache<T, C>(v[i], a.v_scale, h);
      }
    }
  }
}
}  // namespace

void kv_append(const KvAppendArgs& a) {
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    if (a.cache_dtype == DType::f8e4m3) run<T, f8e4m3>(a);
    else run<T, T>(a);
  });
}

}  // namespace gk::cpu
