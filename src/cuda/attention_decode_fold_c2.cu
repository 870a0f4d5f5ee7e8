// CUDA attention_decode, variant 39 (session 9, decattn12): the cluster kernel of 4-warp CTAs (33) with TWO
// groups per CTA, so that a sequence of 16 groups (B2 / B3 at 4096 keys, Hkv 8) is a cluster of 8 CTAs of 112 KB
// (two per SM: a 4-SM footprint) instead of 16 (33: 8 SMs; 14 of the 16 clusters of B2 T4096 resident on the
// H200) or 8 CTAs of 224 KB (25: 8 SMs; 15 of 16). All clusters resident means one wave and no merge in global
// memory: the groups fold through distributed shared memory as in attention_decode_fold_cl.cu.
//
// Work of CTA r (grid (cs, hkv x head groups, B), clusters of cs = the power of two >= ngmax, halved, along x):
// groups r and r + cs of its (sequence, kv head, head group). Warp w streams four chunks one after the other
// through its ring of S stages (the fold kernels' tile step, S - 1 tiles in flight, the prefetch crossing chunk
// boundaries): slot 0 = chunk w of group r, 1 = chunk w + 4 of group r, 2 = chunk w of group r + cs, 3 = chunk
// w + 4 of group r + cs. A finished chunk's partial (o, max, sum) waits in registers (slots 0-2; 4-warp CTAs may
// use 255 registers a thread at two CTAs per SM) until the warp's last tile has landed, then all four go to the
// warp's ring (4 x 4160 bytes at head_dim 128: the ring's 24 KB). After a CTA barrier each group's chunks are
// folded in chunk order (the result in warp 0's ring after its partials), a cluster barrier, then every CTA folds
// its share of the outputs over the groups in group order (group s: CTA s % cs, slot s / cs), O / L, and a last
// cluster barrier keeps the shared memory alive until every peer's reads are done. Same partials, same folds in
// the same order as every fold kernel (common/decode_fold.cuh): the same bits as 23.
#include <atomic>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/common/attention.cuh"
#include "cuda/common/cluster_dsm.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace dmma;
using namespace dfold;

constexpr int kW = kGroup / 2;     // warps per CTA
constexpr int kGpc = 2;            // groups per CTA
constexpr int kCpw = kGroup / kW;  // chunks of a group per warp
constexpr int kNs = kGpc * kCpw;   // chunk slots per warp
constexpr int kMaxCs = 8;          // CTAs per cluster (16 groups: the fold kernels' bound)

using dcl::cl_sync;
using dcl::ld_peer;

// Layout: the stage ring of MCfg<D, 4> per warp; after streaming, partial k of warp w at w's ring + k * PB
// (8 heads x D outputs, then (max, sum) of each head), the CTA's two group results in warp 0's ring at RES.
template <int D>
struct C2Cfg {
  using Cf = MCfg<D, kW>;
  static constexpr int PB = (8 * D + 16) * 4;
  static constexpr int RES = kNs * PB;
  static_assert(PB % 16 == 0, "16-byte aligned partials");
  static_assert(RES + kGpc * PB <= Cf::WARPB, "four partials and two group results fit in one warp's ring");
};

template <class T, int D>
__global__ void __launch_bounds__(kW * 32, 1) k_decode_fold_c2(const __grid_constant__ DecodeArgs a) {
  using Cf = MCfg<D, kW>;
  using Z = C2Cfg<D>;
  constexpr int S = Cf::S, ROWB = Cf::ROWB, CH = Cf::CH, KVB = Cf::KVB, STAGE = Cf::STAGE, CPL = Cf::CPL,
                QPL = Cf::QPL, KSTEP = Cf::KSTEP, NT = kW * 32, PB = Z::PB;
  static_assert(S >= 3, "two tiles in flight");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned msk[kW][S];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int r = blockIdx.x, cs = gridDim.x;  // rank in the cluster (clusters span x)
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int b = blockIdx.z, kvh = blockIdx.y / ngb, gb = blockIdx.y % ngb;
  const int h0 = kvh * G + gb * 8, nh = min(8, G - gb * 8);
  gdc_wait();    // (launched with PDL: q, the cache and the lengths may come from the previous kernel)
  gdc_launch();  // the next kernel waits for this grid's completion before reading the outputs
  const SeqPlan p = seq_plan(a, b);

  unsigned char* ring = smem + size_t(warp) * Cf::WARPB;
  unsigned char* qslot = ring + S * STAGE;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)), qslot_s = ring_s + S * STAGE;
  int nwk[kGpc];  // chunks of group r + k cs (0: none)
