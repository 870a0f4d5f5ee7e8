// CPU reference kernels of the row reductions and of softmax/log_softmax.
// Each row is reduced pairwise: blocks of up to 256 elements go into 8
// interleaved lanes that are then combined in a fixed tree, and longer ranges
// are split in halves recursively. The order is fixed, so the result is the
// same on every run, and the error of a float sum grows like log(n).
#include <cmath>

#include "ops/backend.h"
#include "ops/reduce_functors.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("sum", "mean", "max", "min", "argmax", "argmin", "softmax", "log_softmax");

namespace {

constexpr int64_t kLeaf = 256;

// Pairwise reduction of n accumulators produced by get(j), j in [begin, begin+n).
template <class Acc, class Get, class Comb>
Acc pairwise(int64_t begin, int64_t n, Acc ident, const Get& get, const Comb& comb) {
  if (n <= kLeaf) {
    Acc l[8] = {ident, ident, ident, ident, ident, ident, ident, ident};
    // (A hand-unrolled form of this loop is miscompiled by GCC 12 at -O3 for
    // int8 -> int64 sums; keep the plain form.)
    for (int64_t j = 0; j < n; ++j) l[j & 7] = comb(l[j & 7], get(begin + j));
    return comb(comb(comb(l[0], l[1]), comb(l[2], l[3])), comb(comb(l[4], l[5]), comb(l[6], l[7])));
  }
  int64_t h = (n / 2 + kLeaf - 1) / kLeaf * kLeaf;
  return comb(pairwise(begin, h, ident, get, comb), pairwise(begin + h, n - h, ident, get, comb));
}

template <ReduceOp OP, class T>
void reduce_t(const RowArgs& a) {
  using R = red::reducer_t<OP, T>;
  using Acc = typename R::Acc;
  using O = typename R::Out;
  if (dtype_of<O>::value != a.out_dtype) throw ValueError("reduce_rows: output dtype does not match the op");
  const T* in = static_cast<const T*>(a.in);
  O* out = static_cast<O*>(a.out);
  auto comb = [](Acc x, Acc y) { return R::combine(x, y); };
  for (int64_t r = 0; r < a.rows; ++r) {
    const T* row = in + r * a.in_row_stride;
    Acc acc = pairwise(0, a.cols, R::init(), [&](int64_t j) { return R::load(row[j], j); }, comb);
    out[r * a.out_row_stride] = R::finish(acc, a.cols);
  }
}

template <class T>
void softmax_t(const RowArgs& a, bool log) {
  using C = compute_t<T>;
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  auto cmax = [](C x, C y) { return red::MaxR<C, true>::combine(x, y); };
  auto cadd = [](C x, C y) { return C(x + y); };
  for (int64_t r = 0; r < a.rows; ++r) {
    const T* x = in + r * a.in_row_stride;
    T* y = out + r * a.out_row_stride;
    C m = pairwise(0, a.cols, red::lowest<C>(), [&](int64_t j) { return C(x[j]); }, cmax);
    C s = pairwise(0, a.cols, C(0), [&](int64_t j) { return C(std::exp(C(x[j]) - m)); }, cadd);
    if (log) {
      C ls = std::log(s);
      for (int64_t j = 0; j < a.cols; ++j) y[j] = convert<T>(C(C(x[j]) - m) - ls);
    } else {
      for (int64_t j = 0; j < a.cols; ++j) y[j] = convert<T>(C(std::exp(C(x[j]) - m) / s));
    }
  }
}

}  // namespace

void reduce_rows(ReduceOp op, const RowArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    red::dispatch_reduce(op, [&](auto o) { reduce_t<decltype(o)::value, T>(a); });
  });
}

void softmax_rows(const RowArgs& a, bool log) {
  if (a.rows <= 0 || a.cols <= 0) return;
  dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (red::is_float_v<T>) softmax_t<T>(a, log);
    else throw TypeError("x: softmax needs a floating-point array");
  });
}

}  // namespace gk::cpu
