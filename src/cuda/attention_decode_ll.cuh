// CUDA attention_decode: the tagged cross-CTA merge of 37 (attention_decode_fold_cta.cu, the CTA group units of
// 18) and 38 (attention_decode_fold_cl.cu, the 4-warp CTA groups of 34). Opt-in candidates (session 8 prep).
//
// 18 / 34 merge the groups of a (sequence, kv head, head group) through the workspace: every CTA writes its group's
// result, fences, counts itself in; the CTA completing the count fences, loads every group's result and folds.
// After the last group's result the chain is fence + atomic + loads: about three trips to L2. Here instead:
//  - each CTA takes a ticket at its START (a 64-bit counter per group index ci: arrivals in the low half, a launch
//    epoch in the high half), off the critical path (the CTA's first tiles are in flight meanwhile);
//  - the CTA with the last ticket (ng - 1) merges; every other CTA of that ci took its ticket before, so it is
//    running and waits on nothing: no deadlock whatever the residency (no co-residency assumption);
//  - every CTA writes its group's result as 64-bit words {float, tag = 2 x epoch + 1} with relaxed gpu-scope
//    stores (single-copy atomic: a word with the tag carries its value), no fence; the merging CTA loads every
//    word it needs at once and reloads the ones without this launch's tag until all have it (no fence either:
//    each word is its own flag). The last result to arrive costs about one trip to L2 and back.
//  - the merging CTA sets the counter to (epoch + 1, 0 arrivals) at its end (every ticket of the launch taken).
// Same partials, same folds in group order (18's fast path): the same bits as 18 / 34.
//
// Buffer (ll_buffer): kLLCtr counters, then per ci kLLGroups slots of kLLSlot words (head h's output d at
// h * D + d, its (max, sum) at 1024 + 2h). The layout does not depend on the call (B, heads, head_dim), so a slot
// is only ever written with its own counter's epochs and a stale word never carries the current tag (until the
// 32-bit tag wraps: 2^31 launches of the same ci with the slot untouched in between). One buffer per (device,
// stream, capture), as merge_counters: launches that may run concurrently never share one; launches on one
// stream are ordered (PDL: griddepcontrol.wait waits for the previous grid's completion). A launch that dies
// mid-way leaves a counter off its epoch boundary (the context is lost anyway).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda_util.h"
#include "cuda/common/decode_fold.cuh"

namespace gk::cuda::dll {

constexpr int kLLCtr = 1024;           // group indices (counters); the slots follow
constexpr int kLLGroups = 16;          // groups per ci (18's fast path: the host checks ngmax <= 16)
constexpr int kLLSlot = 8 * 128 + 16;  // words per group: 8 heads x 128 outputs, then (max, sum) per head

__device__ __forceinline__ void st_tag(unsigned long long* p, float v, unsigned tag) {
  const unsigned long long w = (static_cast<unsigned long long>(tag) << 32) | __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned long long ld_tag(const unsigned long long* p) {
  unsigned long long w;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p));
  return w;
}
__device__ __forceinline__ bool tag_ok(unsigned long long w, unsigned tag) { return unsigned(w >> 32) == tag; }

// The ticket of ci (one thread): ll_s[0] = arrivals before this CTA, ll_s[1] = this launch's tag.
__device__ __forceinline__ void ll_ticket(unsigned long long* llc, int ci, unsigned* ll_s) {
  const unsigned long long t = atomicAdd(llc + ci, 1ull);
  ll_s[0] = unsigned(t);
  ll_s[1] = 2u * unsigned(t >> 32) + 1u;
}

__device__ __forceinline__ unsigned long long* ll_slot(unsigned long long* llc, int ci, int grp) {
  return llc + kLLCtr + (int64_t(ci) * kLLGroups + grp) * kLLSlot;
}

// Group grp's result for head h, output d (and its max / sum once per head, d == 0).
template <int D>
__device__ __forceinline__ void ll_put(unsigned long long* llc, int ci, int grp, int h, int d, float O, float M,
                                       float L, unsigned tag) {
  unsigned long long* slot = ll_slot(llc, ci, grp);
  st_tag(slot + h * D + d, O, tag);
  if (d == 0) {
    st_tag(slot + 8 * 128 + 2 * h, M, tag);
    st_tag(slot + 8 * 128 + 2 * h + 1, L, tag);
  }
}

