// Session 7 (helper gguf8): the staged GGUF GEMV with line-aligned window copies, rebuilt for low
// per-unit overhead (quant_gguf_st.cu, its only includer; the knob's V 41, its copies alone V 42, and
// the default behind the switch GPUKIT_GGUF_AW: Q8_0's compiled default since the session-8 prep; V 47 / 48 the
// opaque magic and the early refill, kOptOpq / kOptEarly).
//
// Why: V 39 (k_ggst_aw, removed in the session-8 prep) had the same ring and windows, but its SASS spends ~280
// instructions per Q8_0 unit on the copies (per window and row: a 64-bit modulo by NCR, 64-bit
// compares, a branch around each cp.async) plus a chain of 8 compare-and-branch for its run-time wait
// count, against ~450 for the decode itself: with 2 warps per CTA and 8 units per warp on the 30 MB
// shapes the decode's instruction issue, not the copies, decides the time (checkpoint A: V 40, the
// copies alone, 84-92% of copy; V 39 45-58%, below the default's 56-66%).
//
// Here (same ring: NR whole units of UB bytes per row, NCR 16-byte chunks, chunk s of the warp's range
// at ring chunk s mod NCR; windows of one 128-byte line per row, lane l: chunk l % 8 of rows l / 8 + 4 i):
// - per row and lane, 32-bit state advanced per window: s (the lane's chunk of the window, relative to
//   the warp's first chunk; negative before it), its ring address (one add, one compare-and-subtract),
//   the global address from s; the cp.async predicated, no branch; when the row stride is a multiple of
//   128 bytes (every K % 2048 == 0 of these formats) all rows share row 0's line phase and one chunk
//   index, ring address and predicate serve the lane's 4 rows (~18 instructions per window, not ~41);
// - one commit group per unit: after decoding unit j the windows its chunks freed (G_j); the prologue
//   commits C + 1 groups (P_k: the windows unit k < C needs; P_C: all that fit the ring), so unit i
//   always waits with the constant cp.async.wait_group C (C: the largest c with NUC (NR - c - 1) >= 14,
//   so that G_j holds every window unit j + C + 1 needs at any row phase: Q8_0 1, Q4_0 / Q4_K 3, Q4_1 2);
// - x of the unit loaded before that wait (Q8_0 / Q4_0 / Q4_1: 16 loads into registers, consumed by
//   unit32 unchanged), so their latency hides behind the copies' wait;
// - 32-bit loop counters (the host checks the warp's chunk count fits).
// The decode of a unit (unit32 / unit_q4k_ss_s6 with the format's shipped OPT bits), the units' order,
// the warps' split of K and the reduction are k_ggst's: with the same plan, the same bits (tested).
#pragma once
#include "common/gemv_stage.cuh"
#include "quant_gguf_st_s6.cuh"
#include "quant_gguf_st_units.cuh"

namespace gk::cuda::gguf_st {

using namespace gemv_detail;

// The ring of a warp (session 7's V 39, whose kernel k_ggst_aw was removed in the session-8 prep): NR whole units
// of UB bytes per row (816 / 864 / 800 / 864 bytes), NCR 16-byte chunks, rows P bytes apart.
template <int F>
struct AW {
  static constexpr int UB = GS<F>::UB, NUC = UB / 16;
  static constexpr int NR = (768 + UB - 1) / UB;  // units per row ring (816 / 864 / 800 bytes)
  static constexpr int NCR = NR * NUC;
  static constexpr int P = NCR * 16 % 32 == 16 ? NCR * 16 : NCR * 16 + 16;  // row pitch (conflict-free rows g)
  static constexpr int SB = 16 * P;                                        // bytes per warp
  static_assert(UB % 16 == 0 && NCR > NUC + 13, "whole chunks; the windows a unit waits for are issued");
};

template <int F>
struct AW2 {
  using A = AW<F>;
  static constexpr int UB = A::UB, NUC = A::NUC, NR = A::NR, NCR = A::NCR, P = A::P, SB = A::SB;
  static constexpr int lookahead() {
    int c = 0;
    while (NUC * (NR - c - 2) >= 14) ++c;
    return c;
  }
  static constexpr int C = lookahead();
  static_assert(NUC * (NR - C - 1) >= 14 && C <= 7, "the constant wait count");
  // DYN: the most windows issued beyond the last one unit i needs (Wmax(i) - wn(i), periodic in i mod 8)
  static constexpr int dyn_ahead() {
    int k = 0;
    for (int i = 0; i < 8; ++i) {
      const int d = (NCR + NUC * i - 8) / 8 - (NUC * i + NUC + 6) / 8;
      k = d > k ? d : k;
    }
    return k;
  }
  static constexpr int K1 = dyn_ahead();
  static_assert(K1 >= 1 && K1 <= 7, "the run-time wait counts");
};

// the lane's copies of window w (state advanced to window w + 1): rows rr + 4 i, chunk s[i] of the
// warp's range (copied when 0 <= s < nch) to ring address dst[i]
template <int NCR>
__device__ __forceinline__ void aw2_window(const uint8_t* const (&base)[4], int (&s)[4], uint32_t (&dst)[4],
                                           const uint32_t (&rend)[4], int nch) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (unsigned(s[i]) < unsigned(nch)) cp_async16(dst[i], base[i] + 16 * s[i]);
    s[i] += 8;
    dst[i] += 128u;
    if (dst[i] >= rend[i]) dst[i] -= uint32_t(16 * NCR);
  }
}

