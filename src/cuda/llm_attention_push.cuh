// The fused decode attention's push merge (AttnArgs::push; src/cuda/llm_attention.cu, the
// only includer). The S chunks of a (sequence, kv head) form a thread block cluster as in
// the pull merge (cluster_merge), but instead of every CTA publishing its partial with a
// release barrier (barrier.cluster.arrive.release: MEMBAR.ALL.GPU + CCTL.IVALL in the
// SASS) and rank 0 reading the others' shared memory, each chunk s > 0 stores its partial
// (o[G][D] unnormalised, max[G], sum[G]) into rank 0's shared memory with st.async, whose
// complete_tx signals rank 0's mbarrier with the bytes: no fence, no second barrier, the
// other CTAs exit as soon as their stores are issued. Rank 0 waits for the mbarrier's
// phase (the expected bytes of nsplit - 1 chunks) and merges from its own shared memory
// with the arithmetic of cluster_merge in the same chunk order: the same bits.
//
// Order of the protocol: rank 0 initialises the mbarrier and arrives with the expected
// bytes at the kernel's start, then every thread of the cluster arrives (relaxed; the
// mbarrier init fenced with fence.mbarrier_init) on the cluster barrier; the senders wait
// on it only after P V (long since complete), so the barrier costs nothing on the path.
#pragma once
#include <cstdint>

#include "cuda/llm_attention_parts.cuh"

namespace gk::cuda {
namespace {
using namespace llmk;

__device__ __forceinline__ uint32_t push_smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Rank 0, thread 0: the mbarrier for one phase of `bytes` bytes (count 1: this arrival).
__device__ __forceinline__ void push_init(unsigned long long* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t a = push_smem_addr(bar);
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a) : "memory");
  asm volatile(
      "{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(a), "r"(bytes)
      : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void push_cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void push_cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}
// The shared::cluster address of local shared address `a` in CTA `rank` of the cluster.
__device__ __forceinline__ uint32_t push_mapa(uint32_t a, uint32_t rank) {
  uint32_t r = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
#endif
  return r;
}
__device__ __forceinline__ void push_st4(uint32_t dst, float4 v, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
               : "memory");
#endif
}
__device__ __forceinline__ void push_st2(uint32_t dst, float x, float y, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(dst),
               "f"(x), "f"(y), "r"(bar)
               : "memory");
#endif
}
// Rank 0: wait for phase 0 of the mbarrier (acquire at cluster scope: the senders' data).
// A bounded wait: a protocol error traps (a launch error) instead of hanging the GPU.
__device__ __forceinline__ void push_wait(unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t a = push_smem_addr(bar);
  for (uint32_t it = 0;; ++it) {
    uint32_t done = 0;
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], 0;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(a)
        : "memory");
    if (done) return;
    if (it > (1u << 22)) __trap();
  }
#endif
}

// Bytes rank 0 expects from nsplit - 1 chunks of G heads.
__host__ __device__ constexpr uint32_t push_bytes(int nsplit, int G, int D) {
  return uint32_t(nsplit - 1) * uint32_t(G) * uint32_t(D * 4 + 8);
}
// Rank 0's receive area (after the kernel's own shared memory): chunk q >= 1's o at
// po + (q - 1) * kG * D floats, its (max, sum) of head g at pml + ((q - 1) * kG + g) * 2.
template <int D, int kG>
__host__ __device__ constexpr size_t push_recv_bytes(int S) {
  return size_t(S > 1 ? S - 1 : 0) * kG * (D * 4 + 8);
}

// Chunk s > 0: its partial (of[G][D], rm[G], rl[G] in shared memory) into rank 0's receive
// area, each store counted on rank 0's mbarrier.
template <int D, int kG>
__device__ __forceinline__ void push_send(const float* of, const float* rm, const float* rl, int G, int s, int S,
                                          const unsigned char* recv, unsigned long long* bar, int tid, int nthr) {
  const uint32_t rbar = push_mapa(push_smem_addr(bar), 0u);
  const uint32_t ro = push_mapa(push_smem_addr(recv), 0u) + uint32_t(s - 1) * kG * D * 4;
  const uint32_t rml = push_mapa(push_smem_addr(recv), 0u) + uint32_t(S - 1) * kG * D * 4 + uint32_t(s - 1) * kG * 8;
  for (int e4 = tid; e4 < G * D / 4; e4 += nthr)
    push_st4(ro + uint32_t(e4) * 16, reinterpret_cast<const float4*>(of)[e4], rbar);
  for (int g = tid; g < G; g += nthr) push_st2(rml + uint32_t(g) * 8, rm[g], rl[g], rbar);
}

// Rank 0: the merge of its own partial (po, rm, rl) and the received ones, in chunk order
// with cluster_merge's arithmetic.
template <class T, int D, int kG>
__device__ __forceinline__ void push_merge(const float* po, const float* rm, const float* rl, int nsplit, int S,
                                           int G, const unsigned char* recv, T* out, int tid, int nthr) {
  constexpr int kMaxS = 8;
  const float* ro = reinterpret_cast<const float*>(recv);
  const float* rml = ro + size_t(S - 1) * kG * D;
  for (int e = tid; e < G * D; e += nthr) {
    const int g = e / D;
    float mq[kMaxS], lq[kMaxS], pq[kMaxS];
    mq[0] = rm[g];
    lq[0] = rl[g];
    pq[0] = po[e];
#pragma unroll
    for (int q = 1; q < kMaxS; ++q) {
      if (q < nsplit) {
        mq[q] = rml[((q - 1) * kG + g) * 2];
        lq[q] = rml[((q - 1) * kG + g) * 2 + 1];
        pq[q] = ro[(q - 1) * kG * D + e];
      }
    }
    float M = -INFINITY;
#pragma unroll
    for (int q = 0; q < kMaxS; ++q)
      if (q < nsplit) M = fmaxf(M, mq[q]);
    float num = 0.f, den = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int q = 0; q < kMaxS; ++q) {
        if (q < nsplit) {
          const float w = mq[q] == -INFINITY ? 0.f : expf(mq[q] - M);
          num = fmaf(w, pq[q], num);
          den = fmaf(w, lq[q], den);
        }
      }
    }
    out[e] = convert<T>(den > 0.f ? num / den : 0.f);
  }
}

}  // namespace
}  // namespace gk::cuda