#pragma unroll
  for (int k = 0; k < kGpc; ++k) {
    const int grp = r + k * cs;
    nwk[k] = grp < p.ng ? min(kGroup, p.nsp - grp * kGroup) : 0;
  }

  {
    int nt[kNs], lenk[kNs], cum[kNs + 1];
    int64_t j0k[kNs];
    cum[0] = 0;
#pragma unroll
    for (int k = 0; k < kNs; ++k) {
      const int ci = warp + (k % kCpw) * kW;  // the chunk's index in its group
      const int cw = (r + (k / kCpw) * cs) * kGroup + ci;
      lenk[k] = ci < nwk[k / kCpw] ? int(min(p.chunk, p.n - int64_t(cw) * p.chunk)) : 0;
      j0k[k] = p.start + int64_t(cw) * p.chunk;
      nt[k] = (lenk[k] + 15) / 16;
      cum[k + 1] = cum[k] + nt[k];
    }
    const int ntot = cum[kNs];
    const T* kc = static_cast<const T*>(a.kc);
    const T* vc = static_cast<const T*>(a.vc);
    // flat tile i of the warp's stream: the last slot k with cum[k] <= i, tile i - cum[k] of its chunk
    auto row_of = [&](int i) {
      if (i >= ntot) return -1;
      int t = i, len = lenk[0];
      int64_t j0 = j0k[0];
#pragma unroll
      for (int k = 1; k < kNs; ++k)
        if (i >= cum[k]) {
          t = i - cum[k];
          len = lenk[k];
          j0 = j0k[k];
        }
      const int tt = t * 16 + (lane & 15);
      if (tt >= len) return -1;
      const int j = int(j0) + tt;
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

    const float sl2 = a.scale * kLog2e;
    const bool capped = a.softcap > 0.f;
    const float cap_in = capped ? a.scale / a.softcap : 0.f, cap_out = a.softcap * kLog2e;
    uint32_t qa[KSTEP][2];
    float o[KSTEP][4], so[kNs - 1][KSTEP][4];  // so[k]: slot k's partial while the later slots run
    float sm[kNs - 1][4];                      // slot k's mA, mB, lA, lB
#pragma unroll
    for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][e] = 0.f;
#pragma unroll
    for (int k = 0; k < kNs - 1; ++k) {
#pragma unroll
      for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) so[k][mt][e] = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) sm[k][e] = 0.f;
    }
    float mrow = -INFINITY, lsum = 0.f;
    const int hA = 2 * t4, hB = 2 * t4 + 1;
    // publishes a chunk partial (o, stats) as partial k of this warp (all its copies have landed)
    auto publish = [&](int k, const float (&ov)[KSTEP][4], const float (&stv)[4]) {
      float* pw = reinterpret_cast<float*>(ring + k * PB);
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
      if (i + 1 < ntot) {  // slot k's chunk ends here and a later slot's follows: keep its partial
#pragma unroll
        for (int k = 0; k < kNs - 1; ++k) {
          if (i + 1 == cum[k + 1]) {  // (warp-uniform)
            stats(sm[k]);
#pragma unroll
            for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                so[k][mt][e] = o[mt][e];
                o[mt][e] = 0.f;
              }
            mrow = -INFINITY;
            lsum = 0.f;
          }
        }
      }
    }
    cp_async_wait<0>();
    if (ntot > 0) {
      float st[4];
      stats(st);
      __syncwarp();  // every lane's ldmatrix reads of the ring are done
      int kl = 0;  // the last slot with tiles: its partial is the live one
#pragma unroll
      for (int k = 0; k < kNs; ++k)
        if (nt[k] > 0) kl = k;
#pragma unroll
      for (int k = 0; k < kNs; ++k) {
        if (nt[k] == 0) continue;
        if (k == kl) publish(k, o, st);
        else publish(k, so[k < kNs - 1 ? k : 0], sm[k < kNs - 1 ? k : 0]);
      }
    }
  }
  __syncthreads();
  // each group: its chunks folded in order (chunk c: warp c % 4, partial k * 2 + c / 4), into warp 0's ring at RES
