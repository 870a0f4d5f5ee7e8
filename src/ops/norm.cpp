// Front end of rms_norm (plain, fused with a residual add, Gemma-style) and
// layer_norm: validate, allocate, dispatch.
#include <cmath>

#include "gpukit/nn.h"
#include "ops/common.h"
#include "ops/nn_args.h"

namespace gk {

namespace detail {
void require_half_or_float(const Array& a, const char* arg) {
  DType t = a.dtype();
  if (t != DType::f32 && t != DType::f16 && t != DType::bf16)
    throw TypeError(cat(arg, ": dtype ", dtype_name(t), " is not supported (float32, float16 or bfloat16)"));
}
void require_same_dtype(const Array& a, const char* arg, const Array& ref, const char* ref_arg) {
  if (a.dtype() != ref.dtype())
    throw TypeError(cat(arg, ": dtype ", dtype_name(a.dtype()), " does not match ", ref_arg, " (",
                        dtype_name(ref.dtype()), ")"));
}
Rows as_rows(const Array& x, const Stream& s) {
  Rows r;
  int nd = x.ndim();
  r.H = nd ? x.shape(-1) : 1;
  r.rows = r.H ? x.numel() / r.H : 0;
  if (nd == 0) {
    r.a = x;
    r.rs = 1;
    return r;
  }
  bool ok = r.H == 1 || x.stride(-1) == 1;
  // Leading dimensions must collapse into one row stride.
  int64_t rs = r.H, expect = -1;
  for (int d = nd - 2; d >= 0 && ok; --d) {
    if (x.shape(d) == 1) continue;
    if (expect < 0) {
      rs = x.stride(d);
    } else if (x.stride(d) != expect) {
      ok = false;
    }
    expect = x.stride(d) * x.shape(d);
  }
  if (ok && r.rows > 1 && rs < r.H) ok = false;  // overlapping rows (e.g. broadcast): copy
  if (!ok) {
    r.a = x.contiguous(&s);
    r.rs = r.H;
  } else {
    r.a = x;
    r.rs = rs;
  }
  return r;
}
}  // namespace detail

namespace nn {
namespace {

void check_eps(double eps) {
  if (!std::isfinite(eps) || eps < 0) throw ValueError(cat("eps: must be finite and >= 0, got ", eps));
}

Array check_vec(const Array& v, const char* arg, const Array& x, int64_t H, const Stream& s) {
  detail::require_same_dtype(v, arg, x, "x");
  if (v.ndim() != 1 || v.shape(0) != H)
    throw ValueError(cat(arg, ": shape ", shape_str(v.shape()), " does not match the last dimension of x (", H, ")"));
  return v.contiguous(&s);
}

void run(NormArgs& a, Device d, const Stream& s) {
  if (a.rows == 0 || a.H == 0) return;
  if (d.is_cpu()) return cpu::norm(a);
#if GPUKIT_WITH_CUDA
  cuda::norm(a, s.handle());
#else
  (void)s;
  detail::no_cuda_backend();
#endif
}

// The arguments every norm shares: x as rows, w, a fresh contiguous output of x's shape.
NormArgs base_args(const detail::Rows& x, const Array& w, const Array& out, const Array& x_in, int64_t H,
                   double eps) {
  NormArgs a;
  a.x = x.a.data();
  a.w = w.data();
  a.out = out.data();
  a.rows = x.rows;
  a.H = H;
  a.x_rs = x.rs;
  a.out_rs = H;
  a.dtype = x_in.dtype();
  a.eps = eps;
  return a;
}

std::pair<Array, Array> rms_impl(const Array& x_in, const Array* res_in, const Array& w_in, double eps, bool gemma,
                                 const Stream* sp) {
  Device d = res_in ? detail::common_device({{"x", &x_in}, {"residual", res_in}, {"w", &w_in}})
                    : detail::common_device({{"x", &x_in}, {"w", &w_in}});
  detail::require_half_or_float(x_in, "x");
  if (x_in.ndim() < 1) throw ValueError("x: must have at least one dimension [..., H]");
  check_eps(eps);
  if (res_in) {
    detail::require_same_dtype(*res_in, "residual", x_in, "x");
    if (res_in->shape() != x_in.shape())
      throw ValueError(cat("residual: shape ", shape_str(res_in->shape()), " does not match x ",
                           shape_str(x_in.shape())));
  }
  Stream s = resolve_stream(sp, d);
  int64_t H = x_in.shape(-1);
  Array w = check_vec(w_in, "w", x_in, H, s);
  detail::Rows x = detail::as_rows(x_in, s);
  Array out = Array::empty(x_in.shape(), x_in.dtype(), d, &s);
  NormArgs a = base_args(x, w, out, x_in, H, eps);
  a.gemma = gemma;
  Array res_out;
  detail::Rows r;
  if (res_in) {
    r = detail::as_rows(*res_in, s);
    res_out = Array::empty(x_in.shape(), x_in.dtype(), d, &s);
    a.res = r.a.data();
    a.res_rs = r.rs;
    a.res_out = res_out.data();
    a.res_out_rs = H;
    detail::mark_used(r.a, s);
  }
  detail::mark_used(x.a, s);
  detail::mark_used(w, s);
  run(a, d, s);
  return {out, res_out};
}

}  // namespace

Array rms_norm(const Array& x, const Array& w, double eps, bool gemma, const Stream* s) {
  return rms_impl(x, nullptr, w, eps, gemma, s).first;
}

std::pair<Array, Array> rms_norm_residual(const Array& x, const Array& residual, const Array& w, double eps,
                                          bool gemma, const Stream* s) {
  detail::require_defined(residual, "residual");
  return rms_impl(x, &residual, w, eps, gemma, s);
}

Array layer_norm(const Array& x_in, const Array& w_in, const Array& b_in, double eps, const Stream* sp) {
  Device d = b_in.defined() ? detail::common_device({{"x", &x_in}, {"w", &w_in}, {"b", &b_in}})
                            : detail::common_device({{"x", &x_in}, {"w", &w_in}});
  detail::require_half_or_float(x_in, "x");
  if (x_in.ndim() < 1) throw ValueError("x: must have at least one dimension [..., H]");
  check_eps(eps);
  Stream s = resolve_stream(sp, d);
  int64_t H = x_in.shape(-1);
  Array w = check_vec(w_in, "w", x_in, H, s);
  Array b = b_in.defined() ? check_vec(b_in, "b", x_in, H, s) : Array();
  detail::Rows x = detail::as_rows(x_in, s);
  Array out = Array::empty(x_in.shape(), x_in.dtype(), d, &s);
  NormArgs a = base_args(x, w, out, x_in, H, eps);
  a.b = b.defined() ? b.data() : nullptr;
  a.layer = true;
  detail::mark_used(x.a, s);
  detail::mark_used(w, s);
  if (b.defined()) detail::mark_used(b, s);
  run(a, d, s);
  return out;
}

}  // namespace nn
}  // namespace gk
