// attention_prefill on Hopper, warp-specialized (FlashAttention-3 style), bf16 / fp16.
//
// One CTA per (query head, query tile of BM = 128 rows of one sequence), three
// warpgroups. Warpgroup 0 is the producer: one thread issues TMA loads (Q once,
// then K and V tiles of BN keys into a 2- or 3-stage ring of 128-byte-swizzled
// buffers) that complete on mbarriers, and waits on "empty" barriers before
// reusing a stage; it gives its registers away (setmaxnreg). Warpgroups 1 and 2
// each own 64 query rows. Per key tile n they issue S_n = Q K_n^T and then
// O += P_{n-1} V_{n-1} (P from registers) back to back, run the online softmax
// of S_n while the second product runs on the tensor cores, then rescale O and
// convert P_n; K is released right after S_n, V after its product.
// Ping-pong (the default): the two consumer warpgroups take turns issuing their
// products (named barriers), so one's softmax overlaps the other's products.
// Persistent (one sequence): one CTA per multiprocessor walks (tile, head)
// items; Q is released after an item's last S_n, so the next item's Q and K / V
// loads overlap the end of the current one.
//
// Masking, softmax, tile order and output rows are those of the cp.async kernel
// (attention_prefill_sm90.cu): each output row is written by one thread of one
// CTA and every sum has a fixed order, so results are bitwise reproducible.
// Keys past the end of the sequence (read from the next sequence or
// zero-filled past the tensor) always get probability 0; where the last key
// tile of a sequence reads rows of the next sequence, the producer warp zeroes
// those V rows in shared memory before the consumers see the tile, so Inf / NaN
// there cannot reach the output through 0 * Inf in P V.
// Persistent item order (PersistOrder): heads are taken in sections of `hs`
// heads (all heads by default); inside a section the longest query tiles of all
// its heads come first. Smaller sections keep the K / V rows that concurrently
// running CTAs read within L2 (on the H200 that did not pay: the default is one
// section; see the experiment bits below for what else was measured).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdint>
#include <type_traits>

#include "core/cuda_util.h"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/common/wgmma_attn.cuh"
#include "cuda/common/wgmma_wide.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
namespace {
using namespace sm90;

constexpr int kCons = 2;  // consumer warpgroups

constexpr int default_bn(int D) { return D == 256 ? 64 : 128; }

template <int D, int ST, int BN_ = default_bn(D)>  // ST: K / V pipeline stages; BN_: keys per tile
struct CfgWS {
  static constexpr int BM = 64 * kCons;
  static constexpr int BN = BN_;
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int KV_BYTES = BN * D * 2;
  static constexpr int THREADS = 128 * (kCons + 1);
};

// Timing experiments (template OPT, bench only, GPUKIT_PREFILL_SM90_OPT): bit 0: no K / V
// loads after the first ST tiles (memory taken out; WRONG results), bit 1: no softmax
// (P = S unscaled; WRONG results); bit 2: a quarter of the exponentials of unmasked tiles
// by a polynomial (ex2_poly; correct results); bit 3: O is rescaled only when a row maximum of
// the warp changed (exact: the skipped factors are 1). Instantiated for bf16, head_dim 128,
// persistent.
// bit 4: dynamic persistent order (the next item from an atomic counter, as CTAs get free);
// bit 5: two P register buffers, so that P_n is converted before O += P_{n-1} V_{n-1} is done;
// bit 6: the ping-pong turns run on across items (warpgroup 0 may start an item while
// warpgroup 1 still writes the previous one); bit 7 (bf16): P cut to bf16 by truncation,
// packed by byte permutes instead of conversions (row sums of the cut values); bit 8: row
// maxima by a chain instead of a tree (the previous form).
// bit 9: the running row maximum is raised only on jumps of more than 2^8 (softmax_step_t STALE),
// and O is rescaled only when a row of the warp raised it (correct results); bit 10: cycle
// profile of the consumer loop (clock64 per phase, warp 0 of each consumer warpgroup; the host
// prints it; bench only); bit 11: O is rescaled (by the factor of the previous tile) between
// issuing S_n and O += P_{n-1} V_{n-1}, while S_n runs, instead of after P_{n-1} V_{n-1} is done;
// bit 12: Q in registers (A fragments loaded once per item by ldmatrix; S = Q K^T with A from
// registers), so that S_n reads only K from shared memory (a third less shared-memory traffic
// per S), and Q's buffer is released at the item's start; bit 13 (with bits 9 and 5): speculative
// softmax (softmax_spec): on unmasked tiles the exponentials are taken against the row's current
// maximum right away, packed into the second P buffer, and the tile maximum only checked after
// (the rows of a warp redo the step by softmax_step_t when one of them jumped); bit 14: the producer
// loads K one tile ahead of V (K_n, then V_{n-1}), so that a K load no longer waits for the
// release of the V tile two back; bit 15: mbarrier waits that sleep in try_wait (a suspend-time
// hint) instead of spinning; bit 16: a consumer warpgroup passes the ping-pong turn only once its
// S_n is done (not right after issuing), bit 17: only once its P V is done, so that the other's
// HGMMAs do not sit blocked in issue (at checkpoint A issue took 690-980 cycles per step, while the
// other warpgroup's softmax ran ~3x slower than its instruction count).
constexpr int kOptNoLoad = 1, kOptNoSoftmax = 2, kOptPolyExp = 4, kOptSkipRescale = 8, kOptDynamic = 16,
              kOptDoubleP = 32, kOptChain = 64, kOptTruncP = 128, kOptChainMax = 256, kOptStale = 512,
              kOptProf = 1024, kOptEarly = 2048, kOptQReg = 4096, kOptSpec = 8192, kOptKVOrder = 16384,
              kOptSleepWait = 32768, kOptLateTurn = 65536, kOptLateTurn2 = 131072;

// kOptProf counters: per consumer warpgroup w, g_prof[10 w + i]: cycles in phase i (0 waiting for
// K / V, 1 for the turn, 2 issuing, 3 waiting for S, 4 softmax, 5 waiting for P V, 6 rescale and
// convert), 7 all cycles of the consumer loop, 8 key-tile steps, 9 items; g_prof[20] cycles and
// g_prof[21] nanoseconds (globaltimer) of the first consumer thread of each CTA.
constexpr int kOptLegacy = 1 << 20;  // (run-time only) the kernel without OPT bits, the default before B
constexpr int kProfSlots = 24;
__device__ unsigned long long g_prof[kProfSlots];
__device__ __forceinline__ uint64_t clk() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ uint64_t gtimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t)::"memory");
  return t;
}

