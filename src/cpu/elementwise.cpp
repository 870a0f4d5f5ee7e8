// CPU reference kernels of the elementwise ops.
#include "cpu/ew_loop.h"
#include "ops/backend.h"
#include "ops/ew_dispatch.h"
#include "ops/ew_functors.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("copy", "fill", "arange", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne",
                    "lt", "le", "gt", "ge", "logical_and", "logical_or", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
                    "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "logical_not", "where",
                    "clamp");

void copy(const EwArgs& a) {
  dispatch_dtype(a.out_dtype, [&](auto o) {
    using O = decltype(o);
    dispatch_dtype(a.in_dtype, [&](auto i) {
      using I = decltype(i);
      O* out = static_cast<O*>(a.ptr[0]);
      const I* in = static_cast<const I*>(a.ptr[1]);
      for_each_offset(a, [&](const int64_t* off) { out[off[0]] = convert<O>(in[off[1]]); });
    });
  });
}

void fill(const EwArgs& a) {
  dispatch_dtype(a.out_dtype, [&](auto o) {
    using O = decltype(o);
    O v = a.in_dtype == DType::f64 ? convert<O>(a.scalar_f) : convert<O>(a.scalar_i);
    O* out = static_cast<O*>(a.ptr[0]);
    for_each_offset(a, [&](const int64_t* off) { out[off[0]] = v; });
  });
}

void arange(const EwArgs& a, double start, double step) {
  dispatch_dtype(a.out_dtype, [&](auto o) {
    using O = decltype(o);
    O* out = static_cast<O*>(a.ptr[0]);
    int64_t stride = a.ndim ? a.strides[0][0] : 1;
    for (int64_t i = 0; i < a.numel; ++i) out[i * stride] = convert<O>(start + double(i) * step);
  });
}

namespace {
template <BinaryOp OP, class T>
void binary_t(const EwArgs& a) {
  using C = compute_t<T>;
  using R = std::conditional_t<(OP >= BinaryOp::Eq), bool, T>;
  R* out = static_cast<R*>(a.ptr[0]);
  const T* x = static_cast<const T*>(a.ptr[1]);
  const T* y = static_cast<const T*>(a.ptr[2]);
  C sv = a.scalar_slot > 0 ? C(convert<T>(scalar_as<C>(a))) : C(0);  // rounded to T like an array value
  for_each_offset(a, [&](const int64_t* off) {
    C u = a.scalar_slot == 1 ? sv : C(x[off[1]]);
    C v = a.scalar_slot == 2 ? sv : C(y[off[2]]);
    out[off[0]] = convert<R>(ew::binary<OP, C>(u, v));
  });
}

template <UnaryOp OP, class T>
void unary_t(const EwArgs& a) {
  using C = compute_t<T>;
  using R = std::conditional_t<OP == UnaryOp::LogicalNot, bool, T>;
  R* out = static_cast<R*>(a.ptr[0]);
  const T* x = static_cast<const T*>(a.ptr[1]);
  for_each_offset(a, [&](const int64_t* off) { out[off[0]] = convert<R>(ew::unary<OP, C>(C(x[off[1]]))); });
}

template <class T>
constexpr bool float_or_int_only = !std::is_same_v<T, bool>;
}  // namespace

void binary(BinaryOp op, const EwArgs& a) {
  ew::dispatch_binary(op, a.in_dtype, [&]<BinaryOp OP, class T>() { binary_t<OP, T>(a); });
}

void unary(UnaryOp op, const EwArgs& a) {
  ew::dispatch_unary(op, a.in_dtype, [&]<UnaryOp OP, class T>() { unary_t<OP, T>(a); });
}

void where(const EwArgs& a) {
  dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    T* out = static_cast<T*>(a.ptr[0]);
    const bool* c = static_cast<const bool*>(a.ptr[1]);
    const T* x = static_cast<const T*>(a.ptr[2]);
    const T* y = static_cast<const T*>(a.ptr[3]);
    for_each_offset(a, [&](const int64_t* off) { out[off[0]] = c[off[1]] ? x[off[2]] : y[off[3]]; });
  });
}

void clamp(const EwArgs& a, bool has_lo, double lo, bool has_hi, double hi) {
  dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    T* out = static_cast<T*>(a.ptr[0]);
    const T* x = static_cast<const T*>(a.ptr[1]);
    C l = C(convert<T>(lo)), h = C(convert<T>(hi));
    for_each_offset(a, [&](const int64_t* off) {
      out[off[0]] = convert<T>(ew::clamp<C>(C(x[off[1]]), has_lo, l, has_hi, h));
    });
  });
}

}  // namespace gk::cpu
