// Quantized decode GEMV (W8A16 fp8-e4m3 / int8 with per-channel scales, W4A16 int4
// with group scales and zero points; formats in ops/quant_args.h). Same plan as
// gemv.cu: two output rows per warp, each lane streams 16-byte vectors of both rows
// (16 weights for 8-bit formats, 32 for int4) with several loads in flight, x read
// through the read-only cache in bf16/fp16, fp32 accumulation, a fixed xor-butterfly
// over the lanes, and a deterministic split-K (slices summed in order by a second
// kernel) for small N.
//   fp8/int8: sum of float(q) * x per row, times the row's scale at the end.
//   int4: per 32-weight vector (inside one group, since G % 32 == 0), the exact small
//         integers (q - z) times x are summed, then scaled by s[j, g] into the row sum.
// The front end guarantees 16-byte aligned q rows and x rows, K % 16 == 0 (8-bit)
// and G % 32 == 0, K % G == 0 (int4); GGUF Q8_0 / Q4_0 blocks (k_ggml_gemv) need
// only K % 32 == 0 and 2-byte aligned rows.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_util.h"
#include "ops/backend.h"
#include "ops/gguf_blocks.h"
#include "ops/quant_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("gemv_fp8", "gemv_int8", "gemv_int4", "gemv_q8_0", "gemv_q4_0");

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 2;
constexpr int kMaxSplit = 16;
constexpr int kTargetWarps = 132 * 32;

template <class T>
__device__ __forceinline__ float2 pair(uint32_t v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  } else {
    __half2 h = *reinterpret_cast<__half2*>(&v);
    return __half22float2(h);
  }
}

// Eight x values (one uint4) against eight decoded weights.
template <class T>
__device__ __forceinline__ float dot8(const uint4& x, const float* wf, float acc) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 a = pair<T>(xs[i]);
    acc = fmaf(a.x, wf[2 * i], acc);
    acc = fmaf(a.y, wf[2 * i + 1], acc);
  }
  return acc;
}

// Decodes 16 bytes of weights into E floats (fp8/int8: 16 values; int4: 32 values q - z).
template <int F>
__device__ __forceinline__ void decode(const uint4& v, float* out, int zero) {
  const uint32_t ws[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t u = ws[i];
    if constexpr (F == int(QFormat::fp8)) {
      __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u & 0xffffu), __NV_E4M3);
      __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u >> 16), __NV_E4M3);
      float2 a = __half22float2(*reinterpret_cast<__half2*>(&lo));
      float2 b = __half22float2(*reinterpret_cast<__half2*>(&hi));
      out[4 * i] = a.x;
      out[4 * i + 1] = a.y;
      out[4 * i + 2] = b.x;
      out[4 * i + 3] = b.y;
    } else if constexpr (F == int(QFormat::int8)) {
#pragma unroll
      for (int b = 0; b < 4; ++b) out[4 * i + b] = float(int8_t(uint8_t(u >> (8 * b))));
    } else {
#pragma unroll
      for (int b = 0; b < 8; ++b) out[8 * i + b] = float(int((u >> (4 * b)) & 0xfu) - zero);
    }
  }
}

__device__ __forceinline__ void store(void* y, DType t, int64_t i, float v) {
  if (t == DType::f32) static_cast<float*>(y)[i] = v;
  else if (t == DType::bf16) static_cast<bf16*>(y)[i] = convert<bf16>(v);
  else static_cast<f16*>(y)[i] = convert<f16>(v);
}

