// CPU reference of rms_norm (with the fused residual add) and layer_norm:
// plain loops in double precision; outputs rounded once to the storage type.
#include <cmath>
#include <vector>

#include "ops/nn_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("rms_norm", "rms_norm_residual", "layer_norm");

namespace {
template <class T>
void norm_t(const NormArgs& a) {
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  std::vector<double> row(size_t(a.H));
  for (int64_t r = 0; r < a.rows; ++r) {
    const T* x = static_cast<const T*>(a.x) + r * a.x_rs;
    T* out = static_cast<T*>(a.out) + r * a.out_rs;
    if (a.res) {
      // The new residual is rounded to T, and the normalization sees the rounded value.
      const T* res = static_cast<const T*>(a.res) + r * a.res_rs;
      T* ro = static_cast<T*>(a.res_out) + r * a.res_out_rs;
      for (int64_t i = 0; i < a.H; ++i) {
        T v = convert<T>(float(convert<float>(x[i])) + float(convert<float>(res[i])));
        ro[i] = v;
        row[i] = double(convert<float>(v));
      }
    } else {
      for (int64_t i = 0; i < a.H; ++i) row[i] = double(convert<float>(x[i]));
    }
    if (a.layer) {
      double mean = 0;
      for (int64_t i = 0; i < a.H; ++i) mean += row[i];
      mean /= double(a.H);
      double var = 0;
      for (int64_t i = 0; i < a.H; ++i) var += (row[i] - mean) * (row[i] - mean);
      var /= double(a.H);
      double inv = 1.0 / std::sqrt(var + a.eps);
      for (int64_t i = 0; i < a.H; ++i) {
        double y = (row[i] - mean) * inv * double(convert<float>(w[i]));
        if (b) y += double(convert<float>(b[i]));
        out[i] = convert<T>(float(y));
      }
    } else {
      double ss = 0;
      for (int64_t i = 0; i < a.H; ++i) ss += row[i] * row[i];
      double inv = 1.0 / std::sqrt(ss / double(a.H) + a.eps);
      for (int64_t i = 0; i < a.H; ++i) {
        double wi = double(convert<float>(w[i]));
        if (a.gemma) wi += 1.0;
        out[i] = convert<T>(float(row[i] * inv * wi));
      }
    }
  }
}
}  // namespace

void norm(const NormArgs& a) {
  switch (a.dtype) {
    case DType::f32: return norm_t<float>(a);
    case DType::f16: return norm_t<f16>(a);
    case DType::bf16: return norm_t<bf16>(a);
    default: throw TypeError("norm: unsupported dtype");
  }
}

}  // namespace gk::cpu
