// CUDA attention_decode, the fold kernel's fourth way to cut the work (common/decode_fold.cuh): one
// thread-block cluster per (sequence, kv head, head group), for a few sequences (head_dim 64 and 128,
// sm_90). No workspace, no counters, no second launch.
//
// The cluster has cs CTAs (the power of two >= the most groups a sequence of the cache's capacity can have, <= 16);
// CTA r runs group r of the sequence: warp w reduces chunk 8 r + w tile by tile (the tile step of every
// fold kernel), puts its partial in its ring, and after a barrier the CTA folds the chunks in order (the
// group's result, kept in shared memory). After a cluster barrier every CTA folds, for its share of the
// (head, dim) outputs, the groups' results in group order, read from the other CTAs' shared memory
// (distributed shared memory), and writes O / L; a second cluster barrier keeps every CTA's shared memory
// alive until all reads are done. Same partials, same folds, same order as the other fold kernels: the
// same bits (a single group folded into the empty top accumulator is itself).
#include <atomic>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/attention_decode_fold_cl_parts.cuh"
#include "cuda/attention_decode_ll.cuh"
#include "cuda/common/attention.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace dmma;
using namespace dfold;
using dll::ll_ticket;

constexpr int kMaxCluster = 16;

// (cl_sync, ld_peer and fold_cnt, the counter merge's end: attention_decode_fold_cl_parts.cuh)

// grid (cs, H = hkv * ngb, B), clusters of cs CTAs along x. CTA r runs groups r, r + cs, ... (GPC of them at
// most, one after the other in each warp's stream of tiles). W warps per CTA: 8 (warp w: chunk w of each group)
// or 4 (warp w: chunks w and w + 4 of the group, one after the other; CTAs of 112 KB, two per SM, so clusters of
// 16 CTAs fit on 8 SMs of a GPC).
//
// CNT (34): no cluster; grid (ngmax, H, B), one group per CTA (GPC 1): the group's result goes to the workspace
// (a sequence of one group: to the output) and the CTA that completes the (sequence, kv head, head group)'s count of
// groups folds them in group order, as the CTA kernel (18) does (the same bits). S_: the stages per warp (0: MCfg's
// default; 36 is 34 with S_ 2 at head_dim 128 (3 at 64): CTAs of 72 KB, three per SM).
// LLM (38, CNT only): 34 with the tagged merge (attention_decode_ll.cuh; counters: its buffer).
template <class T, int D, int GPC, int W, bool CNT, int S_, bool LLM>
__device__ __forceinline__ void fold_cl(const DecodeArgs& a, int* counters) {
  using Cf = MCfg<D, W, S_>;
  static_assert(W == kGroup || W == kGroup / 2, "a warp runs one or two chunks of a group");
  constexpr int CPW = kGroup / W;  // chunks of a group per warp
  constexpr int NS = GPC * CPW;    // chunk slots per warp: slot k = (group r + (k / CPW) cs, chunk warp + (k % CPW) W)
  static_assert(GPC >= 1 && NS <= 2 && Cf::S >= NS + (CNT ? 0 : 1),
                "partials in stages 0 .. NS - 1, results in stage S - 1 (counter merge: no result stage)");
  static_assert(!CNT || GPC == 1, "counter merge: one group per CTA");
  static_assert(!LLM || CNT, "tagged merge: the counter form");
  constexpr int S = Cf::S, ROWB = Cf::ROWB, CH = Cf::CH, KVB = Cf::KVB, STAGE = Cf::STAGE, CPL = Cf::CPL,
                QPL = Cf::QPL, KSTEP = Cf::KSTEP;
  static_assert(8 * D * 4 + 64 <= STAGE, "a partial fits in one stage");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned msk[W][S];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int r = blockIdx.x, cs = gridDim.x;  // rank in the cluster (clusters span x)
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int b = blockIdx.z, kvh = blockIdx.y / ngb, gb = blockIdx.y % ngb;
  const int h0 = kvh * G + gb * 8, nh = min(8, G - gb * 8);
  gdc_wait();  // (launched with PDL: q, the cache and the lengths may come from the previous kernel)
  gdc_launch();  // the next kernel waits for this grid's completion before reading the outputs
  const SeqPlan p = seq_plan(a, b);
  if constexpr (CNT) {
    if (r >= max(p.ng, 1)) return;  // (the same for every thread; no cluster barrier in this form)
  }
  __shared__ unsigned ll_s[2];  // (LLM) this CTA's ticket and the launch's tag

  unsigned char* ring = smem + size_t(warp) * Cf::WARPB;
  unsigned char* qslot = ring + S * STAGE;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)), qslot_s = ring_s + S * STAGE;
  // Group gi (group r + gi cs) of this CTA: its chunks' partials in stages gi * CPW .. of the warps (chunk c: warp
  // c % W, stage gi * CPW + c / W), the group's result in stage S - 1 of warp gi.
  int nwk[GPC];  // chunks of slot k's group (0: none)
