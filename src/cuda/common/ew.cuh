// Generic elementwise kernels: a vectorized path for dense operands (16-byte
// accesses, several in flight per thread) and a strided path for any layout.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

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

// Raw register type of a Vec<T, N> (so that the loads of a thread are all issued
// before the first element is unpacked).
template <int B>
struct RawOf;
template <> struct RawOf<16> { using type = uint4; };
template <> struct RawOf<8> { using type = uint2; };
template <> struct RawOf<4> { using type = uint32_t; };
template <> struct RawOf<2> { using type = uint16_t; };
template <class T, int N>
using raw_t = typename RawOf<int(sizeof(T)) * N>::type;

template <class T, int N>
__device__ __forceinline__ raw_t<T, N> ld_vec(const T* p, int64_t i) {
  return reinterpret_cast<const raw_t<T, N>*>(p)[i];
}
template <class T, int N>
__device__ __forceinline__ Vec<T, N> as_vec(const raw_t<T, N>& r) {
  Vec<T, N> v;
  memcpy(&v, &r, sizeof(v));
  return v;
}

// Stores N compute values as R (bf16 pairs through the paired conversion).
template <class R, int N, class C>
__device__ __forceinline__ void st_vec(R* p, int64_t i, const C (&c)[N]) {
  if constexpr (std::is_same_v<R, bf16> && std::is_same_v<C, float> && N % 2 == 0) {
    uint32_t w[N / 2];
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      float lo = c[2 * j], hi = c[2 * j + 1];
      __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
      memcpy(&w[j], &h, 4);
      if (lo != lo || hi != hi) w[j] = uint32_t(convert<bf16>(lo).bits) | (uint32_t(convert<bf16>(hi).bits) << 16);
    }
    raw_t<R, N> r;
    memcpy(&r, w, sizeof(r));
    reinterpret_cast<raw_t<R, N>*>(p)[i] = r;
  } else {
    Vec<R, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = convert<R>(c[j]);
    reinterpret_cast<raw_t<R, N>*>(p)[i] = *reinterpret_cast<const raw_t<R, N>*>(&o);
  }
}

// ---- two inputs (either may be a scalar) ----
// Full tiles of kThreads * kUnroll vectors without bounds checks (every load of a
// thread in flight at once), then the remaining vectors one per thread.
template <class T, class R, int N, class F>
__global__ void __launch_bounds__(kThreads) k_binary_vec(const T* __restrict__ x, const T* __restrict__ y,
                                                         R* __restrict__ out, int64_t nvec, int slot,
                                                         compute_t<T> sv, F f) {
  using C = compute_t<T>;
  using RT = raw_t<T, N>;
  constexpr int64_t kTile = int64_t(kThreads) * kUnroll;
  const int64_t full = nvec / kTile;
  auto compute = [&](const RT& xr, const RT& yr, int64_t i) {
    Vec<T, N> xv = as_vec<T, N>(xr), yv = as_vec<T, N>(yr);
    C o[N];
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = C(f(slot == 1 ? sv : C(xv.v[j]), slot == 2 ? sv : C(yv.v[j])));
    st_vec<R, N>(out, i, o);
  };
  for (int64_t tile = blockIdx.x; tile < full; tile += gridDim.x) {
    const int64_t base = tile * kTile + threadIdx.x;
    RT xa[kUnroll] = {}, ya[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (slot != 1) xa[u] = ld_vec<T, N>(x, base + u * kThreads);
      if (slot != 2) ya[u] = ld_vec<T, N>(y, base + u * kThreads);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) compute(xa[u], ya[u], base + u * kThreads);
  }
  for (int64_t i = full * kTile + int64_t(blockIdx.x) * kThreads + threadIdx.x; i < nvec;
       i += int64_t(gridDim.x) * kThreads) {
    RT xr = {}, yr = {};
    if (slot != 1) xr = ld_vec<T, N>(x, i);
    if (slot != 2) yr = ld_vec<T, N>(y, i);
    compute(xr, yr, i);
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
// Twice the binary kernel's unroll: one stream in needs twice the vectors per
// thread to keep as many bytes in flight.
constexpr int kUnrollUnary = 2 * kUnroll;

template <class T, class R, int N, class F>
__global__ void __launch_bounds__(kThreads) k_unary_vec(const T* __restrict__ x, R* __restrict__ out, int64_t nvec,
                                                        F f) {
  using RT = raw_t<T, N>;
  constexpr int64_t kTile = int64_t(kThreads) * kUnrollUnary;
  const int64_t full = nvec / kTile;
  auto compute = [&](const RT& xr, int64_t i) {
    Vec<T, N> xv = as_vec<T, N>(xr);
    Vec<R, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = f(xv.v[j]);
    reinterpret_cast<raw_t<R, N>*>(out)[i] = *reinterpret_cast<const raw_t<R, N>*>(&o);
  };
  for (int64_t tile = blockIdx.x; tile < full; tile += gridDim.x) {
    const int64_t base = tile * kTile + threadIdx.x;
    RT xa[kUnrollUnary];
#pragma unroll
    for (int u = 0; u < kUnrollUnary; ++u) xa[u] = ld_vec<T, N>(x, base + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnrollUnary; ++u) compute(xa[u], base + u * kThreads);
  }
  for (int64_t i = full * kTile + int64_t(blockIdx.x) * kThreads + threadIdx.x; i < nvec;
       i += int64_t(gridDim.x) * kThreads)
    compute(ld_vec<T, N>(x, i), i);
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
      k_unary_vec<T, R, N><<<grid_for(nvec, kThreads * kUnrollUnary), kThreads, 0, s>>>(x, out, nvec, f);
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
