// The math of the reductions, written once for the CPU reference and the CUDA
// kernels. A reducer R<T> has an accumulator type Acc and
//   init()            the identity element,
//   load(v, j)        the accumulator of element v at column j of its row,
//   combine(a, b)     associative and commutative (so any fixed tree gives one answer
//                     for the integer and arg ops, and a fixed answer for float sums),
//   finish<O>(a, n)   the result of a row of n elements.
// Result dtypes (ReduceOut) follow NumPy: sum of bool/int -> int64, mean of
// bool/int -> float32, max/min keep the dtype, argmax/argmin -> int64.
#pragma once
#include <cstdint>
#include <limits>
#include <type_traits>

#include "gpukit/dtype.h"
#include "gpukit/ops.h"

namespace gk::red {

template <class T>
inline constexpr bool is_float_v = std::is_floating_point_v<compute_t<T>>;

template <class C> GK_HD bool is_nan(C x) {
  if constexpr (std::is_floating_point_v<C>) return x != x;
  else return false;
}

template <class C> GK_HD C lowest() {
  if constexpr (std::is_floating_point_v<C>) return -std::numeric_limits<C>::infinity();
  else return std::numeric_limits<C>::lowest();
}
template <class C> GK_HD C highest() {
  if constexpr (std::is_floating_point_v<C>) return std::numeric_limits<C>::infinity();
  else return std::numeric_limits<C>::max();
}

// Sum and mean: float types accumulate in their compute type (fp32 for the
// narrow floats, f64 for f64); bool and integers in int64 (wrapping).
template <class T, bool MEAN>
struct SumR {
  using C = compute_t<T>;
  using Acc = std::conditional_t<std::is_floating_point_v<C>, C, int64_t>;
  using Out = std::conditional_t<is_float_v<T>, T, std::conditional_t<MEAN, float, int64_t>>;
  GK_HD static Acc init() { return Acc(0); }
  GK_HD static Acc load(T v, int64_t) { return Acc(C(v)); }
  GK_HD static Acc combine(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<Acc>) return a + b;
    else return Acc(uint64_t(a) + uint64_t(b));
  }
  GK_HD static Out finish(Acc a, int64_t n) {
    if constexpr (!MEAN) return convert<Out>(a);
    else if constexpr (std::is_floating_point_v<Acc>) return convert<Out>(Acc(a / Acc(n)));
    else return convert<Out>(float(double(a) / double(n)));
  }
};

// Max and min: NaN propagates (the first NaN met in the fixed order wins).
template <class T, bool MAX>
struct MaxR {
  using C = compute_t<T>;
  using Acc = C;
  using Out = T;
  GK_HD static Acc init() { return MAX ? lowest<C>() : highest<C>(); }
  GK_HD static Acc load(T v, int64_t) { return C(v); }
  GK_HD static Acc combine(Acc a, Acc b) {
    if (is_nan(a)) return a;
    if (is_nan(b)) return b;
    if constexpr (MAX) return a < b ? b : a;
    else return b < a ? b : a;
  }
  GK_HD static Out finish(Acc a, int64_t) { return convert<Out>(a); }
};

template <class C>
struct ArgAcc {
  C v;
  int64_t i;
};

// Argmax and argmin: a total order (NaN first, then the larger/smaller value,
// then the lower index), so ties go to the lowest index and the index of the
// first NaN is returned when there is one, whatever the combination tree.
template <class T, bool MAX>
struct ArgR {
  using C = compute_t<T>;
  using Acc = ArgAcc<C>;
  using Out = int64_t;
  GK_HD static Acc init() { return {MAX ? lowest<C>() : highest<C>(), std::numeric_limits<int64_t>::max()}; }
  GK_HD static Acc load(T v, int64_t j) { return {C(v), j}; }
  GK_HD static Acc combine(Acc a, Acc b) {
    bool an = is_nan(a.v), bn = is_nan(b.v);
    if (an || bn) {
      if (an && bn) return a.i <= b.i ? a : b;
      return an ? a : b;
    }
    if (a.v == b.v) return a.i <= b.i ? a : b;
    if constexpr (MAX) return a.v > b.v ? a : b;
    else return a.v < b.v ? a : b;
  }
  GK_HD static Out finish(Acc a, int64_t) { return a.i; }
};

template <ReduceOp OP, class T>
struct ReducerFor;
template <class T> struct ReducerFor<ReduceOp::Sum, T> { using type = SumR<T, false>; };
template <class T> struct ReducerFor<ReduceOp::Mean, T> { using type = SumR<T, true>; };
template <class T> struct ReducerFor<ReduceOp::Max, T> { using type = MaxR<T, true>; };
template <class T> struct ReducerFor<ReduceOp::Min, T> { using type = MaxR<T, false>; };
template <class T> struct ReducerFor<ReduceOp::Argmax, T> { using type = ArgR<T, true>; };
template <class T> struct ReducerFor<ReduceOp::Argmin, T> { using type = ArgR<T, false>; };
template <ReduceOp OP, class T>
using reducer_t = typename ReducerFor<OP, T>::type;

// Result dtype of a reduction of a `t` array.
inline DType reduce_out_dtype(ReduceOp op, DType t) {
  switch (op) {
    case ReduceOp::Sum: return is_floating(t) ? t : DType::i64;
    case ReduceOp::Mean: return is_floating(t) ? t : DType::f32;
    case ReduceOp::Max: case ReduceOp::Min: return t;
    case ReduceOp::Argmax: case ReduceOp::Argmin: return DType::i64;
  }
  return t;
}

// Calls f(std::integral_constant<ReduceOp, op>{}).
template <class F>
decltype(auto) dispatch_reduce(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::Sum: return f(std::integral_constant<ReduceOp, ReduceOp::Sum>{});
    case ReduceOp::Mean: return f(std::integral_constant<ReduceOp, ReduceOp::Mean>{});
    case ReduceOp::Max: return f(std::integral_constant<ReduceOp, ReduceOp::Max>{});
    case ReduceOp::Min: return f(std::integral_constant<ReduceOp, ReduceOp::Min>{});
    case ReduceOp::Argmax: return f(std::integral_constant<ReduceOp, ReduceOp::Argmax>{});
    case ReduceOp::Argmin: return f(std::integral_constant<ReduceOp, ReduceOp::Argmin>{});
  }
  return f(std::integral_constant<ReduceOp, ReduceOp::Sum>{});
}

}  // namespace gk::red
