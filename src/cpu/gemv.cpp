// CPU reference of the decode GEMV: y[m, j] = sum over k in increasing order of
// float(x[m, k]) * float(w[j, k]) in fp32, rounded once to the output dtype.
#include "ops/backend.h"
#include "ops/gemv_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("gemv");

namespace {

template <class T, class O>
void gemv_t(const GemvArgs& p) {
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  O* y = static_cast<O*>(p.y);
  for (int64_t mi = 0; mi < p.m; ++mi)
    for (int64_t j = 0; j < p.n; ++j) {
      const T* xr = x + mi * p.x_rs;
      const T* wr = w + j * p.w_rs;
      float acc = 0.0f;
      for (int64_t kk = 0; kk < p.k; ++kk) acc += float(xr[kk]) * float(wr[kk]);
      y[mi * p.n + j] = convert<O>(acc);
    }
}

template <class T>
void by_out(const GemvArgs& p) {
  switch (p.out_dtype) {
    case DType::f32: return gemv_t<T, float>(p);
    case DType::f16: return gemv_t<T, f16>(p);
    case DType::bf16: return gemv_t<T, bf16>(p);
    default: throw TypeError(cat("gemv: unsupported output dtype ", dtype_name(p.out_dtype)));
  }
}

}  // namespace

void gemv(const GemvArgs& a) {
  if (a.m <= 0 || a.n <= 0) return;
  switch (a.dtype) {
    case DType::f16: return by_out<f16>(a);
    case DType::bf16: return by_out<bf16>(a);
    default: throw TypeError(cat("gemv: unsupported weight dtype ", dtype_name(a.dtype)));
  }
}

}  // namespace gk::cpu
