// CUDA attention_decode, the fold kernel's sixth way to cut the work (common/decode_fold.cuh): the pair kernel
// (attention_decode_fold_pair.cu) spread over a thread-block cluster, for mid-size batches (head_dim 64 / 128,
// sm_90). One launch, no workspace, no counters.
//
// A cluster of cs CTAs of W warps runs one (sequence, kv head, head group) pair: warp w of CTA r runs group
// r * W + w (its chunks reduced tile by tile and folded into the group's accumulator in registers, as the pair
// kernel and the warp group units do), and puts the group's result in its ring. After a cluster barrier every
// CTA folds its share of the pair's outputs over groups 0 .. ng - 1 in order, reading the results through
// distributed shared memory, and writes O / L; a second cluster barrier keeps the shared memory alive while
// peers read it. Same partials, same folds, same order as the other fold kernels: the same bits.
//
// Why: the pair kernel has one CTA per pair, so B4 T4096 (Hq 32, Hkv 8) fills 32 of 132 SMs and B8 64; here a
// pair has one warp per group (16 at T4096), so B4 runs 512 warps on 128 SMs (W 4, clusters of 4; two CTAs of
// 104 KB fit an SM) and B8 1024 (W 8, clusters of 2, or W 4 two CTAs per SM), in one launch without the
// two-kernel fold's merge kernel (5-6 us at checkpoint A of session 5). "deep": W 4 with twice the stages (one
// CTA per SM, 5 tiles in flight per warp instead of 2: B4 has 4 warps per SM, each 16 tiles long).
#include <atomic>
#include <cfloat>

#include "cuda/common/attention.cuh"
#include "cuda/common/cluster_dsm.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace dmma;
using namespace dfold;

constexpr int kMaxGroups = 16;  // groups of a pair (the host checks the capacity's bound)

using dcl::cl_sync;
using dcl::ld_peer;

// Per warp: S stages of a 16-key K and V tile (MCfg's stage layout), then one query slot (8 heads).
template <int D, int W, int S>
struct PclCfg {
  using Cf = MCfg<D>;
  static constexpr int WARPB = S * Cf::STAGE + Cf::QB;
  static constexpr size_t SMEM = size_t(W) * WARPB;
};

