// attention_decode_fold_cl.cu's device helpers (its only includer; the cluster barrier and distributed shared
// memory load of its cluster forms 24 / 25 / 33 are common/cluster_dsm.cuh's): the end of the counter-merged form (34 / 36; 38: the tagged
// merge of attention_decode_ll.cuh).
#pragma once
#include "cuda/attention_decode_ll.cuh"
#include "cuda/common/attention.cuh"
#include "cuda/common/cluster_dsm.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_mma.cuh"

namespace gk::cuda {
namespace {
using namespace dmma;
using namespace dfold;
using dll::ll_put;
using dll::merge_ll;
using dcl::cl_sync;
using dcl::ld_peer;

// 34's end (CNT): after the barrier that follows the partials' publication (chunk c of the group in stage c / W of
// warp c % W), fold group r's nw chunks in order; one group: the output; else the workspace (group r's slot), then
// the counter of unit ci; the CTA completing it folds the ng groups in order (18's merge: the same folds).
// LLM (38): the group's result as tagged words, merged by the CTA with the last ticket (attention_decode_ll.cuh).
template <class T, int D, int W, int S_, bool LLM = false>
__device__ __forceinline__ void fold_cnt(const DecodeArgs& a, int* counters, int ng, int nw, int r, int b, int h0,
                                         int nh, int ci, unsigned char* smem, const unsigned* ll_s = nullptr) {
  using Cf = MCfg<D, W, S_>;
  constexpr int S = Cf::S, STAGE = Cf::STAGE, NT = W * 32;
  __shared__ int last;
  unsigned long long* const llc = reinterpret_cast<unsigned long long*>(counters);  // (LLM)
  const int64_t hrow = int64_t(b) * a.hq + h0;
  for (int idx = threadIdx.x; idx < nh * D; idx += NT) {
    const int h = idx / D, d = idx - h * D;
    float M = -INFINITY, L = 0.f, O = 0.f;
    for (int c = 0; c < nw; ++c) {
      const float* q = reinterpret_cast<const float*>(smem + size_t(c % W) * Cf::WARPB + (c / W) * STAGE);
      float wa, wb;
      fold_w(M, q[8 * D + 2 * h], wa, wb);
      L = fold_v(L, wa, q[8 * D + 2 * h + 1], wb);
      O = fold_v(O, wa, q[h * D + d], wb);
    }
    if (ng <= 1) {  // (no keys: 0)
      static_cast<T*>(a.out)[(hrow + h) * D + d] = convert<T>(finalize(O, L));
    } else if constexpr (LLM) {
      ll_put<D>(llc, ci, r, h, d, O, M, L, ll_s[1]);
    } else {
      a.ws_o[((hrow + h) * a.nsplit + r) * D + d] = O;
      if (d == 0) {
        float* ml = a.ws_ml + ((hrow + h) * a.nsplit + r) * 2;
        ml[0] = M;
        ml[1] = L;
      }
    }
  }
  if (ng <= 1) return;
  if constexpr (LLM) {  // (the maxima and sums in warp 0's stage S - 1, as below; the fold above read it)
    merge_ll<T, D, NT>(a, hrow, nh, ng, ci, llc, ll_s, reinterpret_cast<float*>(smem + (S - 1) * STAGE));
    return;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counters + ci, 1) == ng - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // the maxima and sums through shared memory (warp 0's stage S - 1: read by the fold above, free), then each
  // thread's outputs in blocks of KB, every partial of a block loaded before its folds (ng <= 16: the host checks)
  float* sml = reinterpret_cast<float*>(smem + (S - 1) * STAGE);
  static_assert(2 * 8 * 16 * 4 <= STAGE, "the maxima and sums fit");
  for (int i = threadIdx.x; i < nh * ng; i += NT) {
    const int h = i / ng, s2 = i - h * ng;
    const float2 v = __ldcg(reinterpret_cast<const float2*>(a.ws_ml + ((hrow + h) * a.nsplit + s2) * 2));
    sml[2 * i] = v.x;
    sml[2 * i + 1] = v.y;
  }
  __syncthreads();
  constexpr int KO = 8 * D / NT, KB = KO < 4 ? KO : 4, NGF = 16;
#pragma unroll 1
  for (int k0 = 0; k0 < KO; k0 += KB) {
    float ov[KB][NGF];
#pragma unroll
    for (int k = 0; k < KB; ++k) {
      const int idx = threadIdx.x + (k0 + k) * NT, h = idx / D, d = idx - h * D;
      const float* po = a.ws_o + (hrow + h) * a.nsplit * D + d;
#pragma unroll
      for (int s2 = 0; s2 < NGF; ++s2) ov[k][s2] = idx < nh * D && s2 < ng ? __ldcg(po + int64_t(s2) * D) : 0.f;
    }
#pragma unroll
    for (int k = 0; k < KB; ++k) {
      const int idx = threadIdx.x + (k0 + k) * NT, h = idx / D, d = idx - h * D;
      if (idx < nh * D) {
        float TM = -INFINITY, TL = 0.f, TO = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < NGF; ++s2) {
          if (s2 < ng) {
            float wa, wb;
            fold_w(TM, sml[2 * (h * ng + s2)], wa, wb);
            TL = fold_v(TL, wa, sml[2 * (h * ng + s2) + 1], wb);
            TO = fold_v(TO, wa, ov[k][s2], wb);
          }
        }
        static_cast<T*>(a.out)[(hrow + h) * D + d] = convert<T>(finalize(TO, TL));
      }
    }
  }
  if (threadIdx.x == 0) counters[ci] = 0;  // every group has arrived: ready for the next launch
}
}  // namespace
}  // namespace gk::cuda
