// The math of every elementwise op, written once for the CPU reference and the
// CUDA kernels. C is the compute type (float, double or an integer type).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "gpukit/numeric.h"
#include "gpukit/ops.h"

namespace gk::ew {

#if defined(__CUDA_ARCH__)
#define GK_M(fn) ::fn
#else
#define GK_M(fn) std::fn
#endif

template <class C> GK_HD bool is_nan(C x) {
  if constexpr (std::is_floating_point_v<C>) return x != x;
  else return false;
}

template <class C> GK_HD C ipow(C base, C e) {
  if (e < 0) {
    if (base == C(1)) return C(1);
    if (base == C(-1)) return (e & 1) ? C(-1) : C(1);
    return C(0);
  }
  C r = 1;
  while (e) {
    if (e & 1) r = C(r * base);
    base = C(base * base);
    e >>= 1;
  }
  return r;
}

template <BinaryOp OP, class C> GK_HD auto binary(C a, C b) {
  if constexpr (OP == BinaryOp::Add) return C(a + b);
  else if constexpr (OP == BinaryOp::Sub) return C(a - b);
  else if constexpr (OP == BinaryOp::Mul) return C(a * b);
  else if constexpr (OP == BinaryOp::Div) {
    if constexpr (std::is_floating_point_v<C>) return C(a / b);
    else return C(b == 0 ? 0 : a / b);  // integer division only reaches here for floor-free callers
  } else if constexpr (OP == BinaryOp::Pow) {
    if constexpr (std::is_floating_point_v<C>) return C(GK_M(pow)(a, b));
    else if constexpr (std::is_same_v<C, bool>) return bool(a || !b);
    else return ipow<C>(a, b);
  } else if constexpr (OP == BinaryOp::Maximum) {
    if (is_nan(a) || is_nan(b)) return C(a + b);
    return a > b ? a : b;
  } else if constexpr (OP == BinaryOp::Minimum) {
    if (is_nan(a) || is_nan(b)) return C(a + b);
    return a < b ? a : b;
  } else if constexpr (OP == BinaryOp::Eq) return a == b;
  else if constexpr (OP == BinaryOp::Ne) return a != b;
  else if constexpr (OP == BinaryOp::Lt) return a < b;
  else if constexpr (OP == BinaryOp::Le) return a <= b;
  else if constexpr (OP == BinaryOp::Gt) return a > b;
  else if constexpr (OP == BinaryOp::Ge) return a >= b;
  else if constexpr (OP == BinaryOp::LogicalAnd) return bool(a) && bool(b);
  else return bool(a) || bool(b);
}

template <UnaryOp OP, class C> GK_HD auto unary(C x) {
  if constexpr (OP == UnaryOp::Neg) return C(-x);
  else if constexpr (OP == UnaryOp::Abs) {
    if constexpr (std::is_unsigned_v<C> || std::is_same_v<C, bool>) return x;
    else return x < C(0) ? C(-x) : (x == C(0) ? C(0) : x);
  } else if constexpr (OP == UnaryOp::Relu) {
    if (is_nan(x)) return x;
    return x > C(0) ? x : C(0);
  } else if constexpr (OP == UnaryOp::LogicalNot) return !bool(x);
  else if constexpr (OP == UnaryOp::Exp) return C(GK_M(exp)(x));
  else if constexpr (OP == UnaryOp::Log) return C(GK_M(log)(x));
  else if constexpr (OP == UnaryOp::Sqrt) return C(GK_M(sqrt)(x));
  else if constexpr (OP == UnaryOp::Rsqrt) return C(C(1) / GK_M(sqrt)(x));
  else if constexpr (OP == UnaryOp::Sin) return C(GK_M(sin)(x));
  else if constexpr (OP == UnaryOp::Cos) return C(GK_M(cos)(x));
  else if constexpr (OP == UnaryOp::Tanh) return C(GK_M(tanh)(x));
  else if constexpr (OP == UnaryOp::Sigmoid) return C(C(1) / (C(1) + GK_M(exp)(-x)));
  else if constexpr (OP == UnaryOp::Silu) return C(x / (C(1) + GK_M(exp)(-x)));
  else if constexpr (OP == UnaryOp::GeluErf) return C(C(0.5) * x * (C(1) + GK_M(erf)(x * C(0.70710678118654752440))));
  else {
    C inner = C(0.79788456080286535588) * (x + C(0.044715) * x * x * x);
    return C(C(0.5) * x * (C(1) + GK_M(tanh)(inner)));
  }
}

// Whether a unary op needs a floating input (integers are converted first).
constexpr bool unary_needs_float(UnaryOp op) {
  return !(op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::LogicalNot);
}

template <class C> GK_HD C clamp(C x, bool has_lo, C lo, bool has_hi, C hi) {
  if (is_nan(x)) return x;
  if (has_lo && x < lo) x = lo;
  if (has_hi && x > hi) x = hi;
  return x;
}

#undef GK_M
}  // namespace gk::ew
