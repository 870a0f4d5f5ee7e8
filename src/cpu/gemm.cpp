// CPU reference of the epilogue pass of linear / gate_up_swiglu (see EpilogueArgs
// in ops/backend.h): the GEMM itself is cpu::matmul writing an fp32 (fp64)
// accumulator; this applies bias, activation, residual or SwiGLU in that
// precision and rounds once.
#include <cmath>

#include "ops/backend.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("linear", "gate_up_swiglu", "int8_linear", "fp8_linear");

namespace {

template <class A>
A act_fn(A v, int act) {
  if (act == 1) return A(0.5) * v * (A(1) + std::erf(v * A(0.70710678118654752440)));
  if (act == 2) return A(0.5) * v * (A(1) + std::tanh(A(0.79788456080286535588) * (v + A(0.044715) * v * v * v)));
  if (act == 3) return v / (A(1) + std::exp(-v));
  return v;
}

template <class A, class O>
void epilogue_t(const EpilogueArgs& p) {
  const A* acc = static_cast<const A*>(p.acc);
  const O* bias = static_cast<const O*>(p.bias);
  const O* res = static_cast<const O*>(p.res);
  O* out = static_cast<O*>(p.out);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      A v;
      if (p.swiglu) {
        v = act_fn<A>(acc[i * 2 * p.n + j], 3) * acc[i * 2 * p.n + p.n + j];
      } else {
        v = acc[i * p.n + j];
        if (bias) v += A(bias[j]);
        v = act_fn<A>(v, p.act);
        if (res) v += A(res[i * p.n + j]);
      }
      out[i * p.n + j] = convert<O>(v);
    }
}

}  // namespace

void gemm_epilogue(const EpilogueArgs& a) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.acc_dtype == DType::f64) {
    if (a.out_dtype != DType::f64) throw ValueError("gemm_epilogue: float64 accumulators need a float64 output");
    return epilogue_t<double, double>(a);
  }
  switch (a.out_dtype) {
    case DType::f32: return epilogue_t<float, float>(a);
    case DType::f16: return epilogue_t<float, f16>(a);
    case DType::bf16: return epilogue_t<float, bf16>(a);
    default: throw ValueError(cat("gemm_epilogue: unsupported output dtype ", dtype_name(a.out_dtype)));
  }
}

void matmul_i8(const MatmulArgs& p) {
  const int8_t* A = static_cast<const int8_t*>(p.a);
  const int8_t* B = static_cast<const int8_t*>(p.b);
  int32_t* C = static_cast<int32_t*>(p.c);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      int64_t acc = 0;  // exact; the front end bounds k so that the int32 result cannot overflow
      for (int64_t kk = 0; kk < p.k; ++kk) acc += int64_t(A[i * p.a_rs + kk * p.a_cs]) * B[kk * p.b_rs + j * p.b_cs];
      C[i * p.c_rs + j] = int32_t(acc);
    }
}

namespace {
template <class A, class O>
void int8_epilogue_t(const Int8EpilogueArgs& p) {
  const A* acc = static_cast<const A*>(p.acc);
  const O* bias = static_cast<const O*>(p.bias);
  O* out = static_cast<O*>(p.out);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      float v = float(acc[i * p.n + j]) * p.xs[i] * p.ws[j];
      if (bias) v += float(bias[j]);
      out[i * p.n + j] = convert<O>(v);
    }
}
}  // namespace

template <class A>
void int8_epilogue_acc(const Int8EpilogueArgs& a) {
  switch (a.out_dtype) {
    case DType::f32: return int8_epilogue_t<A, float>(a);
    case DType::f16: return int8_epilogue_t<A, f16>(a);
    case DType::bf16: return int8_epilogue_t<A, bf16>(a);
    default: throw TypeError(cat("int8_linear: unsupported output dtype ", dtype_name(a.out_dtype)));
  }
}

void int8_epilogue(const Int8EpilogueArgs& a) {
  switch (a.acc_dtype) {
    case DType::i32: return int8_epilogue_acc<int32_t>(a);
    case DType::f32: return int8_epilogue_acc<float>(a);
    default: throw TypeError(cat("int8_linear: unsupported output dtype ", dtype_name(a.out_dtype)));
  }
}

}  // namespace gk::cpu
