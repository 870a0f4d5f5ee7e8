// CUDA kernels of the row reductions and of softmax/log_softmax.
//
// Determinism: no atomics. A row of up to kWarpCols elements is reduced by one
// warp (each lane folds a strided slice, then a shuffle tree); a longer row by
// one block of kThreads (strided slices, warp trees, then a tree over the
// warps). A row longer than kSplitCols is cut into fixed chunks of kChunk
// elements: pass 1 writes one partial per chunk into the workspace, pass 2
// reduces the partials. Every choice depends only on the row length, never on
// the number of rows or the device, so a row gives the same bits on every run
// and in any batch. Dense, aligned softmax rows of 32 or more 16-byte vectors
// take the warp-row form of src/cuda/rows_warp.cu (session 4: 93-99% of a copy
// on the H200); with GPUKIT_TUNE rows.on=0 they take the register form below or,
// with softmax.pipe=1 (the default for f32 rows of 129 to 1024 vectors), the
// staged form of src/cuda/rows_pipe.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/cuda_util.h"
#include "cuda/common/softmax_rows.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/rows_pipe.h"
#include "cuda/rows_warp.h"
#include "ops/backend.h"
#include "ops/reduce_functors.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("sum", "mean", "max", "min", "argmax", "argmin", "softmax", "log_softmax");

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kWarpCols = 1024;
constexpr int64_t kSplitCols = 65536;
constexpr int64_t kChunk = 32768;
constexpr int64_t kMaxGrid = int64_t(1) << 20;

// Shuffle of any trivially copyable value, 4 bytes at a time (shfl: one 32-bit shuffle).
template <class X, class S>
__device__ __forceinline__ X shfl_words(X v, S shfl) {
  constexpr int W = int((sizeof(X) + 3) / 4);
  int w[W] = {};
  memcpy(w, &v, sizeof(X));
#pragma unroll
  for (int i = 0; i < W; ++i) w[i] = shfl(w[i]);
  X r;
  memcpy(&r, w, sizeof(X));
  return r;
}
template <class X>
__device__ __forceinline__ X shfl_down(X v, int off) {
  return shfl_words(v, [off](int w) { return __shfl_down_sync(0xffffffffu, w, off); });
}
template <class X>
__device__ __forceinline__ X shfl_idx(X v, int lane) {
  return shfl_words(v, [lane](int w) { return __shfl_sync(0xffffffffu, w, lane); });
}

// Fixed shuffle tree; every lane returns lane 0's result.
template <class X, class F>
__device__ __forceinline__ X warp_all(X v, F f) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = f(v, shfl_down(v, off));
  return shfl_idx(v, 0);
}

// Fixed tree over the block; every thread returns the result. `sm` holds kWarps values.
template <class X, class F>
__device__ __forceinline__ X block_all(X v, F f, X ident, X* sm) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_all(v, f);
  __syncthreads();  // sm may still be read by a previous call
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  X t = lane < kWarps ? sm[lane] : ident;
  return warp_all(t, f);
}

// ---- sources and sinks of the row-reduction kernel ----
template <class R, class T>
struct InSrc {  // logical row r = physical row r
  const T* p;
  int64_t rs, cols;
  __device__ int64_t len(int64_t) const { return cols; }
  __device__ typename R::Acc get(int64_t r, int64_t j) const { return R::load(p[r * rs + j], j); }
};
template <class R, class T>
struct ChunkSrc {  // logical row r = chunk r % nchunks of physical row r / nchunks
  const T* p;
  int64_t rs, cols, nchunks;
  __device__ int64_t len(int64_t r) const {
    int64_t left = cols - (r % nchunks) * kChunk;
    return left < kChunk ? left : kChunk;
  }
  __device__ typename R::Acc get(int64_t r, int64_t j) const {
    int64_t c0 = (r % nchunks) * kChunk;
    return R::load(p[(r / nchunks) * rs + c0 + j], c0 + j);
  }
};
template <class R>
struct PartSrc {
  const typename R::Acc* p;
  int64_t nchunks;
  __device__ int64_t len(int64_t) const { return nchunks; }
  __device__ typename R::Acc get(int64_t r, int64_t j) const { return p[r * nchunks + j]; }
};
template <class R>
struct OutSink {
  typename R::Out* p;
  int64_t rs, n;
  __device__ void put(int64_t r, typename R::Acc a) const { p[r * rs] = R::finish(a, n); }
};
template <class R>
struct PartSink {
  typename R::Acc* p;
  __device__ void put(int64_t r, typename R::Acc a) const { p[r] = a; }
};

