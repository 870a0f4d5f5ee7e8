// The per-warp pieces that the one-launch fold kernels share (attention_decode_fold_{cl,pcl,pair,cta}.cu and
// attention_decode_fold.cu): the copies of a K / V tile and of a query slot into a warp's ring, the query
// fragments, a chunk's statistics at its end, the fold of a chunk into a group accumulator in registers, the
// publication of a partial into a ring stage for the CTA's fold, and the thread-block-cluster helpers
// (barrier, distributed shared memory load; device_sm90 and launch_cluster_maybe_pdl are in decode_mma.cuh). All
// inline: the kernels compile to the code they had with these
// pieces written out in each (checked on the cubins' code sections when they moved here).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/attention.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda::dfold {

// The 16 key rows of one tile of kv head kvh (K into st, V into st + KVB; rows swizzled) by 16-byte cp.async,
// lane l's row being that of key l & 15 (prow: this lane's cache row, -1 masked: zero-filled). The mask of
// valid keys is stored by lane 0 at *msk. ef: L2 evict-first with policy pol.
template <class T, int D>
__device__ __forceinline__ void copy_kv_tile(unsigned char* st, unsigned* msk, const DecodeArgs& a, int kvh, int prow,
                                             int lane, bool ef, uint64_t pol) {
  using Cf = MCfg<D>;
  constexpr int ROWB = Cf::ROWB, CH = Cf::CH, KVB = Cf::KVB, CPL = Cf::CPL;
  const T* kc = static_cast<const T*>(a.kc);
  const T* vc = static_cast<const T*>(a.vc);
  const unsigned m = __ballot_sync(kFull, prow >= 0) & 0xffffu;
  if (lane == 0) *msk = m;
  const int64_t hoff = int64_t(kvh) * D;
#pragma unroll
  for (int u = 0; u < CPL; ++u) {
    const int c = lane + 32 * u, rr = c / CH, cc = c % CH;
    const int row = __shfl_sync(kFull, prow, rr);
    const bool ok = row >= 0;
    const int64_t off = ok ? int64_t(row) * a.hkv * D + hoff + cc * 8 : 0;
    if (ef) {
      cp_async16_ef(st + swz(rr, cc, ROWB), kc + off, ok, pol);
      cp_async16_ef(st + KVB + swz(rr, cc, ROWB), vc + off, ok, pol);
    } else {
      cp_async16(st + swz(rr, cc, ROWB), kc + off, ok);
      cp_async16(st + KVB + swz(rr, cc, ROWB), vc + off, ok);
    }
  }
}

// The queries of heads [h0, h0 + nh) of sequence b into the query slot qslot (8 rows, swizzled; rows past nh
// zero-filled).
template <class T, int D>
__device__ __forceinline__ void copy_q(unsigned char* qslot, const DecodeArgs& a, int b, int h0, int nh, int lane) {
  using Cf = MCfg<D>;
  constexpr int ROWB = Cf::ROWB, CH = Cf::CH, QPL = Cf::QPL;
  const T* qp = static_cast<const T*>(a.q);
  const T* q = qp + int64_t(b) * a.q_bs + int64_t(h0) * a.q_hs;
#pragma unroll
  for (int u = 0; u < QPL; ++u) {
    const int c = lane + 32 * u, rr = c / CH, cc = c % CH;
    const bool ok = rr < nh;
    cp_async16(qslot + swz(rr, cc, ROWB), ok ? q + int64_t(rr) * a.q_hs + cc * 8 : qp, ok);
  }
}

// The A fragments of the query slot at shared address qslot_s (ldmatrix).
template <int D>
__device__ __forceinline__ void load_q_frags(uint32_t (&qa)[D / 16][2], uint32_t qslot_s, int lane) {
  constexpr int ROWB = D * 2, KSTEP = D / 16;
#pragma unroll
  for (int k2 = 0; k2 < KSTEP / 2; ++k2) {
    uint32_t x[4];
    ldsm_x4(x, qslot_s + swz(lane & 7, 4 * k2 + (lane >> 3), ROWB));
    qa[2 * k2][0] = x[0];
    qa[2 * k2][1] = x[1];
    qa[2 * k2 + 1][0] = x[2];
    qa[2 * k2 + 1][1] = x[3];
  }
}

