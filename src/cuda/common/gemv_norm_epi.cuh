// The residual add + RMSNorm epilogue of the quantized decode GEMVs (k_w8 in gemv_w8.cuh, k_w4
// in gemv_w4.cuh; arguments in ops/norm_epi_args.h; EngineOptions::fused_norm_epilogue): in place
// of the engine's separate add_rms_norm launch after the o and down projections.
//
// Every CTA stores its outputs y as usual, makes them visible (__threadfence) and takes an integer
// ticket (one atomicAdd per CTA on the engine's counter); the CTA that draws the last ticket reads
// the whole rows of y (from L2) and does res_out = round(y + res), out = round(res_out * inv * w)
// with inv = rsqrt(mean(res_out^2) + eps), then resets the counter to 0 (graph replays). No float
// atomics. The sum of squares reproduces k_add_rms_norm(_reg) exactly whatever the GEMV's block
// size: nt "virtual" threads (add_rms_norm's block for rows of n elements), virtual thread v
// summing fmaf(r, r, ss) over its 16-byte vectors v * 8 + k * nt * 8 in k order; the warp
// butterfly (warp_sum) over each 32 virtual threads; the warps' sums added in warp order from 0
// (row_sum; nt == 32: the warp sum itself). A real thread takes virtual threads tid, tid +
// blockDim, ...; real warp w reduces virtual warps w, w + nw, ... with the same shuffles.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/common/rows.cuh"
#include "gpukit/dtype.h"
#include "ops/norm_epi_args.h"
#include "ops/quant_args.h"

namespace gk::cuda::norm_epi {

// Scratch floats the epilogue takes from the caller's shared memory (virtual thread sums, warp
// sums, the ticket flag).
constexpr int kScratchFloats = 256 + 8 + 4;

// The norm of rows 0 .. m - 1 of y [m, n] (dense) by the calling CTA (all its threads).
template <class T>
__device__ __forceinline__ void rows(const NormEpi& e, const T* y, int64_t m, int64_t n, float* scratch) {
  constexpr int N = 8;  // 16-byte vectors of bf16 / f16
  float* ssv = scratch;
  float* wsum = scratch + 256;
  const int nt = e.nt, tid = threadIdx.x, nb = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwr = nb >> 5, nvw = nt >> 5;
  const int64_t step = int64_t(nt) * N;
  const T* w = static_cast<const T*>(e.w);
  for (int64_t r = 0; r < m; ++r) {
    const T* yr = y + r * n;
    const T* res = static_cast<const T*>(e.res) + r * e.res_rs;
    T* ro = static_cast<T*>(e.res_out) + r * n;
    T* out = static_cast<T*>(e.out) + r * n;
    for (int v = tid; v < nt; v += nb) {
      float ss = 0.f;
      for (int64_t i0 = int64_t(v) * N; i0 < n; i0 += 4 * step) {
        Vec<T, N> yv[4], rv[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // the loads of up to 4 vectors at once
          const int64_t i = i0 + k * step;
          if (i < n) {
            const uint4 u = __ldcg(reinterpret_cast<const uint4*>(yr + i));  // written by the other CTAs
            memcpy(&yv[k], &u, 16);
            const uint4 q = __ldcg(reinterpret_cast<const uint4*>(res + i));
            memcpy(&rv[k], &q, 16);
          }
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int64_t i = i0 + k * step;
          if (i < n) {
#pragma unroll
            for (int j = 0; j < N; ++j) {
              rv[k].v[j] = convert<T>(float(yv[k].v[j]) + float(rv[k].v[j]));
              const float f = float(rv[k].v[j]);
              ss = fmaf(f, f, ss);
            }
            *reinterpret_cast<Vec<T, N>*>(ro + i) = rv[k];
          }
        }
      }
      ssv[v] = ss;
    }
    __syncthreads();
    for (int vw = warp; vw < nvw; vw += nwr) {
      const float s = warp_sum(ssv[vw * 32 + lane]);
      if (lane == 0) wsum[vw] = s;
    }
    __syncthreads();
    float tot;
    if (nt == 32) {
      tot = wsum[0];
    } else {
      tot = 0.f;
      for (int i = 0; i < nvw; ++i) tot += wsum[i];
    }
    const float inv = rsqrtf(tot / float(n) + e.eps);
    for (int v = tid; v < nt; v += nb) {
      for (int64_t i = int64_t(v) * N; i < n; i += step) {
        const Vec<T, N> rv = *reinterpret_cast<const Vec<T, N>*>(ro + i);  // this thread's own writes
        const Vec<T, N> wv = *reinterpret_cast<const Vec<T, N>*>(w + i);
        Vec<T, N> o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = convert<T>(float(rv.v[j]) * inv * float(wv.v[j]));
        *reinterpret_cast<Vec<T, N>*>(out + i) = o;
      }
    }
    __syncthreads();  // ssv / wsum reused by the next row
  }
}

// rows() with every load of a row issued at once and the row kept in registers: for CTAs where each
// thread has at most U (virtual thread, vector) pairs (8B: 2 with 256 threads, 4 with 128). Pair u of
// thread tid is virtual thread tid + (u / nvv) * blockDim, its vector u % nvv (nvv: vectors per
// virtual thread), so a virtual thread's vectors come in k order: the same sums as rows().
template <class T, int U>
__device__ __forceinline__ void rows_reg(const NormEpi& e, const T* y, int64_t m, int64_t n, float* scratch,
                                         int nvv) {
  constexpr int N = 8;
  float* ssv = scratch;
  float* wsum = scratch + 256;
  const int nt = e.nt, tid = threadIdx.x, nb = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nwr = nb >> 5, nvw = nt >> 5;
  const int64_t step = int64_t(nt) * N;
  const int cnt = tid < nt ? ((nt - 1 - tid) / nb + 1) * nvv : 0;  // this thread's pairs
  const T* w = static_cast<const T*>(e.w);
  for (int64_t r = 0; r < m; ++r) {
    const T* yr = y + r * n;
    const T* res = static_cast<const T*>(e.res) + r * e.res_rs;
    T* ro = static_cast<T*>(e.res_out) + r * n;
    T* out = static_cast<T*>(e.out) + r * n;
    Vec<T, N> yv[U], rv[U], wv[U];
    int64_t at[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int a = u / nvv, k = u - a * nvv;
      at[u] = u < cnt ? int64_t(tid + a * nb) * N + k * step : n;
      if (at[u] < n) {
        uint4 t = __ldcg(reinterpret_cast<const uint4*>(yr + at[u]));  // written by the other CTAs
        memcpy(&yv[u], &t, 16);
        t = __ldcg(reinterpret_cast<const uint4*>(res + at[u]));
        memcpy(&rv[u], &t, 16);
        wv[u] = *reinterpret_cast<const Vec<T, N>*>(w + at[u]);
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < cnt) {
        if (at[u] < n) {
#pragma unroll
          for (int j = 0; j < N; ++j) {
            rv[u].v[j] = convert<T>(float(yv[u].v[j]) + float(rv[u].v[j]));
            const float f = float(rv[u].v[j]);
            ss = fmaf(f, f, ss);
          }
          *reinterpret_cast<Vec<T, N>*>(ro + at[u]) = rv[u];
        }
        const int a = u / nvv;
        if (u - a * nvv == nvv - 1) {  // the virtual thread's last vector
          ssv[tid + a * nb] = ss;
          ss = 0.f;
        }
      }
    }
    __syncthreads();
    for (int vw = warp; vw < nvw; vw += nwr) {
      const float s = warp_sum(ssv[vw * 32 + lane]);
      if (lane == 0) wsum[vw] = s;
    }
    __syncthreads();
    float tot;
    if (nt == 32) {
      tot = wsum[0];
    } else {
      tot = 0.f;
      for (int i = 0; i < nvw; ++i) tot += wsum[i];
    }
    const float inv = rsqrtf(tot / float(n) + e.eps);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (at[u] < n) {
        Vec<T, N> o;
#pragma unroll
        for (int j = 0; j < N; ++j) o.v[j] = convert<T>(float(rv[u].v[j]) * inv * float(wv[u].v[j]));
        *reinterpret_cast<Vec<T, N>*>(out + at[u]) = o;
      }
    }
    __syncthreads();  // ssv / wsum reused by the next row
  }
}

