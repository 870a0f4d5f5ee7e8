// More of the engine's kernels (see src/llm/fused.h): the decode step's first launch
// (embedding row gather + RMSNorm), the L2 prefetch of weights the next kernels read
// (a side branch of the step while attention runs), and the quantized prefill's
// pieces (a layer's quantized weight expanded to bf16/fp16 for the GEMM, the
// per-output-channel scale applied to the GEMM's float32 result).
#include <algorithm>
#include <cstring>

#include "core/cuda_util.h"
#include "cuda/common/rows.cuh"
#include "cuda/llm_common.cuh"
#include "cuda/llm_norm_reg.cuh"
#include "llm/fused.h"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace llmk;

// ---- embedding + RMSNorm (the row in registers) ----
// x_out[t] = table[ids[t]] and h_out[t] = rms_norm(x_out[t]) * w, with the per-thread
// order and block sum of add_rms_norm. An id outside [0, V) gives rows of zeros.
template <class T, int NV>
__global__ void __launch_bounds__(256) k_embed_norm(const llm::EmbedNormArgs a) {
  __shared__ float sh[32];
  constexpr int N = 16 / int(sizeof(T));
  const int64_t row = blockIdx.x;
  const int64_t step = int64_t(blockDim.x) * N;
  Vec<T, N> wv[NV], xv[NV];
  load_row_reg(wv, static_cast<const T*>(a.w), a.H);
  pdl_trigger();
  pdl_wait();
  const int64_t id = a.ids[row];
  const bool ok = id >= 0 && id < a.V;
  const T* x = static_cast<const T*>(a.table) + (ok ? id : 0) * a.table_rs;
  float ss = 0.f;
  T* xo = static_cast<T*>(a.x_out) + row * a.H;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t i = int64_t(threadIdx.x) * N + k * step;
    if (i < a.H) {
      if (ok) {
        xv[k] = *reinterpret_cast<const Vec<T, N>*>(x + i);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) xv[k].v[j] = convert<T>(0.f);
      }
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float f = float(xv[k].v[j]);
        ss = fmaf(f, f, ss);
      }
      *reinterpret_cast<Vec<T, N>*>(xo + i) = xv[k];
    }
  }
  const float inv = rsqrtf(row_sum(ss, sh) / float(a.H) + a.eps);
  store_norm_reg(static_cast<T*>(a.h_out) + row * a.H, xv, wv, inv, a.H);
}

// ---- L2 prefetch ----
// Fire-and-forget prefetches of every 128-byte line of up to 4 regions; nothing waits
// for them (a side branch of the step: the kernels that read these bytes find them in L2).
template <bool LAST>
__global__ void __launch_bounds__(256) k_prefetch_l2(const llm::PrefetchArgs a) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, nth = int64_t(gridDim.x) * blockDim.x;
  for (int r = 0; r < a.n; ++r) {
    const uintptr_t b0 = reinterpret_cast<uintptr_t>(a.p[r]) & ~uintptr_t(127);
    const uintptr_t e = reinterpret_cast<uintptr_t>(a.p[r]) + uintptr_t(a.bytes[r]);
    const int64_t lines = int64_t((e - b0 + 127) / 128);
    for (int64_t i = tid; i < lines; i += nth) {
      const void* p = reinterpret_cast<const void*>(b0 + uintptr_t(i) * 128);
      if constexpr (LAST) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
      else asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
  }
}

// ---- quantized weight -> bf16 / fp16 (prefill) ----
// fp8 e4m3 and int8: the code values (exact in bf16 and fp16; the per-row scale is
// applied to the GEMM's result); int4: (q - z) * s rounded once. One thread per 8
// outputs of a row.
__device__ __forceinline__ float e4m3_to_float(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 0) v = ldexpf(float(m), -9);  // subnormal: m * 2^-6 / 8
  else if (e == 15 && m == 7) v = __int_as_float(0x7fc00000);  // NaN
  else v = ldexpf(float(8 + m), e - 10);  // (1 + m/8) * 2^(e-7)
  return s ? -v : v;
}

