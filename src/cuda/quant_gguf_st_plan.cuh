// The launch plan of the staged GGUF GEMV (quant_gguf_st.cu, its only includer): the
// configuration (shipped default, the benchmarking knob GPUKIT_GEMV_GGUF and the variants) and
// the warps per CTA / split-K of a shape. Host code only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/cuda_util.h"
#include "quant_gguf_st_units.cuh"

namespace gk::cuda {

namespace {

using namespace gguf_st;  // GS, GL

// k_ggst's OPT bits (quant_gguf_st.cu says what each does).
constexpr int kOptPI = 1, kOptFold = 2, kOptLate = 4;
// k_ggst_aw2 only (the knob's V 47, GPUKIT_GGUF_AW=o; session 8 prep, gguf9): the magic bytes made opaque to
// ptxas (bit 3 of each or-ed with p.m >> 31, 0), so that the byte permutes keep their selectors as immediates
// (quant_gguf_st_aw2.cuh says why). Same values: the same bits.
constexpr int kOptOpq = 8;
// k_ggst_aw2 DYN only (the knob's V 48, GPUKIT_GGUF_AW=e; session 8 prep): V 47 with the windows a unit freed
// issued after the next unit's wait, before its decode (k_ggst's non-late order; session 6 measured the late
// order as a loss for the 4-bit formats). Same decode: the same bits.
constexpr int kOptEarly = 16;
// k_ggst only (session 8, gguf10; GPUKIT_GGUF_LA, off by default): line-aligned copy lanes. A stage's chunks
// (the same set, to the same shared offsets: the same bits) are given to the lanes by their address, lane
// l % 8 taking the chunks at 16 (l % 8) of each 128-byte line, so that every 8-lane row segment of a copy
// instruction is one line (some lanes idle at the stage's two edges) instead of two (the stages of 288 / 320 /
// 144 / 160 bytes start at any 16-byte offset of a line).
constexpr int kOptLA = 32;

struct GCfg {
  int d = 3, wt = 12, ux = 1, wmin = 1;  // ring depth, target warps per SM, units per stage x1 (0: half), warps per CTA at least
  int roll = 0;                          // 1: the stage and unit loops not unrolled (k_ggst's ROLL)
  int ss = 0;                            // 1: Q4_K / Q6_K scales once per quad (k_ggst's SS)
  int opt = 0;                           // k_ggst's OPT bits (kOptPI, kOptFold, kOptLate; variants 30-35)
  int probe = 0;                         // the knob's V 7 / 36: the copies alone (as variant 7 / 36); 37 / 38:
                                         // line-aligned windows of 256 / 512 bytes per row (quant_gguf_st_probe.cuh)
  int sp = 1;                            // 1: shared memory sized so that the CTAs spread evenly (launch_d); 0: not;
                                         // 2: room for one CTA more per SM (the next kernel's, under PDL)
  int la = 0;                            // 1: k_ggst with line-aligned copy lanes (kOptLA; GPUKIT_GGUF_LA)
};

// The session-6 kernels (variants 30-35; the knob's V): OPT bits and SS of variant v (0: none).
// 34 / 35: 30 / 33 with the late refill (kOptLate).
GCfg with_s6(GCfg c, int v) {
  if (v < 30 || v > 35) return c;
  c.opt = kOptPI | ((v == 32 || v == 33 || v == 35) ? kOptFold : 0) | (v >= 34 ? kOptLate : 0);
  c.ss = (v == 31 || v == 33 || v == 35) ? 1 : c.ss;
  return c;
}

int default_depth(QFormat f) {
  switch (f) {
    case QFormat::q4_0: return GS<int(QFormat::q4_0)>::D;
    case QFormat::q4_1: return GS<int(QFormat::q4_1)>::D;
    case QFormat::q8_0: return GS<int(QFormat::q8_0)>::D;
    case QFormat::q4_k: return GS<int(QFormat::q4_k)>::D;
    default: return GS<int(QFormat::q6_k)>::D;
  }
}

// The session-5 configuration (the base of the benchmarking variants 4, 5, 7, 13, 21, 22, 29-36).
GCfg gcfg_s5(QFormat f) {
  GCfg c;
  c.d = default_depth(f);
  return c;
}

// The shipped configuration (no knob): a function of (format, N, K) only. Session 6, checkpoint A
// (docs/device-runs: device-results/A/2/plan_4; % of the copy bandwidth at M = 1, (K, N) = (4096,
// 14336) / (14336, 4096) / (4096, 128256), against the session-5 default in the same run):
// - Q8_0: variant 34 (PI, Q8_0's bf16 byte decode, late refill): 66 / 66 / 80 (62 / 62 / 79); M = 8
//   57 / 56 / 72 (53 / 50 / 70). The session-5 default's bits.
// - Q4_0: N < 132 x 8 x 16 rows (all row tiles resident at once): half the units per stage (UX 0)
//   57 / 53 (53 / 52); the lm-head keeps one unit per stage (UX 0: 74 against 78) with PI 79.
// - Q4_1: the codes as 128 + q (kOptFold, bf16 x) with UX 0 for the small N: 60 / 57 (50 / 49); the
//   lm-head UX 1 with the late refill: 82 (74).
// - Q4_K: UX 0, quad-shared scales, kOptFold: 52 / 50 / 70 (45 / 43 / 63).
// - Q6_K: quad-shared scales (variant 31): 55 / 55 / 72 (53 / 52 / 69); the session-5 bits.
// The switch GPUKIT_GGUF_AW (session 7, gguf8): the shipped configuration of a format below run through
// k_ggst_aw2 (line-aligned window copies, quant_gguf_st_aw2.cuh) with the same plan, hence the same bits.
// "1": Q8_0 / Q4_0 / Q4_1 / Q4_K with the constant wait (the knob's V 41; Q6_K has no aligned kernel:
// unchanged), "d": the same with the run-time wait (DYN, V 43), "0": none, or a list of format names
// ("q8_0,q4_0"; "d:q8_0,q4_0" for DYN; "q6_k" listed: Q6_K through k_ggst_aw6, V 45, whose wait is always
// the run-time one); unset: the formats of kAwDefault (a bit per QFormat value; kAwDefaultMany for N above
// 132 x 8 row tiles, the lm-head) with the wait of kAwDefaultDyn. Returns 0 (off), 41, 43 or 45 (the knob's V
// of the kernel). Session 7's final run (docs/device-runs/2026-11-30-h200-s7-final-2.log plan 12; % of copy at
// M = 1, (4096, 14336) / (14336, 4096) / (4096, 128256), default -> aw=d): Q8_0 66 / 66 / 79 -> 72 / 71 / 93
// (aw=1: 68 / 70 / 92); Q6_K through k_ggst_aw6 54 / 55 / 72 -> 53 / 56 / 77 (the lm-head only); Q4_0 / Q4_1 /
// Q4_K slower through aw2 (e.g. Q4_0 56 / 53 / 78 -> 49 / 48 / 73). So (session 8 prep, gguf9): Q8_0 through
// aw2 with the run-time wait on every shape, Q6_K through aw6 on the lm-head; the same plan, hence the same
// bits as before (tests/python/test_gguf_aw2_cuda.py test_aw2_compiled_default_same_bits).
constexpr unsigned kAwDefault = 1u << int(QFormat::q8_0);
constexpr unsigned kAwDefaultMany = (1u << int(QFormat::q8_0)) | (1u << int(QFormat::q6_k));
constexpr bool kAwDefaultDyn = true;
// With kAwDefaultDyn, true: the unset switch's k_ggst_aw2 formats take V 47 (the opaque magic; GPUKIT_GGUF_AW=o)
// instead of V 43. Off until the next run measures it (docs/notes/gguf-s8-prep.md has the rule).
constexpr bool kAwDefaultOpq = false;
constexpr unsigned kAwAll = (1u << int(QFormat::q8_0)) | (1u << int(QFormat::q4_0)) | (1u << int(QFormat::q4_1)) |
                            (1u << int(QFormat::q4_k));  // "1" / "d"

int aw_switch(QFormat f, bool few) {
  const unsigned bit = 1u << int(f);
  const bool q6 = f == QFormat::q6_k;
  if ((kAwAll & bit) == 0 && !q6) return 0;
  const char* e = std::getenv("GPUKIT_GGUF_AW");
  if (!e || !*e)
    return ((few ? kAwDefault : kAwDefaultMany) & bit) != 0 ? (q6 ? 45 : (kAwDefaultDyn ? (kAwDefaultOpq ? 47 : 43) : 41))
                                                            : 0;
  std::string v(e);
  if (v == "1") return q6 ? 0 : 41;
  if (v == "d") return q6 ? 0 : 43;
  if (v == "o") return q6 ? 0 : 47;  // "d" with the opaque magic (kOptOpq; session 8 prep)
  if (v == "e") return q6 ? 0 : 48;  // "o" with the early refill (kOptEarly; session 8 prep)
  if (v == "0") return 0;
  const bool dyn = v.rfind("d:", 0) == 0;
  if (dyn) v = v.substr(2);
  static const char* const kNames[] = {"fp8", "int8", "int4", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "nvf4"};
  size_t i = 0;
  bool hit = false;
  while (i <= v.size()) {
    size_t j = v.find(',', i);
    if (j == std::string::npos) j = v.size();
    const std::string name = v.substr(i, j - i);
    bool known = false;
    for (int q = 0; q < 9; ++q)
      if (name == kNames[q]) {
        known = true;
        if (q == int(f)) hit = true;
      }
    if (!known)
      throw ValueError(cat("GPUKIT_GGUF_AW: expected 0, 1, d, o, e or GGUF format names (q8_0,q4_0,q4_1,q4_k,q6_k; d:... for the ",
                           "run-time wait), got '", e, "'"));
    i = j + 1;
  }
  return hit ? (q6 ? 45 : (dyn ? 43 : 41)) : 0;
}

// GPUKIT_GGUF_LA (session 8, gguf10; benchmarking, off by default): "1" the shipped configuration's k_ggst
// launches (Q4_0 / Q4_1 / Q4_K; Q8_0 with GPUKIT_GGUF_AW=0) with line-aligned copy lanes (kOptLA: the same
// plan, the same shared layout, the same decode: the same bits); "p" the copies alone of variant 7 (the
// session-5 configuration and plan) with line-aligned copy lanes (wrong results: that pattern's ceiling; Q6_K's
// phased units: variant 7 itself); "0": off; unset: the formats of kLaDefault (a bit per QFormat value;
// kLaDefaultMany for N above 132 x 8 row tiles, the lm-head). Returns -1 (unset), 0, 1 or 2 ("p").
// Off until a run measures it (docs/notes/gguf-s8.md has the rule); the bits are the same either way.
constexpr unsigned kLaDefault = 0u;
constexpr unsigned kLaDefaultMany = 0u;
int la_switch() {
  const char* e = std::getenv("GPUKIT_GGUF_LA");
  if (!e || !*e) return -1;
  const std::string v(e);
  if (v == "0") return 0;
  if (v == "1") return 1;
  if (v == "p") return 2;
  throw ValueError(cat("GPUKIT_GGUF_LA: expected 0, 1 or p, got '", e, "'"));
}

GCfg gcfg_default(QFormat f, int64_t n, int64_t k) {
  (void)k;
  const int la = la_switch();
  if (la == 2) {  // variant 7's configuration, line-aligned copy lanes
    GCfg c = gcfg_s5(f);
    c.probe = 7;
    c.la = 1;
    return c;
  }
  GCfg c = gcfg_s5(f);
  const bool few = (n + 15) / 16 <= int64_t(132) * 8;  // all row tiles resident at once (not the lm-head)
  c.la = la >= 0 ? la : int((((few ? kLaDefault : kLaDefaultMany) >> int(f)) & 1u) != 0);
  switch (f) {
    case QFormat::q8_0: c.opt = kOptPI | kOptLate; break;
    case QFormat::q4_0:
      c.opt = kOptPI;
      c.ux = few ? 0 : 1;
      break;
    case QFormat::q4_1:
      c.opt = kOptPI | kOptFold | (few ? 0 : kOptLate);
      c.ux = few ? 0 : 1;
      break;
    case QFormat::q4_k:
      c.opt = kOptPI | kOptFold;
      c.ss = 1;
      c.ux = 0;
      break;
    default:  // q6_k
      c.opt = kOptPI;
      c.ss = 1;
      break;
  }
  c.probe = aw_switch(f, few);
  return c;
}

// GPUKIT_GEMV_GGUF="D,WT[,UX[,WMIN[,PF[,MINB[,R[,SP[,V]]]]]]]": the benchmarking knob: ring depth 2..4,
// target warps per SM, UX 1 (0: half the units per stage, Q4_0 / Q4_1 / Q4_K; D 2 or 3), at least
// WMIN (1..8) warps per CTA (shorter CTAs when there are many, e.g. the lm-head's 8016), PF and MINB
// kept as fields but only 0 and 2 (session 6 removed the L2 prefetch, 80 registers and UX 2: each
// lost everywhere in session 5), R 1 the rolled stage loop (as variant 21; UX 1 and the default D
// only), SP 0 no CTA spreading (shared memory as the rings need), 2 spreading with room for one CTA
// more per SM, V 30..35 the session-6 kernel of that variant (UX 1 and the default D, or UX 0 and
// D 2; R 0; 0: the session-5 kernel), 7 / 36 the copies alone (as the variants), 37 / 38 the copies
// alone in 128-byte-line-aligned windows of 256 / 512 bytes per row (session 7; k_ggst_ap), (39 / 40: session 7's
// k_ggst_aw, superseded by k_ggst_aw2 and removed in the session-8 prep: rejected), 41 the shipped math of
// Q8_0 / Q4_0 / Q4_1 / Q4_K through k_ggst_aw2 (session 7, gguf8: aligned windows at low per-unit cost; Q6_K: its
// shipped kernel), 42 k_ggst_aw2's copies alone (zeros; Q6_K as 41), 43 / 44 as 41 / 42 with the run-time wait
// (k_ggst_aw2's DYN), 45 / 46 as 43 / 44 and Q6_K through k_ggst_aw6 (quant_gguf_st_aw6.cuh), 47 as 43 with the
// magic bytes opaque to ptxas (kOptOpq; session 8 prep: Q4_0's selectors re-materialised per permute otherwise),
// 48 as 47 with the early refill (kOptEarly: the freed windows issued before the next decode).

GCfg gcfg_env(QFormat f, int64_t n, int64_t k) {
  const char* e = std::getenv("GPUKIT_GEMV_GGUF");
  if (!e || !*e) return gcfg_default(f, n, k);
  GCfg c;
  c.d = default_depth(f);
  int d = 0, wt = 0, ux = 1, wmin = 1, pf = 0, minb = 2, roll = 0, sp = 1, v = 0;
  const int got = std::sscanf(e, "%d,%d,%d,%d,%d,%d,%d,%d,%d", &d, &wt, &ux, &wmin, &pf, &minb, &roll, &sp, &v);
  if (ux == 0 && (f == QFormat::q8_0 || f == QFormat::q6_k)) ux = 1;  // one unit per stage already
  const bool dflt = ux == 1 && d == default_depth(f);
  const bool half_ok = ux == 0 && (d == 2 || d == 3) && roll == 0 && (v == 0 || d == 2);
  if (got < 2 || d < 2 || d > 4 || wt < 1 || wt > 64 || (ux != 0 && ux != 1) || (ux == 0 && !half_ok) || wmin < 1 ||
      wmin > 8 || pf != 0 || minb != 2 || (roll != 0 && roll != 1) || (roll == 1 && !dflt) || (sp < 0 || sp > 2) ||
      (v != 0 && v != 7 && (v < 30 || v > 48 || v == 39 || v == 40)) || (v != 0 && !half_ok && (!dflt || roll != 0)) ||
      ((v == 7 || (v >= 36 && v <= 38)) && !dflt))
    throw ValueError(cat("GPUKIT_GEMV_GGUF: expected D,WT[,UX[,WMIN[,PF[,MINB[,R[,SP[,V]]]]]]] with D in 2..4, WT in ",
                         "1..64, UX 1 or 0 (half the units; D 2 or 3, R 0), WMIN in 1..8, PF 0, MINB 2, R 0 or 1 (UX 1 ",
                         "and the default D), SP 0..2, V 0 or 30..35 (UX 1 and the default D or UX 0 and D 2; R 0; V 34, ",
                         "35: D 2; V 7 / 36 / 37 / 38, the copies alone: UX 1 and the default D; V 41..48: UX 1 and the default D or UX 0 and D 2), got '", e, "'"));
  c = with_s6(c, v);
  c.probe = (v == 7 || v >= 36) ? v : 0;
  if (v >= 41 && v <= 48) {  // k_ggst_aw2 with the shipped math (Q8_0 / Q4_0 / Q4_1 / Q4_K; Q6_K: its default kernel)
    const GCfg dc = gcfg_default(f, n, k);
    c.opt = dc.opt;
    c.ss = dc.ss;
  }
  c.sp = sp;
  c.roll = roll;
  c.d = d;
  c.wt = wt;
  c.ux = ux;
  c.wmin = wmin;
  return c;
}

// The variant switch (benchmarking only): 4 a 3-stage ring (the default is 2), 5 a 4-stage ring,
// 7 the copies without decode (the probe; wrong results), 12 Q8_0 with bf16 x through an fp16
// copy of x (k_gg_xprep), 13 Q8_0 with bf16 x decoded to bf16 by byte operations (int8x4_bf16),
// 21 the rolled stage loop (k_ggst's ROLL; with the knob's D and UX at their defaults), 22 Q4_K /
// Q6_K with the block scales formed once per quad (k_ggst's SS; the knob's D and UX at their defaults).
// Session 6 (the knob's D, UX at their defaults, MINB 2, R 0): 30 byte permutes with immediate
// selectors (kOptPI; Q8_0 with bf16 x also decoded as variant 13; the default's bits), 31 30 with
// variant 22's quad scales (Q4_K / Q6_K; the default's bits), 32 30 with Q4_1 / Q4_K's codes as
// 128 + q (kOptFold, bf16 x; other bits), 33 31 + 32, 34 30 with the late refill (kOptLate: the
// default's bits), 35 33 with the late refill, 36 the copies alone (as 7) with the late refill.
// 29: the session-5 default kernel (no session-6 options: the reference of the same-bits tests,
// whatever the default is). Without the knob, 4, 5, 7, 13, 21, 22 and 29-36 start from the
// session-5 configuration (gcfg_s5: one unit per stage, no options), the others (2: the default
// without PDL, 12) from the shipped one (gcfg_default).
GCfg gcfg(int variant, QFormat f, int64_t n, int64_t k) {
  const char* e = std::getenv("GPUKIT_GEMV_GGUF");
  const bool s5base = variant == 4 || variant == 5 || variant == 7 || variant == 13 || variant == 21 || variant == 22 ||
                      (variant >= 29 && variant <= 36);
  GCfg c = (s5base && (!e || !*e)) ? gcfg_s5(f) : gcfg_env(f, n, k);
  c = with_s6(c, variant);
  if (variant == 7 || variant == 13 || variant == 21 || variant == 22 || variant == 29 || variant == 36) c.opt = 0;
  if (variant == 29 || variant == 13 || variant == 21) c.ss = 0;
  if (variant == 21) c.roll = 1;
  if (variant == 22) c.ss = 1;
  if (variant == 4) c.d = default_depth(f) == 2 ? 3 : 2;
  if (variant == 5) c.d = 4;
  return c;
}

constexpr int kSmemMax = 227 * 1024;  // dynamic shared memory of one CTA at most
constexpr int64_t kSmSmem = 228 * 1024;
constexpr int kSMs = 132;

template <int F>
int stage_bytes_f(int ux) {
  return ux == 0 ? 16 * GL<F, 0>::P : 16 * GL<F, 1>::P;
}
int stage_bytes(QFormat f, int ux) {
  switch (f) {
    case QFormat::q4_0: return stage_bytes_f<int(QFormat::q4_0)>(ux);
    case QFormat::q4_1: return stage_bytes_f<int(QFormat::q4_1)>(ux);
    case QFormat::q8_0: return stage_bytes_f<int(QFormat::q8_0)>(ux);
    case QFormat::q4_k: return stage_bytes_f<int(QFormat::q4_k)>(ux);
    default: return stage_bytes_f<int(QFormat::q6_k)>(ux);
  }
}
template <int F>
int64_t units_per_stage_f(int ux) {
  return ux == 0 ? GL<F, 0>::U : GS<F>::U * ux;
}
int64_t units_per_stage(QFormat f, int ux) {
  switch (f) {
    case QFormat::q4_0: return units_per_stage_f<int(QFormat::q4_0)>(ux);
    case QFormat::q4_1: return units_per_stage_f<int(QFormat::q4_1)>(ux);
    case QFormat::q8_0: return units_per_stage_f<int(QFormat::q8_0)>(ux);
    case QFormat::q4_k: return units_per_stage_f<int(QFormat::q4_k)>(ux);
    default: return units_per_stage_f<int(QFormat::q6_k)>(ux);
  }
}
int64_t unit_weights(QFormat f) { return f == QFormat::q6_k ? 512 : 256; }

struct GPlan {
  int nw = 1, split = 1;
};

// Warps per CTA (1..8) and split-K: about wt warps per SM over the GPU, at least two stages
// per warp, the CTAs of one SM within its shared memory when all fit at once; split-K only
// when the row tiles alone leave the GPU half empty. A function of (N, K, format, knob).
GPlan gplan(int64_t n, int64_t k, QFormat f, const GCfg& c) {
  GPlan p;
  const int64_t nu = k / unit_weights(f), su = units_per_stage(f, c.ux);
  const int64_t rb = (n + 15) / 16, want = int64_t(kSMs) * c.wt;
  int64_t w = (want + rb / 2) / rb;
  w = std::min<int64_t>(std::max<int64_t>(w, c.wmin), 8);
  w = std::min<int64_t>(w, std::max<int64_t>(nu / (2 * su), 1));
  const int64_t ring = int64_t(c.d) * stage_bytes(f, c.ux);  // per warp
  w = std::min<int64_t>(w, kSmemMax / ring);
  const int64_t per_sm = (rb + kSMs - 1) / kSMs;  // CTAs per SM when all are resident
  if (per_sm * (ring + 1024) <= kSmSmem)  // all can be: keep them so
    w = std::max<int64_t>(std::min<int64_t>(w, (kSmSmem - per_sm * 1024) / (per_sm * ring)), 1);
  p.nw = int(w);
  if (rb * w * 2 < want) {
    int64_t sp = (want + rb * w - 1) / (rb * w);
    sp = std::min<int64_t>({sp, 16, std::max<int64_t>(nu / (w * 2 * su), 1)});
    p.split = int(std::max<int64_t>(sp, 1));
  }
  return p;
}

}  // namespace

}  // namespace gk::cuda
