// The engine's small decode kernels (see src/llm/fused.h): q/k RoPE + paged KV append,
// residual add + RMSNorm, SwiGLU and the step's input update, written for programmatic
// dependent launch (PDL) as the projection GEMV of llm_decode.cu is (the order of loads,
// launch_dependents and wait is described there).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_util.h"
#include "cuda/common/rows.cuh"
#include "cuda/llm_common.cuh"
#include "cuda/llm_norm_reg.cuh"
#include "llm/fused.h"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace llmk;

// ---- q/k RoPE + paged KV append ----
// One thread per item of a token (a q rotary pair, a k rotary pair, a k tail element, a v
// element; grid.y = token): every load is issued at once, nothing waits on a table. The
// rotation rounds each product (no fused multiply-add), as the q/k/v GEMV's epilogue
// does, so both give the same bits.
template <class T, bool IL>
__device__ __forceinline__ void rope_item(const llm::RopeAppendArgs& a, int64_t t, int u, int32_t p) {
  const int n = a.rd / 2;
  const int qpairs = a.hq * n, kpairs = a.hkv * n, ktail = a.hkv * (a.D - a.rd);
  if (u < qpairs + kpairs) {
    const bool isq = u < qpairs;
    const int w = isq ? u : u - qpairs, h = w / n, i = w - h * n;
    const int i1 = IL ? 2 * i : i, i2 = IL ? 2 * i + 1 : i + n;
    const T* src = isq ? static_cast<const T*>(a.q) + t * a.q_ts + h * a.q_hs
                       : static_cast<const T*>(a.k) + t * a.k_ts + h * a.k_hs;
    const float x1 = float(src[i1]), x2 = float(src[i2]);
    float sn, cs, r1, r2;
    sincosf(float(p) * a.inv_freq[i], &sn, &cs);
    rotate(x1, x2, __fmul_rn(cs, a.mscale), __fmul_rn(sn, a.mscale), r1, r2);
    if (isq) {
      T* q = static_cast<T*>(a.q) + t * a.q_ts + h * a.q_hs;
      q[i1] = convert<T>(r1);
      q[i2] = convert<T>(r2);
      return;
    }
    int64_t slot;
    if (!llm_slot(a, t, p, slot)) return;
    T* kc = static_cast<T*>(a.kc) + (slot * a.hkv + h) * a.D;
    kc[i1] = convert<T>(r1);
    kc[i2] = convert<T>(r2);
    return;
  }
  int64_t slot;
  if (!llm_slot(a, t, p, slot)) return;
  if (u < qpairs + kpairs + ktail) {
    const int tl = a.D - a.rd, w = u - qpairs - kpairs, h = w / tl, i = a.rd + (w - h * tl);
    static_cast<T*>(a.kc)[(slot * a.hkv + h) * a.D + i] = static_cast<const T*>(a.k)[t * a.k_ts + h * a.k_hs + i];
  } else {
    const int w = u - qpairs - kpairs - ktail, h = w / a.D, i = w - h * a.D;
    static_cast<T*>(a.vc)[(slot * a.hkv + h) * a.D + i] = static_cast<const T*>(a.v)[t * a.v_ts + h * a.v_hs + i];
  }
}

// One thread per item of a token (grid.y = token; with a grid cap, a thread takes items
// u, u + the grid's threads, ...).
template <class T, bool IL>
__global__ void __launch_bounds__(128) k_rope_append(const __grid_constant__ llm::RopeAppendArgs a) {
  l2_prefetch_part(a.l2, a.l2_bytes, int64_t(blockIdx.y) * gridDim.x + blockIdx.x, int64_t(gridDim.x) * gridDim.y);
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.y;
  const int items = a.hq * (a.rd / 2) + a.hkv * (a.rd / 2) + a.hkv * (a.D - a.rd) + a.hkv * a.D;
  const int32_t p = a.pos[t];
  for (int u = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x); u < items; u += int(gridDim.x * blockDim.x))
    rope_item<T, IL>(a, t, u, p);
}