// The merge, by the whole CTA of NT threads with the last ticket (the others return at once). hrow: the first
// output row (sequence x hq + first head); sml: shared memory for 2 x nh x ng floats that the caller's warps may
// still be reading (a barrier first). KB outputs per thread at a time, all their words loaded before any wait.
template <class T, int D, int NT>
__device__ __forceinline__ void merge_ll(const DecodeArgs& a, int64_t hrow, int nh, int ng, int ci,
                                         unsigned long long* llc, const unsigned* ll_s, float* sml) {
  if (ll_s[0] != unsigned(ng - 1)) return;  // (the same in every thread of the CTA)
  __syncthreads();
  constexpr int KO = 8 * D / NT, KB = KO < 4 ? KO : 4, NGF = kLLGroups;
  static_assert(KO % KB == 0, "outputs per thread: blocks of KB");
  const unsigned tag = ll_s[1];
  const unsigned long long* slots = ll_slot(llc, ci, 0);
  const unsigned long long okw = static_cast<unsigned long long>(tag) << 32;  // (outputs / groups not there)
  unsigned long long w[KB][NGF];
  auto load_block = [&](int k0) {
#pragma unroll
    for (int j = 0; j < KB; ++j) {
      const int idx = threadIdx.x + (k0 + j) * NT, h = idx / D, d = idx - h * D;
#pragma unroll
      for (int s2 = 0; s2 < NGF; ++s2)
        w[j][s2] = idx < nh * D && s2 < ng ? ld_tag(slots + int64_t(s2) * kLLSlot + h * D + d) : okw;
    }
  };
  load_block(0);  // the first block's words in flight while the maxima and sums are loaded
  for (int i = threadIdx.x; i < nh * ng; i += NT) {  // maxima and sums: one thread per (head, group)
    const int h = i / ng, s2 = i - h * ng;
    const unsigned long long* p = slots + int64_t(s2) * kLLSlot + 8 * 128 + 2 * h;
    unsigned long long m = ld_tag(p), l = ld_tag(p + 1);
    while (!tag_ok(m, tag) || !tag_ok(l, tag)) {
      __nanosleep(32);
      if (!tag_ok(m, tag)) m = ld_tag(p);
      if (!tag_ok(l, tag)) l = ld_tag(p + 1);
    }
    sml[2 * i] = __uint_as_float(unsigned(m));
    sml[2 * i + 1] = __uint_as_float(unsigned(l));
  }
  __syncthreads();
#pragma unroll 1
  for (int k0 = 0; k0 < KO; k0 += KB) {
    if (k0 > 0) {
      if (int(threadIdx.x) + k0 * NT >= nh * D) break;  // (no barrier below)
      load_block(k0);
    }
    for (;;) {  // until every word carries this launch's tag
      bool all = true;
#pragma unroll
      for (int j = 0; j < KB; ++j)
#pragma unroll
        for (int s2 = 0; s2 < NGF; ++s2) all = all && tag_ok(w[j][s2], tag);
      if (all) break;
      __nanosleep(32);
#pragma unroll
      for (int j = 0; j < KB; ++j) {
        const int idx = threadIdx.x + (k0 + j) * NT, h = idx / D, d = idx - h * D;
#pragma unroll
        for (int s2 = 0; s2 < NGF; ++s2)
          if (!tag_ok(w[j][s2], tag)) w[j][s2] = ld_tag(slots + int64_t(s2) * kLLSlot + h * D + d);
      }
    }
#pragma unroll
    for (int j = 0; j < KB; ++j) {
      const int idx = threadIdx.x + (k0 + j) * NT, h = idx / D, d = idx - h * D;
      if (idx < nh * D) {
        float TM = -INFINITY, TL = 0.f, TO = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < NGF; ++s2) {
          if (s2 < ng) {  // 18's fast path: the same folds in group order
            float wa, wb;
            dfold::fold_w(TM, sml[2 * (h * ng + s2)], wa, wb);
            TL = dfold::fold_v(TL, wa, sml[2 * (h * ng + s2) + 1], wb);
            TO = dfold::fold_v(TO, wa, __uint_as_float(unsigned(w[j][s2])), wb);
          }
        }
        static_cast<T*>(a.out)[(hrow + h) * D + d] = convert<T>(dfold::finalize(TO, TL));
      }
    }
  }
  // every ticket of this launch is taken: arrivals back to 0, the next epoch
  if (threadIdx.x == 0) atomicExch(llc + ci, static_cast<unsigned long long>((tag >> 1) + 1) << 32);
}

// The buffer of (device, stream, capture), for at least nci group indices (nci <= kLLCtr: the caller checks);
// nullptr while the stream's capture is invalidated. Zeroed (tag 0 is no launch's: tags are odd). A smaller
// buffer it replaces may still be used by queued launches: kept for the process.
inline unsigned long long* ll_buffer(cudaStream_t st, int64_t nci) {
  static std::mutex mu;
  static std::map<std::tuple<int, cudaStream_t, unsigned long long>, std::pair<unsigned long long*, int64_t>> bufs;
  int dev = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  GK_CUDA_CHECK(cudaStreamGetCaptureInfo(st, &cs, &id));
  if (cs == cudaStreamCaptureStatusInvalidated) return nullptr;
  if (cs == cudaStreamCaptureStatusNone) id = 0;
  std::lock_guard<std::mutex> lk(mu);
  auto& e = bufs[{dev, st, id}];
  if (e.first && e.second >= nci) return e.first;
  const int64_t cap = std::max<int64_t>(nci, 8);
  const size_t bytes = size_t(kLLCtr + cap * kLLGroups * kLLSlot) * sizeof(unsigned long long);
  unsigned long long* p = nullptr;
  GK_CUDA_CHECK(cudaMalloc(&p, bytes));
  cudaStream_t z = nullptr;
  GK_CUDA_CHECK(cudaStreamCreateWithFlags(&z, cudaStreamNonBlocking));
  GK_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, z));
  GK_CUDA_CHECK(cudaStreamSynchronize(z));
  GK_CUDA_CHECK(cudaStreamDestroy(z));
  e = {p, cap};
  return p;
}

}  // namespace gk::cuda::dll
