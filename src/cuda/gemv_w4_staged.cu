// The staged 4-bit decode GEMV (int4 with group scales and zero points, NVF4; kernel and plan
// in common/gemv_w4.cuh): the launch plan (warps per CTA, split-K), the argument checks and
// the benchmarking variants (gk._C._gemv_set_variant; bf16 x only, float16 x runs the default
// configuration): 6 without the CTA spreading (MODE 0, ring of 3), 7 the copies without decode
// (wrong results: the access pattern's ceiling), 9 more warps per SM (a ring of 2, registers for
// 3 CTAs of 256 threads, sized for 24 warps per SM), 11 lean copies (k_w4's MODE 3: a full
// stage's copies from addresses computed once, block 0's shared reads before the next copies),
// 13 MODE 0 with a ring of 3 (session 5's default), 14 MODE 5 (11 with x of each stage's first
// block loaded during the previous stage; 11, 13 and 14 give the same bits); session 6: 16 the
// probe without x loads (MODE 7: x from register moves; wrong results: the decode's ceiling),
// 17 x through a ring of 3 at M = 1 (MODE 8: each stage's x copied with its codes and read from
// shared memory; M > 1: MODE 0 with the same plan), 19 the same with a ring of 2 (the default
// since session 6), 20 MODE 0 with a ring of 2 (x from global memory at every M; its own plan),
// 27 19 with the stage loop not unrolled (MODE 9 / 10: one full-stage body; the default's bits);
// session 7 (int4 g128, bf16 x; other formats and float16 x run the default): 37 the per-shape
// plan (w4_g128_ring2: variant 20's configuration where N >= 2 K, the default elsewhere), 38 the
// default on weights in the mma nibble order (k_w4's ORD: nibble p = weight 2p, p + 4 = 2p + 1 in
// each 32-bit word; wrong results on the natural order), 39 37 with the mma nibble order, 48 MODE 11
// (x paired in place in the ring once per stage, copied through L1) at every shape, 51 MODE 12 (19 with
// x copied through L1); session 8 (every format and x type, float16 x included; off by default): 52
// MODE 11 with the default's plan (int4 g32 / g64, NVF4, float16 x: the default's bits; int4 g128 with
// bf16 x: 48), 53 MODE 11 with a ring of 3 (two stages in flight per warp) and wt 12 (the shared memory
// then allows 1 warp per CTA at (4096, 14336): 8 stages per warp, the same bytes in flight per SM, half the
// exposed last stage; 6 warps at (14336, 4096): 1.5x the bytes in flight), 54 MODE 11 with a ring of 2 and
// wt 8 (half the warps per SM: twice the stages per warp, half the bytes in flight), 55 a ring of 3 and wt 8,
// 56 the copies alone (MODE 1, the probe: wrong results) with a ring of 2 (48's warps per CTA at the three
// benchmark shapes: one stage of codes in flight per warp, as 48; variant 7 keeps two), 57 52 without the
// CTA spreading (the same warps per CTA, so 52's bits; room for the next call's CTAs under PDL), 58 53
// with k_w4's MODE 13 (the first stage waits for its own codes and x only; 53's bits); 59 / 60 (int4 g128, bf16 x)
// MODE 13 at M = 1 on stages of 2 blocks (KB = 2) with a ring of 4 / 3, on 48's plan and 48's split of K (48's bits;
// launch_kb2); 61 (session 9, int4 g128 with bf16 x, NEW NUMERICS: x as fp16 x 2^e per warp and stage, codes decoded
// as fp16, k_w4 MODE 14 at M = 1 on 48's plan; M > 1: 48's MODE 0); 62 (session 10, int4 g128 with bf16 x; 48's bits)
// k_w4 MODE 15 at M = 1: 48 with the next stage's copies issued before the wait for this stage's bytes (two stages
// in flight while a warp waits) and a full stage's copies from addresses computed once (M > 1: 48's MODE 0); session 14
// (int4 g128, bf16 x, K % 512 == 0, M <= 8; NEW NUMERICS; common/gemv_w4i.cuh): 63-66 k_w4i, the codes into int8 mma against x
// as 16-bit fixed point per block (63: 48's plan, a ring of 2; 64: wt 24, MINB 3; 65: a ring of 3; 66: 63 with one
// stage per warp allowed; M > 1: x converted once per call by k_w4i_xprep); GPUKIT_GEMV_W4_VARIANT runs a variant's configuration where the process variant is 0 (w4_env_variant);
// 0 / 2 / 10 the default (MODE kDefaultMode, ring of kDefaultD; int4 g128 with bf16 x: the configuration
// of variant kG128Wide where N >= 2 K and of kG128Mid elsewhere, 48 since session 7's final run). Removed in session 6: 4 (stages
// of 8 blocks), 5 (a ring of 4), 8 (int4's shifts as mul.hi; NVF4's 8 is the per-lane kernel's),
// 12 (11 + mul.hi): slower than the default at every shape of session 5; 15 / 18 (int4's
// "zero-point mma", with / without x through the ring): slower at every shape of session 6's
// checkpoint A (docs/notes/gemv4-s6.md). Removed in session 8: 45-47, 49, 50 (k_w4's DEC 1 / 2, the zero
// point through x sums): slower than 48 at every shape of session 7's final run (docs/notes/gemv4-s7.md).
#include "common/gemv_w4.cuh"
#include "common/gemv_w4_launch.cuh"
#include "common/gemv_w4i.cuh"
#include "core/cuda_util.h"

