// The radix select steps of the multi-pass sampling path (src/cuda/sampling.cu): which
// filters a row runs, the per-entry weight and select key, and the row's last CTA picking
// the bin of one level from the merged histogram. Also the programmatic-dependent-launch
// entry of its select / final kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/sampling_weight.cuh"
#include "cuda/common/sampling_wide.cuh"
#include "ops/sampling_args.h"

namespace gk::cuda::wide {

enum Sel : int { kTopK = 0, kTopP = 1, kTyp = 2 };

// Programmatic dependent launch (the select / final kernels are launched with it): wait for
// the previous kernel's grid and memory before touching anything, then let the next kernel's
// CTAs be scheduled (they wait the same way). No-ops on a plain launch.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ bool sel_active(const SampleArgs& a, const smp::RowCfg& c, int which) {
  if (a.mode == SampleMode::Draw && c.greedy) return false;
  return which == kTopK ? c.top_k > 0 : (which == kTopP ? c.top_p < 1.f : c.typical < 1.f);
}

// weight_of(rel_exp(s, m)), the same bits (live_weight: no conversion instructions; 0 below
// s - m = -28, where exp < 2^-40)
__device__ __forceinline__ uint64_t weight(float s, float m) {
  const float d = smp::fsub_rn(s, m);
  return d >= -28.f ? smp::live_weight(d < 0.f ? d : 0.f, nullptr) : 0ull;
}

// ---------------------------------------------------------------- radix selects
struct SelCtx {
  float m;
  uint32_t kv;      // inclusion: order key >= kv (top-p: kk; typical: max(kk, kp))
  float minp;       // typical inclusion: rel_exp >= minp (0: off)
  double mean;      // typical mean of (s - m)
};

__device__ __forceinline__ double typical_mean(const RowState& st) {
  return st.W1 ? double(st.S1) / double(st.W1) : 0.0;
}

template <int which>
__device__ __forceinline__ bool sel_key(const SelCtx& x, float s, uint32_t& key) {
  const uint32_t ok = smp::order_key(s);
  if (which == kTopK) {
    key = ok;
    return true;
  }
  if (which == kTopP) {
    key = ok;
    return ok >= x.kv;
  }
  if (ok < x.kv) return false;
  if (x.minp != 0.f && !(smp::rel_exp(s, x.m) >= x.minp)) return false;
  key = smp::typical_key(smp::fsub_rn(s, x.m), x.mean);
  return true;
}

// The row's last CTA after a histogram pass: takes the merged histogram (leaving zeros
// for the next pass), picks the bin in descending key order where the cumulative count /
// mass reaches the target, and records the prefix (and at level 2 the threshold).
template <int which>
__device__ __forceinline__ void finish_level(Scratch& sh, unsigned long long* hv, unsigned long long* gv,
                                             const smp::RowCfg& c,
                                             RowState& st, int level, uint32_t prefix) {
  const int width = level == 2 ? 10 : 11;
#pragma unroll
  for (int k = 0; k < kBins / kThreads; ++k) {
    const int b = threadIdx.x + k * kThreads;
    hv[b] = __ldcg(&gv[b]);
  }
#pragma unroll
  for (int k = 0; k < kBins / kThreads; ++k) {
    const int b = threadIdx.x + k * kThreads;
    gv[b] = 0;
  }
  if (threadIdx.x == 0) sh.pick = INT32_MAX;
  __syncthreads();
  // descending bin order: thread t owns ranks [8t, 8t + 8)
  unsigned long long loc = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) loc += hv[kBins - 1 - (threadIdx.x * 8 + k)];
  unsigned long long tot;
  const unsigned long long before = block_excl_scan(sh, loc, &tot);
  unsigned long long target;
  if (level == 0) {
    target = which == kTopK ? (unsigned long long)c.top_k
                            : (unsigned long long)smp::frac_target(which == kTopP ? c.top_p : c.typical, tot);
  } else {
    target = st.target;
  }
  unsigned long long cum = before;
  int cand = INT32_MAX;
  unsigned long long above = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int b = kBins - 1 - (threadIdx.x * 8 + k);
    const unsigned long long nx = cum + hv[b];
    if (cand == INT32_MAX && hv[b] && nx >= target) cand = threadIdx.x * 8 + k, above = cum;
    cum = nx;
  }
  if (cand != INT32_MAX) atomicMin(&sh.pick, cand);
  __syncthreads();
  const int pick = sh.pick;
  if (pick == INT32_MAX) {
    if (threadIdx.x == 0) st.dead = 1;  // keep everything (threshold 0)
    return;
  }
  if (cand == pick) {  // exactly one thread
    const uint32_t np = (prefix << width) | uint32_t(kBins - 1 - pick);
    st.dead = 0;
    st.prefix = np;
    st.target = target - above;
    if (level == 2) {
      if (which == kTopK) st.kk = np;
      else if (which == kTopP) st.kp = np;
      else st.kt = np;
    }
  }
}

}  // namespace gk::cuda::wide