template <class R>
struct Comb {
  __device__ typename R::Acc operator()(typename R::Acc a, typename R::Acc b) const { return R::combine(a, b); }
};

// One warp per logical row.
template <class R, class Src, class Sink>
__global__ void __launch_bounds__(kThreads) k_rows_warp(Src src, Sink sink, int64_t rows) {
  using Acc = typename R::Acc;
  int lane = threadIdx.x & 31;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += int64_t(gridDim.x) * kWarps) {
    Acc acc = R::init();
    int64_t n = src.len(r);
    for (int64_t j = lane; j < n; j += 32) acc = R::combine(acc, src.get(r, j));
    acc = warp_all(acc, Comb<R>{});
    if (lane == 0) sink.put(r, acc);
  }
}

// One block per logical row.
template <class R, class Src, class Sink>
__global__ void __launch_bounds__(kThreads) k_rows_block(Src src, Sink sink, int64_t rows) {
  using Acc = typename R::Acc;
  __shared__ Acc sm[kWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Acc acc = R::init();
    int64_t n = src.len(r);
    for (int64_t j = threadIdx.x; j < n; j += kThreads) acc = R::combine(acc, src.get(r, j));
    acc = block_all(acc, Comb<R>{}, R::init(), sm);
    if (threadIdx.x == 0) sink.put(r, acc);
  }
}

template <class R, class Src, class Sink>
void launch_rows(Src src, Sink sink, int64_t rows, int64_t len, cudaStream_t s) {
  if (len <= kWarpCols) {
    unsigned g = unsigned(std::min<int64_t>((rows + kWarps - 1) / kWarps, kMaxGrid));
    k_rows_warp<R><<<g, kThreads, 0, s>>>(src, sink, rows);
    GK_LAUNCH_CHECK("reduce_rows_warp");
  } else {
    unsigned g = unsigned(std::min<int64_t>(rows, kMaxGrid));
    k_rows_block<R><<<g, kThreads, 0, s>>>(src, sink, rows);
    GK_LAUNCH_CHECK("reduce_rows_block");
  }
}

bool aligned_16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int64_t num_chunks(int64_t cols) { return cols > kSplitCols ? (cols + kChunk - 1) / kChunk : 1; }

template <ReduceOp OP, class T>
void reduce_t(const RowArgs& a, cudaStream_t s) {
  using R = red::reducer_t<OP, T>;
  using Acc = typename R::Acc;
  using O = typename R::Out;
  if (dtype_of<O>::value != a.out_dtype) throw ValueError("reduce_rows: output dtype does not match the op");
  const T* in = static_cast<const T*>(a.in);
  OutSink<R> out{static_cast<O*>(a.out), a.out_row_stride, a.cols};
  int64_t nc = num_chunks(a.cols);
  if (nc == 1) return launch_rows<R>(InSrc<R, T>{in, a.in_row_stride, a.cols}, out, a.rows, a.cols, s);
  if (!a.work) throw ValueError("reduce_rows: missing workspace for a long row");
  Acc* part = static_cast<Acc*>(a.work);
  launch_rows<R>(ChunkSrc<R, T>{in, a.in_row_stride, a.cols, nc}, PartSink<R>{part}, a.rows * nc, kChunk, s);
  launch_rows<R>(PartSrc<R>{part, nc}, out, a.rows, nc, s);
}

// ---- softmax ----
template <class C>
struct MaxC {
  __device__ C operator()(C a, C b) const { return red::MaxR<C, true>::combine(a, b); }
};
template <class C>
struct AddC {
  __device__ C operator()(C a, C b) const { return a + b; }
};

template <class C>
__device__ __forceinline__ C exp_c(C x) {
  if constexpr (std::is_same_v<C, double>) return ::exp(x);
  else return ::expf(x);
}
template <class C>
__device__ __forceinline__ C log_c(C x) {
  if constexpr (std::is_same_v<C, double>) return ::log(x);
  else return ::logf(x);
}