// ---- residual add + RMSNorm ----
template <class T, bool VEC>
__global__ void __launch_bounds__(256) k_add_rms_norm(const llm::AddNormArgs a) {
  __shared__ float sh[32];
  pdl_trigger();
  pdl_wait();
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * a.x_rs;
  const T* res = static_cast<const T*>(a.res) + row * a.res_rs;
  const T* w = static_cast<const T*>(a.w);
  T* out = static_cast<T*>(a.out) + row * a.H;
  T* ro = static_cast<T*>(a.res_out) + row * a.H;
  constexpr int N = VEC ? 16 / int(sizeof(T)) : 1;
  float ss = 0.f;
  for (int64_t i = int64_t(threadIdx.x) * N; i < a.H; i += int64_t(blockDim.x) * N) {
    Vec<T, N> xv = *reinterpret_cast<const Vec<T, N>*>(x + i);
    Vec<T, N> rv = *reinterpret_cast<const Vec<T, N>*>(res + i);
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      o.v[j] = convert<T>(float(xv.v[j]) + float(rv.v[j]));
      const float f = float(o.v[j]);
      ss = fmaf(f, f, ss);
    }
    *reinterpret_cast<Vec<T, N>*>(ro + i) = o;
  }
  const float inv = rsqrtf(row_sum(ss, sh) / float(a.H) + a.eps);
  for (int64_t i = int64_t(threadIdx.x) * N; i < a.H; i += int64_t(blockDim.x) * N) {
    Vec<T, N> rv = *reinterpret_cast<const Vec<T, N>*>(ro + i);  // this thread's own writes
    Vec<T, N> wv = *reinterpret_cast<const Vec<T, N>*>(w + i);
    Vec<T, N> o;
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = convert<T>(float(rv.v[j]) * inv * float(wv.v[j]));
    *reinterpret_cast<Vec<T, N>*>(out + i) = o;
  }
}

// The same with the row held in registers (H <= blockDim * N * NV, aligned rows): the
// weights are read before waiting for the previous kernel, x and the residual in one
// round of loads; the sums and roundings of k_add_rms_norm, so the same bits.
//
// XH (EngineOptions::quantized_x_prep, bf16): also the fp8 / int8 staged GEMV's scaled fp16 x
// of the output row (the values of gemv_w8.cu's k_w8_xprep from the same bf16 output: the
// largest |out| of the row lands in [2^14, 2^15) after the scaling by 2^c, c = 0 for a zero,
// inf or NaN maximum; xinv = 2^-c), so the GEMV needs no decode of x to bf16 products.
__device__ __forceinline__ int xprep_exponent(uint32_t mx) {
  if (mx == 0 || mx >= 0x7f80u) return 0;
  const int c = 14 - ilogbf(__uint_as_float(mx << 16));
  return c < -126 ? -126 : (c > 126 ? 126 : c);
}

template <int N, int NV>
__device__ __forceinline__ void store_xprep(const llm::AddNormArgs& a, int64_t row, const Vec<bf16, N> (&xv)[NV],
                                            const Vec<bf16, N> (&wv)[NV], float inv) {
  static_assert(N == 8, "16-byte vectors of bf16");
  __shared__ uint32_t mxs[32];
  const int64_t step = int64_t(blockDim.x) * N;
  Vec<bf16, N> o[NV];
  uint32_t mx = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t i = int64_t(threadIdx.x) * N + k * step;
    if (i < a.H) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        o[k].v[j] = convert<bf16>(float(xv[k].v[j]) * inv * float(wv[k].v[j]));  // store_norm_reg's value
        mx = max(mx, uint32_t(o[k].v[j].bits) & 0x7fffu);               // |bf16| orders as its bits
      }
    }
  }
  mx = __reduce_max_sync(0xffffffffu, mx);  // redux.sync (sm_80+)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (lane == 0) mxs[warp] = mx;
  __syncthreads();
  mx = mxs[0];
  for (int w = 1; w < nw; ++w) mx = max(mx, mxs[w]);
  const int c = xprep_exponent(mx);
  const float sc = __uint_as_float(uint32_t(c + 127) << 23);
  if (threadIdx.x == 0) a.xinv[row] = __uint_as_float(uint32_t(127 - c) << 23);
  f16* xh = static_cast<f16*>(a.xh) + row * a.H;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t i = int64_t(threadIdx.x) * N + k * step;
    if (i < a.H) {
      uint32_t w4[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __half2 h = __floats2half2_rn(float(o[k].v[2 * j]) * sc, float(o[k].v[2 * j + 1]) * sc);
        w4[j] = *reinterpret_cast<const uint32_t*>(&h);
      }
      *reinterpret_cast<uint4*>(xh + i) = make_uint4(w4[0], w4[1], w4[2], w4[3]);
    }
  }
}