// aw2_window when the lane's 4 rows have the same line phase (the row stride a multiple of 128 bytes, so
// every row of the matrix has the one of row 0): one chunk index, one ring address (row i at + 4 i P), one
// predicate for the four copies (state in s[0], dst[0], rend[0] only).
template <int NCR, int P>
__device__ __forceinline__ void aw2_window_uni(const uint8_t* const (&base)[4], int (&s)[4], uint32_t (&dst)[4],
                                               const uint32_t (&rend)[4], int nch) {
  const bool in = unsigned(s[0]) < unsigned(nch);
  const int64_t off = 16 * int64_t(s[0]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* src = base[i] + off;
    if (in) cp_async16(dst[0] + uint32_t(4 * i * P), src);
  }
  s[0] += 8;
  dst[0] += 128u;
  if (dst[0] >= rend[0]) dst[0] -= uint32_t(16 * NCR);
}

// wait until at most n (0..K) of this thread's groups are pending (n clamped to 0..K; K1 + 1 compare-and-branch)
template <int K>
__device__ __forceinline__ void aw2_wait_upto(int n) {
  if constexpr (K <= 0) {
    cp_wait<0>();
  } else {
    if (n >= K) cp_wait<K>();
    else aw2_wait_upto<K - 1>(n);
  }
}

// kOptEarly (V 48): the windows unit i - 1 freed are issued after unit i's wait, before its decode (k_ggst's
// non-late order); unit i's windows must then be issued by G_{i-2}: NUC (NR - 2) >= 14 (every format here).
template <int F>
constexpr bool A_NUC_OK = AW<F>::NUC * (AW<F>::NR - 2) >= 14;