template <class T, class C>
__device__ __forceinline__ void softmax_write(const T* x, T* y, int64_t j, C m, C sum, C lsum, bool log) {
  C v = C(x[j]) - m;
  y[j] = convert<T>(log ? C(v - lsum) : C(exp_c(v) / sum));
}

template <class T>
__global__ void __launch_bounds__(kThreads) k_softmax_warp(const T* in, T* out, int64_t rows, int64_t cols,
                                                           int64_t irs, int64_t ors, bool log) {
  using C = compute_t<T>;
  int lane = threadIdx.x & 31;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < rows; r += int64_t(gridDim.x) * kWarps) {
    const T* x = in + r * irs;
    T* y = out + r * ors;
    C m = red::lowest<C>();
    for (int64_t j = lane; j < cols; j += 32) m = MaxC<C>{}(m, C(x[j]));
    m = warp_all(m, MaxC<C>{});
    C sum = 0;
    for (int64_t j = lane; j < cols; j += 32) sum += exp_c(C(C(x[j]) - m));
    sum = warp_all(sum, AddC<C>{});
    C lsum = log_c(sum);
    for (int64_t j = lane; j < cols; j += 32) softmax_write(x, y, j, m, sum, lsum, log);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) k_softmax_block(const T* in, T* out, int64_t rows, int64_t cols,
                                                            int64_t irs, int64_t ors, bool log) {
  using C = compute_t<T>;
  __shared__ C sm[kWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = in + r * irs;
    T* y = out + r * ors;
    C m = red::lowest<C>();
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) m = MaxC<C>{}(m, C(x[j]));
    m = block_all(m, MaxC<C>{}, red::lowest<C>(), sm);
    C sum = 0;
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) sum += exp_c(C(C(x[j]) - m));
    sum = block_all(sum, AddC<C>{}, C(0), sm);
    C lsum = log_c(sum);
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) softmax_write(x, y, j, m, sum, lsum, log);
  }
}

// ---- softmax, rows in registers ----
// A group of blockDim.x threads per row (blockDim.y rows per block); thread t
// holds the row's 16-byte vectors t, t + tpr, ... (VPT of them), loaded raw
// before any arithmetic: one read and one write of the row. Each thread takes
// the max of its values and the sum of their exponentials relative to it; one
// reduction of (max, sum) pairs (a shuffle tree per warp, then the row's warps
// in order; every thread gets lane 0's value) gives the row's, so the bits do
// not depend on the batch. NaN, +inf and all -inf rows give what the CPU
// reference gives (NaN rows).

// Over the blockDim.x threads of one row, fixed order, every thread gets the
// result; sh holds 64 floats; all threads of the block call it.
__device__ __forceinline__ MaxSum group_maxsum(MaxSum v, float* sh) {
  v = warp_maxsum(v);
  if (blockDim.x == 32) return v;
  const int nw = blockDim.x >> 5;
  float* mine = sh + threadIdx.y * nw * 2;
  __syncthreads();  // sh may still be read by the previous row
  if ((threadIdx.x & 31) == 0) mine[(threadIdx.x >> 5) * 2] = v.m, mine[(threadIdx.x >> 5) * 2 + 1] = v.s;
  __syncthreads();
  MaxSum r{mine[0], mine[1]};
  for (int i = 1; i < nw; ++i) r = combine(r, MaxSum{mine[2 * i], mine[2 * i + 1]});
  return r;
}