#pragma unroll
  for (int k = 0; k < GPC; ++k) {
    const int grp = r + k * cs;
    nwk[k] = grp < p.ng ? min(kGroup, p.nsp - grp * kGroup) : 0;
  }

  {
    // this warp's chunks: slot k's chunk (r + (k / CPW) cs) * 8 + warp + (k % CPW) W when it is one of its
    // group's nwk chunks; nt[k] tiles each
    int nt[NS], lenk[NS];
    int64_t j0k[NS];
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      const int ci = warp + (k % CPW) * W;  // the chunk's index in its group
      const int cw = (r + (k / CPW) * cs) * kGroup + ci;
      lenk[k] = ci < nwk[k / CPW] ? int(min(p.chunk, p.n - int64_t(cw) * p.chunk)) : 0;
      j0k[k] = p.start + int64_t(cw) * p.chunk;
      nt[k] = (lenk[k] + 15) / 16;
    }
    int ntot = 0;
#pragma unroll
    for (int k = 0; k < NS; ++k) ntot += nt[k];
    const T* kc = static_cast<const T*>(a.kc);
    const T* vc = static_cast<const T*>(a.vc);
    // flat tile i of the warp's stream: slot k, tile t of that chunk
    auto row_of = [&](int i) {
      if (i >= ntot) return -1;
      int k = 0, t = i;
      if (NS > 1 && t >= nt[0]) {
        t -= nt[0];
        k = 1;
      }
      const int tt = t * 16 + (lane & 15);
      const int len = k ? lenk[NS - 1] : lenk[0];
      if (tt >= len) return -1;
      const int j = int(k ? j0k[NS - 1] : j0k[0]) + tt;
      if (!a.block_table) return b * int(a.bs) + j;
      const int bs = int(a.bs), blk = a.block_table[b * a.bt_stride + j / bs];
      return blk < 0 || blk >= a.nb ? -1 : blk * bs + j % bs;
    };
    int prow = row_of(0);
    auto issue = [&](int i) {
      if (i < ntot) {
        unsigned char* st = ring + (i % S) * STAGE;
        const unsigned m = __ballot_sync(kFull, prow >= 0) & 0xffffu;
        if (lane == 0) msk[warp][i % S] = m;
        const int64_t hoff = int64_t(kvh) * D;
#pragma unroll
        for (int u = 0; u < CPL; ++u) {
          const int c = lane + 32 * u, rr = c / CH, cc = c % CH;
          const int row = __shfl_sync(kFull, prow, rr);
          const bool ok = row >= 0;
          const int64_t off = ok ? int64_t(row) * a.hkv * D + hoff + cc * 8 : 0;
          cp_async16(st + swz(rr, cc, ROWB), kc + off, ok);
          cp_async16(st + KVB + swz(rr, cc, ROWB), vc + off, ok);
        }
        if (i == 0) {
          const T* qp = static_cast<const T*>(a.q);
          const T* q = qp + int64_t(b) * a.q_bs + int64_t(h0) * a.q_hs;
#pragma unroll
          for (int u = 0; u < QPL; ++u) {
            const int c = lane + 32 * u, rr = c / CH, cc = c % CH;
            const bool ok = rr < nh;
            cp_async16(qslot + swz(rr, cc, ROWB), ok ? q + int64_t(rr) * a.q_hs + cc * 8 : qp, ok);
          }
        }
      }
      cp_async_commit();
      prow = row_of(i + 1);
    };