template <class T>
__global__ void __launch_bounds__(256) k_dequant(const llm::DequantArgs a) {
  const int64_t per_row = a.k / 8;
  const int64_t total = a.n * per_row;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = u / per_row, c = (u - j * per_row) * 8;
    Vec<T, 8> o;
    if (a.fmt == 0 || a.fmt == 1) {  // fp8, int8: 8 bytes
      const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(a.q) + j * a.q_rs + c);
      uint8_t b[8];
      memcpy(b, &raw, 8);
#pragma unroll
      for (int e = 0; e < 8; ++e) o.v[e] = convert<T>(a.fmt == 0 ? e4m3_to_float(b[e]) : float(int8_t(b[e])));
    } else {  // int4: 4 bytes, low nibble first
      const uint32_t raw = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(a.q) + j * a.q_rs + c / 2);
      const int64_t g = j * (a.k / a.group) + c / a.group;  // 8 | group: one group
      const float s = a.scales[g];
      const int z = a.zeros[g];
#pragma unroll
      for (int e = 0; e < 8; ++e) o.v[e] = convert<T>(float(int((raw >> (4 * e)) & 15u) - z) * s);
    }
    *reinterpret_cast<Vec<T, 8>*>(static_cast<T*>(a.out) + j * a.k + c) = o;
  }
}

// y[i, j] = round(acc[i, j] * scales[j]) (fp8 / int8 prefill: the per-row scale of the
// weight on the float32 GEMM result)
template <class O>
__global__ void __launch_bounds__(256) k_scale_cols(const float* acc, const float* scales, O* y, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    y[e] = convert<O>(acc[e] * scales[e % n]);
}

unsigned grid_for(int64_t work) { return unsigned(std::max<int64_t>(1, std::min<int64_t>((work + 255) / 256, 132 * 32))); }

}  // namespace

void llm_embed_norm(const llm::EmbedNormArgs& a, void* stream) {
  if (a.T <= 0 || a.H <= 0) return;
  if (a.T > int64_t(INT32_MAX)) throw ValueError("embed_norm: too many rows");
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_float(a.dtype, [&](auto tv) {
    using T = decltype(tv);
    const int64_t per = a.H / (16 / int64_t(sizeof(T)));
    if (a.H % (16 / int64_t(sizeof(T))) || per > 256 * 4) throw ValueError("embed_norm: H must fit the register rows");
    const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (per + 31) / 32 * 32)));
    launch_ex(k_embed_norm<T, 4>, dim3(unsigned(a.T)), dim3(unsigned(threads)), st, a.pdl, "llm_embed_norm", a);
  });
}

void llm_prefetch_l2(const llm::PrefetchArgs& a, bool evict_last, void* stream) {
  int64_t lines = 0;
  for (int r = 0; r < a.n; ++r) lines += a.bytes[r] / 128 + 2;
  if (lines <= 2) return;
  const unsigned blocks = unsigned(std::min<int64_t>((lines + 256 * 4 - 1) / (256 * 4), 264));
  auto st = static_cast<cudaStream_t>(stream);
  if (evict_last) launch_ex(k_prefetch_l2<true>, dim3(blocks), dim3(256), st, false, "llm_prefetch_l2", a);
  else launch_ex(k_prefetch_l2<false>, dim3(blocks), dim3(256), st, false, "llm_prefetch_l2", a);
}

void llm_dequant(const llm::DequantArgs& a, void* stream) {
  if (a.n <= 0 || a.k <= 0) return;
  if (a.k % 8) throw ValueError("dequant: K must be a multiple of 8");
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned g = grid_for(a.n * (a.k / 8));
  if (a.out_dtype == DType::bf16) launch_ex(k_dequant<bf16>, dim3(g), dim3(256), st, false, "llm_dequant", a);
  else if (a.out_dtype == DType::f16) launch_ex(k_dequant<f16>, dim3(g), dim3(256), st, false, "llm_dequant", a);
  else throw TypeError("dequant: bfloat16 or float16 output expected");
}

void llm_scale_cols(const float* acc, const float* scales, void* y, int64_t m, int64_t n, DType out, void* stream) {
  if (m <= 0 || n <= 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  const unsigned g = grid_for(m * n);
  if (out == DType::f32) launch_ex(k_scale_cols<float>, dim3(g), dim3(256), st, false, "llm_scale_cols", acc, scales,
                                   static_cast<float*>(y), m, n);
  else if (out == DType::bf16) launch_ex(k_scale_cols<bf16>, dim3(g), dim3(256), st, false, "llm_scale_cols", acc,
                                         scales, static_cast<bf16*>(y), m, n);
  else if (out == DType::f16) launch_ex(k_scale_cols<f16>, dim3(g), dim3(256), st, false, "llm_scale_cols", acc,
                                        scales, static_cast<f16*>(y), m, n);
  else throw TypeError("scale_cols: float output expected");
}

}  // namespace gk::cuda