// PERSIST: a grid of about one wave loops over the row groups, loading the next
// group's rows while it reduces and writes the current one.
template <class T, int VPT, int MAXT, bool PERSIST>
__global__ void __launch_bounds__(MAXT) k_softmax_vec(const T* in, T* out, int64_t rows, int64_t cols, int64_t irs,
                                                      int64_t ors, bool log) {
  constexpr int N = kVecN<T>;
  __shared__ float sh[64];
  const int tpr = blockDim.x, t = threadIdx.x;
  const int64_t groups = (rows + blockDim.y - 1) / blockDim.y;
  auto load = [&](int64_t g, raw16 (&xs)[VPT]) {
    const int64_t row = g * blockDim.y + threadIdx.y;
    const int nvec = row < rows ? int(cols / N) : 0;
    const raw16* x = reinterpret_cast<const raw16*>(in + row * irs);
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (t + k * tpr < nvec) xs[k] = ld16(x + t + k * tpr);
  };
  auto process = [&](int64_t g, const raw16 (&xs)[VPT]) {
    const int64_t row = g * blockDim.y + threadIdx.y;
    const int nvec = row < rows ? int(cols / N) : 0;  // a dead row only joins the barriers
    raw16* y = reinterpret_cast<raw16*>(out + row * ors);
    // this thread's max (NaN skipped: a NaN still reaches the sum below) and its
    // exponentials relative to it
    float mt = -INFINITY;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (t + k * tpr < nvec) {
        float f[N];
        unpack<T>(xs[k], f);
#pragma unroll
        for (int j = 0; j < N; ++j) mt = fmaxf(mt, f[j]);
      }
    const float base = mt == -INFINITY ? 0.f : mt;  // only -inf (and NaN) here: their terms are 0 (NaN)
    float e[VPT][N], st = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (t + k * tpr < nvec) {
        float f[N];
        unpack<T>(xs[k], f);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          e[k][j] = exp_t<T>(f[j] - base);
          st += e[k][j];
        }
      }
    const MaxSum ms = group_maxsum(MaxSum{mt, st}, sh);
    const float M = ms.m, S = ms.s;
    const float ls = log ? ::logf(S) : 0.f;
    // exp(x - M) / S = e * exp(mt - M) / S; a thread whose values are all -inf
    // (its scale could overflow) recomputes exp(x - M) instead
    const bool direct = mt == -INFINITY;
    const float scale = direct ? 0.f : ::expf(mt - M) / S;
    const int mode = log ? 0 : direct ? 1 : 2;  // uniform per thread: one loop body each
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (t + k * tpr < nvec) {
        float f[N];
        unpack<T>(xs[k], f);
        if (mode == 0) {
#pragma unroll
          for (int j = 0; j < N; ++j) f[j] = (f[j] - M) - ls;
        } else if (mode == 1) {
#pragma unroll
          for (int j = 0; j < N; ++j) f[j] = ::expf(f[j] - M) / S;
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) f[j] = e[k][j] * scale;
        }
        st16(y + t + k * tpr, pack<T>(f));
      }
  };
  raw16 xs[VPT];
  int64_t g = blockIdx.x;
  load(g, xs);
  if constexpr (!PERSIST) {
    process(g, xs);
  } else {
    for (;;) {
      const int64_t gn = g + gridDim.x;
      raw16 xn[VPT];
      if (gn < groups) load(gn, xn);  // block-uniform
      process(g, xs);
      if (gn >= groups) break;
      g = gn;
#pragma unroll
      for (int k = 0; k < VPT; ++k) xs[k] = xn[k];
    }
  }
}

