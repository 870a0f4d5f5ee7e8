// Generic elementwise kernels: a vectorized path for dense operands (16-byte
// accesses, several in flight per thread) and a strided path for any layout.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_util.h"
#include "gpukit/dtype.h"
#include "ops/ew_args.h"

namespace gk::cuda {

template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <int NOPS>
struct OffCalc {
  int nd;
  int64_t shape[kMaxDims];
  int64_t st[NOPS][kMaxDims];
};

template <int NOPS>
OffCalc<NOPS> make_offcalc(const EwArgs& a) {
  OffCalc<NOPS> oc{};
  oc.nd = a.ndim;
  for (int d = 0; d < a.ndim; ++d) {
    oc.shape[d] = a.shape[d];
    for (int k = 0; k < NOPS; ++k) oc.st[k][d] = a.strides[k][d];
  }
  return oc;
}

template <int NOPS>
__device__ __forceinline__ void offsets(const OffCalc<NOPS>& oc, int64_t i, int64_t (&off)[NOPS]) {
#pragma unroll
  for (int k = 0; k < NOPS; ++k) off[k] = 0;
  if (oc.nd <= 1) {
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] = oc.nd ? i * oc.st[k][0] : 0;
    return;
  }
  for (int d = oc.nd - 1; d >= 0; --d) {
    int64_t q = i / oc.shape[d];
    int64_t r = i - q * oc.shape[d];
    i = q;
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] += r * oc.st[k][d];
  }
}

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

inline unsigned grid_for(int64_t work, int per_block) {
  int64_t g = (work + per_block - 1) / per_block;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(g, int64_t(1) << 20)));
}

template <class T, int N>
inline bool aligned_for(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) % (sizeof(T) * N)) == 0;
}

// ---- two inputs (either may be a scalar) ----
template <class T, class R, int N, class F>
__global__ void __launch_bounds__(kThreads) k_binary_vec(const T* __restrict__ x, const T* __restrict__ y,
                                                         R* __restrict__ out, int64_t nvec, int slot,
                                                         compute_t<T> sv, F f) {
  using C = compute_t<T>;
  const int64_t step = int64_t(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = int64_t(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < nvec; base += step) {
    Vec<T, N> xa[kUnroll], ya[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t i = base + int64_t(u) * kThreads;
      if (i < nvec) {
        if (slot != 1) xa[u] = reinterpret_cast<const Vec<T, N>*>(x)[i];
        if (slot != 2) ya[u] = reinterpret_cast<const Vec<T, N>*>(y)[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t i = base + int64_t(u) * kThreads;
      if (i < nvec) {
        Vec<R, N> o;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          C a = slot == 1 ? sv : C(xa[u].v[j]);
          C b = slot == 2 ? sv : C(ya[u].v[j]);
          o.v[j] = convert<R>(f(a, b));
        }
        reinterpret_cast<Vec<R, N>*>(out)[i] = o;
      }
    }
  }
}

template <class T, class R, class F>
__global__ void __launch_bounds__(kThreads) k_binary_strided(OffCalc<3> oc, int64_t n, const T* x, const T* y,
                                                             R* out, int slot, compute_t<T> sv, F f) {
  using C = compute_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[3];
    offsets<3>(oc, i, off);
    C a = slot == 1 ? sv : C(x[off[1]]);
    C b = slot == 2 ? sv : C(y[off[2]]);
    out[off[0]] = convert<R>(f(a, b));
  }
}

template <class T, class R, class F>
void launch_binary(const EwArgs& a, F f, compute_t<T> sv, cudaStream_t s) {
  constexpr int N = 16 / (sizeof(T) > sizeof(R) ? sizeof(T) : sizeof(R));
  const T* x = static_cast<const T*>(a.ptr[1]);
  const T* y = static_cast<const T*>(a.ptr[2]);
  R* out = static_cast<R*>(a.ptr[0]);
  int64_t done = 0;
  if (a.contiguous && aligned_for<R, N>(out) && (a.scalar_slot == 1 || aligned_for<T, N>(x)) &&
      (a.scalar_slot == 2 || aligned_for<T, N>(y))) {
    int64_t nvec = a.numel / N;
    if (nvec > 0) {
      k_binary_vec<T, R, N><<<grid_for(nvec, kThreads * kUnroll), kThreads, 0, s>>>(x, y, out, nvec, a.scalar_slot,
                                                                                     sv, f);
      GK_LAUNCH_CHECK("binary_vec");
    }
    done = nvec * N;
    if (done == a.numel) return;
  }
  OffCalc<3> oc = make_offcalc<3>(a);
  if (done) {  // dense tail
    oc.nd = 1;
    oc.shape[0] = a.numel - done;
    oc.st[0][0] = oc.st[1][0] = oc.st[2][0] = 1;
    out += done;
    if (a.scalar_slot != 1) x += done;
    if (a.scalar_slot != 2) y += done;
  }
  int64_t n = a.numel - done;
  k_binary_strided<T, R><<<grid_for(n, kThreads), kThreads, 0, s>>>(oc, n, x, y, out, a.scalar_slot, sv, f);
  GK_LAUNCH_CHECK("binary_strided");
}

// ---- one input ----
template <class T, class R, int N, class F>
__global__ void __launch_bounds__(kThreads) k_unary_vec(const T* __restrict__ x, R* __restrict__ out, int64_t nvec,
                                                        F f) {
  const int64_t step = int64_t(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = int64_t(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < nvec; base += step) {
    Vec<T, N> xa[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t i = base + int64_t(u) * kThreads;
      if (i < nvec) xa[u] = reinterpret_cast<const Vec<T, N>*>(x)[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t i = base + int64_t(u) * kThreads;
      if (i < nvec) {
        Vec<R, N> o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = f(xa[u].v[j]);
        reinterpret_cast<Vec<R, N>*>(out)[i] = o;
      }
    }
  }
}

template <class T, class R, class F>
__global__ void __launch_bounds__(kThreads) k_unary_strided(OffCalc<2> oc, int64_t n, const T* x, R* out, F f) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[2];
    offsets<2>(oc, i, off);
    out[off[0]] = f(x[off[1]]);
  }
}

// f maps a T to an R (storage types; the functor converts).
template <class T, class R, class F>
void launch_unary(const EwArgs& a, F f, cudaStream_t s) {
  constexpr int N = 16 / (sizeof(T) > sizeof(R) ? sizeof(T) : sizeof(R));
  const T* x = static_cast<const T*>(a.ptr[1]);
  R* out = static_cast<R*>(a.ptr[0]);
  int64_t done = 0;
  if (a.contiguous && aligned_for<R, N>(out) && aligned_for<T, N>(x)) {
    int64_t nvec = a.numel / N;
    if (nvec > 0) {
      k_unary_vec<T, R, N><<<grid_for(nvec, kThreads * kUnroll), kThreads, 0, s>>>(x, out, nvec, f);
      GK_LAUNCH_CHECK("unary_vec");
    }
    done = nvec * N;
    if (done == a.numel) return;
  }
  OffCalc<2> oc = make_offcalc<2>(a);
  if (done) {
    oc.nd = 1;
    oc.shape[0] = a.numel - done;
    oc.st[0][0] = oc.st[1][0] = 1;
    out += done;
    x += done;
  }
  int64_t n = a.numel - done;
  k_unary_strided<T, R><<<grid_for(n, kThreads), kThreads, 0, s>>>(oc, n, x, out, f);
  GK_LAUNCH_CHECK("unary_strided");
}

}  // namespace gk::cuda