template <class T, int F, int MT>
__global__ void __launch_bounds__(kThreads) k_qgemv(QGemvArgs p) {
  constexpr bool kInt4 = F == int(QFormat::int4);
  constexpr int E = kInt4 ? 32 : 16;  // weights per 16-byte vector
  constexpr int U = MT >= 4 ? 1 : 2;  // vectors per row in flight per lane
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= p.n) return;
  const int s = blockIdx.y, S = gridDim.y;
  const int m = int(p.m);
  const int64_t rows[kRows] = {row0, row0 + 1 < p.n ? row0 + 1 : row0};
  const T* x = static_cast<const T*>(p.x);
  const uint4* wq[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    wq[r] = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.q) + rows[r] * p.q_rs);
  const int64_t ng = kInt4 ? p.k / p.group : 1;
  float acc[MT][kRows];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = 0.0f;

  const int64_t kv = p.k / E;
  const int64_t nch = (kv + 31) / 32;
  const int64_t cps = (nch + S - 1) / S;
  const int64_t c0 = int64_t(s) * cps, c1 = std::min(nch, c0 + cps);
  for (int64_t c = c0; c < c1; c += U) {
    uint4 wv[U][kRows];
    bool ok[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = (c + u) * 32 + lane;
      ok[u] = c + u < c1 && v < kv;
      if (ok[u]) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) wv[u][r] = __ldcs(wq[r] + v);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!ok[u]) continue;
      const int64_t v = (c + u) * 32 + lane;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float wf[E];
        float scale = 1.0f;
        int zero = 0;
        if constexpr (kInt4) {
          const int64_t g = rows[r] * ng + (v * E) / p.group;
          scale = __ldg(p.scales + g);
          zero = int(__ldg(p.zeros + g));
        }
        decode<F>(wv[u][r], wf, zero);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          if (i < m) {
            const uint4* xv = reinterpret_cast<const uint4*>(x + i * p.x_rs) + v * (E / 8);
            float d = 0.0f;
#pragma unroll
            for (int h = 0; h < E / 8; ++h) d = dot8<T>(__ldg(xv + h), wf + 8 * h, d);
            if constexpr (kInt4) acc[i][r] = fmaf(scale, d, acc[i][r]);
            else acc[i][r] += d;
          }
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
      float v = acc[i][r];
      if constexpr (!kInt4) v *= __ldg(p.scales + row);
      if (S == 1) store(p.y, p.out_dtype, i * p.n + row, v);
      else p.part[(int64_t(s) * p.m + i) * p.n + row] = v;
    }
  }
}

// GGUF Q8_0 / Q4_0: one 32-weight block per lane per step (blocks are 34 / 18 bytes, so
// only 2-byte aligned: read as 16-bit words). The block's integer codes times x are
// summed exactly-ordered in fp32, then scaled by the block's d.
template <class T, int F, int MT>
__global__ void __launch_bounds__(kThreads) k_ggml_gemv(QGemvArgs p) {
  constexpr bool kQ8 = F == int(QFormat::q8_0);
  constexpr int BB = kQ8 ? gguf::kQ8_0Bytes : gguf::kQ4_0Bytes;
  constexpr int W16 = BB / 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= p.n) return;
  const int s = blockIdx.y, S = gridDim.y;
  const int m = int(p.m);
  const int64_t rows[kRows] = {row0, row0 + 1 < p.n ? row0 + 1 : row0};
  const T* x = static_cast<const T*>(p.x);
  float acc[MT][kRows];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = 0.0f;
  const int64_t nb = p.k / gguf::kBlock;
  const int64_t nch = (nb + 31) / 32;
  const int64_t cps = (nch + S - 1) / S;
  const int64_t c0 = int64_t(s) * cps, c1 = std::min(nch, c0 + cps);
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t blk = c * 32 + lane;
    if (blk >= nb) continue;
    uint16_t raw[kRows][W16];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint16_t* b = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(p.q) + rows[r] * p.q_rs +
                                                            blk * BB);