#pragma unroll
  for (int k = 0; k < kGpc; ++k) {
    if (nwk[k] == 0) continue;
    float* gres = reinterpret_cast<float*>(smem + Z::RES + k * PB);
    for (int idx = threadIdx.x; idx < nh * D; idx += NT) {
      const int h = idx / D, d = idx - h * D;
      float M = -INFINITY, L = 0.f, O = 0.f;
      for (int c = 0; c < nwk[k]; ++c) {
        const float* q =
            reinterpret_cast<const float*>(smem + size_t(c % kW) * Cf::WARPB + (k * kCpw + c / kW) * PB);
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
  // The top fold of this CTA's share of the nh * D outputs: groups 0 .. ng - 1 (ng <= 2 cs <= 16) in order; group
  // s is in CTA s % cs, slot s / cs.
  const uint32_t base_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + Z::RES;
  const int per = (nh * D + cs - 1) / cs;
  const int ng = min(p.ng, cs * kGpc);  // (always p.ng: the host picks 2 cs >= the most groups of the capacity)
  for (int idx = r * per + threadIdx.x; idx < min(nh * D, (r + 1) * per); idx += NT) {
    const int h = idx / D, d = idx - h * D;
    float mv[2 * kMaxCs], lv[2 * kMaxCs], ov[2 * kMaxCs];
#pragma unroll
    for (int s = 0; s < 2 * kMaxCs; ++s) {
      if (s < ng) {
        const int rk = s % cs;
        const uint32_t gs = base_s + uint32_t(s / cs) * PB;
        mv[s] = ld_peer(gs + (8 * D + 2 * h) * 4, rk);
        lv[s] = ld_peer(gs + (8 * D + 2 * h + 1) * 4, rk);
        ov[s] = ld_peer(gs + (h * D + d) * 4, rk);
      }
    }
    float TM = -INFINITY, TL = 0.f, TO = 0.f;
#pragma unroll
    for (int s = 0; s < 2 * kMaxCs; ++s) {
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

int c2_log_on() {
  const char* e = std::getenv("GPUKIT_DECODE_LOG");
  return e && *e && std::strcmp(e, "0") != 0;
}

// Clusters of cs CTAs resident at once on this device (queried once per (device, dtype, head_dim, cs)); 0: such a
// cluster cannot run.
template <class T, int D>
int c2_resident(int cs) {
  using Cf = MCfg<D, kW>;
  static std::atomic<int> cache[64][kMaxCs + 1];  // resident + 1 (0: not queried)
  int dev = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) dev = 0;
  int v = cache[dev][cs].load(std::memory_order_relaxed);
  if (v == 0) {
    auto kern = k_decode_fold_c2<T, D>;
    GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cf::SMEM)));
    GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100));  // 2 per SM
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3{unsigned(cs), 1u, 1u};
    cfg.blockDim = dim3{unsigned(kW * 32), 1u, 1u};
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

// resident_only: only when all B x hkv x head-group clusters are resident at once (the route; one wave), else
// whenever such a cluster can run (forced variant 39). pdl: with the PDL attribute (and decode_pdl()).
template <class T, int D>
bool go_c2(const DecodeArgs& a, cudaStream_t st, bool resident_only, bool pdl) {
  using Cf = MCfg<D, kW>;
  static_assert(Cf::SMEM + kW * Cf::S * 4 <= 227 * 1024, "shared memory");
  const int ngmax = (a.nsplit + kGroup - 1) / kGroup;
  if (ngmax < 1 || ngmax > 2 * kMaxCs) return false;
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  if (a.hkv * ngb > 65535) return false;
  int cs = 1;
  while (2 * cs < ngmax) cs *= 2;  // 2 cs >= ngmax: groups r and r + cs in CTA r
  const int64_t clusters = int64_t(a.B) * a.hkv * ngb;
  const int res = c2_resident<T, D>(cs);
  if (c2_log_on())
    std::fprintf(stderr,
                 "attention_decode cluster: %lld clusters needed; %d clusters of %d CTAs of 4 warps, two groups per "
                 "CTA, resident\n",
                 static_cast<long long>(clusters), res, cs);
  if (res <= 0 || (resident_only && clusters > res)) return false;
  auto kern = k_decode_fold_c2<T, D>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3{unsigned(cs), unsigned(a.hkv * ngb), unsigned(a.B)};
  cfg.blockDim = dim3{unsigned(kW * 32), 1u, 1u};
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
  if (cudaLaunchKernelEx(&cfg, kern, a) != cudaSuccess) {
    (void)cudaGetLastError();
    if (cfg.numAttrs == 1) return false;
    cfg.numAttrs = 1;  // without PDL
    if (cudaLaunchKernelEx(&cfg, kern, a) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
  }
  GK_LAUNCH_CHECK("attention_decode_fold_c2");
  return true;
}
}  // namespace

bool attention_decode_fold_c2(const DecodeArgs& a, cudaStream_t st, bool resident_only, bool pdl) {
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
    return a.D == 64 ? go_c2<T, 64>(a, st, resident_only, pdl) : go_c2<T, 128>(a, st, resident_only, pdl);
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

}  // namespace gk::cuda
