// gpukit's block-scaled FP8 GEMM (the fallback when cuBLASLt's block-scaled kernels
// cannot take the problem) and the fp8 block quantizer. Both follow the CPU
// reference (src/cpu/fp8_block.cpp) bit for bit: products of e4m3 values are exact
// in fp32, each thread sums its block of 128 K values in increasing order, folds the
// block sum into the accumulator with the scale product (explicit _rn operations, no
// contraction), and adds the bias last.
//
// GEMM: a block of 256 threads owns a 64x64 tile of y; K is walked 32 deep through
// shared memory (values converted to float as they are staged); each thread holds a
// 4x4 micro-tile (rows ty + 16*i, columns tx + 16*j).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_util.h"
#include "gpukit/numeric.h"
#include "ops/fp8_block_args.h"
#include "ops/registry.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("fp8_block_linear", "quantize_fp8_blocks");

namespace {

constexpr int kTile = 64, kDepth = 32, kThreads = 256, kMicro = 4;
constexpr unsigned kMaxGridY = 65535;

template <class O>
__global__ void __launch_bounds__(kThreads) k_fp8_block(const uint8_t* __restrict__ x, const uint8_t* __restrict__ w,
                                                        const float* __restrict__ xs, const float* __restrict__ ws,
                                                        const O* __restrict__ bias, O* __restrict__ out, int64_t m,
                                                        int64_t n, int64_t k, int64_t x_rs, int64_t w_rs) {
  __shared__ float As[kDepth][kTile + 1];
  __shared__ float Bs[kDepth][kTile + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t col0 = int64_t(blockIdx.x) * kTile;
  const int64_t nb = (k + kFp8Block - 1) / kFp8Block;
  for (int64_t row0 = int64_t(blockIdx.y) * kTile; row0 < m; row0 += int64_t(gridDim.y) * kTile) {
    float acc[kMicro][kMicro];
#pragma unroll
    for (int i = 0; i < kMicro; ++i)
#pragma unroll
      for (int j = 0; j < kMicro; ++j) acc[i][j] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      float part[kMicro][kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) part[i][j] = 0.0f;
      const int64_t kb1 = min(k, (b + 1) * kFp8Block);
      for (int64_t k0 = b * kFp8Block; k0 < kb1; k0 += kDepth) {
        // 64 rows x 32 k of x and of w: 2048 values each, 8 per thread (consecutive threads walk k)
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          int e = tid + u * kThreads;
          int r = e / kDepth, kk = e % kDepth;
          int64_t gk = k0 + kk;
          int64_t gr = row0 + r, gc = col0 + r;
          As[kk][r] = (gr < m && gk < kb1) ? float(f8e4m3::from_bits(x[gr * x_rs + gk])) : 0.0f;
          Bs[kk][r] = (gc < n && gk < kb1) ? float(f8e4m3::from_bits(w[gc * w_rs + gk])) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kDepth; ++kk) {
          float av[kMicro], bv[kMicro];
#pragma unroll
          for (int i = 0; i < kMicro; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
          for (int j = 0; j < kMicro; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < kMicro; ++i)
#pragma unroll
            for (int j = 0; j < kMicro; ++j) part[i][j] = fmaf(av[i], bv[j], part[i][j]);  // product exact
        }
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
        int64_t gr = row0 + ty + 16 * i;
        float sx = gr < m ? xs[gr * nb + b] : 0.0f;
#pragma unroll
        for (int j = 0; j < kMicro; ++j) {
          int64_t gc = col0 + tx + 16 * j;
          float sw = gc < n ? ws[(gc / kFp8Block) * nb + b] : 0.0f;
          acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(__fmul_rn(sx, sw), part[i][j]));
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
      int64_t gr = row0 + ty + 16 * i;
      if (gr >= m) continue;
#pragma unroll
      for (int j = 0; j < kMicro; ++j) {
        int64_t gc = col0 + tx + 16 * j;
        if (gc >= n) continue;
        float v = acc[i][j];
        if (bias) v = __fadd_rn(v, float(bias[gc]));
        out[gr * n + gc] = convert<O>(v);
      }
    }
  }
}

// One block of 128 threads per (row block, 128-column block): thread t owns column
// c0 + t over the block's rows; the block maximum is exact whatever the order.
template <class T>
__global__ void k_quant(const T* __restrict__ in, int64_t rows, int64_t cols, int64_t in_rs, int64_t block_rows,
                        uint8_t* __restrict__ q, float* __restrict__ s) {
  __shared__ float red[128];
  const int t = threadIdx.x;
  const int64_t nbc = (cols + kFp8Block - 1) / kFp8Block;
  const int64_t cb = blockIdx.x;
  for (int64_t rb = blockIdx.y; rb * block_rows < rows; rb += gridDim.y) {
    const int64_t r0 = rb * block_rows, r1 = min(rows, r0 + block_rows);
    const int64_t c = cb * kFp8Block + t;
    float amax = 0.0f;
    if (c < cols)
      for (int64_t r = r0; r < r1; ++r) amax = fmaxf(amax, fabsf(float(in[r * in_rs + c])));
    red[t] = amax;
    __syncthreads();
    for (int h = 64; h > 0; h >>= 1) {
      if (t < h) red[t] = fmaxf(red[t], red[t + h]);
      __syncthreads();
    }
    float sc = __fdiv_rn(red[0], 448.0f);
    if (!(sc > 0.0f) || !isfinite(sc)) sc = 1.0f;
    if (t == 0) s[rb * nbc + cb] = sc;
    if (c < cols)
      for (int64_t r = r0; r < r1; ++r) q[r * cols + c] = f8e4m3(__fdiv_rn(float(in[r * in_rs + c]), sc)).bits;
    __syncthreads();
  }
}

}  // namespace

void fp8_block_gemm(const Fp8BlockArgs& p, void* stream) {
  if (p.m <= 0 || p.n <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  int64_t gx = (p.n + kTile - 1) / kTile, gy = (p.m + kTile - 1) / kTile;
  if (gx > int64_t(INT32_MAX)) throw ValueError("fp8_block_linear: n is too large for the CUDA kernel");
  dim3 grid(unsigned(gx), unsigned(std::min<int64_t>(gy, kMaxGridY)));
  auto run = [&](auto tag) {
    using O = decltype(tag);
    k_fp8_block<O><<<grid, kThreads, 0, s>>>(p.x, p.w, p.xs, p.ws, static_cast<const O*>(p.bias),
                                             static_cast<O*>(p.out), p.m, p.n, p.k, p.x_rs, p.w_rs);
  };
  switch (p.out_dtype) {
    case DType::f32: run(float{}); break;
    case DType::f16: run(f16{}); break;
    case DType::bf16: run(bf16{}); break;
    default: throw ValueError(cat("fp8_block_linear: unsupported output dtype ", dtype_name(p.out_dtype)));
  }
  GK_LAUNCH_CHECK("fp8_block_linear");
}

void quantize_fp8_blocks(const Fp8QuantArgs& p, void* stream) {
  if (p.rows <= 0 || p.cols <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  int64_t nbc = (p.cols + kFp8Block - 1) / kFp8Block, nbr = (p.rows + p.block_rows - 1) / p.block_rows;
  if (nbc > int64_t(INT32_MAX)) throw ValueError("quantize_fp8_blocks: too many columns for the CUDA kernel");
  dim3 grid(unsigned(nbc), unsigned(std::min<int64_t>(nbr, kMaxGridY)));
  auto run = [&](auto tag) {
    using T = decltype(tag);
    k_quant<T><<<grid, 128, 0, s>>>(static_cast<const T*>(p.in), p.rows, p.cols, p.in_rs, p.block_rows, p.q, p.s);
  };
  switch (p.in_dtype) {
    case DType::f32: run(float{}); break;
    case DType::f16: run(f16{}); break;
    case DType::bf16: run(bf16{}); break;
    default: throw TypeError(cat("quantize_fp8_blocks: unsupported input dtype ", dtype_name(p.in_dtype)));
  }
  GK_LAUNCH_CHECK("quantize_fp8_blocks");
}

}  // namespace gk::cuda
