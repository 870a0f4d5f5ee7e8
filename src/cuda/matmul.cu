// CUDA kernel of matmul: a simple shared-memory tiled kernel (fast GEMM is a
// later issue). A block of 256 threads computes a 64x64 tile of C; the k axis
// is walked 16 deep at a time, A and B tiles are converted to the accumulation
// type (fp32; f64 for float64) as they are staged in shared memory, and each
// thread accumulates a 4x4 micro-tile (rows ty + 16*i, columns tx + 16*j).
// Operands take any element strides. Each output element is summed over k in
// increasing order: the same bits on every run. This kernel is the fallback when
// cuBLASLt is absent (src/blas/cublaslt.h); the front end (src/ops/gemm.cpp) picks.
// Also here: the elementwise epilogue pass of linear and gate_up_swiglu.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_util.h"
#include "ops/backend.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("matmul", "linear", "gate_up_swiglu", "int8_linear", "fp8_linear");

namespace {

constexpr int kTile = 64;
constexpr int kDepth = 16;
constexpr int kThreads = 256;
constexpr int kMicro = 4;
constexpr unsigned kMaxGridYZ = 65535;

struct BatchIndex {
  int nd;
  int64_t shape[kMaxDims];
  int64_t as[kMaxDims], bs[kMaxDims];
};

template <class T, class O>
__global__ void __launch_bounds__(kThreads) k_matmul(const T* __restrict__ A, const T* __restrict__ B, O* C,
                                                     int64_t batch, int64_t m, int64_t n, int64_t k, int64_t a_rs,
                                                     int64_t a_cs, int64_t b_rs, int64_t b_cs, int64_t c_rs,
                                                     int64_t c_cs, BatchIndex bix) {
  using Acc = compute_t<T>;
  __shared__ Acc As[kDepth][kTile + 1];  // As[kk][row]
  __shared__ Acc Bs[kDepth][kTile + 1];  // Bs[kk][col]
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t col0 = int64_t(blockIdx.x) * kTile;
  for (int64_t bi = blockIdx.z; bi < batch; bi += gridDim.z) {
    int64_t aoff = 0, boff = 0, rem = bi;
    for (int d = bix.nd - 1; d >= 0; --d) {
      int64_t q = rem / bix.shape[d], i = rem - q * bix.shape[d];
      rem = q;
      aoff += i * bix.as[d];
      boff += i * bix.bs[d];
    }
    const T* a = A + aoff;
    const T* b = B + boff;
    O* c = C + bi * m * n;
    for (int64_t row0 = int64_t(blockIdx.y) * kTile; row0 < m; row0 += int64_t(gridDim.y) * kTile) {
      Acc acc[kMicro][kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) acc[i][j] = Acc(0);
      for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
        // Stage A[row0:row0+64, k0:k0+16] and B[k0:k0+16, col0:col0+64]: 1024 values each, 4 per thread.
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          int e = tid + u * kThreads;
          int r = e / kDepth, kk = e % kDepth;  // A: consecutive threads walk k
          int64_t gr = row0 + r, gk = k0 + kk;
          As[kk][r] = (gr < m && gk < k) ? Acc(a[gr * a_rs + gk * a_cs]) : Acc(0);
          int bk = e / kTile, bc = e % kTile;  // B: consecutive threads walk columns
          int64_t gbk = k0 + bk, gc = col0 + bc;
          Bs[bk][bc] = (gbk < k && gc < n) ? Acc(b[gbk * b_rs + gc * b_cs]) : Acc(0);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kDepth; ++kk) {
          Acc av[kMicro], bv[kMicro];
#pragma unroll
          for (int i = 0; i < kMicro; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
          for (int j = 0; j < kMicro; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < kMicro; ++i)
#pragma unroll
            for (int j = 0; j < kMicro; ++j) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
        int64_t gr = row0 + ty + 16 * i;
        if (gr >= m) continue;
#pragma unroll
        for (int j = 0; j < kMicro; ++j) {
          int64_t gc = col0 + tx + 16 * j;
          if (gc < n) c[gr * c_rs + gc * c_cs] = convert<O>(acc[i][j]);
        }
      }
    }
  }
}

template <class T, class O>
void launch(const MatmulArgs& p, cudaStream_t s) {
  BatchIndex bix{};
  bix.nd = p.batch_ndim;
  for (int d = 0; d < p.batch_ndim; ++d) {
    bix.shape[d] = p.batch_shape[d];
    bix.as[d] = p.a_batch_strides[d];
    bix.bs[d] = p.b_batch_strides[d];
  }
  int64_t gx = (p.n + kTile - 1) / kTile, gy = (p.m + kTile - 1) / kTile;
  if (gx > int64_t(INT32_MAX)) throw ValueError("matmul: n is too large for the CUDA kernel");
  dim3 grid(unsigned(gx), unsigned(std::min<int64_t>(gy, kMaxGridYZ)),
            unsigned(std::min<int64_t>(p.batch, kMaxGridYZ)));
  k_matmul<T, O><<<grid, kThreads, 0, s>>>(static_cast<const T*>(p.a), static_cast<const T*>(p.b),
                                           static_cast<O*>(p.c), p.batch, p.m, p.n, p.k, p.a_rs, p.a_cs, p.b_rs,
                                        p.b_cs, p.c_rs, p.c_cs, bix);
  GK_LAUNCH_CHECK("matmul");
}

template <class T>
void launch_out(const MatmulArgs& a, cudaStream_t s) {
  switch (a.out_dtype) {
    case DType::f32: return launch<T, float>(a, s);
    case DType::f16: return launch<T, f16>(a, s);
    case DType::bf16: return launch<T, bf16>(a, s);
    case DType::f64: return launch<T, double>(a, s);
    default: throw ValueError(cat("matmul: unsupported output dtype ", dtype_name(a.out_dtype)));
  }
}

// ---- epilogue of linear / gate_up_swiglu (see EpilogueArgs in ops/backend.h) ----

template <class A>
__device__ __forceinline__ A act_fn(A v, int act) {
  if constexpr (sizeof(A) == 8) {
    if (act == 1) return 0.5 * v * (1.0 + erf(v * 0.70710678118654752440));
    if (act == 2) return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    if (act == 3) return v / (1.0 + exp(-v));
  } else {
    if (act == 1) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
    if (act == 2) return 0.5f * v * (1.0f + tanhf(0.79788456080286535588f * (v + 0.044715f * v * v * v)));
    if (act == 3) return v / (1.0f + expf(-v));
  }
  return v;
}

template <class A, class O>
__global__ void k_epilogue(const A* __restrict__ acc, const O* __restrict__ bias, const O* __restrict__ res,
                           O* __restrict__ out, int64_t m, int64_t n, int act, bool swiglu) {
  const int64_t total = m * n;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = e / n, j = e - i * n;
    A v;
    if (swiglu) {
      A g = acc[i * 2 * n + j], u = acc[i * 2 * n + n + j];
      v = act_fn<A>(g, 3) * u;
    } else {
      v = acc[e];
      if (bias) v += A(bias[j]);
      v = act_fn<A>(v, act);
      if (res) v += A(res[e]);
    }
    out[e] = convert<O>(v);
  }
}