// grid (cs, H = hkv * ngb, B), clusters of cs CTAs along x; CTA r (rank), warp w: group r * W + w; S stages per
// warp (S - 1 tiles in flight).
// EF: K / V loads tagged L2 evict-first (the only form launched: 23 beat 19 at every shape of checkpoint A).
template <class T, int D, int W, int S, bool EF>
__global__ void __launch_bounds__(W * 32) k_decode_fold_pcl(const __grid_constant__ DecodeArgs a) {
  using Cf = MCfg<D>;
  constexpr int WARPB = PclCfg<D, W, S>::WARPB;
  static_assert(S >= 2, "a stage ring");
  constexpr int ROWB = Cf::ROWB, CH = Cf::CH, KVB = Cf::KVB, STAGE = Cf::STAGE, CPL = Cf::CPL,
                QPL = Cf::QPL, KSTEP = Cf::KSTEP;
  static_assert(8 * D * 4 + 64 <= STAGE, "a group's result fits in one stage");
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
  const int ng = min(p.ng, min(cs * W, kMaxGroups));  // (always p.ng: the host checks the capacity's bound)

  unsigned char* ring = smem + size_t(warp) * WARPB;
  unsigned char* qslot = ring + S * STAGE;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)), qslot_s = ring_s + S * STAGE;
  const int hA = 2 * t4, hB = 2 * t4 + 1;
  {
    const int grp = r * W + warp;
    const int64_t c0 = int64_t(grp) * kGroup;
    const int len = grp < ng ? int(min((c0 + kGroup) * p.chunk, p.n) - c0 * p.chunk) : 0;
    const int64_t j0 = p.start + c0 * p.chunk;
    const int ntot = (len + 15) / 16;
    const int ctiles = int(p.chunk / 16);  // tiles per chunk (chunk_min % 16 == 0)
    const T* kc = static_cast<const T*>(a.kc);
    const T* vc = static_cast<const T*>(a.vc);
    const uint64_t pol = EF ? l2_evict_first() : 0;
    auto row_of = [&](int i) {
      if (i >= ntot) return -1;
      const int tt = i * 16 + (lane & 15);
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
          if constexpr (EF) {
            cp_async16_ef(st + swz(rr, cc, ROWB), kc + off, ok, pol);
            cp_async16_ef(st + KVB + swz(rr, cc, ROWB), vc + off, ok, pol);
          } else {
            cp_async16(st + swz(rr, cc, ROWB), kc + off, ok);
            cp_async16(st + KVB + swz(rr, cc, ROWB), vc + off, ok);
          }
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
    float o[KSTEP][4], go[KSTEP][4];  // chunk, group accumulator
#pragma unroll
    for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][e] = go[mt][e] = 0.f;
    float mrow = -INFINITY, lsum = 0.f;
    float gmA = -INFINITY, gmB = -INFINITY, glA = 0.f, glB = 0.f;  // group accumulator (heads hA, hB)
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
      if (i + 1 == ntot || (i + 1) % ctiles == 0) {  // a chunk ends: the group accumulator (+)= this chunk
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
    }
    cp_async_wait<0>();
    __syncwarp();  // every lane's ldmatrix reads of the ring are done
    if (ntot > 0) {  // the group's result into stage 0 of this warp's ring
      float* pw = reinterpret_cast<float*>(ring);
#pragma unroll
      for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) pw[(e & 1 ? hB : hA) * D + mt * 16 + g + (e >= 2 ? 8 : 0)] = go[mt][e];
      if (lane < 4) {
        pw[8 * D + 2 * hA] = gmA;
        pw[8 * D + 2 * hA + 1] = glA;
        pw[8 * D + 2 * hB] = gmB;
        pw[8 * D + 2 * hB + 1] = glB;
      }
    }
  }
  __syncwarp();
  cl_sync();  // every group's result is visible to the cluster
  // The top fold of this CTA's share of the nh * D outputs: groups 0 .. ng - 1 in order (group s: CTA s / W,
  // warp s % W, stage 0), then O / L.
  const uint32_t base_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int per = (nh * D + cs - 1) / cs;
  for (int idx = r * per + int(threadIdx.x); idx < min(nh * D, (r + 1) * per); idx += W * 32) {
    const int h = idx / D, d = idx - h * D;
    float mv[kMaxGroups], lv[kMaxGroups], ov[kMaxGroups];
#pragma unroll
    for (int s = 0; s < kMaxGroups; ++s) {
      if (s < ng) {
        const uint32_t gs = base_s + uint32_t(s % W) * uint32_t(WARPB);
        const uint32_t rk = uint32_t(s / W);
        mv[s] = ld_peer(gs + (8 * D + 2 * h) * 4, rk);
        lv[s] = ld_peer(gs + (8 * D + 2 * h + 1) * 4, rk);
        ov[s] = ld_peer(gs + (h * D + d) * 4, rk);
      }
    }
    float TM = -INFINITY, TL = 0.f, TO = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxGroups; ++s) {
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

template <class T, int D, int W, int S, bool EF>
bool launch_pcl(const DecodeArgs& a, cudaStream_t st, int cs) {
  constexpr size_t SMEM = PclCfg<D, W, S>::SMEM;
  static_assert(SMEM + W * S * 4 <= 227 * 1024, "shared memory");
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  auto kern = k_decode_fold_pcl<T, D, W, S, EF>;
  {
    static std::atomic<unsigned long long> done{0};
    int dev = 0;
    GK_CUDA_CHECK(cudaGetDevice(&dev));
    const unsigned long long bit = 1ull << (dev & 63);
    if (dev >= 64 || !(done.load(std::memory_order_relaxed) & bit)) {
      GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(SMEM)));
      done.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3{unsigned(cs), unsigned(a.hkv * ngb), unsigned(a.B)};
  cfg.blockDim = dim3{unsigned(W * 32), 1u, 1u};
  cfg.dynamicSmemBytes = SMEM;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(cs);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = decode_pdl() ? 2 : 1;
  if (cudaLaunchKernelEx(&cfg, kern, a) != cudaSuccess) {
    (void)cudaGetLastError();
    if (cfg.numAttrs == 1) return false;
    cfg.numAttrs = 1;  // without PDL
    if (cudaLaunchKernelEx(&cfg, kern, a) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
  }
  GK_LAUNCH_CHECK("attention_decode_fold_pcl");
  return true;
}
}  // namespace

bool attention_decode_fold_pcl(const DecodeArgs& a, cudaStream_t st, int warps, bool deep) {
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  if (!half || a.cache_dtype != a.dtype || (a.D != 64 && a.D != 128)) return false;
  if (warps != 4 && warps != 8) return false;
  if (!aligned16(a.q) || (a.q_bs * 2) % 16 || (a.q_hs * 2) % 16) return false;
  if (a.B > 65535 || a.nb * a.bs > int64_t(INT32_MAX)) return false;
  if (a.chunk_min % 16) return false;
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  if (int64_t(a.hkv) * ngb > 65535) return false;
  const int ngmax = (a.nsplit + kGroup - 1) / kGroup;
  if (ngmax > kMaxGroups) return false;
  int cs = 1;
  while (cs * warps < ngmax) cs *= 2;  // (<= 4: 16 groups)
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
    if (warps == 8) return a.D == 64 ? launch_pcl<T, 64, 8, 5, true>(a, st, cs) : launch_pcl<T, 128, 8, 3, true>(a, st, cs);
    if (deep) return a.D == 64 ? launch_pcl<T, 64, 4, 10, true>(a, st, cs) : launch_pcl<T, 128, 4, 6, true>(a, st, cs);
    return a.D == 64 ? launch_pcl<T, 64, 4, 5, true>(a, st, cs) : launch_pcl<T, 128, 4, 3, true>(a, st, cs);
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

}  // namespace gk::cuda
