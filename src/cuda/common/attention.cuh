// Shared pieces of the attention kernels: asynchronous 16-byte global-to-shared
// copies (cp.async, sm_80+; a synchronous fallback on older targets) and the
// float conversion of a 16-byte vector of cache elements.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/rows.cuh"

namespace gk {
struct DecodeArgs;
}

namespace gk::cuda {

// Copies 16 bytes from global `src` to shared `dst`; when !valid the 16 bytes
// are zero-filled and nothing is read (src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n) : "memory");
#else
  *static_cast<uint4*>(dst) = valid ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// The 16 / sizeof(C) elements of one 16-byte vector at p (shared or global) as floats.
template <class C>
__device__ __forceinline__ void vec16_to_float(const void* p, float* out) {
  constexpr int N = 16 / sizeof(C);
  const Vec<C, N> v = *static_cast<const Vec<C, N>*>(p);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = float(v.v[j]);
}

// attention_decode_mma.cu: the tensor-core decode kernel (bf16 / fp16 caches; chunks + merge); false when
// the call is not covered (other dtypes, fp8 caches, unaligned query rows): attention_decode.cu's kernel runs.
bool attention_decode_mma(const DecodeArgs& a, cudaStream_t st);
// attention_decode_fold.cu: the default tensor-core decode kernel (bf16 / fp16 caches; chunk partials
// folded in a fixed order, chunk or group work units); force: 0 auto, 1 chunk units, 2 group units.
// False when not covered (as attention_decode_mma).
bool attention_decode_fold(const DecodeArgs& a, cudaStream_t st, int force);
// attention_decode_fold_cta.cu: the fold kernel's CTA group units in one launch (head_dim 64 / 128, B <= 512);
// false when not covered. fence1: the cross-CTA merge with one fence per CTA (thread 0) instead of one per thread.
bool attention_decode_fold_cta(const DecodeArgs& a, cudaStream_t st, bool fence1 = false);
// 37: the same CTA group units merged without fence or counter (tagged words, the last CTA to start merges).
bool attention_decode_fold_cta_ll(const DecodeArgs& a, cudaStream_t st);
// attention_decode_fold_cl.cu: one thread-block cluster per (sequence, kv head, head group), the groups' results
// folded through distributed shared memory (head_dim 64 / 128, sm_90, capacity <= 16 groups); one launch. force 0:
// only when all clusters are resident at once; 1: whenever it can run; 2: the same with two groups per CTA; 3-5:
// see go_cl; 6: no cluster, one CTA of 4 warps per group, the groups merged through the workspace by the last CTA
// (34); 7: 34 with 2 stages (36); 8: 34 with the tagged merge of attention_decode_ll.cuh (38); 9: two groups per CTA
// (25) only where all its clusters are resident (ngmax >= 2); 10: 5 (33, all clusters resident) with PDL. False
// when not covered (nothing launched).
bool attention_decode_fold_cl(const DecodeArgs& a, cudaStream_t st, int force);
// attention_decode_fold_pair.cu: one CTA per (sequence, kv head, head group), warps on group units, the groups
// folded through shared memory (head_dim 64 / 128, capacity <= 16 groups); one launch; evict_first: K / V loads
// tagged L2 evict-first; pdl false: launched without PDL (route bit 32768). False when not covered.
bool attention_decode_fold_pair(const DecodeArgs& a, cudaStream_t st, bool evict_first, bool pdl = true);
// attention_decode_fold_c2.cu (variant 39, route bits 131072 / 262144): 33's 4-warp CTAs with two groups each, in
// clusters of half the power of two covering the capacity's groups (B2 / B3 T4096: 8 CTAs on 4 SMs), the groups
// folded through distributed shared memory (head_dim 64 / 128, sm_90, capacity <= 16 groups); one launch.
// resident_only: only when all clusters are resident at once. pdl: with the PDL attribute (and decode_pdl()).
// False when not covered (nothing launched).
bool attention_decode_fold_c2(const DecodeArgs& a, cudaStream_t st, bool resident_only, bool pdl);
// attention_decode_fold_pcl.cu: the pair kernel spread over a thread-block cluster (one warp per group, CTAs of
// `warps` = 4 or 8 warps, clusters of the power of two covering the capacity's groups), the groups folded through
// distributed shared memory (head_dim 64 / 128, sm_90, capacity <= 16 groups; K / V loads L2 evict-first); one
// launch. deep (warps 4 only): twice the stage ring (one CTA per SM). False when not covered (nothing launched).
bool attention_decode_fold_pcl(const DecodeArgs& a, cudaStream_t st, int warps, bool deep);

}  // namespace gk::cuda
