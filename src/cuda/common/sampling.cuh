// Block-level building blocks of the sampling kernels: deterministic reductions
// and scans (fixed shuffle trees, no float atomics) and a 3-level radix select
// (11 + 11 + 10 bits) on 32-bit order keys, driven by integer histograms.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

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

// a better than b: larger value, ties -> lower index.
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

__device__ __forceinline__ void block_argmax(Shared& sh, float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) sh.fsum[w] = v, sh.warg[w] = i;
  __syncthreads();
  v = sh.fsum[0];
  i = sh.warg[0];
  for (int k = 1; k < kWarps; ++k)
    if (better(sh.fsum[k], sh.warg[k], v, i)) v = sh.fsum[k], i = sh.warg[k];
  __syncthreads();
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
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.wsum[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned long long t = 0;
  for (int k = 0; k < kWarps; ++k) t += sh.wsum[k];
  __syncthreads();
  return t;
}

// Exclusive prefix of v over the threads of the block (in thread order); *total gets the sum.
__device__ __forceinline__ unsigned long long block_excl_scan(Shared& sh, unsigned long long v,
                                                             unsigned long long* total) {
  int l = threadIdx.x & 31, w = threadIdx.x >> 5;
  unsigned long long inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    unsigned long long n = __shfl_up_sync(0xffffffffu, inc, o);
    if (l >= o) inc += n;
  }
  __syncthreads();
  if (l == 31) sh.wsum[w] = inc;
  __syncthreads();
  unsigned long long before = 0, all = 0;
  for (int k = 0; k < kWarps; ++k) {
    if (k < w) before += sh.wsum[k];
    all += sh.wsum[k];
  }
  __syncthreads();
  *total = all;
  return before + inc - v;
}

// Radix select: the largest key kappa, among the keys of the included entries, such
// that the sum of val over included entries with key >= kappa reaches `target`
// (val = weight for a mass select, 1 for a count select). `elem(i, key, val)` returns
// whether entry i is included and sets its key and value. Returns 0 (keep all) if
// the included total is below target.
template <class Elem>
__device__ __forceinline__ uint32_t radix_select(Shared& sh, int64_t n, unsigned long long target, Elem elem) {
  uint32_t prefix = 0;
  const int shifts[3] = {21, 10, 0};
  const int widths[3] = {11, 11, 10};
#pragma unroll
  for (int lv = 0; lv < 3; ++lv) {
    const int sh_ = shifts[lv];
    const uint32_t mask = (1u << widths[lv]) - 1u;
    for (int b = threadIdx.x; b < kBins; b += kRowThreads) sh.hval[b] = 0, sh.hcnt[b] = 0;
    __syncthreads();
    // thread-local run cache: flat rows hit one bin, so flush only when the bin changes
    int cur = -1;
    unsigned long long cv = 0;
    unsigned int cc = 0;
    for (int64_t i = threadIdx.x; i < n; i += kRowThreads) {
      uint32_t key;
      unsigned long long v;
      if (!elem(i, key, v)) continue;
      if (lv > 0 && (key >> (sh_ + widths[lv])) != prefix) continue;
      int d = int((key >> sh_) & mask);
      if (d != cur) {
        if (cur >= 0) atomicAdd(&sh.hval[cur], cv), atomicAdd(&sh.hcnt[cur], cc);
        cur = d, cv = 0, cc = 0;
      }
      cv += v;
      ++cc;
    }
    if (cur >= 0) atomicAdd(&sh.hval[cur], cv), atomicAdd(&sh.hcnt[cur], cc);
    if (threadIdx.x == 0) sh.pick = kBins;
    __syncthreads();
    // ranks in descending bin order: thread t owns ranks 2t and 2t+1
    const int r0 = 2 * threadIdx.x;
    const int b0 = kBins - 1 - r0, b1 = b0 - 1;
    unsigned long long v0 = sh.hval[b0], v1 = sh.hval[b1];
    unsigned long long tot;
    unsigned long long before = block_excl_scan(sh, v0 + v1, &tot);
    int cand = kBins;
    if (sh.hcnt[b0] && before + v0 >= target) cand = r0;
    else if (sh.hcnt[b1] && before + v0 + v1 >= target) cand = r0 + 1;
    if (cand < kBins) atomicMin(&sh.pick, cand);
    __syncthreads();
    const int pick = sh.pick;
    if (pick == kBins) return 0u;  // not reachable: keep everything
    // mass strictly above the picked bin, from the owner thread
    if (threadIdx.x == (pick >> 1)) {
      unsigned long long above = before + ((pick & 1) ? v0 : 0ull);
      sh.wsum[0] = above;
    }
    __syncthreads();
    target -= sh.wsum[0] < target ? sh.wsum[0] : target;
    prefix = (prefix << widths[lv]) | uint32_t(kBins - 1 - pick);
    __syncthreads();
  }
  return prefix;
}

}  // namespace gk::cuda::smpk
