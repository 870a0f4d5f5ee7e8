// The runtime op -> template switch of the elementwise ops, shared by the CPU reference
// (src/cpu/elementwise.cpp) and the CUDA kernels (src/cuda/unary.cu, binary.cu), so both
// backends instantiate the same (op, dtype) set: f.template operator()<OP, T>() with T the
// input's storage type.
#pragma once
#include <type_traits>

#include "gpukit/dtype.h"
#include "gpukit/errors.h"
#include "gpukit/numeric.h"
#include "gpukit/ops.h"

namespace gk::ew {

#define GK_EW_CASE(ENUM, OP) \
  case ENUM::OP: return f.template operator()<ENUM::OP, T>();

// Every binary op on every dtype.
template <class F>
void dispatch_binary(BinaryOp op, DType dt, F&& f) {
  dispatch_dtype(dt, [&](auto t) {
    using T = decltype(t);
    switch (op) {
      GK_EW_CASE(BinaryOp, Add) GK_EW_CASE(BinaryOp, Sub) GK_EW_CASE(BinaryOp, Mul) GK_EW_CASE(BinaryOp, Div)
      GK_EW_CASE(BinaryOp, Pow) GK_EW_CASE(BinaryOp, Maximum) GK_EW_CASE(BinaryOp, Minimum)
      GK_EW_CASE(BinaryOp, Eq) GK_EW_CASE(BinaryOp, Ne) GK_EW_CASE(BinaryOp, Lt) GK_EW_CASE(BinaryOp, Le)
      GK_EW_CASE(BinaryOp, Gt) GK_EW_CASE(BinaryOp, Ge) GK_EW_CASE(BinaryOp, LogicalAnd)
      GK_EW_CASE(BinaryOp, LogicalOr)
    }
  });
}

// Every unary op on floating-point dtypes; Neg, Abs, Relu and LogicalNot on the others
// (TypeError for the rest).
template <class F>
void dispatch_unary(UnaryOp op, DType dt, F&& f) {
  dispatch_dtype(dt, [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      switch (op) {
        GK_EW_CASE(UnaryOp, Neg) GK_EW_CASE(UnaryOp, Abs) GK_EW_CASE(UnaryOp, Exp) GK_EW_CASE(UnaryOp, Log)
        GK_EW_CASE(UnaryOp, Sqrt) GK_EW_CASE(UnaryOp, Rsqrt) GK_EW_CASE(UnaryOp, Sin) GK_EW_CASE(UnaryOp, Cos)
        GK_EW_CASE(UnaryOp, Tanh) GK_EW_CASE(UnaryOp, Sigmoid) GK_EW_CASE(UnaryOp, Relu)
        GK_EW_CASE(UnaryOp, GeluErf) GK_EW_CASE(UnaryOp, GeluTanh) GK_EW_CASE(UnaryOp, Silu)
        GK_EW_CASE(UnaryOp, LogicalNot)
      }
    } else {
      switch (op) {
        GK_EW_CASE(UnaryOp, Neg) GK_EW_CASE(UnaryOp, Abs) GK_EW_CASE(UnaryOp, Relu) GK_EW_CASE(UnaryOp, LogicalNot)
        default: throw TypeError(cat("x: ", op_name(op), " needs a floating-point input"));
      }
    }
  });
}

#undef GK_EW_CASE

}  // namespace gk::ew
