// CPU reference kernel of matmul: blocked loops with fp32 accumulation (f64 for
// float64). B is converted once per batch to a dense [k, n] buffer of the
// accumulation type; blocks of A rows are converted the same way; each output
// element is the sum over k in increasing order, so the result is the same on
// every run. The result is rounded once to out_dtype. Fast path (float32/float16/bfloat16, A rows and B columns both dense along k: the
// "x @ W.T" of linear layers): each output is a dot product of two contiguous
// vectors, summed in 8 interleaved partial sums (lane l takes k = l, l + 8, ...;
// the tail goes to lane 0..) combined in a fixed order; B is read once per
// 4-column block for all rows of A. Deterministic, but not bitwise equal to the
// general path. On x86-64 CPUs with AVX2 the same loop runs with 8-wide vectors
// (no FMA), giving the same bits as the baseline build (GPUKIT_CPU_NO_AVX2=1). The fast
// path serves when the output dtype equals the input dtype.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/backend.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("matmul");

namespace {

constexpr int64_t kRowBlock = 32;
constexpr int64_t kKBlock = 256;

constexpr int kLanes = 8;
constexpr int64_t kCols = 4;

// c[i, j] for rows i of A (float, converted) and columns j0..j0+nc of B (nc <= kCols).
template <class T>
[[gnu::always_inline]] inline void dot_block_body(const float* a, int64_t a_rs, const T* b, int64_t b_cs, int64_t m,
                                                  int64_t k, int64_t nc, T* c, int64_t c_rs, int64_t c_cs) {
  const T* bj[kCols];
  for (int64_t j = 0; j < kCols; ++j) bj[j] = b + std::min(j, nc - 1) * b_cs;
  const int64_t kv = k - k % kLanes;
  for (int64_t i = 0; i < m; ++i) {
    const float* ai = a + i * a_rs;
    float acc[kCols][kLanes] = {};
    for (int64_t kk = 0; kk < kv; kk += kLanes) {
      for (int64_t j = 0; j < kCols; ++j)
        for (int l = 0; l < kLanes; ++l) acc[j][l] += ai[kk + l] * float(bj[j][kk + l]);
    }
    for (int64_t kk = kv; kk < k; ++kk)
      for (int64_t j = 0; j < kCols; ++j) acc[j][kk - kv] += ai[kk] * float(bj[j][kk]);
    for (int64_t j = 0; j < nc; ++j) {
      float s = ((acc[j][0] + acc[j][4]) + (acc[j][1] + acc[j][5])) + ((acc[j][2] + acc[j][6]) + (acc[j][3] + acc[j][7]));
      c[i * c_rs + j * c_cs] = convert<T>(s);
    }
  }
}

// The same body compiled for plain x86-64 and for AVX2 (wider vectors, no FMA: every
// lane does the same multiply and add, so both give the same bits).
template <class T>
void dot_block_base(const float* a, int64_t a_rs, const T* b, int64_t b_cs, int64_t m, int64_t k, int64_t nc, T* c,
                    int64_t c_rs, int64_t c_cs) {
  dot_block_body<T>(a, a_rs, b, b_cs, m, k, nc, c, c_rs, c_cs);
}
#if defined(__x86_64__) && defined(__GNUC__)
template <class T>
__attribute__((target("avx2"))) void dot_block_avx2(const float* a, int64_t a_rs, const T* b, int64_t b_cs, int64_t m,
                                                     int64_t k, int64_t nc, T* c, int64_t c_rs, int64_t c_cs) {
  dot_block_body<T>(a, a_rs, b, b_cs, m, k, nc, c, c_rs, c_cs);
}
bool have_avx2() {
  static const bool yes = [] {
    const char* off = std::getenv("GPUKIT_CPU_NO_AVX2");  // set to 1 to compare the two builds of the loop
    return __builtin_cpu_supports("avx2") && !(off && *off && std::string(off) != "0");
  }();
  return yes;
}
#endif
template <class T>
void dot_block(const float* a, int64_t a_rs, const T* b, int64_t b_cs, int64_t m, int64_t k, int64_t nc, T* c,
               int64_t c_rs, int64_t c_cs) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_avx2()) return dot_block_avx2<T>(a, a_rs, b, b_cs, m, k, nc, c, c_rs, c_cs);
#endif
  dot_block_base<T>(a, a_rs, b, b_cs, m, k, nc, c, c_rs, c_cs);
}

// The dot-product path for float32/float16/bfloat16 with fp32 accumulation; false
// when the layout does not fit (A's rows or B's columns not dense along k).
template <class T>
bool matmul_dot(const MatmulArgs& p) {
  if (p.a_cs != 1 || p.b_rs != 1 || p.k < kLanes) return false;
  const T* A = static_cast<const T*>(p.a);
  const T* B = static_cast<const T*>(p.b);
  T* Cm = static_cast<T*>(p.c);
  std::vector<float> af;
  if constexpr (!std::is_same_v<T, float>) af.resize(size_t(p.m * p.k));
  int64_t idx[kMaxDims] = {};
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    int64_t aoff = 0, boff = 0;
    for (int d = 0; d < p.batch_ndim; ++d) {
      aoff += idx[d] * p.a_batch_strides[d];
      boff += idx[d] * p.b_batch_strides[d];
    }
    const float* a;
    int64_t a_rs;
    if constexpr (std::is_same_v<T, float>) {
      a = A + aoff;
      a_rs = p.a_rs;
    } else {
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t kk = 0; kk < p.k; ++kk) af[size_t(i * p.k + kk)] = float(A[aoff + i * p.a_rs + kk]);
      a = af.data();
      a_rs = p.k;
    }
    T* c = Cm + bi * p.m * p.n;
    for (int64_t j0 = 0; j0 < p.n; j0 += kCols)
      dot_block<T>(a, a_rs, B + boff + j0 * p.b_cs, p.b_cs, p.m, p.k, std::min(kCols, p.n - j0), c + j0 * p.c_cs,
                   p.c_rs, p.c_cs);
    for (int d = p.batch_ndim - 1; d >= 0; --d) {
      if (++idx[d] < p.batch_shape[d]) break;
      idx[d] = 0;
    }
  }
  return true;
}

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
  if constexpr (!std::is_same_v<T, double>)
    if (a.out_dtype == a.dtype && matmul_dot<T>(a)) return;
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
