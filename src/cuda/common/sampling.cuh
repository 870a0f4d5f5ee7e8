// Block-level building blocks of the sampling kernels: deterministic reductions
// and scans (fixed shuffle trees, no float atomics) and a 3-level radix select
// (11 + 11 + 10 bits) on 32-bit order keys, driven by integer histograms.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/block_reduce.cuh"
#include "ops/sampling_args.h"

namespace gk::cuda::smpk {

constexpr int kRowThreads = 1024;
constexpr int kWarps = kRowThreads / 32;
constexpr int kBins = 2048;

struct Shared {
  unsigned long long hval[kBins];  // mass or count per bin
  unsigned int hcnt[kBins];        // entries per bin
  unsigned long long wsum[kWarps];
  float fsum[kWarps];
  int warg[kWarps];
  int pick;
  int flag;
};

using blk::better;

__device__ __forceinline__ void block_argmax(Shared& sh, float& v, int& i) {
  blk::argmax<kWarps>(sh.fsum, sh.warg, v, i);
}

__device__ __forceinline__ float block_sum_f(Shared& sh, float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.fsum[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
  for (int k = 0; k < kWarps; ++k) t += sh.fsum[k];
  __syncthreads();
  return t;
}

__device__ __forceinline__ unsigned long long block_sum_u(Shared& sh, unsigned long long v) {
  return blk::sum_u64<kWarps>(sh.wsum, v);
}

// Exclusive prefix of v over the threads of the block (in thread order); *total gets the sum.
__device__ __forceinline__ unsigned long long block_excl_scan(Shared& sh, unsigned long long v,
                                                             unsigned long long* total) {
  return blk::excl_scan_u64<kWarps>(sh.wsum, v, total);
}

// Calls f(i, value) for every element of a row, 16-byte loads, 4 in flight per
// thread (each thread sees runs of consecutive indices); scalar tail.
template <class T, class F>
__device__ __forceinline__ void row_for_each(const T* x, int64_t V, F&& f) {
  constexpr int N = 16 / sizeof(T), U = 4;
  struct alignas(16) Pack { T v[N]; };
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const int64_t nv = vec ? V / N : 0;
  const Pack* xp = reinterpret_cast<const Pack*>(x);
  for (int64_t base = threadIdx.x; base < nv; base += int64_t(kRowThreads) * U) {
    Pack p[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t j = base + int64_t(u) * kRowThreads;
      if (j < nv) p[u] = xp[j];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t j = base + int64_t(u) * kRowThreads;
      if (j < nv) {
#pragma unroll
        for (int e = 0; e < N; ++e) f(j * N + e, float(p[u].v[e]));
      }
    }
  }
  for (int64_t i = nv * N + threadIdx.x; i < V; i += kRowThreads) f(i, float(x[i]));
}

// In-place version for an f32 row: x[i] = f(i, x[i]), 16-byte loads and stores.
template <class F>
__device__ __forceinline__ void row_transform(float* x, int64_t V, F&& f) {
  constexpr int U = 4;
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const int64_t nv = vec ? V / 4 : 0;
  float4* xp = reinterpret_cast<float4*>(x);
  for (int64_t base = threadIdx.x; base < nv; base += int64_t(kRowThreads) * U) {
    float4 p[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t j = base + int64_t(u) * kRowThreads;
      if (j < nv) p[u] = xp[j];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int64_t j = base + int64_t(u) * kRowThreads;
      if (j < nv) {
        p[u].x = f(j * 4, p[u].x);
        p[u].y = f(j * 4 + 1, p[u].y);
        p[u].z = f(j * 4 + 2, p[u].z);
        p[u].w = f(j * 4 + 3, p[u].w);
        xp[j] = p[u];
      }
    }
  }
  for (int64_t i = nv * 4 + threadIdx.x; i < V; i += kRowThreads) x[i] = f(i, x[i]);
}

struct Selected {
  uint32_t key;             // kappa
  unsigned long long mass;  // sum of val over included entries with key >= kappa
};

// Radix select: the largest key kappa, among the keys of the included entries, such
// that the sum of val over included entries with key >= kappa reaches the target
// (val = weight for a mass select, 1 for a count select). `inc(i, s, key)` says
// whether entry i (value s) is included and sets its key; `val(i, s)` is computed
// only for entries in the current radix prefix; `target_of(total)` gets the
// included total (from the first level) and returns the target. Returns key 0
// (keep all) if the total is below the target.
template <class T, class Inc, class Val, class Target>
__device__ __forceinline__ Selected radix_select(Shared& sh, const T* x, int64_t n, Target target_of, Inc inc,
                                                 Val val) {
  uint32_t prefix = 0;
  unsigned long long target = 0, above_all = 0;
#pragma unroll
  for (int lv = 0; lv < 3; ++lv) {
    const int shift = lv == 0 ? 21 : (lv == 1 ? 10 : 0);
    const int width = lv == 2 ? 10 : 11;
    const uint32_t mask = (1u << width) - 1u;
    for (int b = threadIdx.x; b < kBins; b += kRowThreads) sh.hval[b] = 0, sh.hcnt[b] = 0;
    __syncthreads();
    // thread-local run cache: flat rows hit one bin, so flush only when the bin changes
    int cur = -1;
    unsigned long long cv = 0;
    unsigned int cc = 0;
    row_for_each(x, n, [&](int64_t i, float s) {
      uint32_t key;
      if (!inc(i, s, key)) return;
      if (lv > 0 && (key >> (shift + width)) != prefix) return;
      int d = int((key >> shift) & mask);
      if (d != cur) {
        if (cur >= 0) atomicAdd(&sh.hval[cur], cv), atomicAdd(&sh.hcnt[cur], cc);
        cur = d, cv = 0, cc = 0;
      }
      cv += val(i, s);
      ++cc;
    });
    if (cur >= 0) atomicAdd(&sh.hval[cur], cv), atomicAdd(&sh.hcnt[cur], cc);
    if (threadIdx.x == 0) sh.pick = kBins;
    __syncthreads();
    // ranks in descending bin order: thread t owns ranks 2t and 2t+1
    const int r0 = 2 * threadIdx.x;
    const int b0 = kBins - 1 - r0, b1 = b0 - 1;
    const unsigned long long v0 = sh.hval[b0], v1 = sh.hval[b1];
    unsigned long long tot;
    const unsigned long long before = block_excl_scan(sh, v0 + v1, &tot);
    if (lv == 0) target = target_of(tot);
    if (lv == 0 && tot < target) return {0u, tot};  // uniform: keep everything
    int cand = kBins;
    if (sh.hcnt[b0] && before + v0 >= target) cand = r0;
    else if (sh.hcnt[b1] && before + v0 + v1 >= target) cand = r0 + 1;
    if (cand < kBins) atomicMin(&sh.pick, cand);
    __syncthreads();
    const int pick = sh.pick;
    if (pick == kBins) return {0u, tot};  // not reachable
    if (threadIdx.x == (pick >> 1)) {  // mass strictly above the picked bin, and the bin's own
      sh.wsum[0] = before + ((pick & 1) ? v0 : 0ull);
      sh.wsum[1] = (pick & 1) ? v1 : v0;
    }
    __syncthreads();
    const unsigned long long above = sh.wsum[0], inbin = sh.wsum[1];
    target -= above < target ? above : target;
    above_all += above;
    prefix = (prefix << width) | uint32_t(kBins - 1 - pick);
    __syncthreads();
    if (lv == 2) return {prefix, above_all + inbin};
  }
  return {prefix, 0};
}

}  // namespace gk::cuda::smpk