struct PersistOrder {
  int hs;  // heads per section (>= hq: one section)
  int* counter;  // kOptDynamic: items taken after the first gridDim.x (zeroed before the launch)
};

// Counters of the dynamic order: one per launch in flight (a rotating slot, zeroed on the
// launch's stream before it).
constexpr int kCounterSlots = 256;
__device__ int g_item_counters[kCounterSlots];

template <bool BF16, int D, bool PP, int ST, bool PERSIST, int OPT = 0, int BNT = default_bn(D)>
__global__ void __launch_bounds__(CfgWS<D, ST, BNT>::THREADS, 1)
    k_prefill_ws(const __grid_constant__ PrefillArgs a, const __grid_constant__ CUtensorMap tq,
                 const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                 const PersistOrder po) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = CfgWS<D, ST, BNT>;
  constexpr int BM = C::BM, BN = C::BN, NCB = D / 64;
  extern __shared__ char smem_raw[];
  __shared__ int sh_find[2];
  __shared__ int sh_item[2];  // kOptDynamic: item of round k in slot k & 1 (-1: none)
  // k_full[ST], v_full[ST], k_empty[ST], v_empty[ST], q_full, q_empty, v_fix
  __shared__ __align__(8) uint64_t bars[3 + 4 * ST];
  const uint32_t sbase = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t sQ = sbase;
  auto sK = [&](int s) { return sbase + C::Q_BYTES + s * C::KV_BYTES; };
  auto sV = [&](int s) { return sbase + C::Q_BYTES + (ST + s) * C::KV_BYTES; };
  const uint32_t b0 = uint32_t(__cvta_generic_to_shared(bars));
  auto k_full = [&](int s) { return b0 + 8u * s; };
  auto v_full = [&](int s) { return b0 + 8u * (ST + s); };
  auto k_empty = [&](int s) { return b0 + 8u * (2 * ST + s); };
  auto v_empty = [&](int s) { return b0 + 8u * (3 * ST + s); };
  const uint32_t q_full = b0 + 8u * (4 * ST), q_empty = q_full + 8u, v_fix = q_full + 16u;
  // K / V tile number g (counted over all items of the CTA) uses stage g % ST for the
  // (g / ST)-th time: barrier phase parity (g / ST) & 1.
  auto stage = [](int it) { return it % ST; };
  auto par = [](int it) { return uint32_t(it / ST) & 1u; };

  const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31;
  constexpr bool KVORD = (OPT & kOptKVOrder) != 0, SLEEP = (OPT & kOptSleepWait) != 0;
  constexpr int LATE = (OPT & kOptLateTurn) ? 1 : (OPT & kOptLateTurn2) ? 2 : 0;
  auto mwait = [](uint32_t bar, uint32_t parity) {
    if constexpr (SLEEP) mbar_wait_sleep(bar, parity);
    else mbar_wait(bar, parity);
  };
  // Work items (query tile, head). One per CTA: (blockIdx.y, blockIdx.x), varlen lookup
  // by find_tile. PERSIST (one sequence, no cu_seqlens): round k gives this CTA item
  // w (see below): tile y (y = 0 is the longest) of a head, in sections of po.hs heads.
  SeqTile t1{};
  if constexpr (!PERSIST)
    if (!find_tile<BM>(a, int(blockIdx.y), t1, sh_find)) return;
  const int nblk = PERSIST ? int((a.Tq + BM - 1) / BM) : 1;
  constexpr bool DYN = PERSIST && (OPT & kOptDynamic) != 0;
  // PERSIST, static order: round k's item. Snake order: even rounds give CTA i the i-th
  // item, odd rounds the (G - 1 - i)-th, so that no CTA always draws the longest tile of a
  // round. (Dynamic order: CTA i starts with item i and then takes them from the counter.)
  auto static_item = [&](int k) {
    const int G = int(gridDim.x), i = int(blockIdx.x);
    return k * G + ((k & 1) ? G - 1 - i : i);
  };
  // Item w: sections of po.hs heads; inside one, item r is tile y = r / hn of head h0 + r % hn.
  auto decode = [&](int w, SeqTile& t, int& h) {
    const int per = nblk * po.hs, sec = w / per, r = w - sec * per;
    const int h0 = sec * po.hs, hn = min(po.hs, a.hq - h0);
    const int y = r / hn;
    h = h0 + (r - y * hn);
    t = SeqTile{0, 0, a.Tq, a.Tk, (nblk - 1 - y) * BM};
  };
  const int n_items = PERSIST ? nblk * a.hq : 1;
  // The key tiles [n_begin, n_begin + ntiles) of an item and the CTA's mask edges.
  struct Tiles {
    int n_begin, ntiles, hi_first, lo_last;
  };
  auto tiles_of = [&](const SeqTile& t, const RowRange& rr) {
    const int64_t mlast = min(int64_t(t.m0) + BM, t.Lq) - 1;
    const int kv_lo = rr.lo(t.m0), kv_hi = rr.hi(mlast);
    const int nb = kv_hi > kv_lo ? kv_lo / BN : 0, ne = kv_hi > kv_lo ? (kv_hi + BN - 1) / BN : 0;
    return Tiles{nb, ne - nb, rr.hi(t.m0), rr.lo(mlast)};
  };

  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, 4 * kCons);
    mbar_init(v_fix, 1);
    for (int s = 0; s < ST; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), 4 * kCons);  // one arrival per consumer warp
      mbar_init(v_empty(s), 4 * kCons);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (wg == 0) {  // ---- producer ----
    setmaxnreg_dec<24>();
    if (tid < 32) {  // warp 0: lane 0 issues the copies; the warp zeroes V rows past a sequence
      const bool leader = tid == 0;
      SeqTile t = t1;
      int h = int(blockIdx.x), g = 0, nfix = 0;  // g: K / V tiles loaded so far (all items); nfix: uses of v_fix
      int next = int(blockIdx.x);  // DYN: the item after the current one
      for (int k = 0;; ++k) {
        if (k > 0) mwait(q_empty, uint32_t(k - 1) & 1u);  // the previous item's last S is done
        if constexpr (PERSIST) {
          const int w = DYN ? next : static_item(k);
          if constexpr (DYN) {
            if (leader) {
              sh_item[k & 1] = w < n_items ? w : -1;
              if (w < n_items) next = atomicAdd(po.counter, 1) + int(gridDim.x);
            }
            next = __shfl_sync(0xffffffffu, next, 0);
            if (w >= n_items) {
              if (leader) mbar_arrive(q_full);  // wakes the consumers to read -1
              break;
            }
          }
          if (w >= n_items) break;
          decode(w, t, h);
        } else if (k > 0) {
          break;
        }
        const RowRange rr{t.Lk - t.Lq, t.Lk, a.window, a.causal};
        const Tiles tl = tiles_of(t, rr);
        const int kvh = h / (a.hq / a.hkv);
        if (leader) {
          mbar_expect_tx(q_full, C::Q_BYTES);
#pragma unroll
          for (int c = 0; c < NCB; ++c) tma_load_3d(sQ + c * (BM * 128), &tq, q_full, 64 * c, h, int(t.q0 + t.m0));
        }
        // K tile it (the g-th of the CTA) and V tile it, each after its stage is free.
        auto load_k = [&](int it, int g) {
          const int s = stage(g);
          const int row = int(t.k0 + (tl.n_begin + it) * BN);
          const bool skip = (OPT & kOptNoLoad) && g >= ST;
          if (g >= ST) mwait(k_empty(s), par(g - ST));
          if (leader) {
            if (skip) {
              mbar_arrive(k_full(s));
            } else {
              mbar_expect_tx(k_full(s), C::KV_BYTES);
#pragma unroll
              for (int c = 0; c < NCB; ++c) tma_load_3d(sK(s) + c * (BN * 128), &tk, k_full(s), 64 * c, kvh, row);
            }
          }
        };
        auto load_v = [&](int it, int g) {
          const int s = stage(g);
          const int j0 = (tl.n_begin + it) * BN;  // sequence-relative first key of the tile
          const int row = int(t.k0 + j0);
          const bool skip = (OPT & kOptNoLoad) && g >= ST;
          if (g >= ST) mwait(v_empty(s), par(g - ST));
          // Rows valid .. BN - 1 of the tile belong to the next sequence (rows past the tensor
          // are zero-filled by the copy): load onto v_fix, zero them, then complete v_full.
          const int valid = int(min(int64_t(BN), t.Lk - j0));
          const bool fix = valid < BN && t.k0 + t.Lk < a.Tk;
          if (leader) {
            if (skip) {
              mbar_arrive(v_full(s));
            } else {
              const uint32_t bar = fix ? v_fix : v_full(s);
              mbar_expect_tx(bar, C::KV_BYTES);
#pragma unroll
              for (int c = 0; c < NCB; ++c) tma_load_3d(sV(s) + c * (BN * 128), &tv, bar, 64 * c, kvh, row);
            }
          }
          if (fix && !skip) {
            mwait(v_fix, uint32_t(nfix++) & 1u);
            // Row r of column block c: 128 bytes at c * BN * 128 + r * 128 (the swizzle only
            // permutes the 16-byte chunks inside a row).
            const int n16 = (BN - valid) * NCB * 8;
            for (int u = lane; u < n16; u += 32) {
              const int r = valid + u / (NCB * 8), c = (u / 8) % NCB, ch = u % 8;
              const uint32_t at = sV(s) + c * (BN * 128) + r * 128 + ch * 16;
              asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0u) : "memory");
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // visible to wgmma
            __syncwarp();
            if (leader) mbar_arrive(v_full(s));
          }
        };
        if constexpr (KVORD) {  // K one tile ahead of V: K_it, then V_{it-1}
          for (int it = 0; it < tl.ntiles; ++it, ++g) {
            load_k(it, g);
            if (it > 0) load_v(it - 1, g - 1);
          }
          if (tl.ntiles > 0) load_v(tl.ntiles - 1, g - 1);
        } else {
          for (int it = 0; it < tl.ntiles; ++it, ++g) {
            load_k(it, g);
            load_v(it, g);
          }
        }
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<240>();
  const int cw = wg - 1, warp = (tid % 128) / 32;
  const int cq = 2 * (lane & 3);
  const SoftmaxParams sp(a);
  constexpr bool kPoly = (OPT & kOptPolyExp) != 0, kTrunc = BF16 && (OPT & kOptTruncP) != 0;
  constexpr bool kChainMax = (OPT & kOptChainMax) != 0, kStale = (OPT & kOptStale) != 0;
  constexpr int NPA = (OPT & kOptDoubleP) ? 2 : 1;
  float o[D / 2];
  uint32_t pa_buf[NPA][BN / 16][4];  // P_n in buffer n % NPA
  constexpr bool PROF = (OPT & kOptProf) != 0, EARLY = (OPT & kOptEarly) != 0;
  constexpr bool QREG = (OPT & kOptQReg) != 0, SPEC = (OPT & kOptSpec) != 0;
  static_assert(!SPEC || (kStale && (OPT & kOptDoubleP) && !(OPT & (kOptNoSoftmax | kOptTruncP | kOptPolyExp))),
                "speculative softmax: with the thresholded maximum and two P buffers");
  static_assert(!QREG || (D == 128 && BN == 128), "Q in registers: head_dim 128, 128-key tiles");
  uint32_t qa[QREG ? D / 16 : 1][4];
  uint64_t pacc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tprev = 0, nsteps = 0, nitems = 0;
  const uint64_t t_begin = PROF ? clk() : 0, g_begin = PROF ? gtimer() : 0;
  auto mark = [&](int ph) {
    if constexpr (PROF) {
      const uint64_t t = clk();
      if (ph >= 0) pacc[ph] += t - tprev;
      tprev = t;
    }
  };
  // O *= (a0, a1) per row; skipped where every factor of the warp is 1 (exact) under the
  // options that make that common.
  auto rescale_o = [&](float a0, float a1) {
    if (!(OPT & (kOptSkipRescale | kOptStale)) || !__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f))
      rescale(o, a0, a1);
  };

  auto issue_s = [&](float (&p)[BN / 2], int s) {
    if constexpr (QREG) {
      const uint64_t dk0 = smem_desc(sK(s), 16, 1024);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint64_t dk = dk0 + uint64_t(((kk / 4) * (BN * 128) + (kk % 4) * 32) >> 4);
        mma_rs_k<BN, BF16>(p, qa[kk], dk, kk > 0);
      }
      return;
    }
    // The Q descriptors are recomputed per use from an opaque base rather than kept live
    // across the loop (16 registers: with wide key tiles they would spill).
    // Descriptors are a base plus the step's byte offset / 16 (the 14-bit address field
    // cannot carry: shared addresses stay below 256 KiB).
    uint32_t qb = sQ + cw * (64 * 128);
    asm volatile("" : "+r"(qb));
    const uint64_t dq0 = smem_desc(qb, 16, 1024), dk0 = smem_desc(sK(s), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t dq = dq0 + uint64_t(((kk / 4) * (BM * 128) + (kk % 4) * 32) >> 4);
      const uint64_t dk = dk0 + uint64_t(((kk / 4) * (BN * 128) + (kk % 4) * 32) >> 4);
      mma_ss<BN, BF16>(p, dq, dk, kk > 0);
    }
  };
  auto issue_pv = [&](int s, const uint32_t (&pa)[BN / 16][4]) {
    const uint64_t dv0 = smem_desc(sV(s), BN * 128, 1024);
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      const uint64_t dv = dv0 + uint64_t((j * (16 * 128)) >> 4);
      mma_rs_mn<D, BF16>(o, pa[j], dv, 1);
    }
  };
  auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  // Ping-pong (PP): the two consumer warpgroups take turns issuing their products
  // (named barriers 1 and 2, 256 threads: one warpgroup waits, the other arrives),
  // so that one's softmax runs while the other's products use the tensor cores.
  // Per item, warpgroup 1 opens; every issue point is followed by a signal to the
  // other, except warpgroup 1's last, so each barrier sees as many arrivals as waits.
  auto turn_wait = [&] {
    if constexpr (PP) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory");
  };
  // kOptChain: warpgroup 1 opens only the first item and always signals; warpgroup 0 takes
  // the one signal left over after the last item.
  constexpr bool CHAIN = PP && (OPT & kOptChain) != 0;
  bool opened = false;
  auto turn_pass = [&](bool last) {
    if constexpr (PP)
      if (CHAIN || !(last && cw == 1)) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory");
  };

  SeqTile t = t1;
  int h = int(blockIdx.x), g = 0;  // g: K / V tiles consumed so far (all items)
  for (int k = 0;; ++k) {
    if constexpr (PERSIST) {
      int w;
      if constexpr (DYN) {
        mwait(q_full, uint32_t(k) & 1u);  // the producer stored the item before arriving
        w = *static_cast<volatile int*>(&sh_item[k & 1]);
        if (w < 0) break;
      } else {
        w = static_item(k);
        if (w >= n_items) break;
      }
      decode(w, t, h);
    } else if (k > 0) {
      break;
    }
    const RowRange rr{t.Lk - t.Lq, t.Lk, a.window, a.causal};
    const Tiles tl = tiles_of(t, rr);
    const int ntiles = tl.ntiles, n_begin = tl.n_begin, hi_first = tl.hi_first, lo_last = tl.lo_last;
    const int64_t r0 = t.m0 + cw * 64 + warp * 16 + lane / 4, r1 = r0 + 8;
    const int lo0 = rr.lo(r0), lo1 = rr.lo(r1), hi0 = rr.hi(r0), hi1 = rr.hi(r1);
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    RowState st;

    if constexpr (!DYN) mwait(q_full, uint32_t(k) & 1u);
    if constexpr (QREG) {
      if (ntiles > 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) load_a_frag(qa[kk], sQ + cw * (64 * 128), BM * 128, kk, warp, lane);
      }
      release(q_empty);  // Q is in registers
    } else if (ntiles == 0) {
      release(q_empty);
    }
    if (ntiles > 0) {
      if constexpr (PP)
        if (cw == 1 && !(CHAIN && opened)) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // warpgroup 0 first
      opened = true;
      {  // first tile: S_0 alone
        float p[BN / 2];
        const int s = stage(g);
        mwait(k_full(s), par(g));
        turn_wait();
        wg_fence();
        issue_s(p, s);
        wg_commit();
        if constexpr (!LATE) turn_pass(false);
        wg_wait<0>();
        fence_regs(p);
        if constexpr (LATE) turn_pass(false);
        release(k_empty(s));
        if (!QREG && ntiles == 1) release(q_empty);
        const int j0 = n_begin * BN;
        float al0 = 1.f, al1 = 1.f;
        if constexpr (!(OPT & kOptNoSoftmax))
          softmax_step<BN, kPoly, kTrunc, kChainMax, kStale>(p, st, sp, j0 + BN > hi_first || j0 < lo_last, j0, cq, lo0, hi0,
                                                     lo1, hi1, al0, al1);
        to_a_frags<BN, BF16, kTrunc>(p, pa_buf[0]);  // O is still zero: no rescale
      }
      float pal0 = 1.f, pal1 = 1.f;  // EARLY: the factor for O before the next P V
      // Key tile it >= 1: S_it and O += P_{it-1} V_{it-1}; B: the buffer of P_it (NPA == 2) or 0.
      auto step = [&](int it, auto b_) {
        constexpr int B = decltype(b_)::value, PB = NPA == 2 ? 1 - B : 0;
        const int s = stage(g + it), ps = stage(g + it - 1);
        float p[BN / 2];
        mark(-1);
        mwait(k_full(s), par(g + it));
        mwait(v_full(ps), par(g + it - 1));
        mark(0);
        turn_wait();
        mark(1);
        wg_fence();
        issue_s(p, s);
        wg_commit();
        if constexpr (EARLY) {  // O is free (P_{n-2} V_{n-2} is done): rescale it while S_n runs
          rescale_o(pal0, pal1);
          wg_fence();
        }
        issue_pv(ps, pa_buf[PB]);  // O += P_{n-1} V_{n-1} runs while the softmax of S_n does
        wg_commit();
        if constexpr (!LATE) turn_pass(false);
        mark(2);
        wg_wait<1>();
        fence_regs(p);
        if constexpr (LATE == 1) turn_pass(false);
        mark(3);
        release(k_empty(s));
        if (!QREG && it == ntiles - 1) release(q_empty);
        const int j0 = (n_begin + it) * BN;
        float al0 = 1.f, al1 = 1.f;
        const bool need_mask = j0 + BN > hi_first || j0 < lo_last;
        bool spec_done = false;
        if constexpr (SPEC)
          if (!need_mask && !sp.cap && sp.sc > 0.f) spec_done = softmax_spec<BN, BF16>(p, st, sp, pa_buf[B]);
        if constexpr (!(OPT & kOptNoSoftmax))
          if (!spec_done)
            softmax_step<BN, kPoly, kTrunc, kChainMax, kStale>(p, st, sp, need_mask, j0, cq, lo0, hi0, lo1, hi1, al0,
                                                               al1);
        if constexpr (NPA == 2)
          if (!spec_done) to_a_frags<BN, BF16, kTrunc>(p, pa_buf[B]);  // buffer B's last reader is done
        (void)spec_done;
        if constexpr (PROF) fence_regs(p);
        mark(4);
        wg_wait<0>();
        fence_regs(o);
        if constexpr (LATE == 2) turn_pass(false);
        mark(5);
        release(v_empty(ps));
        if constexpr (EARLY) {
          pal0 = al0;
          pal1 = al1;
        } else {
          rescale_o(al0, al1);
        }
        if constexpr (NPA == 1) to_a_frags<BN, BF16, kTrunc>(p, pa_buf[0]);
        if constexpr (PROF) {
          fence_regs(o);
          ++nsteps;
        }
        mark(6);
      };
      using I0 = std::integral_constant<int, 0>;
      using I1 = std::integral_constant<int, 1>;
      if constexpr (NPA == 2) {
        int it = 1;
        for (; it + 1 < ntiles; it += 2) {
          step(it, I1{});
          step(it + 1, I0{});
        }
        if (it < ntiles) step(it, I1{});
        if ((ntiles - 1) & 1) {  // the last P is in buffer 1: the last product reads buffer 0
#pragma unroll
          for (int j = 0; j < BN / 16; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) pa_buf[0][j][r] = pa_buf[NPA - 1][j][r];
        }
      } else {
        for (int it = 1; it < ntiles; ++it) step(it, I0{});
      }
      const int ls = stage(g + ntiles - 1);
      mwait(v_full(ls), par(g + ntiles - 1));
      if constexpr (EARLY) rescale_o(pal0, pal1);
      turn_wait();
      wg_fence();
      issue_pv(ls, pa_buf[0]);
      wg_commit();
      if constexpr (!LATE) turn_pass(true);
      wg_wait<0>();
      fence_regs(o);
      if constexpr (LATE) turn_pass(true);
      release(v_empty(ls));
      g += ntiles;
    }
    uint16_t* og = static_cast<uint16_t*>(a.out) + (t.q0 * a.hq + h) * int64_t(D);
    store_rows<D, BF16>(o, st, og, int64_t(a.hq) * D, r0, t.Lq, cq);
    (void)r1;
    if constexpr (PROF) ++nitems;
  }
  if constexpr (PROF) {
    if (lane == 0 && warp == 0) {
      pacc[7] = clk() - t_begin;
      for (int i = 0; i < 8; ++i) atomicAdd(&g_prof[10 * cw + i], static_cast<unsigned long long>(pacc[i]));
      atomicAdd(&g_prof[10 * cw + 8], static_cast<unsigned long long>(nsteps));
      atomicAdd(&g_prof[10 * cw + 9], static_cast<unsigned long long>(nitems));
      if (cw == 0) {
        atomicAdd(&g_prof[20], static_cast<unsigned long long>(pacc[7]));
        atomicAdd(&g_prof[21], static_cast<unsigned long long>(gtimer() - g_begin));
      }
    }
  }
  if constexpr (CHAIN)
    if (opened && cw == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
#else
  __trap();  // launched only when sm_90a code was built (GPUKIT_SM90A)
#endif
}

