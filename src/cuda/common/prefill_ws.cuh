// attention_prefill on Hopper, warp-specialized (FlashAttention-3 style), bf16 / fp16: the kernel.
// Included by attention_prefill_sm90_ws.cu only (host side and dispatch there); like the rest of
// that translation unit it lives in an anonymous namespace.
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
// section).
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/cuda_util.h"
#include "cuda/common/tma.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/common/wgmma_attn.cuh"
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

// Template OPT bits of k_prefill_ws (default_opt() in attention_prefill_sm90_ws.cu picks them per
// dtype / head_dim / stages; session 4's timing experiments with other bits were removed in
// session 5, their figures are in docs/notes/prefill-s4.md). The values are kept as they were, so
// the kernels keep their names.
// kOptDoubleP: two P register buffers, so that P_n is converted before O += P_{n-1} V_{n-1} is
// done. kOptStale: the running row maximum is raised only on jumps of more than 2^8
// (softmax_step_t STALE), and O is rescaled only when a row of the warp raised it. kOptSpec (with
// both): speculative softmax (softmax_spec): on unmasked tiles the exponentials are taken against
// the row's current maximum right away, packed into the second P buffer, and the tile maximum only
// checked after (the rows of a warp redo the step by softmax_step_t when one of them jumped).
// kOptProf: cycle profile of the consumer loop (clock64 per phase, warp 0 of each consumer
// warpgroup; the host prints it; bench / diagnosis only, GPUKIT_PREFILL_SM90_PROF).
constexpr int kOptDoubleP = 32, kOptStale = 512, kOptProf = 1024, kOptSpec = 8192;

// kOptProf counters: per consumer warpgroup w, g_prof[10 w + i]: cycles in phase i (0 waiting for
// K / V, 1 for the turn, 2 issuing, 3 waiting for S, 4 softmax, 5 waiting for P V, 6 rescale and
// convert), 7 all cycles of the consumer loop, 8 key-tile steps, 9 items; g_prof[20] cycles and
// g_prof[21] nanoseconds (globaltimer) of the first consumer thread of each CTA.
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
};