template <class A, class O>
void launch_epilogue(const EpilogueArgs& p, cudaStream_t s) {
  int64_t total = p.m * p.n;
  int64_t blocks = std::min<int64_t>((total + 255) / 256, int64_t(132) * 32);
  k_epilogue<A, O><<<unsigned(blocks), 256, 0, s>>>(static_cast<const A*>(p.acc), static_cast<const O*>(p.bias),
                                                    static_cast<const O*>(p.res), static_cast<O*>(p.out), p.m, p.n,
                                                    p.act, p.swiglu);
  GK_LAUNCH_CHECK("gemm_epilogue");
}

// ---- int8 x int8 -> int32 (the fallback when cuBLASLt is absent): 64x64 tiles as
// above, int32 accumulation (exact; k is bounded by the front end) ----
__global__ void __launch_bounds__(kThreads) k_matmul_i8(const int8_t* __restrict__ A, const int8_t* __restrict__ B,
                                                        int32_t* C, int64_t m, int64_t n, int64_t k, int64_t a_rs,
                                                        int64_t a_cs, int64_t b_rs, int64_t b_cs, int64_t c_rs) {
  __shared__ int32_t As[kDepth][kTile + 1];
  __shared__ int32_t Bs[kDepth][kTile + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t col0 = int64_t(blockIdx.x) * kTile;
  for (int64_t row0 = int64_t(blockIdx.y) * kTile; row0 < m; row0 += int64_t(gridDim.y) * kTile) {
    int32_t acc[kMicro][kMicro] = {};
    for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        int e = tid + u * kThreads;
        int r = e / kDepth, kk = e % kDepth;
        int64_t gr = row0 + r, gk = k0 + kk;
        As[kk][r] = (gr < m && gk < k) ? int32_t(A[gr * a_rs + gk * a_cs]) : 0;
        int bk = e / kTile, bc = e % kTile;
        int64_t gbk = k0 + bk, gc = col0 + bc;
        Bs[bk][bc] = (gbk < k && gc < n) ? int32_t(B[gbk * b_rs + gc * b_cs]) : 0;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kDepth; ++kk)
#pragma unroll
        for (int i = 0; i < kMicro; ++i)
#pragma unroll
          for (int j = 0; j < kMicro; ++j) acc[i][j] += As[kk][ty + 16 * i] * Bs[kk][tx + 16 * j];
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
      int64_t gr = row0 + ty + 16 * i;
      if (gr >= m) continue;
#pragma unroll
      for (int j = 0; j < kMicro; ++j) {
        int64_t gc = col0 + tx + 16 * j;
        if (gc < n) C[gr * c_rs + gc] = acc[i][j];
      }
    }
  }
}