#pragma unroll 1
    for (int i = 0; i < S - 1; ++i) issue(i);
    if constexpr (LLM) {  // the ticket, taken while the first tiles are in flight
      if (threadIdx.x == 0 && p.ng > 1)
        ll_ticket(reinterpret_cast<unsigned long long*>(counters), b * int(gridDim.y) + int(blockIdx.y), ll_s);
    }

    const float sl2 = a.scale * kLog2e;
    const bool capped = a.softcap > 0.f;
    const float cap_in = capped ? a.scale / a.softcap : 0.f, cap_out = a.softcap * kLog2e;
    uint32_t qa[KSTEP][2];
    float o[KSTEP][4], so[KSTEP][4];  // so: slot 0's partial while slot 1's chunk runs (NS 2)
    float sm[4];                      // slot 0's mA, mB, lA, lB
#pragma unroll
    for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][e] = so[mt][e] = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) sm[e] = 0.f;
    float mrow = -INFINITY, lsum = 0.f;
    const int hA = 2 * t4, hB = 2 * t4 + 1;
    // publishes the chunk partial (o, stats) into stage k of this warp's ring (all its copies have landed)
    auto publish = [&](int k, const float (&ov)[KSTEP][4], const float (&stv)[4]) {
      float* pw = reinterpret_cast<float*>(ring + k * STAGE);
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
    };
    auto stats = [&](float (&stv)[4]) {
      float l = lsum;
      l += __shfl_xor_sync(kFull, l, 1);
      l += __shfl_xor_sync(kFull, l, 2);
      stv[0] = __shfl_sync(kFull, mrow, 8 * t4);
      stv[1] = __shfl_sync(kFull, mrow, 8 * t4 + 4);
      stv[2] = __shfl_sync(kFull, l, 8 * t4);
      stv[3] = __shfl_sync(kFull, l, 8 * t4 + 4);
    };
#pragma unroll 1
    for (int i = 0; i < ntot; ++i) {
      cp_async_wait<S - 2>();
      __syncwarp();
      if (i == 0) {
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
      issue(i + S - 1);  // into the stage of tile i - 1 (its reads are ordered by the __syncwarp above)
      tile_step<T, D>(ring_s + (i % S) * STAGE, qa, msk[warp][i % S], sl2, capped, cap_in, cap_out, o, mrow, lsum,
                      lane);
      if (NS > 1 && i + 1 == nt[0] && ntot > nt[0]) {  // slot 0's chunk ends, slot 1's follows: keep it
        stats(sm);
#pragma unroll
        for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            so[mt][e] = o[mt][e];
            o[mt][e] = 0.f;
          }
        mrow = -INFINITY;
        lsum = 0.f;
      }
    }
    cp_async_wait<0>();
    if (ntot > 0) {
      float st[4];
      stats(st);
      __syncwarp();  // every lane's ldmatrix reads of the ring are done
      if (NS > 1 && ntot > nt[0]) {
        if (nt[0] > 0) publish(0, so, sm);
        publish(NS - 1, o, st);
      } else {
        publish(0, o, st);
      }
    }
  }
  __syncthreads();
  if constexpr (CNT) {
    fold_cnt<T, D, W, S_, LLM>(a, counters, p.ng, nwk[0], r, b, h0, nh, b * int(gridDim.y) + int(blockIdx.y), smem,
                               ll_s);
    return;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < GPC; ++k) {  // each group: its chunks folded in order, into stage S - 1 of warp k
    if (nwk[k] == 0) continue;
    float* gres = reinterpret_cast<float*>(smem + size_t(k) * Cf::WARPB + (S - 1) * STAGE);
    for (int idx = threadIdx.x; idx < nh * D; idx += W * 32) {
      const int h = idx / D, d = idx - h * D;
      float M = -INFINITY, L = 0.f, O = 0.f;
      for (int c = 0; c < nwk[k]; ++c) {
        const float* q =
            reinterpret_cast<const float*>(smem + size_t(c % W) * Cf::WARPB + (k * CPW + c / W) * STAGE);
        float wa, wb;
        fold_w(M, q[8 * D + 2 * h], wa, wb);
        L = fold_v(L, wa, q[8 * D + 2 * h + 1], wb);
        O = fold_v(O, wa, q[h * D + d], wb);
      }
      gres[h * D + d] = O;
      if (d == 0) {
        gres[8 * D + 2 * h] = M;
        gres[8 * D + 2 * h + 1] = L;
      }
    }
  }
  __syncwarp();
  cl_sync();  // every group's result is visible to the cluster
  // The top fold of this CTA's share of the nh * D outputs: groups 0 .. ng - 1 (ng <= cs * GPC <= 16) in order;
  // group s is in CTA s % cs, slot s / cs.
  const uint32_t base_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + (S - 1) * STAGE;
  const int per = (nh * D + cs - 1) / cs;
  const int ng = min(p.ng, cs * GPC);  // (always p.ng: the host picks cs * GPC >= the most groups of the capacity)
  for (int idx = r * per + threadIdx.x; idx < min(nh * D, (r + 1) * per); idx += W * 32) {
    const int h = idx / D, d = idx - h * D;
    float mv[kMaxCluster], lv[kMaxCluster], ov[kMaxCluster];
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s) {
      if (s < ng) {
        const int rk = GPC > 1 ? s % cs : s;
        const uint32_t gs = base_s + (GPC > 1 ? uint32_t(s / cs) * Cf::WARPB : 0u);
        mv[s] = ld_peer(gs + (8 * D + 2 * h) * 4, rk);
        lv[s] = ld_peer(gs + (8 * D + 2 * h + 1) * 4, rk);
        ov[s] = ld_peer(gs + (h * D + d) * 4, rk);
      }
    }
    float TM = -INFINITY, TL = 0.f, TO = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s) {
      if (s < ng) {
        float wa, wb;
        fold_w(TM, mv[s], wa, wb);
        TL = fold_v(TL, wa, lv[s], wb);
        TO = fold_v(TO, wa, ov[s], wb);
      }
    }
    static_cast<T*>(a.out)[(int64_t(b) * a.hq + h0 + h) * D + d] = convert<T>(finalize(TO, TL));
  }
  __syncwarp();
  cl_sync();  // no CTA leaves (freeing its shared memory) while others read it
}