#pragma unroll
      for (int h = 0; h < W16; ++h) raw[r][h] = __ldcs(b + h);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(raw[r]);
      const float d = gguf::block_scale(bytes);
      float wf[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) wf[j] = float(kQ8 ? gguf::q8_0_code(bytes, j) : gguf::q4_0_code(bytes, j));
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i < m) {
          const uint4* xv = reinterpret_cast<const uint4*>(x + i * p.x_rs) + blk * 4;
          float dsum = 0.0f;
#pragma unroll
          for (int h = 0; h < 4; ++h) dsum = dot8<T>(__ldg(xv + h), wf + 8 * h, dsum);
          acc[i][r] = fmaf(d, dsum, acc[i][r]);
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

__global__ void k_qsum(const float* __restrict__ part, void* y, DType out, int64_t mn, int S) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < mn; i += int64_t(gridDim.x) * blockDim.x) {
    float v = part[i];
    for (int s = 1; s < S; ++s) v += part[int64_t(s) * mn + i];
    store(y, out, i, v);
  }
}

template <class T, int F>
void launch(const QGemvArgs& p, cudaStream_t st) {
  const int64_t blocks = (p.n + kWarps * kRows - 1) / (kWarps * kRows);
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, p.split)));
  if constexpr (F == int(QFormat::q8_0) || F == int(QFormat::q4_0)) {
    if (p.m <= 1) k_ggml_gemv<T, F, 1><<<grid, kThreads, 0, st>>>(p);
    else if (p.m <= 2) k_ggml_gemv<T, F, 2><<<grid, kThreads, 0, st>>>(p);
    else if (p.m <= 4) k_ggml_gemv<T, F, 4><<<grid, kThreads, 0, st>>>(p);
    else k_ggml_gemv<T, F, 8><<<grid, kThreads, 0, st>>>(p);
  } else {
    if (p.m <= 1) k_qgemv<T, F, 1><<<grid, kThreads, 0, st>>>(p);
    else if (p.m <= 2) k_qgemv<T, F, 2><<<grid, kThreads, 0, st>>>(p);
    else if (p.m <= 4) k_qgemv<T, F, 4><<<grid, kThreads, 0, st>>>(p);
    else k_qgemv<T, F, 8><<<grid, kThreads, 0, st>>>(p);
  }
  GK_LAUNCH_CHECK("qgemv");
  if (p.split > 1) {
    const int64_t mn = p.m * p.n;
    k_qsum<<<unsigned(std::min<int64_t>((mn + 255) / 256, 132 * 8)), 256, 0, st>>>(p.part, p.y, p.out_dtype, mn,
                                                                                   p.split);
    GK_LAUNCH_CHECK("qgemv_sum");
  }
}

template <class T>
void by_format(const QGemvArgs& p, cudaStream_t st) {
  switch (p.fmt) {
    case QFormat::fp8: return launch<T, int(QFormat::fp8)>(p, st);
    case QFormat::int8: return launch<T, int(QFormat::int8)>(p, st);
    case QFormat::int4: return launch<T, int(QFormat::int4)>(p, st);
    case QFormat::q8_0: return launch<T, int(QFormat::q8_0)>(p, st);
    case QFormat::q4_0: return launch<T, int(QFormat::q4_0)>(p, st);
  }
}

}  // namespace

int qgemv_split(int64_t n, int64_t k) {
  const int64_t warps = (n + kRows - 1) / kRows;
  const int64_t chunks = (k / 16 + 31) / 32;
  int64_t s = warps >= kTargetWarps ? 1 : kTargetWarps / std::max<int64_t>(warps, 1);
  s = std::min<int64_t>({s, int64_t(kMaxSplit), std::max<int64_t>(chunks / 4, 1)});
  return int(std::max<int64_t>(s, 1));
}

void qgemv(const QGemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.m > 8) throw ValueError("gemv: the kernel takes at most 8 rows of x");
  auto s = static_cast<cudaStream_t>(stream);
  if (a.x_dtype == DType::bf16) return by_format<bf16>(a, s);
  if (a.x_dtype == DType::f16) return by_format<f16>(a, s);
  throw TypeError(cat("gemv: unsupported activation dtype ", dtype_name(a.x_dtype)));
}

}  // namespace gk::cuda
