// Device pieces of the engine's fused decode attention (src/cuda/llm_attention.cu, the only
// includer): RoPE helpers, the cluster barriers and merge, the tensor-core wrappers of the
// MMA passes, the debug stamps.
#pragma once
#include <cooperative_groups.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/common/rows.cuh"
#include "cuda/llm_common.cuh"
#include "llm/fused.h"

namespace gk::cuda {
namespace {
using namespace llmk;

__device__ __forceinline__ void rot(float x1, float x2, float cs, float sn, float& r1, float& r2) {
  r1 = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
  r2 = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));
}

// The cache slot of position p of sequence b, or -1 (page outside the table or the pool).
__device__ __forceinline__ int64_t a_slot(const llm::AttnArgs& a, int b, int64_t p) {
  if (p < 0) return -1;
  if (p >= a.max_blocks * a.bs) return -1;
  const int bs = int(a.bs), li = int(p) / bs;  // positions < 2^31, bs <= 256: 32-bit division
  const int64_t blk = a.block_table[int64_t(b) * a.bt_stride + li];
  if (blk < 0 || blk >= a.nb) return -1;
  return blk * a.bs + (int(p) - li * bs);
}

// Pair u of a head's D / 2 pairs: its two dimensions and its rotary frequency index (-1: not rotated).
__device__ __forceinline__ void a_pair(const llm::AttnArgs& a, int u, int& i1, int& i2, int& j) {
  const int n2 = a.rd / 2;
  if (u < n2) {
    i1 = a.interleaved ? 2 * u : u;
    i2 = a.interleaved ? 2 * u + 1 : u + n2;
    j = u;
  } else {
    i1 = a.rd + 2 * (u - n2);
    i2 = i1 + 1;
    j = -1;
  }
}

// Thread block clusters (sm_90): the barrier of every thread of the cluster (release /
// acquire: shared memory written before it is visible to the cluster after it); the remote
// loads of the merge: cluster_merge.
__device__ __forceinline__ void cluster_sync_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// The barrier without release (the arrive orders no memory: no MEMBAR.ALL.GPU in the SASS):
// for the merge's second barrier (rank 0 has used every remote value it loaded, the others
// only wait to keep their shared memory) and the chunks without keys (nothing to publish).
__device__ __forceinline__ void cluster_sync_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
#endif
}

// The cluster merge (rank 0): output element e of G x D from every chunk's partial po[e],
// (max, sum) in rm[g], rl[g], all in the cluster CTAs' shared memory. Per element the
// 3 x nsplit remote loads are issued together (plain loads through map_shared_rank: the
// compiler keeps them after the cluster barrier and may overlap them; session 5's volatile
// loads ran one after the other, ~5 us at 2 chunks beside the o GEMV), then the
// workspace merge's arithmetic in chunk order: the same bits.
template <class T, int D>
__device__ __forceinline__ void cluster_merge(const float* po, const float* rm, const float* rl, int nsplit, int G,
                                              T* out, int tid, int nthr) {
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  constexpr int kMaxS = 8;
  for (int e = tid; e < G * D; e += nthr) {
    const int g = e / D;
    float mq[kMaxS], lq[kMaxS], pq[kMaxS];
#pragma unroll
    for (int q = 0; q < kMaxS; ++q) {
      if (q < nsplit) {
        mq[q] = *cl.map_shared_rank(rm + g, unsigned(q));
        lq[q] = *cl.map_shared_rank(rl + g, unsigned(q));
        pq[q] = *cl.map_shared_rank(po + e, unsigned(q));
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

// MMA (AttnArgs::mma): the tensor-core score pass and the 16-byte P V pass.
__device__ __forceinline__ void a_ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
template <class T>
__device__ __forceinline__ void a_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two values of T (exact: q is stored rounded to T) in one register, lo first.
template <class T>
__device__ __forceinline__ uint32_t a_pack2(float lo, float hi) {
  const T l = convert<T>(lo), h = convert<T>(hi);
  uint16_t ul, uh;
  memcpy(&ul, &l, 2);
  memcpy(&uh, &h, 2);
  return uint32_t(ul) | (uint32_t(uh) << 16);
}

// Debug stamps (AttnArgs::stamps): thread 0 of the CTA writes %globaltimer to slot i.
__device__ __forceinline__ void a_stamp(const llm::AttnArgs& a, int64_t cta, int i) {
  if (a.stamps == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  a.stamps[cta * 8 + i] = t;
}

}  // namespace
}  // namespace gk::cuda