template <class A, class O>
__global__ void k_int8_epilogue(Int8EpilogueArgs p) {
  const int64_t total = p.m * p.n;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = e / p.n, j = e - i * p.n;
    float v = float(static_cast<const A*>(p.acc)[e]) * p.xs[i] * p.ws[j];
    if (p.bias) v += float(static_cast<const O*>(p.bias)[j]);
    static_cast<O*>(p.out)[e] = convert<O>(v);
  }
}

}  // namespace

void matmul_i8(const MatmulArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  int64_t gx = (a.n + kTile - 1) / kTile, gy = (a.m + kTile - 1) / kTile;
  if (gx > int64_t(INT32_MAX)) throw ValueError("int8 matmul: n is too large for the CUDA kernel");
  dim3 grid(unsigned(gx), unsigned(std::min<int64_t>(gy, kMaxGridYZ)));
  k_matmul_i8<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const int8_t*>(a.a), static_cast<const int8_t*>(a.b), static_cast<int32_t*>(a.c), a.m, a.n, a.k,
      a.a_rs, a.a_cs, a.b_rs, a.b_cs, a.c_rs);
  GK_LAUNCH_CHECK("matmul_i8");
}

void int8_epilogue(const Int8EpilogueArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  int64_t blocks = std::min<int64_t>((a.m * a.n + 255) / 256, int64_t(132) * 32);
  const bool f = a.acc_dtype == DType::f32;
  switch (a.out_dtype) {
    case DType::f32:
      f ? k_int8_epilogue<float, float><<<unsigned(blocks), 256, 0, s>>>(a)
        : k_int8_epilogue<int32_t, float><<<unsigned(blocks), 256, 0, s>>>(a);
      break;
    case DType::f16:
      f ? k_int8_epilogue<float, f16><<<unsigned(blocks), 256, 0, s>>>(a)
        : k_int8_epilogue<int32_t, f16><<<unsigned(blocks), 256, 0, s>>>(a);
      break;
    case DType::bf16:
      f ? k_int8_epilogue<float, bf16><<<unsigned(blocks), 256, 0, s>>>(a)
        : k_int8_epilogue<int32_t, bf16><<<unsigned(blocks), 256, 0, s>>>(a);
      break;
    default: throw ValueError(cat("int8_linear: unsupported output dtype ", dtype_name(a.out_dtype)));
  }
  GK_LAUNCH_CHECK("int8_epilogue");
}

void gemm_epilogue(const EpilogueArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (a.acc_dtype == DType::f64) {
    if (a.out_dtype != DType::f64) throw ValueError("gemm_epilogue: float64 accumulators need a float64 output");
    return launch_epilogue<double, double>(a, s);
  }
  switch (a.out_dtype) {
    case DType::f32: return launch_epilogue<float, float>(a, s);
    case DType::f16: return launch_epilogue<float, f16>(a, s);
    case DType::bf16: return launch_epilogue<float, bf16>(a, s);
    default: throw ValueError(cat("gemm_epilogue: unsupported output dtype ", dtype_name(a.out_dtype)));
  }
}

void matmul(const MatmulArgs& a, void* stream) {
  if (a.batch <= 0 || a.m <= 0 || a.n <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case DType::f32: return launch_out<float>(a, s);
    case DType::f64: return launch_out<double>(a, s);
    case DType::f16: return launch_out<f16>(a, s);
    case DType::bf16: return launch_out<bf16>(a, s);
    default: throw ValueError(cat("matmul: unsupported dtype ", dtype_name(a.dtype)));
  }
}

}  // namespace gk::cuda