// Heads per section of the persistent order: hs > 0 as given; 0: all heads (one
// section); -1: as many heads as keep their K and V within kL2Budget bytes.
int heads_per_section(const PrefillArgs& a, int hs) {
  constexpr double kL2Budget = 24.0 * (1 << 20);
  if (hs == 0) return a.hq;
  if (hs < 0) {
    const double per_head = double(a.Tk) * a.D * 2 * 2 / double(a.hq / a.hkv);  // K + V bytes per q head
    hs = int(std::max(1.0, kL2Budget / std::max(per_head, 1.0)));
  }
  return std::min(hs, a.hq);
}

// kOptProf: waits for the kernel and prints its cycle profile (stderr; bench only).
void print_prof(cudaStream_t st) {
  unsigned long long h[kProfSlots];
  GK_CUDA_CHECK(cudaStreamSynchronize(st));
  GK_CUDA_CHECK(cudaMemcpyFromSymbol(h, g_prof, sizeof(h)));
  static const char* names[7] = {"wait K/V", "wait turn", "issue", "wait S", "softmax", "wait PV", "rescale+cvt"};
  for (int w = 0; w < 2; ++w) {
    const double n = double(std::max(h[10 * w + 8], 1ull));
    double sum = 0;
    std::fprintf(stderr, "prefill prof wg%d: %llu steps, %llu items; cycles per step:", w, h[10 * w + 8], h[10 * w + 9]);
    for (int i = 0; i < 7; ++i) {
      std::fprintf(stderr, " %s %.0f;", names[i], double(h[10 * w + i]) / n);
      sum += double(h[10 * w + i]);
    }
    std::fprintf(stderr, " step %.0f; outside steps per item %.0f\n", sum / n,
                 (double(h[10 * w + 7]) - sum) / double(std::max(h[10 * w + 9], 1ull)));
  }
  std::fprintf(stderr, "prefill prof: SM clock while running %.0f MHz (clock64 / globaltimer over the CTAs)\n",
               double(h[20]) * 1e3 / double(std::max(h[21], 1ull)));
}