#include <cstdlib>
#include <string>

namespace gk::cuda {

namespace {

using namespace gemv_detail;

struct W4Cfg {
  int kb = 4, d = 3, wt = 16;  // blocks per stage, ring depth, target warps per SM
  int mode = 0;  // k_w4's MODE: 1 the probe, 3 lean copies, 5 3 + x ahead, 7 no x loads, 8 x through
                 // the ring (M = 1), 9 8 with the stage loop rolled
  int minb = 2;                // k_w4's MINB
  bool spread = true;          // at most ceil(CTAs / 132) CTAs per SM when all fit at once
  bool old = false;            // MODE 0 whatever kDefaultMode is (variant 13)
  bool shape = false;          // int4 g128: the per-shape plan (variant 37 / 39)
  bool ord = false;            // int4 g128: codes in the mma nibble order (38 / 39)
  bool xall = false;           // MODE 11 / 13 for every format and x type (52-55, 57, 58)
  int skb = 4;                 // blocks per stage of the M = 1 kernel (2: variants 59 / 60; the plan keeps kb)
  int imma = 0;                // int4 g128, bf16 x, M <= 8: k_w4i (common/gemv_w4i.cuh) with a ring of imma (63-66)
  int minst = 2;               // stages per warp at least (of its split slice; 66: 1)
};

// A variant without a configuration of its own (0, 2: no PDL, 10, ..., the other formats' numbers)
bool w4_is_default(const W4Cfg& c) {
  const W4Cfg d;
  return c.kb == d.kb && c.d == d.d && c.wt == d.wt && c.mode == d.mode && c.minb == d.minb &&
         c.spread == d.spread && !c.old && !c.shape && !c.ord && !c.xall && c.skb == d.skb && c.imma == 0 &&
         c.minst == d.minst;
}

W4Cfg w4_cfg(int variant) {
  W4Cfg c;
  switch (variant) {
    case 6: c.spread = false; break;
    case 7: c.mode = 1; break;
    case 9: c.d = 2, c.minb = 3, c.wt = 24; break;
    case 11: c.mode = 3; break;
    case 13: c.mode = 0, c.old = true; break;
    case 14: c.mode = 5; break;
    case 16: c.mode = 7; break;
    case 17: c.mode = 8; break;
    case 19: c.mode = 8, c.d = 2; break;
    case 20: c.d = 2; break;
    case 27: c.mode = 9, c.d = 2; break;
    case 37: c.shape = true; break;
    case 38: c.ord = true; break;
    case 39: c.shape = true, c.ord = true; break;
    case 48: c.mode = 11, c.d = 2; break;
    case 52: c.mode = 11, c.d = 2, c.xall = true; break;
    case 53: c.mode = 11, c.d = 3, c.wt = 12, c.xall = true; break;
    case 54: c.mode = 11, c.d = 2, c.wt = 8, c.xall = true; break;
    case 55: c.mode = 11, c.d = 3, c.wt = 8, c.xall = true; break;
    case 56: c.mode = 1, c.d = 2; break;
    case 57: c.mode = 11, c.d = 2, c.xall = true, c.spread = false; break;
    case 58: c.mode = 13, c.d = 3, c.wt = 12, c.xall = true; break;
    case 51: c.mode = 12, c.d = 2; break;
    case 59: c.mode = 13, c.d = 4, c.skb = 2; break;
    case 60: c.mode = 13, c.d = 3, c.skb = 2; break;
    case 61: c.mode = 14, c.d = 2; break;
    case 62: c.mode = 15, c.d = 2; break;
    case 63: c.imma = 2; break;
    case 64: c.imma = 2, c.wt = 24, c.minb = 3; break;
    case 65: c.imma = 3; break;
    case 66: c.imma = 2, c.minst = 1; break;
    default: break;
  }
  return c;
}

// The default configuration: k_w4's MODE (0, 3, 5 or 8) and ring depth (2 or 3). Session 5:
// MODE 0 with a ring of 3 (variant 13; lean copies, MODE 3, lost at g32). Session 6, H200
// checkpoint A (docs/notes/gemv4-s6.md; bench/gemv.py, % of copy at (4096, 14336) /
// (14336, 4096) / (4096, 128256)): x through a ring of 2 (MODE 8 at M = 1, variant 19) against
// MODE 0 / ring of 3, M = 1: int4 g128 52/61/74 vs 52/50/78, g64 65/67/89 vs 49/52/68, g32
// 67/69/89 vs 49/54/71, NVF4 51/59/76 vs the per-lane kernel's 50/52/68; M = 8 (MODE 0 with a
// ring of 2 and the same plan): g128 46/45/65 vs 44/39/61, g64 52/54/58 vs 46/47/49, g32
// 53/51/64 vs 41/47/59, NVF4 45/45/62 vs 44/44/50.
constexpr int kDefaultMode = 8;
constexpr int kDefaultD = 2;

// int4 g128's per-shape plan (variants 37 / 39; a function of (N, K) only): MODE 0 with a ring of 2
// (variant 20's configuration and plan, x from global memory at every M) where N >= 2 K, the
// default elsewhere. Session 6's final run, % of copy at M = 1, (4096, 14336) / (14336, 4096) /
// (4096, 128256): variant 20 58 / 57 / 85, the default 51 / 61 / 74 (g64 / g32 / NVF4: the
// default won at every shape, so they keep it).
bool w4_g128_ring2(int64_t n, int64_t k) { return n >= 2 * k; }
// int4 g128 with bf16 x (the engine's format): the default ran the per-shape plan (variant 37) from checkpoint A of
// session 7. H200 checkpoint A of session 7 (/work/wt/device-results/s7A/2/plan_4_bench.log, % of copy at
// (4096, 14336) / (14336, 4096) / (4096, 128256)): M = 1 37 58 / 61 / 86 against the session-6 default
// (19) 51 / 61 / 74; M = 8 46 / 45 / 65 against 46 / 45 / 64. Its bits differ from 19's where N >= 2 K
// (another plan: warps per CTA); tested within the default's float64 bound and independent of M
// (tests/python/test_gemv_w4_s7_cuda.py). Variant 19 keeps the previous configuration. float16 x
// keeps x through a ring of 2 (unmeasured with the per-shape plan). The default is the configuration
// of variant kG128Wide where N >= 2 K (w4_g128_ring2) and of kG128Mid elsewhere: each one of 37 / 48 / 51-55
// (configurations complete in w4_cfg, each tested at every shape; the choice is a function of (N, K),
// so a row's bits stay independent of M). tests/python/test_gemv_w4_xpair_cuda.py names them too
// (DEFAULT_G128_WIDE / _MID): change both.
// Since session 7's final run both are 48 (MODE 11: at M = 1 x paired once per stage in shared memory, the
// session-6 default's arithmetic: variant 19's bits). docs/device-runs/2026-11-30-h200-s7-final-2.log plan 11,
// % of copy at M = 1: 48 68 / 67 / 92 against 37 58 / 60 / 85 and 19 51 / 60 / 73; M = 8 45 / 45 against
// 46 / 45 (the DEC variants 45-47, 49, 50 were slower everywhere: 49-61 / 56-63 / 71-87).
// Since session 15 both are 66 (k_w4i on the integer tensor cores, common/gemv_w4i.cuh; NEW NUMERICS: x as 16-bit
// fixed point per 128-element block, where K % 512 == 0 and M <= 8; elsewhere 48's kernels and bits). Session 14 run
// E, bench/e2e.py decode tok/s 48 -> 66: 8B int4 b1 539.7 -> 586.9, b2 896.9 -> 929.1, b4 1657.2 -> 1716.8, b8
// 2929.3 -> 2976.5, 1B b1 1656.8 -> 1812.0 (docs/device-runs/2026-12-01-h200-s14-E.log). The tests hold the default
// to k_w4i's bound where it runs (tests/python/w4_ref.py: DEFAULT_G128, default_is_imma, default_tol).
constexpr int kG128Wide = 66;
constexpr int kG128Mid = 66;
// int4 g32 / g64, NVF4 and float16 x (every format but int4 g128 with bf16 x): true runs variant 52's
// configuration by default (MODE 11 with the default's plan: the same bits as MODE 8). On since session 8's
// final run (% of copy at M = 1, (4096, 14336) / (14336, 4096) / (4096, 128256), MODE 8 -> 52: g64 65 / 67 /
// 88 -> 73 / 69 / 93, g32 66 / 68 / 87 -> 70 / 69 / 89, NVF4 51 / 58 / 76 -> 58 / 61 / 81);
// tests/python/test_gemv_w4_xpair_cuda.py checks 52 = the default bit for bit.
constexpr bool kXPairOthers = true;

constexpr int kSMs = 132;
constexpr int kSmemMax = 200 * 1024;    // dynamic shared memory of one CTA at most
constexpr int kSmemPerSm = 220 * 1024;  // what the CTAs of one SM may use together
constexpr int64_t kSmSmem = 228 * 1024; // shared memory of one H100 / H200 SM

// Warps per CTA: about wt warps per SM over the GPU, 1..8 per 16 rows, at least c.minst (2) stages
// per warp (of its split slice), within the shared memory, and few enough that all CTAs fit
// at once when there are at most a few per SM. A function of (N, K, split) and the variant.
int w4_warps(int64_t n, int64_t k, int split, const W4Cfg& c, int64_t ring) {
  const int64_t nst = (k / 128 + c.kb - 1) / c.kb, rb = (n + 15) / 16, want = int64_t(kSMs) * c.wt;
  int64_t w = (want + rb / 2) / rb;
  w = std::min<int64_t>(std::max<int64_t>(w, 1), 8);
  w = std::min<int64_t>(w, std::max<int64_t>(nst / (c.minst * split), 1));
  w = std::min<int64_t>(w, kSmemMax / ring);
  const int64_t per_sm = (rb * split + kSMs - 1) / kSMs;
  w = std::max<int64_t>(std::min<int64_t>(w, kSmemPerSm / (per_sm * (ring + 256))), 1);
  // the registers of all CTAs of an SM (8 warps per MINB at most) when they fit at once
  w = std::max<int64_t>(std::min<int64_t>(w, int64_t(8 * c.minb) / per_sm), 1);
  return int(w);
}

// The dynamic shared memory of a launch of `ctas` CTAs needing `need` bytes each. When all CTAs fit on the GPU at once,
// ask for enough that at most ceil(CTAs / 132) of them fit on one SM, so the block scheduler spreads them evenly (as
// gemv_w8.cu; H200 session 4: 896 CTAs with room for 9 per SM filled fewer SMs).
int w4_smem(int need, int64_t ctas, const W4Cfg& c) {
  if (need > kSmemMax) throw ValueError("gemv: the staged 4-bit kernel's shared memory does not fit");
  int smem = need;
  const int64_t per_sm = (ctas + kSMs - 1) / kSMs;
  if (c.spread && per_sm >= 1 && per_sm <= 16) {
    const int64_t cap = kSmSmem / (per_sm + 1) - 1024 - 512 + 256;  // just too much for per_sm + 1 CTAs
    if (per_sm * (cap + 1024 + 512) <= kSmSmem && cap > smem) smem = int(std::min<int64_t>(cap, kSmemMax));
  }
  return smem;
}

template <class F, int KB, bool NARROW = false>
bool applies_cfg(const QGemvArgs& p) {
  using L = W4Layout<F, KB, NARROW>;
  const auto al = [](const void* v, int64_t a) { return reinterpret_cast<uintptr_t>(v) % uintptr_t(a) == 0; };
  if (p.k % 128 != 0 || !al(p.q, 16) || p.q_rs % 16 != 0 || !al(p.x, 16) || p.x_rs % 8 != 0) return false;
  const int64_t nblk = p.k / 128;
  if constexpr (NARROW) {
    if constexpr (F::kNvf4) return p.tensor_scale && al(p.zeros, 8);  // K % 128 == 0: 8-byte scale rows
    else return al(p.scales, 4);  // zero points: any alignment
  }
  if constexpr (F::kNvf4) return p.tensor_scale && al(p.zeros, L::US) && (nblk * F::SB) % L::US == 0;
  else return al(p.scales, L::US) && (nblk * F::SB) % L::US == 0 && al(p.zeros, L::UZ) && (nblk * F::ZB) % L::UZ == 0;
}

template <class F>
bool applies_f(const QGemvArgs& p) {
  return applies_cfg<F, 4>(p) || applies_cfg<F, 4, true>(p);
}

bool applies_any(const QGemvArgs& p) {
  if (p.fmt == QFormat::nvf4) return applies_f<W4Nvf4>(p);
  if (p.fmt != QFormat::int4) return false;
  if (p.group == 128) return applies_f<W4Int4<128>>(p);
  if (p.group == 64) return applies_f<W4Int4<64>>(p);
  if (p.group == 32) return applies_f<W4Int4<32>>(p);
  return false;
}

// ring_plan: the ring bytes per warp the plan (warps per CTA) is made for (0: this kernel's);
// XS (MODE 8, M = 1) and its M > 1 kernel (MODE 0) take the plan of the XS ring.
template <class T, class F, int KB, int D, int MODE = 0, bool NARROW = false, int MINB = 2, bool ORD = false>
void launch_k(const QGemvArgs& p, const W4Cfg& c, cudaStream_t st, int64_t ring_plan = 0) {
  constexpr int SB = W4Layout<F, KB, NARROW>::STAGE + (MODE == 8 || MODE == 9 || MODE >= 11 ? KB * 256 : 0);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int split = std::max(1, p.split);
  const int nw = w4_warps(p.n, p.k, split, c, ring_plan > 0 ? ring_plan : int64_t(D) * SB);
  smem_limit<k_w4<T, F, KB, D, MODE, NARROW, MINB, ORD>>(kSmemMax);
  const int smem = w4_smem(std::max(nw * D * SB, nw * 32 * 4 * 4), blocks * split, c);
  launch_ex(k_w4<T, F, KB, D, MODE, NARROW, MINB, ORD>, dim3(unsigned(blocks), unsigned(split)), nw * 32, smem, st,
            p.variant != 2, p);
  GK_LAUNCH_CHECK("qgemv_w4_staged");
  if (split > 1) launch_sum_q(p, st);
}

// k_w4i at M > 1: x from k_w4i_xprep's records (true: one record per 128-element block holding x rows 0..7 and their
// exponents and sums, common/gemv_w4i.cuh) or from its planes per row (false, sessions 14-16). The same values, the
// same bits. GPUKIT_W4I_REC=0 / 1 (benchmarking) overrides kW4iRecDefault. Session 17, run E (docs/device-runs/
// 2026-12-01-h200-s17-E.log; % of copy, records / per row, at (K, N) = (4096, 14336) / (14336, 4096) / (4096, 128256)
// / (4096, 6144) / (4096, 4096)): M = 2 58 / 56 / 88 / 44 / 39 against 55 / 54 / 84 / 43 / 37, M = 4 55 / 53 / 86 / 42
// / 37 against 53 / 51 / 81 / 41 / 35, M = 8 49 / 47 / 76 / 38 / 35 against 47 / 44 / 70 / 38 / 32; 8B int4 decode
// tok/s (bench/e2e.py, +w4irec0) b2 972.0 against 961.1, b4 1827.1 against 1776.1, b8 3191.5 against 3060.1.
constexpr bool kW4iRecDefault = true;
bool w4i_rec() {
  const char* e = std::getenv("GPUKIT_W4I_REC");
  if (!e || !*e) return kW4iRecDefault;
  const std::string v(e);
  if (v == "0" || v == "1") return v == "1";
  throw ValueError(cat("GPUKIT_W4I_REC: expected 0 or 1, got '", e, "'"));
}

// Variants 63-66 (session 14; int4 g128, bf16 x, K % 512 == 0, M <= 8): k_w4i with a ring of D on w4_warps' plan for
// that ring at M = 1 (c.wt target warps per SM, registers for MINB CTAs of 256 threads). M > 1 runs the MULTI kernel on
// the same plan (warps per CTA, split-K) with a ring of 2 (the ring does not change the bits): a row's bits do not
// depend on M.
// SW: the SwiGLU epilogue (QGemvArgs::swiglu; gemv_w4i_swiglu_applies holds: split 1, D = 2, MINB = 2).
template <int D, int MINB, bool SW = false>
void launch_w4i(const QGemvArgs& p, const W4Cfg& c, cudaStream_t st) {
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int split = std::max(1, p.split);
  const int nw = w4_warps(p.n, p.k, split, c, int64_t(D) * W4iLayout::STG);
  if (p.m == 1) {
    smem_limit<k_w4i<D, MINB, false, SW>>(kSmemMax);
    const int smem = w4_smem(std::max(nw * D * W4iLayout::STG, nw * 32 * 4 * 4), blocks * split, c);
    launch_ex(k_w4i<D, MINB, false, SW>, dim3(unsigned(blocks), unsigned(split)), nw * 32, smem, st, p.variant != 2, p);
  } else {  // x's planes once per call (k_w4i_xprep), then the GEMV on the same plan without x in its ring
    if (!p.w4x) throw ValueError("gemv: the integer 4-bit kernel needs its x workspace at M > 1 (internal)");
    const bool rec = w4i_rec();
    const dim3 xg{unsigned(p.k / 512), unsigned(p.m)}, grid{unsigned(blocks), unsigned(split)};
    if (rec) launch_ex(k_w4i_xprep<true>, xg, 32, 0, st, p.variant != 2, p);
    else launch_ex(k_w4i_xprep<false>, xg, 32, 0, st, p.variant != 2, p);
    GK_LAUNCH_CHECK("qgemv_w4i_xprep");
    const int smem = w4_smem(std::max(nw * 2 * W4iLayout::L::STAGE, nw * 32 * 4 * 4), blocks * split, c);
    if (rec) {
      smem_limit<k_w4i<2, MINB, true, SW, true>>(kSmemMax);
      launch_ex(k_w4i<2, MINB, true, SW, true>, grid, nw * 32, smem, st, p.variant != 2, p);
    } else {
      smem_limit<k_w4i<2, MINB, true, SW>>(kSmemMax);
      launch_ex(k_w4i<2, MINB, true, SW>, grid, nw * 32, smem, st, p.variant != 2, p);
    }
  }
  GK_LAUNCH_CHECK("qgemv_w4i");
  if (split > 1) launch_sum_q(p, st);
}

// k_w4 MODE M with the wide copies and a ring of D; M = 8 (x through the ring) runs at M = 1
// only: M > 1 runs MODE 0 with the same plan (the warps per CTA made for the larger XS ring), so
// a row's bits do not depend on M.
template <class T, class F, int M, int D = 3, bool ORD = false>
void launch_mode(const QGemvArgs& p, const W4Cfg& c, cudaStream_t st) {
  if constexpr (M == 8 || M == 9 || M >= 11) {  // 9: 8 with the stage loop rolled (M > 1: MODE 10)
    const int64_t rp = D * int64_t(W4Layout<F, 4>::STAGE + 4 * 256);
    if (p.m == 1) return launch_k<T, F, 4, D, M, false, 2, ORD>(p, c, st, rp);
    return launch_k<T, F, 4, D, M == 9 ? 10 : 0, false, 2, ORD>(p, c, st, rp);
  } else {
    return launch_k<T, F, 4, D, M, false, 2, ORD>(p, c, st);
  }
}

// Variants 37-39 (int4 g128, bf16 x): the per-shape plan and / or the mma nibble order (ORD).
// Narrow rows (K % 512 != 0) run the narrow kernel.
template <class T, class F, bool ORD>
void launch_s7(const QGemvArgs& p, const W4Cfg& c, cudaStream_t st) {
  if (!applies_cfg<F, 4>(p)) return launch_k<T, F, 4, 3, 0, true, 2, ORD>(p, W4Cfg{}, st);
  if (c.shape && w4_g128_ring2(p.n, p.k)) {
    W4Cfg c20;
    c20.d = 2;
    return launch_mode<T, F, 0, 2, ORD>(p, c20, st);
  }
  return launch_mode<T, F, kDefaultMode, kDefaultD, ORD>(p, W4Cfg{}, st);
}

// MODE 11 / 13 (x paired in the ring at M = 1; M > 1: MODE 0 with the same plan) with c's ring
template <class T, class F>
void launch_xp(const QGemvArgs& p, const W4Cfg& c, cudaStream_t st) {
  if (c.mode == 13) return launch_mode<T, F, 13, 3>(p, c, st);  // 58 (a ring of 3 only)
  return c.d == 3 ? launch_mode<T, F, 11, 3>(p, c, st) : launch_mode<T, F, 11, 2>(p, c, st);
}

// GPUKIT_GEMV_W4_VARIANT=V (a benchmarking switch for the engine, e.g. bench/e2e.py's +w4vV): where the
// process-wide variant (gk._C._gemv_set_variant) is 0, this kernel runs variant V's configuration (PDL as the
// default's). V: 0, or 3..66 except the probes 7, 16, 56 (wrong results) and 1 / 2 (other kernels / no PDL).
// GPUKIT_GEMV_W4_SMALL=V (session 10, the same values): variant V's configuration for shapes of at most
// kW4SmallWeights weights only (the 8B model's o and q/k/v projections, not its gate/up, down or lm head), where
// neither the process variant nor GPUKIT_GEMV_W4_VARIANT names one. GPUKIT_GEMV_W4_O=V (session 11): the same
// for at most kW4OWeights weights (the 8B o projection, not its q/k/v), before GPUKIT_GEMV_W4_SMALL.
constexpr int64_t kW4SmallWeights = int64_t(32) << 20;
constexpr int64_t kW4OWeights = int64_t(16) << 20;

template <int Which>
int w4_env_variant_of(const char* name) {
  const char* e = std::getenv(name);
  if (!e || !*e) return 0;
  thread_local std::string last;
  thread_local int v = 0;
  if (last != e) {
    char* end = nullptr;
    const long r = std::strtol(e, &end, 10);
    if (end == e || *end != '\0' || (r != 0 && (r < 3 || r > 66 || r == 7 || r == 16 || r == 56)))
      throw ValueError(cat(name, ": expected 0 or a variant 3..66 other than the probes 7, 16, 56, got '", e, "'"));
    v = int(r);
    last = e;
  }
  return v;
}
int w4_env_variant() { return w4_env_variant_of<0>("GPUKIT_GEMV_W4_VARIANT"); }
int w4_variant_for(const QGemvArgs& p) {
  if (p.variant != 0) return p.variant;
  if (const int v = w4_env_variant(); v != 0) return v;
  if (p.n * p.k <= kW4OWeights)
    if (const int v = w4_env_variant_of<2>("GPUKIT_GEMV_W4_O"); v != 0) return v;
  return p.n * p.k <= kW4SmallWeights ? w4_env_variant_of<1>("GPUKIT_GEMV_W4_SMALL") : 0;
}

// Variants 59 / 60 (int4 g128, bf16 x; session 8): at M = 1, k_w4 MODE 13 on stages of 2 blocks (KB = 2) with a
// ring of 4 / 3, on 48's plan (warps per CTA, CTA spreading) and 48's split of K over the warps (units of 4
// blocks: k_w4's SU), so every warp decodes 48's blocks in 48's order: 48's bits. The same ring bytes as 48
// (59: 3 half stages in flight per warp while one is decoded, 1.5x 48's bytes in flight; 60: one full stage's
// worth, as 48), half the decode exposed after the last copy lands, and the first wait covers half a stage's
// codes and x. M > 1: 48's kernel (MODE 0, KB = 4, a ring of 2).
template <class T, class F>
void launch_kb2(const QGemvArgs& p, const W4Cfg& c, cudaStream_t st) {
  const W4Cfg c48 = w4_cfg(48);
  const int64_t rp = 2 * int64_t(W4Layout<F, 4>::STAGE + 4 * 256);  // 48's plan: a ring of 2 stages of 4 blocks
  if (p.m > 1) return launch_k<T, F, 4, 2, 0>(p, c48, st, rp);
  if (c.d == 4) return launch_k<T, F, 2, 4, 13>(p, c48, st, rp);
  return launch_k<T, F, 2, 3, 13>(p, c48, st, rp);
}

// int4 g128 with bf16 x: the configuration the call runs, from the variant's c (w4_cfg(w4_variant_for(p)),
// resolved once per call: it reads the environment): c itself, or the default's for the shape
W4Cfg w4_g128_cfg(const QGemvArgs& p, const W4Cfg& c) {
  return w4_is_default(c) ? w4_cfg(w4_g128_ring2(p.n, p.k) ? kG128Wide : kG128Mid) : c;
}

// int4 g128 with bf16 x: whether the call runs k_w4i (the variant's or the default's configuration; K % 512 == 0);
// *cfg: that configuration where it does
bool w4i_runs(const QGemvArgs& p, W4Cfg* cfg = nullptr) {
  if (p.fmt != QFormat::int4 || p.group != 128 || p.x_dtype != DType::bf16 || p.m < 1 || p.m > 8) return false;
  if (p.variant == 1 || p.variant == 3 || !applies_cfg<W4Int4<128>, 4>(p)) return false;  // 1 / 3: other kernels
  const W4Cfg c = w4_g128_cfg(p, w4_cfg(w4_variant_for(p)));
  if (cfg) *cfg = c;
  return c.imma != 0;
}

template <class T, class F>
void launch_f(const QGemvArgs& p, cudaStream_t st) {
  W4Cfg c = w4_cfg(w4_variant_for(p));
  constexpr bool kG128 = std::is_same_v<T, bf16> && F::G == 128 && !F::kNvf4;
  if constexpr (!kG128 && kXPairOthers)
    if (w4_is_default(c)) c = w4_cfg(52);
  if constexpr (!kG128)
    if (c.imma) c = w4_cfg(48);  // 63-65: what the other formats and float16 x run under 48
  if constexpr (kG128) {  // 37-39, 48, 51 (their narrow kernel too)
    c = w4_g128_cfg(p, c);  // the default: its shape's configuration
    if (c.imma) {  // 63-66: k_w4i at M <= 8 where K % 512 == 0; elsewhere what 48 runs
      if (!applies_cfg<F, 4>(p)) return launch_k<T, F, 4, 3, 0, true>(p, W4Cfg{}, st);
      if (p.m > 8) return launch_xp<T, F>(p, w4_cfg(48), st);
      if (p.swiglu) return launch_w4i<2, 2, true>(p, c, st);  // gemv_w4i_swiglu_applies
      if (c.imma == 3) return launch_w4i<3, 2>(p, c, st);
      if (c.minb == 3) return launch_w4i<2, 3>(p, c, st);
      return launch_w4i<2, 2>(p, c, st);
    }
    if (c.ord) return launch_s7<T, F, true>(p, c, st);
    if (c.shape) return launch_s7<T, F, false>(p, c, st);
    if (c.skb == 2) {  // 59 / 60: stages of 2 blocks at M = 1, 48's plan and bits
      if (!applies_cfg<F, 4>(p)) return launch_k<T, F, 4, 3, 0, true>(p, W4Cfg{}, st);
      return launch_kb2<T, F>(p, c, st);
    }
    if (c.mode == 14) {  // 61: 48's plan and copies, x as fp16 x 2^e per stage, codes as fp16 (new numerics)
      if (!applies_cfg<F, 4>(p)) return launch_k<T, F, 4, 3, 0, true>(p, W4Cfg{}, st);
      return launch_mode<T, F, 14, 2>(p, c, st);
    }
    if (c.mode == 15) {  // 62: 48 with the next copies issued before the wait, lean copies (48's bits)
      if (!applies_cfg<F, 4>(p)) return launch_k<T, F, 4, 3, 0, true>(p, W4Cfg{}, st);
      return launch_mode<T, F, 15, 2>(p, c, st);
    }
    if (c.mode == 12) {  // 51: 19 with x copied through L1
      if (!applies_cfg<F, 4>(p)) return launch_k<T, F, 4, 3, 0, true>(p, W4Cfg{}, st);
      return launch_mode<T, F, 12, 2>(p, c, st);
    }
    if (c.mode == 11 || c.mode == 13) {  // 48, 52-55, 57, 58: x paired in the ring at M = 1 (M > 1: MODE 0)
      if (!applies_cfg<F, 4>(p)) return launch_k<T, F, 4, 3, 0, true>(p, W4Cfg{}, st);
      return launch_xp<T, F>(p, c, st);
    }
  }
  if (!applies_cfg<F, 4>(p))  // rows of scales / zero points not 16-byte aligned (K % 512 != 0)
    return launch_k<T, F, 4, 3, 0, true>(p, W4Cfg{}, st);
  if (c.xall) return launch_xp<T, F>(p, c, st);  // 52-58: int4 g32 / g64, NVF4 and float16 x too
  if constexpr (std::is_same_v<T, bf16>) {  // the other benchmarking variants: bf16 x only
    if (c.mode == 11 || c.mode == 12 || c.mode == 14 || c.mode == 15 || c.skb == 2) c = W4Cfg{};  // 48, 51, 59-62: g128
    switch (c.mode) {
      case 1: return c.d == 2 ? launch_mode<T, F, 1, 2>(p, c, st) : launch_mode<T, F, 1>(p, c, st);
      case 3: return launch_mode<T, F, 3>(p, c, st);
      case 5: return launch_mode<T, F, 5>(p, c, st);
      case 7: return launch_mode<T, F, 7>(p, c, st);
      case 8: return c.d == 2 ? launch_mode<T, F, 8, 2>(p, c, st) : launch_mode<T, F, 8>(p, c, st);
      case 9: return launch_mode<T, F, 9, 2>(p, c, st);
      default: break;
    }
    if (c.old) return launch_mode<T, F, 0>(p, c, st);
    if (c.minb == 3) return launch_k<T, F, 4, 2, 0, false, 3>(p, c, st);
    if (c.d == 2) return launch_mode<T, F, 0, 2>(p, c, st);
    if (!c.spread) return launch_k<T, F, 4, 3>(p, c, st);
  }
  return launch_mode<T, F, kDefaultMode, kDefaultD>(p, W4Cfg{}, st);
}

}  // namespace

bool w4_staged_applies(const QGemvArgs& p) { return applies_any(p); }

int w4_staged_split(int64_t n, int64_t k) {
  const W4Cfg c;
  const int64_t nst = (k / 128 + c.kb - 1) / c.kb, rb = (n + 15) / 16, want = int64_t(kSMs) * c.wt;
  int64_t w = (want + rb / 2) / rb;
  w = std::min<int64_t>(std::max<int64_t>(w, 1), 8);
  w = std::min<int64_t>(w, std::max<int64_t>(nst / 2, 1));
  if (rb * w * 2 >= want) return 1;
  int64_t sp = (want + rb * w - 1) / (rb * w);
  sp = std::min<int64_t>({sp, 16, std::max<int64_t>(nst / (w * 2), 1)});
  return int(std::max<int64_t>(sp, 1));
}

bool gemv_w4i_swiglu_applies(const QGemvArgs& p) {
  W4Cfg c;
  if (p.n < 2 || p.n % 2 != 0 || p.split > 1 || !w4i_runs(p, &c)) return false;
  return c.imma == 2 && c.minb == 2;
}

int64_t gemv_w4i_workspace(const QGemvArgs& p) {
  if (p.m < 2 || !w4i_runs(p)) return 0;
  return w4i_rec() ? (p.k / 128) * kW4iRec : p.m * p.k * 2 + p.m * (p.k / 128) * 8;
}

template <class T>
void launch_w4_staged(const QGemvArgs& p, cudaStream_t st) {
  if (p.m <= 0 || p.n <= 0) return;
  if (!w4_staged_applies(p)) throw ValueError("gemv: the staged 4-bit kernel does not take these arguments");
  if (p.swiglu && !gemv_w4i_swiglu_applies(p))
    throw ValueError("gemv: the SwiGLU epilogue needs the integer 4-bit kernel without split-K (internal)");
  if (p.fmt == QFormat::nvf4) return launch_f<T, W4Nvf4>(p, st);
  if (p.group == 128) return launch_f<T, W4Int4<128>>(p, st);
  if (p.group == 64) return launch_f<T, W4Int4<64>>(p, st);
  return launch_f<T, W4Int4<32>>(p, st);
}
template void launch_w4_staged<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_w4_staged<f16>(const QGemvArgs&, cudaStream_t);

}  // namespace gk::cuda