template <class T, int D, int GPC, int W, bool CNT = false, int S_ = 0>
__global__ void __launch_bounds__(W * 32, CNT && S_ ? 3 : 1)
    k_decode_fold_cl(const __grid_constant__ DecodeArgs a, int* counters) {
  fold_cl<T, D, GPC, W, CNT, S_, false>(a, counters);
}
template <class T, int D>
__global__ void __launch_bounds__(kGroup / 2 * 32, 1) k_decode_fold_cl_ll(const __grid_constant__ DecodeArgs a,
                                                                          int* llbuf) {
  fold_cl<T, D, 1, kGroup / 2, true, 0, true>(a, llbuf);
}

// Clusters of cs CTAs of the kernel with GPC groups per CTA resident at once on this device (queried once per
// (device, kernel, cs)); 0: such a cluster cannot run.
template <class T, int D, int GPC, int W = kGroup>
int cl_resident(int cs) {
  using Cf = MCfg<D, W>;
  static std::atomic<int> cache[64][kMaxCluster + 1];  // resident + 1 (0: not queried)
  int dev = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 0;
  int v = cache[dev][cs].load(std::memory_order_relaxed);
  if (v == 0) {
    auto kern = k_decode_fold_cl<T, D, GPC, W>;
    GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cf::SMEM)));
    if (cs > 8) GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    if (W < kGroup)  // two CTAs per SM: all of the SM's shared memory for it
      GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3{unsigned(cs), 1u, 1u};
    cfg.blockDim = dim3{unsigned(Cf::W * 32), 1u, 1u};
    cfg.dynamicSmemBytes = Cf::SMEM;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(cs);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    v = n + 1;
    cache[dev][cs].store(v, std::memory_order_relaxed);
  }
  return v - 1;
}

