// CUDA kernels of the unary elementwise ops, clamp, where, fill and arange.
#include "cuda/common/ew.cuh"
#include "ops/backend.h"
#include "ops/ew_dispatch.h"
#include "ops/ew_functors.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "gelu",
                     "gelu_tanh", "silu", "logical_not", "where", "clamp", "fill", "arange");

namespace {
template <UnaryOp OP, class T>
struct UnF {
  using C = compute_t<T>;
  using R = std::conditional_t<OP == UnaryOp::LogicalNot, bool, T>;
  __device__ __forceinline__ R operator()(T x) const { return convert<R>(ew::unary<OP, C>(C(x))); }
};

template <UnaryOp OP, class T>
void run(const EwArgs& a, cudaStream_t s) {
  using F = UnF<OP, T>;
  launch_unary<T, typename F::R>(a, F{}, s);
}

template <class T>
struct ClampF {
  using C = compute_t<T>;
  bool has_lo, has_hi;
  C lo, hi;
  __device__ __forceinline__ T operator()(T x) const { return convert<T>(ew::clamp<C>(C(x), has_lo, lo, has_hi, hi)); }
};

template <class T>
__global__ void k_where(OffCalc<4> oc, int64_t n, T* out, const bool* c, const T* x, const T* y) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[4];
    offsets<4>(oc, i, off);
    out[off[0]] = c[off[1]] ? x[off[2]] : y[off[3]];
  }
}

template <class T>
__global__ void k_fill(OffCalc<1> oc, int64_t n, T* out, T v) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    int64_t off[1];
    offsets<1>(oc, i, off);
    out[off[0]] = v;
  }
}

template <class T>
__global__ void k_arange(int64_t n, int64_t stride, T* out, double start, double step) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    out[i * stride] = convert<T>(start + double(i) * step);
}
}  // namespace

void unary(UnaryOp op, const EwArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  ew::dispatch_unary(op, a.in_dtype, [&]<UnaryOp OP, class T>() { run<OP, T>(a, st); });
}

void clamp(const EwArgs& a, bool has_lo, double lo, bool has_hi, double hi, void* stream) {
  dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    using C = compute_t<T>;
    ClampF<T> f{has_lo, has_hi, C(convert<T>(lo)), C(convert<T>(hi))};
    launch_unary<T, T>(a, f, static_cast<cudaStream_t>(stream));
  });
}

void where(const EwArgs& a, void* stream) {
  dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    auto oc = make_offcalc<4>(a);
    k_where<T><<<grid_for(a.numel, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        oc, a.numel, static_cast<T*>(a.ptr[0]), static_cast<const bool*>(a.ptr[1]), static_cast<const T*>(a.ptr[2]),
        static_cast<const T*>(a.ptr[3]));
    GK_LAUNCH_CHECK("where");
  });
}

void fill(const EwArgs& a, void* stream) {
  dispatch_dtype(a.out_dtype, [&](auto t) {
    using T = decltype(t);
    T v = a.in_dtype == DType::f64 ? convert<T>(a.scalar_f) : convert<T>(a.scalar_i);
    auto oc = make_offcalc<1>(a);
    k_fill<T><<<grid_for(a.numel, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        oc, a.numel, static_cast<T*>(a.ptr[0]), v);
    GK_LAUNCH_CHECK("fill");
  });
}

void arange(const EwArgs& a, double start, double step, void* stream) {
  dispatch_dtype(a.out_dtype, [&](auto t) {
    using T = decltype(t);
    int64_t stride = a.ndim ? a.strides[0][0] : 1;
    k_arange<T><<<grid_for(a.numel, kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        a.numel, stride, static_cast<T*>(a.ptr[0]), start, step);
    GK_LAUNCH_CHECK("arange");
  });
}

}  // namespace gk::cuda