// rows_reg where each thread has at most 4 pairs (rows of up to 4 vectors per virtual thread), else rows.
template <class T>
__device__ __forceinline__ void rows_any(const NormEpi& e, const T* y, int64_t m, int64_t n, float* scratch) {
  const int64_t nvv = (n + int64_t(e.nt) * 8 - 1) / (int64_t(e.nt) * 8);  // vectors per virtual thread
  const int vpt = (e.nt + int(blockDim.x) - 1) / int(blockDim.x);        // virtual threads per thread
  if (nvv * vpt <= 4) rows_reg<T, 4>(e, y, m, n, scratch, int(nvv));
  else rows<T>(e, y, m, n, scratch);
}

// The epilogue proper, called by every thread of every CTA after its outputs are stored (the
// last CTA to finish normalizes). scratch: kScratchFloats floats of shared memory that the
// caller no longer reads after its own __syncthreads. Not inlined: its registers stay out of
// the GEMV's main loop.
template <class T>
__device__ __noinline__ void tail(const NormEpi e, const void* y, int64_t m, int64_t n, float* scratch) {
  int* flag = reinterpret_cast<int*>(scratch + 256 + 8);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *flag = atomicAdd(e.counter, 1) == int(gridDim.x * gridDim.y * gridDim.z) - 1;
  __syncthreads();
  if (!*flag) return;
  __threadfence();
  rows_any<T>(e, static_cast<const T*>(y), m, n, scratch);
  if (threadIdx.x == 0) *e.counter = 0;  // ready for the next launch (graph replays)
}

__device__ __forceinline__ void tail_any(const NormEpi& e, DType out, const void* y, int64_t m, int64_t n,
                                         float* scratch) {
  if (out == DType::f16) tail<f16>(e, y, m, n, scratch);
  else tail<bf16>(e, y, m, n, scratch);
}

}  // namespace gk::cuda::norm_epi

namespace gk::cuda::gemv_detail {
// The parameter of k_w4 with EPI (gemv_w4.cuh): QGemvArgs and the epilogue's, with its tail(scratch).
// A type of its own, so that QGemvArgs, the parameter of the other quantized kernels, keeps its size.
struct QGemvArgsEpi : QGemvArgs {
  NormEpi epi;
  // the epilogue, by every thread of the CTA after its stores (y of out_dtype, [m, n])
  __device__ __forceinline__ void tail(float* scratch) const {
    norm_epi::tail_any(epi, out_dtype, y, m, n, scratch);
  }
};
}  // namespace gk::cuda::gemv_detail
