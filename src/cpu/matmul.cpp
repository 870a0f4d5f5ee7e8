// CPU reference kernel of matmul: blocked loops with fp32 accumulation (f64 for
// float64). B is converted once per batch to a dense [k, n] buffer of the
// accumulation type; blocks of A rows are converted the same way; each output
// element is the sum over k in increasing order, so the result is the same on
// every run. The result is rounded once to out_dtype.
#include <algorithm>
#include <vector>

#include "ops/backend.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("matmul");

namespace {

constexpr int64_t kRowBlock = 32;
constexpr int64_t kKBlock = 256;

template <class T, class O>
void matmul_t(const MatmulArgs& p) {
  using C = compute_t<T>;
  const T* A = static_cast<const T*>(p.a);
  const T* B = static_cast<const T*>(p.b);
  O* Cm = static_cast<O*>(p.c);
  const int64_t m = p.m, n = p.n, k = p.k;
  std::vector<C> bp(size_t(k * n)), ap(size_t(kRowBlock * std::max<int64_t>(k, 1))), acc(size_t(kRowBlock * n));
  int64_t idx[kMaxDims] = {};
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    int64_t aoff = 0, boff = 0;
    for (int d = 0; d < p.batch_ndim; ++d) {
      aoff += idx[d] * p.a_batch_strides[d];
      boff += idx[d] * p.b_batch_strides[d];
    }
    const T* a = A + aoff;
    const T* b = B + boff;
    O* c = Cm + bi * m * n;
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t j = 0; j < n; ++j) bp[size_t(kk * n + j)] = C(b[kk * p.b_rs + j * p.b_cs]);
    for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
      int64_t mb = std::min(kRowBlock, m - i0);
      for (int64_t i = 0; i < mb; ++i)
        for (int64_t kk = 0; kk < k; ++kk) ap[size_t(i * k + kk)] = C(a[(i0 + i) * p.a_rs + kk * p.a_cs]);
      std::fill(acc.begin(), acc.begin() + mb * n, C(0));
      for (int64_t k0 = 0; k0 < k; k0 += kKBlock) {
        int64_t kend = std::min(k, k0 + kKBlock);
        for (int64_t i = 0; i < mb; ++i) {
          C* crow = acc.data() + i * n;
          const C* arow = ap.data() + i * k;
          for (int64_t kk = k0; kk < kend; ++kk) {
            const C av = arow[kk];
            const C* brow = bp.data() + kk * n;
            for (int64_t j = 0; j < n; ++j) crow[j] += av * brow[j];
          }
        }
      }
      for (int64_t i = 0; i < mb; ++i)
        for (int64_t j = 0; j < n; ++j)
          c[(i0 + i) * p.c_rs + j * p.c_cs] = convert<O>(acc[size_t(i * n + j)]);
    }
    for (int d = p.batch_ndim - 1; d >= 0; --d) {
      if (++idx[d] < p.batch_shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

template <class T>
void dispatch_out(const MatmulArgs& a) {
  switch (a.out_dtype) {
    case DType::f32: return matmul_t<T, float>(a);
    case DType::f16: return matmul_t<T, f16>(a);
    case DType::bf16: return matmul_t<T, bf16>(a);
    case DType::f64: return matmul_t<T, double>(a);
    default: throw TypeError(cat("matmul: unsupported output dtype ", dtype_name(a.out_dtype)));
  }
}

void matmul(const MatmulArgs& a) {
  if (a.batch <= 0 || a.m <= 0 || a.n <= 0) return;
  switch (a.dtype) {
    case DType::f32: return dispatch_out<float>(a);
    case DType::f64: return dispatch_out<double>(a);
    case DType::f16: return dispatch_out<f16>(a);
    case DType::bf16: return dispatch_out<bf16>(a);
    default: throw TypeError(cat("matmul: unsupported dtype ", dtype_name(a.dtype)));
  }
}

}  // namespace gk::cpu