template <class T, int D, int GPC, int W = kGroup>
bool launch_cl(const DecodeArgs& a, cudaStream_t st, int cs, bool pdl = true) {
  using Cf = MCfg<D, W>;
  static_assert(Cf::SMEM + Cf::W * Cf::S * 4 <= 227 * 1024, "shared memory");
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  auto kern = k_decode_fold_cl<T, D, GPC, W>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3{unsigned(cs), unsigned(a.hkv * ngb), unsigned(a.B)};
  cfg.blockDim = dim3{unsigned(Cf::W * 32), 1u, 1u};
  cfg.dynamicSmemBytes = Cf::SMEM;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cs);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && decode_pdl() ? 2 : 1;
  if (cudaLaunchKernelEx(&cfg, kern, a, static_cast<int*>(nullptr)) != cudaSuccess) {
    (void)cudaGetLastError();
    if (cfg.numAttrs == 1) return false;
    cfg.numAttrs = 1;  // without PDL
    if (cudaLaunchKernelEx(&cfg, kern, a, static_cast<int*>(nullptr)) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
  }
  GK_LAUNCH_CHECK("attention_decode_fold_cl");
  return true;
}

// 34: grid (ngmax, H, B) of 4-warp CTAs (two per SM), no cluster, the counter merge; false while the stream's
// capture is invalidated (no counters) or ngmax > 16. LLM (38): the tagged merge (at most dll::kLLCtr group
// indices B x H; its buffer instead of the counters).
template <class T, int D, int S_ = 0, bool LLM = false>
bool launch_cnt(const DecodeArgs& a, cudaStream_t st) {
  using Cf = MCfg<D, kGroup / 2, S_>;
  const int ngmax = (a.nsplit + kGroup - 1) / kGroup;
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  if (ngmax < 1 || ngmax > kMaxCluster || a.hkv * ngb > 65535) return false;
  if (LLM && (ngmax > dll::kLLGroups || int64_t(a.B) * a.hkv * ngb > dll::kLLCtr)) return false;
  auto kern = LLM ? k_decode_fold_cl_ll<T, D> : k_decode_fold_cl<T, D, 1, kGroup / 2, true, S_>;
  {
    static std::atomic<unsigned long long> done{0};
    int dev = 0;
    GK_CUDA_CHECK(cudaGetDevice(&dev));
    const unsigned long long bit = 1ull << (dev & 63);
    if (dev >= 64 || !(done.load(std::memory_order_relaxed) & bit)) {
      GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cf::SMEM)));
      GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
      done.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  int* counters = LLM ? reinterpret_cast<int*>(dll::ll_buffer(st, int64_t(a.B) * a.hkv * ngb))
                      : merge_counters(st, int64_t(a.B) * a.hkv * ngb);
  if (!counters) return false;
  launch_maybe_pdl(kern, dim3{unsigned(ngmax), unsigned(a.hkv * ngb), unsigned(a.B)}, dim3{unsigned(Cf::W * 32)},
                   Cf::SMEM, st, decode_pdl(), a, counters);
  GK_LAUNCH_CHECK("attention_decode_fold_cl (counter merge)");
  return true;
}

