// Strided iteration over an EwArgs block for the CPU backend.
#pragma once
#include "ops/ew_args.h"

namespace gk::cpu {

// Calls f(i, off) for every element, where off[k] is operand k's element offset.
template <class F>
void for_each_offset(const EwArgs& a, F&& f) {
  int64_t off[kMaxOperands] = {};
  if (a.contiguous) {
    for (int64_t i = 0; i < a.numel; ++i) {
      for (int k = 0; k < a.nops; ++k) off[k] = i;
      f(off);
    }
    return;
  }
  int64_t idx[kMaxDims] = {};
  int nd = a.ndim;
  for (int64_t i = 0; i < a.numel; ++i) {
    f(off);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < a.shape[d]) {
        for (int k = 0; k < a.nops; ++k) off[k] += a.strides[k][d];
        break;
      }
      for (int k = 0; k < a.nops; ++k) off[k] -= a.strides[k][d] * (a.shape[d] - 1);
      idx[d] = 0;
    }
  }
}

template <class C>
C scalar_as(const EwArgs& a) {
  if (is_floating(a.in_dtype) || a.in_dtype == DType::f64) {
    if constexpr (std::is_floating_point_v<C>) return C(a.scalar_f);
  }
  if constexpr (std::is_floating_point_v<C>) return C(a.scalar_f);
  else return C(a.scalar_i);
}

}  // namespace gk::cpu