template <class T, int NV, bool XH = false>
__global__ void __launch_bounds__(256) k_add_rms_norm_reg(const llm::AddNormArgs a) {
  __shared__ float sh[32];
  constexpr int N = 16 / int(sizeof(T));
  const int64_t row = blockIdx.x;
  const int64_t step = int64_t(blockDim.x) * N;
  Vec<T, N> wv[NV], xv[NV], rv[NV];
  load_row_reg(wv, static_cast<const T*>(a.w), a.H);
  pdl_trigger();
  pdl_wait();
  const T* x = static_cast<const T*>(a.x) + row * a.x_rs;
  const T* res = static_cast<const T*>(a.res) + row * a.res_rs;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t i = int64_t(threadIdx.x) * N + k * step;
    if (i < a.H) {
      xv[k] = *reinterpret_cast<const Vec<T, N>*>(x + i);
      rv[k] = *reinterpret_cast<const Vec<T, N>*>(res + i);
    }
  }
  float ss = 0.f;
  T* ro = static_cast<T*>(a.res_out) + row * a.H;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int64_t i = int64_t(threadIdx.x) * N + k * step;
    if (i < a.H) {
#pragma unroll
      for (int j = 0; j < N; ++j) {
        rv[k].v[j] = convert<T>(float(xv[k].v[j]) + float(rv[k].v[j]));
        const float f = float(rv[k].v[j]);
        ss = fmaf(f, f, ss);
      }
      *reinterpret_cast<Vec<T, N>*>(ro + i) = rv[k];
    }
  }
  const float inv = rsqrtf(row_sum(ss, sh) / float(a.H) + a.eps);
  store_norm_reg(static_cast<T*>(a.out) + row * a.H, rv, wv, inv, a.H);
  if constexpr (XH) store_xprep(a, row, rv, wv, inv);
}

// ---- SwiGLU of a [rows, 2 I] gate/up product (quantized weights: after gemv_quantized) ----
// out[r, j] = silu(g) * u of gu[r, j], gu[r, I + j]; one thread per element.
template <class T>
__global__ void __launch_bounds__(256) k_swiglu(const T* gu, T* out, int64_t rows, int64_t I, int64_t gu_rs) {
  pdl_trigger();
  pdl_wait();
  const int64_t n = rows * I;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / I, j = e - r * I;
    out[e] = convert<T>(gated_fn<nn::GatedAct::SwiGLU, float>(float(gu[r * gu_rs + j]), float(gu[r * gu_rs + I + j])));
  }
}

// ---- the step's input update: ids = tokens, positions and lengths + 1 ----
__global__ void k_advance(int32_t* in, const int32_t* tokens, int B) {
  pdl_trigger();
  pdl_wait();
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < B; b += gridDim.x * blockDim.x) {
    in[b] = tokens[b];
    in[B + b] += 1;
    in[2 * B + b] += 1;
  }
}

__global__ void k_advance_argmax(int32_t* in, unsigned long long* keys, int32_t* tokens, int B) {
  pdl_trigger();
  pdl_wait();
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < B; b += gridDim.x * blockDim.x) {
    const unsigned long long k = keys[b];
    const int32_t t = k ? int32_t(0xffffffffu - uint32_t(k & 0xffffffffu)) : 0;
    keys[b] = 0;  // ready for the next step's lm head
    tokens[b] = t;
    in[b] = t;
    in[B + b] += 1;
    in[2 * B + b] += 1;
  }
}

}  // namespace

void llm_advance_argmax(int32_t* in, unsigned long long* keys, int32_t* tokens, int64_t B, bool pdl, void* stream) {
  if (B <= 0) return;
  if (B > INT32_MAX / 3) throw ValueError("advance: too many rows");
  const unsigned blocks = unsigned(std::min<int64_t>((B + 255) / 256, 1024));
  launch_ex(k_advance_argmax, dim3(blocks), dim3(256), static_cast<cudaStream_t>(stream), pdl, "llm_advance_argmax",
            in, keys, tokens, int(B));
}