// Picks the cluster: the most groups a sequence of the capacity can have (ngmax <= 16) in clusters of the
// power of two cs >= ngmax (one group per CTA), else cs >= ngmax / 2 (two groups per CTA, the second after the
// first in each warp), whichever has all B * hkv * ngb clusters resident at once (force 1: the first that can
// run; 2: two groups per CTA when ngmax > 1; 3: one group per CTA with all clusters resident, else nothing; 4: one
// group per CTA of 4 warps, two chunks per warp (33), when such clusters can run; 5: 4 with all clusters resident,
// launched without PDL;
// 6: 34, the same CTAs without a cluster, merged by counter; 7: 36, 34 with 2 (head_dim 64: 3) stages per warp;
// 9 (route bit 8192): two groups per CTA (25) when ngmax >= 2 and all its clusters are resident at once, else
// nothing (no one-group attempt: bit 8's force 3 runs before it where 24 fits); 10 (route bit 65536): 5 launched with PDL
// (bit 16384's 33 at B >= 2).
template <class T, int D>
bool go_cl(const DecodeArgs& a, cudaStream_t st, int force) {
  const bool forced = force == 1 || force == 2;
  if (force == 6) return launch_cnt<T, D>(a, st);
  if (force == 7) return launch_cnt<T, D, D == 128 ? 2 : 3>(a, st);
  if (force == 8) return launch_cnt<T, D, 0, true>(a, st);
  const int ngmax = (a.nsplit + kGroup - 1) / kGroup;
  if (ngmax > kMaxCluster) return false;
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  if (a.hkv * ngb > 65535) return false;
  const int64_t clusters = int64_t(a.B) * a.hkv * ngb;
  int cs1 = 1;
  while (cs1 < ngmax) cs1 *= 2;
  if (force == 4 || force == 5 || force == 10) {
    const int r4 = cl_resident<T, D, 1, kGroup / 2>(cs1);
    if (const char* e = std::getenv("GPUKIT_DECODE_LOG"); e && *e && std::strcmp(e, "0") != 0)
      std::fprintf(stderr, "attention_decode cluster: %lld clusters needed; %d clusters of %d CTAs of 4 warps resident\n",
                   static_cast<long long>(clusters), r4, cs1);
    // (5, auto's 33: without PDL. Session 7's A, B1 graph us, PDL on / off: T4096 13.1 / 12.9, T16384 30.1 / 26.0,
    // T131072 189.2 / 151.2; likely the early-launched next grid's CTAs taking the second CTA slot of SMs, so that
    // CTAs of one grid end up two to an SM while other SMs idle; 18's one-CTA-per-SM grids cannot co-reside.)
    // (10: as 5 with PDL; session 8's final run, forced 33 graph us PDL on / off: B16 T512 15.6 / 16.2, B6 T1024
    // 13.9 / 13.6, B4 T1024 12.2 / 12.2.)
    return r4 > 0 && (force == 4 || clusters <= r4) && launch_cl<T, D, 1, kGroup / 2>(a, st, cs1, force != 5);
  }
  const int r1 = cl_resident<T, D, 1>(cs1);
  if (const char* e = std::getenv("GPUKIT_DECODE_LOG"); e && *e && std::strcmp(e, "0") != 0)
    std::fprintf(stderr,
                 "attention_decode cluster: %lld clusters needed; resident at once: %d clusters of %d CTAs (1 group "
                 "per CTA), %d of %d (2 groups per CTA)\n",
                 static_cast<long long>(clusters), r1, cs1, cs1 >= 2 ? cl_resident<T, D, 2>(cs1 / 2) : 0, cs1 / 2);
  if (force == 9) {  // (25 only, all clusters resident, ngmax >= 2; the log line above names r2 as well)
    if (cs1 < 2) return false;
    const int r2 = cl_resident<T, D, 2>(cs1 / 2);
    return r2 > 0 && clusters <= r2 && launch_cl<T, D, 2>(a, st, cs1 / 2);
  }
  if (r1 > 0 && (force == 1 || (force == 2 && cs1 == 1) || (!forced && clusters <= r1)))
    return launch_cl<T, D, 1>(a, st, cs1);
  if (force == 3) return false;
  if (cs1 >= 2) {
    const int cs2 = cs1 / 2;
    const int r2 = cl_resident<T, D, 2>(cs2);
    if (r2 > 0 && (forced || clusters <= r2)) return launch_cl<T, D, 2>(a, st, cs2);
  }
  return false;
}
}  // namespace

bool attention_decode_fold_cl(const DecodeArgs& a, cudaStream_t st, int force) {
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  if (!half || a.cache_dtype != a.dtype || (a.D != 64 && a.D != 128)) return false;
  if (!aligned16(a.q) || (a.q_bs * 2) % 16 || (a.q_hs * 2) % 16) return false;
  if (a.B > 65535 || a.nb * a.bs > int64_t(INT32_MAX)) return false;
  if (a.chunk_min % 16) return false;
  {  // sm_90+ only (clusters, distributed shared memory)
    static std::atomic<int> major[64];
    int dev = 0;
    GK_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= 64) dev = 0;
    int m = major[dev].load(std::memory_order_relaxed);
    if (m <= 0) {
      GK_CUDA_CHECK(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev));
      major[dev].store(m, std::memory_order_relaxed);
    }
    if (m < 9) return false;
  }
  auto go = [&](auto t) {
    using T = decltype(t);
    return a.D == 64 ? go_cl<T, 64>(a, st, force) : go_cl<T, 128>(a, st, force);
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

}  // namespace gk::cuda
