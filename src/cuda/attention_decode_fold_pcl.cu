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
// pair has one warp per group (16 at T4096): B4 runs 512 warps on 64 CTAs of 8 warps (clusters of 2), B8 1024
// on 128, in one launch without the two-kernel fold's merge kernel (5-6 us at checkpoint A of session 5).
// Session 5's final run (H200, graph us): B4 T4096 25.3 against 32.1 for the two-kernel fold (23), B8 36.4 /
// 43.5, B16 70.4 / 72.3 (the default for mid-size batches, see attention_decode.cu). Its variants with CTAs of
// 4 warps (30: 27.1 / 48.1 / 79.4) and a deeper ring (32: 37.8 / 57.0 / 95.4) lost at every shape and were
// removed in session 6.
#include <atomic>
#include <cfloat>

#include "cuda/common/attention.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_fold_warp.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace dmma;
using namespace dfold;

constexpr int kMaxGroups = 16;  // groups of a pair (the host checks the capacity's bound)

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
  constexpr int STAGE = Cf::STAGE, KSTEP = Cf::KSTEP;
  static_assert(8 * D * 4 + 64 <= STAGE, "a group's result fits in one stage");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned msk[W][S];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t4 = lane & 3;
  const int r = blockIdx.x, cs = gridDim.x;  // rank in the cluster (clusters span x)
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int b = blockIdx.z, kvh = blockIdx.y / ngb, gb = blockIdx.y % ngb;
  const int h0 = kvh * G + gb * 8, nh = min(8, G - gb * 8);
  if (a.prefetch) l2_prefetch_chunks<D>(a, b, kvh, (r * W + warp) * kGroup, kGroup, lane);  // hints (l2_prefetch_rows)
  gdc_wait();  // (launched with PDL: q, the cache and the lengths may come from the previous kernel)
  gdc_launch();  // the next kernel waits for this grid's completion before reading the outputs
  const SeqPlan p = seq_plan(a, b);
  const int ng = min(p.ng, min(cs * W, kMaxGroups));  // (always p.ng: the host checks the capacity's bound)

  unsigned char* ring = smem + size_t(warp) * WARPB;
  unsigned char* qslot = ring + S * STAGE;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)), qslot_s = ring_s + S * STAGE;
  {
    const int grp = r * W + warp;
    const int64_t c0 = int64_t(grp) * kGroup;
    const int len = grp < ng ? int(min((c0 + kGroup) * p.chunk, p.n) - c0 * p.chunk) : 0;
    const int64_t j0 = p.start + c0 * p.chunk;
    const int ntot = (len + 15) / 16;
    const int ctiles = int(p.chunk / 16);  // tiles per chunk (chunk_min % 16 == 0)
    const uint64_t pol = EF ? l2_evict_first() : 0;
    auto row_of = [&](int i) {
      if (i >= ntot) return -1;
      const int tt = i * 16 + (lane & 15);
      if (tt >= len) return -1;
      const int j = int(j0) + tt;
      return cache_row(a, b, j);
    };
    int prow = row_of(0);
    auto issue = [&](int i) {
      if (i < ntot) {
        copy_kv_tile<T, D>(ring + (i % S) * STAGE, &msk[warp][i % S], a, kvh, prow, lane, EF, pol);
        if (i == 0) copy_q<T, D>(qslot, a, b, h0, nh, lane);
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
      if (i == 0) load_q_frags<D>(qa, qslot_s, lane);
      issue(i + S - 1);  // into the stage of tile i - 1 (its reads are ordered by the __syncwarp above)
      tile_step<T, D>(ring_s + (i % S) * STAGE, qa, msk[warp][i % S], sl2, capped, cap_in, cap_out, o, mrow, lsum,
                      lane);
      if (i + 1 == ntot || (i + 1) % ctiles == 0)  // a chunk ends: the group accumulator (+)= this chunk
        fold_chunk<D>(go, o, gmA, gmB, glA, glB, mrow, lsum, t4);
    }
    cp_async_wait<0>();
    __syncwarp();  // every lane's ldmatrix reads of the ring are done
    if (ntot > 0) {  // the group's result into stage 0 of this warp's ring
      const float gst[4] = {gmA, gmB, glA, glB};
      publish_partial<D>(reinterpret_cast<float*>(ring), go, gst, lane);
    }
  }
  __syncwarp();
  cluster_sync();  // every group's result is visible to the cluster
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
        mv[s] = ld_cluster(gs + (8 * D + 2 * h) * 4, rk);
        lv[s] = ld_cluster(gs + (8 * D + 2 * h + 1) * 4, rk);
        ov[s] = ld_cluster(gs + (h * D + d) * 4, rk);
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
  cluster_sync();  // no CTA leaves (freeing its shared memory) while others read it
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
  if (!launch_cluster_maybe_pdl(kern, dim3{unsigned(cs), unsigned(a.hkv * ngb), unsigned(a.B)},
                                dim3{unsigned(W * 32), 1u, 1u}, SMEM, st, unsigned(cs), decode_pdl(), a))
    return false;
  GK_LAUNCH_CHECK("attention_decode_fold_pcl");
  return true;
}
}  // namespace

bool attention_decode_fold_pcl(const DecodeArgs& a, cudaStream_t st) {
  constexpr int warps = 8;
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  if (!half || a.cache_dtype != a.dtype || (a.D != 64 && a.D != 128)) return false;
  if (!aligned16(a.q) || (a.q_bs * 2) % 16 || (a.q_hs * 2) % 16) return false;
  if (a.B > 65535 || a.nb * a.bs > int64_t(INT32_MAX)) return false;
  if (a.chunk_min % 16) return false;
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  if (int64_t(a.hkv) * ngb > 65535) return false;
  const int ngmax = (a.nsplit + kGroup - 1) / kGroup;
  if (ngmax > kMaxGroups) return false;
  int cs = 1;
  while (cs * warps < ngmax) cs *= 2;  // (<= 2: 16 groups)
  if (!device_sm90()) return false;  // (clusters, distributed shared memory)
  auto go = [&](auto t) {
    using T = decltype(t);
    return a.D == 64 ? launch_pcl<T, 64, 8, 5, true>(a, st, cs) : launch_pcl<T, 128, 8, 3, true>(a, st, cs);
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

}  // namespace gk::cuda