// A chunk's statistics at its end, for this lane's heads hA = 2 t4 and hB = 2 t4 + 1: stv = mA, mB, lA, lB.
__device__ __forceinline__ void chunk_stats(float mrow, float lsum, int t4, float (&stv)[4]) {
  float l = lsum;
  l += __shfl_xor_sync(kFull, l, 1);
  l += __shfl_xor_sync(kFull, l, 2);
  stv[0] = __shfl_sync(kFull, mrow, 8 * t4);
  stv[1] = __shfl_sync(kFull, mrow, 8 * t4 + 4);
  stv[2] = __shfl_sync(kFull, l, 8 * t4);
  stv[3] = __shfl_sync(kFull, l, 8 * t4 + 4);
}

// The group accumulator (go; gm / gl of heads hA, hB) (+)= the chunk that ends (o, mrow, lsum), which is reset.
template <int D>
__device__ __forceinline__ void fold_chunk(float (&go)[D / 16][4], float (&o)[D / 16][4], float& gmA, float& gmB,
                                           float& glA, float& glB, float& mrow, float& lsum, int t4) {
  constexpr int KSTEP = D / 16;
  float l = lsum;
  l += __shfl_xor_sync(kFull, l, 1);
  l += __shfl_xor_sync(kFull, l, 2);
  const float mA = __shfl_sync(kFull, mrow, 8 * t4), mB = __shfl_sync(kFull, mrow, 8 * t4 + 4);
  const float lA = __shfl_sync(kFull, l, 8 * t4), lB = __shfl_sync(kFull, l, 8 * t4 + 4);
  float waA, wbA, waB, wbB;
  fold_w(gmA, mA, waA, wbA);
  fold_w(gmB, mB, waB, wbB);
  glA = fold_v(glA, waA, lA, wbA);
  glB = fold_v(glB, waB, lB, wbB);
#pragma unroll
  for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      go[mt][e] = e & 1 ? fold_v(go[mt][e], waB, o[mt][e], wbB) : fold_v(go[mt][e], waA, o[mt][e], wbA);
      o[mt][e] = 0.f;
    }
  mrow = -INFINITY;
  lsum = 0.f;
}

// A partial (o fragments; stv = mA, mB, lA, lB) into the ring stage pw as [8 heads][D] floats, then the heads'
// (m, l) pairs at pw + 8 D.
template <int D>
__device__ __forceinline__ void publish_partial(float* pw, const float (&ov)[D / 16][4], const float (&stv)[4],
                                                int lane) {
  constexpr int KSTEP = D / 16;
  const int g = lane >> 2, t4 = lane & 3, hA = 2 * t4, hB = 2 * t4 + 1;
#pragma unroll
  for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) pw[(e & 1 ? hB : hA) * D + mt * 16 + g + (e >= 2 ? 8 : 0)] = ov[mt][e];
  if (lane < 4) {
    pw[8 * D + 2 * hA] = stv[0];
    pw[8 * D + 2 * hA + 1] = stv[2];
    pw[8 * D + 2 * hB] = stv[1];
    pw[8 * D + 2 * hB + 1] = stv[3];
  }
}

// Thread-block clusters: an arrive + wait barrier of the cluster (release / acquire: shared-memory writes
// before it are visible to the cluster's loads after it), and the float at shared address s (an offset in this
// CTA's window) of CTA `rank` of the cluster (distributed shared memory).
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __syncthreads();
#endif
}
__device__ __forceinline__ float ld_cluster(uint32_t s, uint32_t rank) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(s), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(ra) : "memory");
#endif
  return v;
}

}  // namespace gk::cuda::dfold