void llm_swiglu(const void* gu, void* out, int64_t rows, int64_t I, int64_t gu_rs, DType t, bool pdl, void* stream,
                int grid_cap) {
  if (rows <= 0 || I <= 0) return;
  const int64_t n = rows * I;
  const unsigned blocks =
      unsigned(std::min<int64_t>({(n + 255) / 256, int64_t(132) * 16, grid_cap > 0 ? int64_t(grid_cap) : INT64_MAX}));
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_float(t, [&](auto tv) {
    using T = decltype(tv);
    launch_ex(k_swiglu<T>, dim3(blocks), dim3(256), st, pdl, "llm_swiglu", static_cast<const T*>(gu),
              static_cast<T*>(out), rows, I, gu_rs);
  });
}

void llm_advance(int32_t* in, const int32_t* tokens, int64_t B, bool pdl, void* stream) {
  if (B <= 0) return;
  if (B > INT32_MAX / 3) throw ValueError("advance: too many rows");
  const unsigned blocks = unsigned(std::min<int64_t>((B + 255) / 256, 1024));
  launch_ex(k_advance, dim3(blocks), dim3(256), static_cast<cudaStream_t>(stream), pdl, "llm_advance", in, tokens,
            int(B));
}

void llm_rope_append(const llm::RopeAppendArgs& a, void* stream) {
  if (a.T <= 0) return;
  if (a.T > 65535) throw ValueError("rope_append: at most 65535 tokens per call");
  auto st = static_cast<cudaStream_t>(stream);
  const int work = a.hq * (a.rd / 2) + a.hkv * (a.rd / 2) + a.hkv * (a.D - a.rd) + a.hkv * a.D;  // items per token
  int bx = (work + 127) / 128;
  if (a.grid_cap > 0 && bx > a.grid_cap) bx = a.grid_cap;
  const dim3 grid{unsigned(bx), unsigned(a.T)};
  dispatch_float(a.dtype, [&](auto tv) {
    using T = decltype(tv);
    if (a.interleaved) launch_ex(k_rope_append<T, true>, grid, dim3(128), st, a.pdl, "llm_rope_append", a);
    else launch_ex(k_rope_append<T, false>, grid, dim3(128), st, a.pdl, "llm_rope_append", a);
  });
}

void llm_add_rms_norm(const llm::AddNormArgs& a, void* stream) {
  if (a.rows <= 0 || a.H <= 0) return;
  if (a.rows > int64_t(INT32_MAX)) throw ValueError("add_rms_norm: too many rows");
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_float(a.dtype, [&](auto tv) {
    using T = decltype(tv);
    const int64_t per = a.vec ? a.H / (16 / int64_t(sizeof(T))) : a.H;
    const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (per + 31) / 32 * 32)));
    const dim3 grid{unsigned(a.rows)}, block{unsigned(threads)};
    if (a.xh || a.xinv) {  // the scaled fp16 copy too (llm_add_rms_norm_xprep_ok)
      if constexpr (std::is_same_v<T, bf16>) {
        if (a.xh && a.xinv && a.vec && per <= int64_t(threads) * 4) {
          launch_ex(k_add_rms_norm_reg<T, 4, true>, grid, block, st, a.pdl, "llm_add_rms_norm", a);
          return;
        }
      }
      throw ValueError("add_rms_norm: the scaled fp16 copy needs bf16, aligned rows and H <= 8192");
    }
    if (a.vec && per <= int64_t(threads) * 4)  // the row in registers
      launch_ex(k_add_rms_norm_reg<T, 4>, grid, block, st, a.pdl, "llm_add_rms_norm", a);
    else if (a.vec)
      launch_ex(k_add_rms_norm<T, true>, grid, block, st, a.pdl, "llm_add_rms_norm", a);
    else
      launch_ex(k_add_rms_norm<T, false>, grid, block, st, a.pdl, "llm_add_rms_norm", a);
  });
}

}  // namespace gk::cuda