// NODEC (V 42 / 44): the copies and waits alone (zeros; benchmarking). SS: Q4_K's quad-shared scales
// (1 KB of scratch per warp after the rings). DYN (V 43 / 44): one commit group per window (as V 39) and
// unit i waits for the windows up to the last one it needs only (n = windows issued after it: K1, K1 - 1
// or, near the end, fewer: then all), so that up to ~K1 windows more stay in flight while it waits.
template <class T, int F, int OPT, bool SS = false, bool NODEC = false, bool DYN = false>
__global__ void __launch_bounds__(256, 2) k_ggst_aw2(const QGemvArgs p) {
  constexpr bool PI = (OPT & kOptPI) != 0, FOLD = (OPT & kOptFold) != 0, EARLY = (OPT & kOptEarly) != 0;
  static_assert(!EARLY || DYN, "the early refill: the run-time wait");
  static_assert(!EARLY || A_NUC_OK<F>, "the early refill: every window unit i needs issued by G_{i-2}");
  constexpr bool kQ4K = F == int(QFormat::q4_k);
  constexpr bool B8 = F == int(QFormat::q8_0) && std::is_same_v<T, bf16> && PI;
  static_assert(!kQ4K || SS, "Q4_K: the shipped quad-shared scales");
  using A = AW2<F>;
  constexpr int UB = A::UB, UW = GS<F>::UW, NUC = A::NUC, NR = A::NR, NCR = A::NCR, P = A::P, C = A::C, K1 = A::K1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nu = p.k / UW;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t u0 = nu * pi / parts, u1 = nu * (pi + 1) / parts;
  const int nun = int(u1 - u0), nch = nun * NUC;  // the warp's units / chunks of a row (host: nu NUC < 2^30)

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(A::SB);
  [[maybe_unused]] const uint32_t scr = smem_addr(smem) + uint32_t(nw) * uint32_t(A::SB) + uint32_t(warp) * 1024u;
  const int ch = lane & 7, rr = lane >> 3;
  const uint8_t* base[4];  // chunk 0 of the warp's range of row rr + 4 i
  int s[4];                // the lane's chunk of the next window (window w: 8 w + ch - the row's line phase)
  uint32_t dst[4], rend[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    base[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + u0 * UB;
    const int lead = int((reinterpret_cast<uintptr_t>(base[i]) >> 4) & 7);  // chunks before it in its line
    s[i] = ch - lead;
    const uint32_t rb = ring + uint32_t((rr + 4 * i) * P);
    dst[i] = rb + uint32_t(16 * (s[i] < 0 ? s[i] + NCR : s[i]));
    rend[i] = rb + uint32_t(16 * NCR);
  }
  const int nwin = (nch + 14) >> 3;  // windows covering [0, nch) at any line phase
  const bool uni = p.q_rs % 128 == 0;  // every row at row 0's line phase (grid-uniform)
  int wnext = 0;
  auto issue_to = [&](int wlast) {  // windows wnext..wlast (at most the last), one group (DYN: one per window)
    const int e = wlast < nwin - 1 ? wlast : nwin - 1;
    if (uni) {
      for (; wnext <= e; ++wnext) {
        aw2_window_uni<NCR, P>(base, s, dst, rend, nch);
        if constexpr (DYN) cp_commit();
      }
    } else {
#pragma unroll 1
      for (; wnext <= e; ++wnext) {
        aw2_window<NCR>(base, s, dst, rend, nch);
        if constexpr (DYN) cp_commit();
      }
    }
    if constexpr (!DYN) cp_commit();
  };

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + 4 * t + u0 * UW;
  uint32_t magic = std::is_same_v<T, bf16> ? 0x43434343u : 0x64646464u;
  asm volatile("" : "+r"(magic));
  const uint32_t opq = PI ? uint32_t(p.m) >> 31 : 0u;
  if constexpr (PI) magic |= opq;
  // kOptOpq (V 47): opq (0: p.m <= 8) or-ed into bit 3 of every magic byte as well. With bf16 x the line above is
  // a no-op for ptxas (0x43 already has bit 0 set, so 0x43434343 | opq == 0x43434343 whatever opq is): it
  // folds the magic into the permutes' immediate slot and keeps their selectors (0x4140 / 0x4342) in
  // registers, which in this kernel's Q4_0 it re-materialises from uniform registers before each permute
  // (74 moves per unit, session 8 prep SASS). Bit 3 is clear in 0x43 and 0x64: the magic is then opaque.
  if constexpr ((OPT & kOptOpq) != 0) magic |= opq * 0x08080808u;
  [[maybe_unused]] const uint32_t k4b = 0x4B000000u | opq;

  pdl_trigger();
  if constexpr (!DYN) {
#pragma unroll
    for (int k = 0; k < C; ++k) issue_to((NUC * (k + 1) + 6) >> 3);  // P_k: the windows unit k needs
  }
  issue_to((NCR - 8) >> 3);  // P_C: all that fit the ring
  pdl_wait();
  uint32_t ua = ring + uint32_t(g * P);  // row g of the unit's ring slot
  int slot = 0;
#pragma unroll 1
  for (int i = 0; i < nun; ++i) {
    [[maybe_unused]] uint2 xv[16];
    if constexpr (!NODEC && !kQ4K) {
#pragma unroll
      for (int j = 0; j < 16; ++j) xv[j] = __ldg(reinterpret_cast<const uint2*>(xr + 16 * j));
    }
    if constexpr (DYN) {
      const int wn = (NUC * (i + 1) + 6) >> 3;                       // the last window unit i needs
      const int n = wnext - 1 - (wn < nwin - 1 ? wn : nwin - 1);  // windows issued after it
      if constexpr (EARLY) {
        aw2_wait_upto<K1>(n);  // fewer windows ahead here (G_{i-1} not yet issued): every count
      } else {
        if (n >= K1) cp_wait<K1>();
        else if (n == K1 - 1) cp_wait<(K1 > 1 ? K1 - 1 : 0)>();
        else cp_wait<0>();
      }
    } else {
      cp_wait<C>();  // groups up to P_i / G_{i-C-1}: every window unit i needs
    }
    __syncwarp();  // every lane's copies of the unit are visible (EARLY: and every lane is done with unit i - 1)
    if constexpr (EARLY) {
      if (i > 0) issue_to((NCR + NUC * i - 8) >> 3);  // G_{i-1}, before the decode (k_ggst's non-late order)
    }
    if constexpr (!NODEC) {
      if constexpr (kQ4K) unit_q4k_ss_s6<T, PI, FOLD>(ua, ua + uint32_t(8 * P), xr, g, t, magic, scr, acc, k4b);
      else unit32<T, F, B8, PI, FOLD, true>(ua, ua + uint32_t(8 * P), xr, t, magic, acc, xv);
    }
    xr += UW;
    if constexpr (!EARLY) {
      __syncwarp();  // every lane is done with the unit's chunks
      issue_to((NCR + NUC * (i + 1) - 8) >> 3);  // G_i: the windows whose ring chunks are free now
    }
    ua += uint32_t(UB);
    if (++slot == NR) {
      slot = 0;
      ua -= uint32_t(NR * UB);
    }
  }
  cp_wait<0>();

  // the warps' sums, added in warp order (as k_ggst)
  warp_sums_out(p, acc, reinterpret_cast<float*>(smem), warp, lane, nw, g, t, row0);
}

}  // namespace gk::cuda::gguf_st
