// Decode GEMV (M = 1..8): y[m, j] = sum_k x[m, k] * w[j, k] with bf16/fp16 x and w,
// fp32 accumulation. The weight read is the whole cost, so the kernel is built
// to stream it at the bandwidth limit:
//
// - a block of 8 warps; each warp owns kRows = 2 consecutive output rows, so x is
//   loaded once per two weight rows;
// - each lane reads 16-byte vectors (8 elements) of both rows, U vectors per row
//   issued before any is used (U = 4 for M <= 2, 2 for larger M), with the
//   streaming cache hint (weights are read once); x vectors come through the
//   read-only cache (x is tiny and shared by every warp);
// - lane l takes vectors l, l + 32, ... of its k range; the 32 lane sums are then
//   combined with a fixed xor-butterfly of shuffles: the same order on every run;
// - split-K for small N (gemv_split: a function of (N, K) only, never of M): slice s
//   of k writes fp32 partial sums to a workspace and a second kernel adds the slices
//   in slice order and rounds once. No atomics anywhere.
//
// Without 16-byte alignment (odd row strides or offsets) the same kernel reads
// single elements (vec = false); k % 8 != 0 leaves a scalar tail done by the last slice.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_util.h"
#include "ops/backend.h"
#include "ops/gemv_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("gemv");

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 2;
constexpr int kMaxSplit = 16;
constexpr int kTargetWarps = 132 * 32;  // enough rows of warps to cover an H200 several times

template <class T>
__device__ __forceinline__ float2 pair(uint32_t v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  } else {
    __half2 h = *reinterpret_cast<__half2*>(&v);
    return __half22float2(h);
  }
}

template <class T>
__device__ __forceinline__ float dot8(const uint4& x, const uint4& w, float acc) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 a = pair<T>(xs[i]), b = pair<T>(ws[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

__device__ __forceinline__ void store(void* y, DType t, int64_t i, float v) {
  if (t == DType::f32) static_cast<float*>(y)[i] = v;
  else if (t == DType::bf16) static_cast<bf16*>(y)[i] = convert<bf16>(v);
  else static_cast<f16*>(y)[i] = convert<f16>(v);
}

template <class T, int MT>
__global__ void __launch_bounds__(kThreads) k_gemv(GemvArgs p) {
  constexpr int U = MT >= 4 ? 2 : 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= p.n) return;  // a whole warp leaves; the kernel has no block barrier
  const int s = blockIdx.y, S = gridDim.y;
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  const bool has1 = row0 + 1 < p.n;
  const T* wr0 = w + row0 * p.w_rs;
  const T* wr1 = w + (has1 ? row0 + 1 : row0) * p.w_rs;
  const int m = int(p.m);
  float acc[MT][kRows];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = 0.0f;

  const int64_t kv = p.vec ? p.k / 8 : 0;  // 16-byte vectors per row
  const int64_t nch = (kv + 31) / 32;      // chunks of 32 vectors, one per lane
  const int64_t cps = (nch + S - 1) / S;
  const int64_t c0 = int64_t(s) * cps, c1 = std::min(nch, c0 + cps);
  const uint4* w0 = reinterpret_cast<const uint4*>(wr0);
  const uint4* w1 = reinterpret_cast<const uint4*>(wr1);
  for (int64_t c = c0; c < c1; c += U) {
    uint4 wv[U][kRows];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = (c + u) * 32 + lane;
      ok[u] = c + u < c1 && v < kv;
      if (ok[u]) {
        wv[u][0] = __ldcs(w0 + v);
        wv[u][1] = __ldcs(w1 + v);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const int64_t v = (c + u) * 32 + lane;
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i < m) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + i * p.x_rs) + v);
          acc[i][0] = dot8<T>(xv, wv[u][0], acc[i][0]);
          acc[i][1] = dot8<T>(xv, wv[u][1], acc[i][1]);
        }
      }
    }
  }
  if (s == S - 1) {  // elements after the last whole vector (all of k without vec)
    for (int64_t e = kv * 8 + lane; e < p.k; e += 32) {
      const float a0 = float(wr0[e]), a1 = float(wr1[e]);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i < m) {
          const float xf = float(x[i * p.x_rs + e]);
          acc[i][0] = fmaf(xf, a0, acc[i][0]);
          acc[i][1] = fmaf(xf, a1, acc[i][1]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float v = acc[i][r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[i][r] = v;
    }
  if (lane != 0) return;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (i >= m) break;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + r;
      if (row >= p.n) break;
      if (S == 1) store(p.y, p.out_dtype, i * p.n + row, acc[i][r]);
      else p.part[(int64_t(s) * p.m + i) * p.n + row] = acc[i][r];
    }
  }
}

// y[i] = sum over slices s = 0..S-1, in that order, of part[s][i].
__global__ void k_gemv_sum(const float* __restrict__ part, void* y, DType out, int64_t mn, int S) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < mn; i += int64_t(gridDim.x) * blockDim.x) {
    float v = part[i];
    for (int s = 1; s < S; ++s) v += part[int64_t(s) * mn + i];
    store(y, out, i, v);
  }
}

template <class T>
void launch(const GemvArgs& p, cudaStream_t st) {
  const int64_t blocks = (p.n + kWarps * kRows - 1) / (kWarps * kRows);
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, p.split)));
  if (p.m <= 1) k_gemv<T, 1><<<grid, kThreads, 0, st>>>(p);
  else if (p.m <= 2) k_gemv<T, 2><<<grid, kThreads, 0, st>>>(p);
  else if (p.m <= 4) k_gemv<T, 4><<<grid, kThreads, 0, st>>>(p);
  else k_gemv<T, 8><<<grid, kThreads, 0, st>>>(p);
  GK_LAUNCH_CHECK("gemv");
  if (p.split > 1) {
    const int64_t mn = p.m * p.n;
    const int64_t sb = std::min<int64_t>((mn + 255) / 256, 132 * 8);
    k_gemv_sum<<<unsigned(sb), 256, 0, st>>>(p.part, p.y, p.out_dtype, mn, p.split);
    GK_LAUNCH_CHECK("gemv_sum");
  }
}

}  // namespace

int gemv_split(int64_t n, int64_t k) {
  const int64_t warps = (n + kRows - 1) / kRows;
  const int64_t chunks = (k / 8 + 31) / 32;  // a slice holds at least one chunk of 256 elements
  int64_t s = warps >= kTargetWarps ? 1 : kTargetWarps / std::max<int64_t>(warps, 1);
  s = std::min<int64_t>({s, int64_t(kMaxSplit), std::max<int64_t>(chunks / 4, 1)});
  return int(std::max<int64_t>(s, 1));
}

void gemv(const GemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.m > 8) throw ValueError("gemv: the kernel takes at most 8 rows of x");
  auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case DType::f16: return launch<f16>(a, s);
    case DType::bf16: return launch<bf16>(a, s);
    default: throw TypeError(cat("gemv: unsupported weight dtype ", dtype_name(a.dtype)));
  }
}

}  // namespace gk::cuda