// PP: ping-pong turns; ST: K / V stages; PERSIST: persistent grid (one sequence); OPT: the bits
// above; BNT: keys per tile (always the default; a template argument so the names stay as they were).
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
  // Work items (query tile, head). One per CTA: (blockIdx.y, blockIdx.x), varlen lookup
  // by find_tile. PERSIST (one sequence, no cu_seqlens): round k gives this CTA item
  // w (see below): tile y (y = 0 is the longest) of a head, in sections of po.hs heads.
  SeqTile t1{};
  if constexpr (!PERSIST)
    if (!find_tile<BM>(a, int(blockIdx.y), t1, sh_find)) return;
  const int nblk = PERSIST ? int((a.Tq + BM - 1) / BM) : 1;
  // PERSIST: round k's item. Snake order: even rounds give CTA i the i-th item, odd rounds
  // the (G - 1 - i)-th, so that no CTA always draws the longest tile of a round.
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
      for (int k = 0;; ++k) {
        if (k > 0) mbar_wait(q_empty, uint32_t(k - 1) & 1u);  // the previous item's last S is done
        if constexpr (PERSIST) {
          const int w = static_item(k);
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
          if (g >= ST) mbar_wait(k_empty(s), par(g - ST));
          if (leader) {
            mbar_expect_tx(k_full(s), C::KV_BYTES);
#pragma unroll
            for (int c = 0; c < NCB; ++c) tma_load_3d(sK(s) + c * (BN * 128), &tk, k_full(s), 64 * c, kvh, row);
          }
        };
        auto load_v = [&](int it, int g) {
          const int s = stage(g);
          const int j0 = (tl.n_begin + it) * BN;  // sequence-relative first key of the tile
          const int row = int(t.k0 + j0);
          if (g >= ST) mbar_wait(v_empty(s), par(g - ST));
          // Rows valid .. BN - 1 of the tile belong to the next sequence (rows past the tensor
          // are zero-filled by the copy): load onto v_fix, zero them, then complete v_full.
          const int valid = int(min(int64_t(BN), t.Lk - j0));
          const bool fix = valid < BN && t.k0 + t.Lk < a.Tk;
          if (leader) {
            const uint32_t bar = fix ? v_fix : v_full(s);
            mbar_expect_tx(bar, C::KV_BYTES);
#pragma unroll
            for (int c = 0; c < NCB; ++c) tma_load_3d(sV(s) + c * (BN * 128), &tv, bar, 64 * c, kvh, row);
          }
          if (fix) {
            mbar_wait(v_fix, uint32_t(nfix++) & 1u);
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
        for (int it = 0; it < tl.ntiles; ++it, ++g) {
          load_k(it, g);
          load_v(it, g);
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
  constexpr bool kStale = (OPT & kOptStale) != 0;
  constexpr int NPA = (OPT & kOptDoubleP) ? 2 : 1;
  float o[D / 2];
  uint32_t pa_buf[NPA][BN / 16][4];  // P_n in buffer n % NPA
  constexpr bool PROF = (OPT & kOptProf) != 0, SPEC = (OPT & kOptSpec) != 0;
  static_assert(!SPEC || (kStale && NPA == 2), "speculative softmax: with the thresholded maximum and two P buffers");
  uint64_t pacc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tprev = 0, nsteps = 0, nitems = 0;
  const uint64_t t_begin = PROF ? clk() : 0, g_begin = PROF ? gtimer() : 0;
  auto mark = [&](int ph) {
    if constexpr (PROF) {
      const uint64_t t = clk();
      if (ph >= 0) pacc[ph] += t - tprev;
      tprev = t;
    }
  };
  // O *= (a0, a1) per row; under kOptStale (where that is common) skipped when every factor of
  // the warp is 1 (exact).
  auto rescale_o = [&](float a0, float a1) {
    if (!kStale || !__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) rescale(o, a0, a1);
  };

  auto issue_s = [&](float (&p)[BN / 2], int s) {
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
  auto turn_pass = [&](bool last) {
    if constexpr (PP)
      if (!(last && cw == 1)) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory");
  };

  SeqTile t = t1;
  int h = int(blockIdx.x), g = 0;  // g: K / V tiles consumed so far (all items)
  for (int k = 0;; ++k) {
    if constexpr (PERSIST) {
      const int w = static_item(k);
      if (w >= n_items) break;
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

    mbar_wait(q_full, uint32_t(k) & 1u);
    if (ntiles == 0) release(q_empty);
    if (ntiles > 0) {
      if constexpr (PP)
        if (cw == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // warpgroup 0 first
      {  // first tile: S_0 alone
        float p[BN / 2];
        const int s = stage(g);
        mbar_wait(k_full(s), par(g));
        turn_wait();
        wg_fence();
        issue_s(p, s);
        wg_commit();
        turn_pass(false);
        wg_wait<0>();
        fence_regs(p);
        release(k_empty(s));
        if (ntiles == 1) release(q_empty);
        const int j0 = n_begin * BN;
        float al0 = 1.f, al1 = 1.f;
        softmax_step<BN, kStale>(p, st, sp, j0 + BN > hi_first || j0 < lo_last, j0, cq, lo0, hi0, lo1, hi1, al0, al1);
        to_a_frags<BN, BF16>(p, pa_buf[0]);  // O is still zero: no rescale
      }
      // Key tile it >= 1: S_it and O += P_{it-1} V_{it-1}; B: the buffer of P_it (NPA == 2) or 0.
      auto step = [&](int it, auto b_) {
        constexpr int B = decltype(b_)::value, PB = NPA == 2 ? 1 - B : 0;
        const int s = stage(g + it), ps = stage(g + it - 1);
        float p[BN / 2];
        mark(-1);
        mbar_wait(k_full(s), par(g + it));
        mbar_wait(v_full(ps), par(g + it - 1));
        mark(0);
        turn_wait();
        mark(1);
        wg_fence();
        issue_s(p, s);
        wg_commit();
        issue_pv(ps, pa_buf[PB]);  // O += P_{n-1} V_{n-1} runs while the softmax of S_n does
        wg_commit();
        turn_pass(false);
        mark(2);
        wg_wait<1>();
        fence_regs(p);
        mark(3);
        release(k_empty(s));
        if (it == ntiles - 1) release(q_empty);
        const int j0 = (n_begin + it) * BN;
        float al0 = 1.f, al1 = 1.f;
        const bool need_mask = j0 + BN > hi_first || j0 < lo_last;
        bool spec_done = false;
        if constexpr (SPEC)
          if (!need_mask && !sp.cap && sp.sc > 0.f) spec_done = softmax_spec<BN, BF16>(p, st, sp, pa_buf[B]);
        if (!spec_done) softmax_step<BN, kStale>(p, st, sp, need_mask, j0, cq, lo0, hi0, lo1, hi1, al0, al1);
        if constexpr (NPA == 2)
          if (!spec_done) to_a_frags<BN, BF16>(p, pa_buf[B]);  // buffer B's last reader is done
        (void)spec_done;
        if constexpr (PROF) fence_regs(p);
        mark(4);
        wg_wait<0>();
        fence_regs(o);
        mark(5);
        release(v_empty(ps));
        rescale_o(al0, al1);
        if constexpr (NPA == 1) to_a_frags<BN, BF16>(p, pa_buf[0]);
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
      mbar_wait(v_full(ls), par(g + ntiles - 1));
      turn_wait();
      wg_fence();
      issue_pv(ls, pa_buf[0]);
      wg_commit();
      turn_pass(true);
      wg_wait<0>();
      fence_regs(o);
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
#else
  __trap();  // launched only when sm_90a code was built (GPUKIT_SM90A)
#endif
}
}  // namespace
#endif

}  // namespace gk::cuda