// The vector form when T has 16-byte vectors and the rows are dense and aligned;
// false when the caller must take the general kernels.
template <class T>
bool softmax_vec(const RowArgs& a, bool log, cudaStream_t s) {
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, bf16> && !std::is_same_v<T, f16>) {
    return false;
  } else {
    constexpr int N = kVecN<T>;
    const int64_t nvec = a.cols / N;
    if (a.cols % N || a.in_row_stride % N || a.out_row_stride % N || !aligned_16(a.in) || !aligned_16(a.out) ||
        nvec > 256 * 16)
      return false;
    if (rows_warp_softmax(a, log, s)) return true;  // the lean warp-row form (src/cuda/rows_warp.cu)
    if (pipe_softmax_ok(a, log)) {  // rows staged in shared memory (src/cuda/rows_pipe.cu)
      pipe_softmax(a, log, s);
      return true;
    }
    int tpr = nvec <= 32 * 4 ? 32 : int(std::min<int64_t>(1024, (nvec + 3) / 4 + 31) / 32 * 32);
    tpr = std::max(32, std::min(1024, tune("softmax.tpr", tpr) / 32 * 32));
    const int64_t need = (nvec + tpr - 1) / tpr;
    const int vpt = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : need <= 8 ? 8 : need <= 16 ? 16 : 0;
    if (!vpt || (vpt >= 8 && tpr > 256)) return false;
    const int maxt = vpt >= 8 ? 256 : 1024;
    const int rpb = std::max(1, std::min({tune("softmax.rows", std::max(1, 128 / tpr)), maxt / tpr, 32 / (tpr / 32)}));
    const int64_t blocks = (a.rows + rpb - 1) / rpb;
    if (blocks > int64_t(INT32_MAX)) return false;
    dim3 block{unsigned(tpr), unsigned(rpb), 1u}, grid{unsigned(blocks), 1u, 1u};
    // persistent: blocks of at most 256 threads (two row buffers need the registers)
    const bool persist = tpr * rpb <= 256 && tune("softmax.persist", 0);
    const T* in = static_cast<const T*>(a.in);
    T* out = static_cast<T*>(a.out);
    const auto rs = a.in_row_stride, os = a.out_row_stride;
    auto go = [&](auto vc, auto mc) {
      constexpr int V = decltype(vc)::value, MT = decltype(mc)::value;
      if (persist) {  // one wave (GPUKIT_TUNE softmax.grid for the tests)
        constexpr auto k = k_softmax_vec<T, V, 256, true>;
        int64_t g = resident_blocks<k>(tpr * rpb);
        if (int forced = tune("softmax.grid", 0); forced > 0) g = forced;
        const dim3 pg{unsigned(std::min<int64_t>(blocks, g)), 1u, 1u};
        k<<<pg, block, 0, s>>>(in, out, a.rows, a.cols, rs, os, log);
      } else if (tpr * rpb <= 256)  // the register budget of 256-thread blocks (no spills at VPT 4)
        k_softmax_vec<T, V, 256, false><<<grid, block, 0, s>>>(in, out, a.rows, a.cols, rs, os, log);
      else k_softmax_vec<T, V, MT, false><<<grid, block, 0, s>>>(in, out, a.rows, a.cols, rs, os, log);
    };
    using std::integral_constant;
    switch (vpt) {
      case 1: go(integral_constant<int, 1>{}, integral_constant<int, 1024>{}); break;
      case 2: go(integral_constant<int, 2>{}, integral_constant<int, 1024>{}); break;
      case 4: go(integral_constant<int, 4>{}, integral_constant<int, 1024>{}); break;
      case 8: go(integral_constant<int, 8>{}, integral_constant<int, 256>{}); break;
      default: go(integral_constant<int, 16>{}, integral_constant<int, 256>{}); break;
    }
    GK_LAUNCH_CHECK("softmax_vec");
    return true;
  }
}

template <class T>
void softmax_t(const RowArgs& a, bool log, cudaStream_t s) {
  if (softmax_vec<T>(a, log, s)) return;
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  if (a.cols <= kWarpCols) {
    unsigned g = unsigned(std::min<int64_t>((a.rows + kWarps - 1) / kWarps, kMaxGrid));
    k_softmax_warp<T><<<g, kThreads, 0, s>>>(in, out, a.rows, a.cols, a.in_row_stride, a.out_row_stride, log);
    GK_LAUNCH_CHECK("softmax_warp");
  } else {
    unsigned g = unsigned(std::min<int64_t>(a.rows, kMaxGrid));
    k_softmax_block<T><<<g, kThreads, 0, s>>>(in, out, a.rows, a.cols, a.in_row_stride, a.out_row_stride, log);
    GK_LAUNCH_CHECK("softmax_block");
  }
}

}  // namespace

size_t reduce_rows_workspace(ReduceOp op, const RowArgs& a) {
  int64_t nc = num_chunks(a.cols);
  if (nc == 1 || a.rows <= 0) return 0;
  size_t acc_size = dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    return red::dispatch_reduce(op, [&](auto o) { return sizeof(typename red::reducer_t<decltype(o)::value, T>::Acc); });
  });
  return size_t(a.rows) * size_t(nc) * acc_size;
}

void reduce_rows(ReduceOp op, const RowArgs& a, void* stream) {
  if (a.rows <= 0 || a.cols <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    red::dispatch_reduce(op, [&](auto o) { reduce_t<decltype(o)::value, T>(a, s); });
  });
}

void softmax_rows(const RowArgs& a, bool log, void* stream) {
  if (a.rows <= 0 || a.cols <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (red::is_float_v<T>) softmax_t<T>(a, log, s);
    else throw TypeError("x: softmax needs a floating-point array");
  });
}

}  // namespace gk::cuda