// The OPT bits of the kernels that run by default (no GPUKIT_PREFILL_SM90_OPT), per dtype, head
// dim and stage count.
constexpr int default_opt(bool bf16, int D, int ST) {
  (void)bf16;
  return D == 128 && ST == 2 ? kOptSpec | kOptStale | kOptDoubleP : 0;
}

template <bool BF16, int D, int ST>
bool launch_ws(const PrefillArgs& a, unsigned ny, bool pp, bool persist, const WsTuning& tu, cudaStream_t st) {
  using C = CfgWS<D, ST>;
  using Kern = void (*)(PrefillArgs, CUtensorMap, CUtensorMap, CUtensorMap, PersistOrder);
  dim3 grid{unsigned(a.hq), ny, 1u};
  PersistOrder po{a.hq, nullptr};
  int bn = C::BN;
  bool prof = false;
  constexpr int DO = default_opt(BF16, D, ST);
  Kern kern = pp ? k_prefill_ws<BF16, D, true, ST, false, DO> : k_prefill_ws<BF16, D, false, ST, false, DO>;
  if constexpr (D <= 128) {  // (head_dim 256 would spill registers)
    if (persist && !a.cu_q) {  // one CTA per multiprocessor walks the (tile, head) items
      int dev = 0, sms = 0;
      GK_CUDA_CHECK(cudaGetDevice(&dev));
      GK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      const int64_t items = (a.Tq + C::BM - 1) / C::BM * a.hq;
      if (items > INT32_MAX / 2) return false;
      kern = k_prefill_ws<BF16, D, true, ST, true, DO>;
      if constexpr (BF16 && D == 128 && ST == 2) {  // run-time experiments (bench); others: default
        constexpr int P = kOptPolyExp;
        const int o = tu.opt, b = tu.bn == 128 ? 0 : tu.bn;
        Kern pick = nullptr;
        if (o == kOptNoLoad && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptNoLoad>;
        if (o == kOptNoSoftmax && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptNoSoftmax>;
        if (o == P && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, P>;
        if (o == 0 && b == 160) pick = k_prefill_ws<BF16, D, true, ST, true, 0, 160>;
        if (o == 0 && b == 176) pick = k_prefill_ws<BF16, D, true, ST, true, 0, 176>;
        if (o == 0 && b == 192) pick = k_prefill_ws<BF16, D, true, ST, true, 0, 192>;
        if (o == P && b == 176) pick = k_prefill_ws<BF16, D, true, ST, true, P, 176>;
        if (o == kOptSkipRescale && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptSkipRescale>;
        if (o == (P | kOptSkipRescale) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, P | kOptSkipRescale>;
        if (o == kOptDynamic && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptDynamic>;
        if (o == kOptDoubleP && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptDoubleP>;
        if (o == kOptChain && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptChain>;
        if (o == kOptTruncP && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptTruncP>;
        if (o == kOptChainMax && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptChainMax>;
        if (o == (kOptTruncP | kOptDoubleP) && b == 0)
          pick = k_prefill_ws<BF16, D, true, ST, true, kOptTruncP | kOptDoubleP>;
        if (o == (kOptTruncP | P) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptTruncP | P>;
        if (o == (kOptDoubleP | kOptSkipRescale) && b == 0)
          pick = k_prefill_ws<BF16, D, true, ST, true, kOptDoubleP | kOptSkipRescale>;
        if (o == (kOptDoubleP | kOptSkipRescale | P) && b == 0)
          pick = k_prefill_ws<BF16, D, true, ST, true, kOptDoubleP | kOptSkipRescale | P>;
        constexpr int SE = kOptStale | kOptEarly, PR = kOptProf;
        if (o == kOptStale && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptStale>;
        if (o == kOptEarly && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptEarly>;
        if (o == SE && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SE>;
        if (o == PR && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, PR>;
        if (o == (PR | kOptStale) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, PR | kOptStale>;
        if (o == (PR | SE) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, PR | SE>;
        if (o == (PR | kOptNoSoftmax) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, PR | kOptNoSoftmax>;
        constexpr int QR = kOptQReg;
        if (o == QR && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, QR>;
        constexpr int SP = kOptSpec | kOptStale | kOptDoubleP, KO = kOptKVOrder, SL = kOptSleepWait;
        if (o == SP && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP>;
        if (o == kOptLegacy && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, 0>;
        if (o == (SP | KO) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | KO>;
        if (o == (SP | SL) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | SL>;
        if (o == (SP | KO | SL) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | KO | SL>;
        if (o == (SP | KO | SL | PR) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | KO | SL | PR>;
        if (o == (kOptStale | KO | SL) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, kOptStale | KO | SL>;
        constexpr int L1 = kOptLateTurn, L2 = kOptLateTurn2;
        if (o == (SP | L1) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | L1>;
        if (o == (SP | L2) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | L2>;
        if (o == (SP | L1 | PR) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | L1 | PR>;
        if (o == (SP | L1 | KO) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | L1 | KO>;
        if (o == (SP | PR) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, SP | PR>;
        if (o == (QR | kOptStale) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, QR | kOptStale>;
        if (o == (QR | PR | kOptStale) && b == 0) pick = k_prefill_ws<BF16, D, true, ST, true, QR | PR | kOptStale>;
        if (pick && (o & kOptProf)) {
          void* base = nullptr;
          GK_CUDA_CHECK(cudaGetSymbolAddress(&base, g_prof));
          GK_CUDA_CHECK(cudaMemsetAsync(base, 0, sizeof(unsigned long long) * kProfSlots, st));
          prof = true;
        }
        if (pick && o == kOptDynamic) {
          static std::atomic<unsigned> slot{0};
          void* base = nullptr;
          GK_CUDA_CHECK(cudaGetSymbolAddress(&base, g_item_counters));
          po.counter = static_cast<int*>(base) + slot.fetch_add(1) % kCounterSlots;
          GK_CUDA_CHECK(cudaMemsetAsync(po.counter, 0, sizeof(int), st));
        }
        if (pick) {
          kern = pick;
          if (b) bn = b;
        }
      }
      grid = dim3{unsigned(std::min<int64_t>(items, std::max(sms, 1))), 1u, 1u};
      po.hs = heads_per_section(a, tu.hs);
    }
  }
  CUtensorMap mq, mk, mv;
  const uint64_t e = 2;  // bytes per element
  if (!make_tmap_3d(&mq, a.q, BF16, D, uint64_t(a.hq), uint64_t(a.Tq), a.q_hs * e, a.q_ts * e, 64, 1, C::BM) ||
      !make_tmap_3d(&mk, a.k, BF16, D, uint64_t(a.hkv), uint64_t(a.Tk), a.k_hs * e, a.k_ts * e, 64, 1, bn) ||
      !make_tmap_3d(&mv, a.v, BF16, D, uint64_t(a.hkv), uint64_t(a.Tk), a.v_hs * e, a.v_ts * e, 64, 1, bn))
    return false;
  const int smem = C::Q_BYTES + 2 * ST * bn * D * 2 + 1024;  // Q, K and V x ST stages; + alignment slack
  GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kern<<<grid, C::THREADS, smem, st>>>(a, mq, mk, mv, po);
  GK_LAUNCH_CHECK("attention_prefill_sm90_ws");
  if (prof) print_prof(st);
  return true;
}
}  // namespace
#endif

// The warp-specialized TMA kernel (pingpong: the consumer warpgroups take turns
// on the tensor cores; stages: 2 or 3 K/V buffers, 3 only for head_dim <= 128);
// the caller has checked the device (sm_90),
// dtype, head_dim and 16-byte alignment. false: not applicable (tensor maps
// rejected, e.g. zero-size or over-large dims), the caller falls back.
bool attention_prefill_sm90_ws(const PrefillArgs& a, bool pingpong, int stages, bool persist, const sm90::WsTuning& tu,
                               void* stream) {
#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
  constexpr int BM = 64 * kCons;
  if (a.Tq <= 0 || a.Tk <= 0 || a.Tq > INT32_MAX || a.Tk > INT32_MAX) return false;
  if (a.q_ts <= 0 || a.q_hs <= 0 || a.k_ts <= 0 || a.k_hs <= 0 || a.v_ts <= 0 || a.v_hs <= 0) return false;
  const int64_t ny = (a.Tq + BM - 1) / BM + (a.cu_q ? a.B : 0);
  if (ny > 65535 || a.hq > 65535) return false;
  auto st = static_cast<cudaStream_t>(stream);
  const bool bf = a.dtype == DType::bf16;
  const unsigned y = unsigned(ny);
  auto go = [&](auto bf16, auto d) {
    constexpr bool B = decltype(bf16)::value;
    constexpr int DD = decltype(d)::value;
    if constexpr (DD <= 128)  // 3 stages fit in shared memory for head_dim 64 and 128
      if (stages == 3) return launch_ws<B, DD, 3>(a, y, pingpong, persist, tu, st);
    return launch_ws<B, DD, 2>(a, y, pingpong, persist, tu, st);
  };
  using T = std::true_type;
  using F = std::false_type;
  switch (a.D) {
    case 64: return bf ? go(T{}, std::integral_constant<int, 64>{}) : go(F{}, std::integral_constant<int, 64>{});
    case 128: return bf ? go(T{}, std::integral_constant<int, 128>{}) : go(F{}, std::integral_constant<int, 128>{});
    case 256: return bf ? go(T{}, std::integral_constant<int, 256>{}) : go(F{}, std::integral_constant<int, 256>{});
    default: return false;
  }
#else
  (void)a;
  (void)pingpong;
  (void)stages;
  (void)persist;
  (void)tu;
  (void)stream;
  return false;
#endif
}

}  // namespace gk::cuda
