// CUDA attention_decode: the routing among the decode kernels (attention_decode_core.cuh: the CUDA-core
// flash-decoding kernels, variant 1 and the fallback; attention_decode_mma.cu: the tensor-core kernels;
// attention_decode_fold*.cu: the fold kernels, the bf16 / fp16 default).
#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/attention_decode_core.cuh"
#include "cuda/common/attention.cuh"
#include "cuda/common/decode_mma.cuh"
#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("attention_decode");

// The default's routing among the fold kernels (variant 20; all give the same bits). With ngmax = the most groups
// of 8 chunks a sequence of the cache's capacity can have and pairs = B * hkv * head groups:
//  - while pairs * ngmax <= the SM count: the cluster kernel (24) with one group per CTA where all its clusters are
//    resident at once (B = 1, the only batch measured; short capacities: up to ~2048 keys with 8 kv heads), else
//    CTA group units (18). Session 6's
//    final run (docs/device-runs/2026-11-30-h200-s6-final-2.log, graph us, 24 / 18): B1 T384 7.1 / 10.9, T1024
//    7.4 / 11.3; at T4096 only 7 clusters of 16 fit (24 forced: 17.0 / 14.1). End to end (8B int4 / fp8 / 1B, b1,
//    same run) +dec24 against 18: 401.7 / 383.7, 361.6 / 350.1, 1130.1 / 1109.6 tok/s.
//  - else CTA group units (one launch) while pairs * ngmax <= the SM count (about one group per CTA; B = 1 with 8 kv
//    heads at any length). Checkpoint A of session 5 (H200, Hq 32, Hkv 8, D 128, CUDA graphs): B1 T4096 14.0 us
//    against 15.6 for the two-kernel fold, T16384 25.8 / 28.1, T131072 131.4 / 134.2; B4 T4096 48.2 / 32.8.
//  - the pair kernel (one CTA per pair, one launch) when its waves are at least kPairMinEff full and every warp
//    has a group (ngmax >= 8): B16 T4096 67.1 us against 74.3, B32 T8192 248.3 / 258.1, B64 T2048 131.3 / 137.1;
//    B8 T4096 (64 pairs) 48.7 / 44.7.
//  - else, in one wave of the pair clusters of 8-warp CTAs (31; one launch, no workspace) when at least 3/4 of
//    their warps have a group (ngmax 8 or 12-16) and there are at least 3 groups per SM (pairs x ngmax >= 3 x SMs),
//    that kernel: session 5's final run (docs/device-runs/2026-11-30-h200-s5-final-2.log, plan 12, graph us) had B4
//    T4096 25.3 against 32.1 for 23, B8 36.4 / 43.5 (B16 70.4 / 72.3, 28 66.6). Two waves (B9-B14) and fewer groups
//    (B2, B3) were not measured: 23 there, as before.
//  - else the two-kernel fold with L2 evict-first K / V loads (23; head_dim 256 always): 0.6-3.4 % faster than
//    without (19) at every shape of that run.
constexpr double kPairMinEff = 0.9;
// Route bits (session 7): auto's refinements of the list above, all giving the same bits. The bits in force are
// kRouteDefault, or GPUKIT_DECODE_ROUTE (an integer read at each call, so at capture time under a graph) when that
// is set: it REPLACES the default (GPUKIT_DECODE_ROUTE=0 is session 6's final routing; benches compare both).
// Figures: session 7's checkpoint A (/work/wt/device-results/s7A/2/plan_{1,2,3}_bench.log, H200, Hq 32, Hkv 8,
// D 128, CUDA graph us):
//  1 (default): the pair clusters (31) with >= 2 groups per SM instead of 3: B3 T4096 25.2 against 23's 26.9
//    (B2 T4096, 256 groups, stays on 23: 21.4 against 31's 25.1).
//  2 / 4 / 32: two waves of the pair clusters' CTAs (SMs < pairs x CTAs per pair <= 2 x SMs, >= 3/4 of 31's
//    warps with a group; B9-B14 at 4096 keys) to the pair kernel 28 (2), to 31 (4), or (32, default) to 28 while
//    the second wave of 31's CTAs is at most 1/4 full, else 31: B10 28 58.8 / 31 60.2 / 23 61.0, B12 60.9 / 60.0 /
//    61.4, B14 64.3 / 63.0 / 67.7. 2 wins over 4, 4 over 32.
//  8 (default): the cluster kernel with one group per CTA (24) first at B = 2..8 too, where all its clusters are
//    resident (short capacities): B2 T384 7.4 against 18's 11.0, B2 T1024 8.9 / 11.8, B4 T384 7.9 / 11.4, B8
//    T384 8.9 / 12.4 (B4 T1024, B8 T1024: not all resident, see 64).
//  16 (default): at B = 1 where 24's clusters do not all fit and the capacity is at most 4096 keys, the cluster
//    kernel of 4-warp CTAs (33) where all its clusters are resident: B1 T4096 13.1 against 18's 14.1; it loses on
//    longer caches (T16384 30.1 / 25.7, T131072 189 / 129: not taken there). Launched without PDL (A: 12.9 us
//    with PDL off; see go_cl in attention_decode_fold_cl.cu).
//  64 (off since the final run): the CTA group units (18) instead of 23 in two waves of them (SMs < pairs x ngmax
//    <= 2 x SMs) when the sequences have fewer than 8 groups (no 28 / 31 candidate): B8 T1024 18 23.5, 23 (auto)
//    24.6-25.1; but B16 T512 24.1 against 23's 20.7 (session 7 final run, plan 10). 512 covers both shapes.
//  128 (candidate, off): the same at >= 8 groups too (B2 T4096: 256 groups; 18 never measured there).
//  256 (candidate, off): 18's cross-CTA merge with one fence per CTA (thread 0, after the barrier) instead of a
//    __threadfence in every thread, as cooperative groups' grid sync does (same arithmetic: the same bits).
//  512 (default since the final run): B >= 2 in two waves of CTA group units (SMs < pairs x ngmax <= 2 x SMs):
//    the counter-merged 4-warp CTA groups (34, two CTAs per SM: one wave of <= 264 CTAs, each with 18's per-CTA
//    work at B1). Session 7's final run (docs/device-runs/2026-11-30-h200-s7-final-2.log, plan 9, graph us):
//    B2 T4096 34 21.2 / 23 21.7; B8 T1024 34 19.7 / 18 23.7 / 23 25.4; B6 T1024 34 18.3 / 18 22.7 (SDPA 15.0,
//    15.5, 13.2). B16 T512 (the same 256 CTAs) measured with 28 18.3 / 23 20.6 only.
//  1024 (candidate, off): B >= 2 in three waves of CTA group units (2 x SMs < pairs x ngmax <= 3 x SMs): 36, 34 with
//    2 stages per warp (head_dim 64: 3), CTAs of 72 KB, three per SM: one wave (B3 T4096: 384 CTAs; 31 25.2 us,
//    SDPA 19.0).
//  2048 (candidate, off; session 8 prep): auto's 18 / 35 as 37 where it runs (units <= SMs, <= 16 groups per
//    sequence): 18 merged without fence or completion counter (attention_decode_ll.cuh: tickets at the start, the
//    last CTA to start polls tagged partials). Same bits. For B1 T4096 / T16384 (18 14.0 / 25.8 us with its merge,
//    9.4 / 21.1 without). Not measured. Bit 16's 33 stays first (B1, capacity <= 4096).
//  4096 (candidate, off; session 8 prep): bit 512's shapes (B >= 2, two waves of CTA group units) to 38 first: 34
//    with 37's merge. B2 T4096, B6 / B8 T1024: 34 21.2 / 18.3 / 19.7 us, SDPA 15.0 / 13.2 / 15.5. Default since
//    session 8's checkpoint A (graph us, 34 -> 38: B2 T4096 21.1 -> 20.6, B6 T1024 18.3 -> 17.8, B8 T1024 19.6 ->
//    19.0, B16 T512 19.4 -> 18.6; SDPA 14.9 / 13.3 / 15.3 / 11.9). Bit 2048 stays off: 37 was not faster than 18
//    (B1 T16384 26.7 against 25.9, T131072 131.8 / 131.6, B4 T1024 13.4 / 13.4).
//  8192 (candidate, off; session 8): B >= 2 with 2..16 groups per sequence in at most two waves of CTA group units
//    (pairs x ngmax <= 2 x SMs: B4 T1024 (18 now), B6 / B8 T1024 and B16 T512 (38 now)): the cluster kernel with
//    two groups per CTA (25: 8-warp CTAs, one per SM, clusters of ngmax / 2 CTAs; B16 T512: clusters of one, i.e.
//    one CTA per (sequence, kv head), both groups in it) where all its clusters are resident at once. No workspace
//    and no cross-CTA merge in global memory: the groups fold through (distributed) shared memory. Why: the
//    global-memory merge is what the same CTAs pay over the cluster merge: B1 T4096 34 16.2 us against 33's 13.0
//    (session 7 final run, the same 4-warp CTAs), B2 T1024 18 11.8 / 24 8.9, B8 T384 12.4 / 8.9 (s7 A); 38's
//    tagged merge took back only 0.5-0.8 us of it (s8 A). Where bit 8's 24 fits, 24 stays first. Not measured.
//  16384 (candidate, off; session 8): the same shapes to 33 (4-warp CTAs, one group each, two per SM; clusters
//    of the power of two >= ngmax) where all its clusters are resident, launched without PDL (as bit 16's). Before
//    8192's 25 when both are set.
//  Both default since session 8's final run (graph us; 4665 / 4665 | 8192 / 4665 | 16384; SDPA): B4 T1024 13.4 /
//    12.8 / 12.1 (11.6), B6 T1024 17.6 / 15.1 / 13.6 (12.8), B8 T1024 18.9 / 15.7 / 18.9 (33's 64 clusters do not
//    all fit: 38) (14.9), B16 T512 18.6 / 16.2 / 16.2 (11.9). With both, 33 first where it fits, else 25.
//  32768 (candidate, off; session 9 prep): auto's 28 where it replaces two waves of 31's CTAs (bits 2 / 32: B9,
//    B10 at 4096 keys, Hkv 8) launched without PDL. Session 8 (verify run, plan 8, graph us): GPUKIT_DECODE_PDL=0
//    (global) took B10 T4096 from 57.4 to 49.1 (SDPA 46.1) but B1 / B3 lose with it and B12 / B14 (31) do not
//    change. Likely cause (not measured): 28's grid is 80 one-CTA-per-SM CTAs on 132 SMs; with PDL the next call's
//    grid is launched as soon as this one starts, its CTAs land on the 52 idle SMs and the rest on the SMs this
//    grid frees first, so the CTA -> SM map of each grid is the previous grid's leftovers, not the block
//    scheduler's spread of a fresh launch: GPCs (their crossbar ports) carry uneven shares of a grid that streams
//    ~2 MB per CTA. Grids that fill every SM (31 at B12 / B14: 192-224 CTAs; 28 at B16: 128) leave nothing to
//    take. 28 chosen by kPairMinEff (B16 T4096, 128 of 132 SMs) keeps PDL. The same kernel: the same bits.
//    With bit 2 as well (ROUTE 29243 | 32768): every two-wave shape of 31 (B9-B14) to 28 without PDL. With PDL, 28
//    and 31 tied at B12 / B14 (s7: 60.9 / 60.0, 64.3 / 63.0); if 28's PDL loss at B10 (8 us of 57) is there too,
//    28 without PDL is ~50 / ~57 us (B10's 42 GB/s per SM, 96 / 112 SMs), SDPA 51.1 / 57.2. Not measured.
//  65536 (candidate, off; session 9 prep): bit 16384's 33 at B >= 2 launched with PDL (bit 16's B1 33 stays
//    without). Session 8's final run (plan 5, forced 33 graph us, PDL on / off): B16 T512 15.6 / 16.2, B6 T1024
//    13.9 / 13.6, B4 T1024 12.2 / 12.2 (B16 T512: 256 CTAs, 2 per SM, every slot taken; B6: 192 of 264).
// Session 9 checkpoint A (docs/device-runs/2026-11-30-h200-s9-ckptA-2.log plans 1-2, graph us, 29241 -> 62011):
// B10 T4096 58.6 -> 49.7, B12 60.2 -> 56.7, B14 62.7 -> 61.9, B16 65.6 -> 65.7: bits 2 and 32768 are on. 65536
// stays off: B16 T512 16.1 -> 15.5 but B6 T1024 13.6 -> 13.9 (the rule allowed 0.2 us).
//  131072 (candidate, off; session 9, decattn12): B >= 2 with 2-16 groups per sequence in at most three waves of CTA
//    group units (B2 / B3 T4096) to 39 (attention_decode_fold_c2.cu: 33's 4-warp CTAs with two groups each, clusters
//    of 8 on 4 SMs at 16 groups) where all its clusters are resident; after 33 / 25 (bits 16384 / 8192), before 38 /
//    31. 262144: 39 of bit 131072 launched without PDL. docs/notes/decattn-s9.md.
constexpr int kRouteDefault = 1 | 2 | 8 | 16 | 32 | 512 | 4096 | 8192 | 16384 | 32768;  // 62011
static int decode_route() {
  const char* e = std::getenv("GPUKIT_DECODE_ROUTE");
  return e && *e ? std::atoi(e) : kRouteDefault;
}
// Whether variant 0 (no GPUKIT_DECODE_SPLIT) runs the fold kernels (else attention_decode_mma.cu).
constexpr bool kFoldDefault = true;

void attention_decode(const DecodeArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  if (!aligned16(a.kc) || !aligned16(a.vc)) throw ValueError("k_cache, v_cache: must be 16-byte aligned");
  if (a.chunk_min < 32 || a.chunk_min % 32 || a.chunk_max < a.chunk_min || a.chunk_max > 4096 || a.target_splits < 1)
    throw ValueError("attention_decode: bad split parameters");
  // bf16 / fp16: the tensor-core kernels. The fold kernels (attention_decode_fold*.cu; the same bits
  // whichever runs): variant 20 (auto, the default): CTA group units (18), the pair kernel (28), the pair clusters
  // of 8-warp CTAs (31) or the two-kernel fold with evict-first (23), see kPairMinEff. 18: CTA group units in one
  // launch (counters, last CTA folds); 19: chunk or warp group units plus the merge kernel (two launches), 23: 19
  // with L2 evict-first K / V loads, 14 / 15 force chunk / group units (+ merge kernel), 17: 19 without the merge
  // (timing only), 21: warp group units merged in the kernel by the last warp (one launch; slow), 22: 21 with
  // evict-first, 26: 19 with the warps of a CTA on consecutive units (the kv heads of one chunk or group), 27: 26
  // with evict-first.
  // 24: one thread-block cluster per (sequence, kv head, head group), merged through distributed shared memory
  // (one launch; 25: two groups per CTA in clusters half as large): slower than 18 at A (only 7 clusters of 16
  // were resident on the H200: B1 T131072 167 us against 131), not used by auto. 28: one CTA per (sequence, kv
  // head, head group), its warps on group units, the groups folded through shared memory (one launch); 29: 28
  // with L2 evict-first K / V loads. 30 / 31: the pair kernel over a thread-block cluster, one warp per group (CTAs
  // of 4 / 8 warps), the groups folded through distributed shared memory, evict-first (one launch; for mid-size
  // batches, e.g. B4-B8 T4096 where 28 fills 32-64 of the SMs; 31 is auto's choice there); 32: 30 with twice the
  // stage ring (one CTA per SM). 33: 24 with CTAs of 4 warps (two chunks per warp, 112 KB: two CTAs per SM, so
  // clusters of 16 CTAs need 8 SMs of a GPC and B = 1 with 8 kv heads is one wave; session 6's A: 14 clusters of 16
  // resident, B1 T4096 12.9 us against 14.0 for 18). 34: one CTA of 4 warps per group (two chunks per warp, two
  // CTAs per SM), no cluster: the groups merged as 18 does (workspace, counter, the last CTA folds). 35: 18 with
  // one fence per CTA in its merge. 36: 34 with 2 stages per warp (head_dim 64: 3), three CTAs per SM. 37: 18
  // whose merge polls tagged partials instead of fence + counter (attention_decode_ll.cuh; where it does not run:
  // 18). 38: 34 with 37's merge (where it does not run: 34). 39: 33's CTAs with two groups each (clusters half as
  // large; attention_decode_fold_c2.cu). Route bits: kRouteDefault.
  // attention_decode_mma.cu: variants 2-13 and 16 (16: its default). Variant 0 is kFoldDefault ? 20 : 16.
  // Variant 1 forces the CUDA-core kernel below.
  int v = a.variant == 0 ? (kFoldDefault ? 20 : 16) : a.variant;
  const int64_t pairs = int64_t(a.B) * a.hkv * ((a.hq / a.hkv + 7) / 8);
  bool cl_first = false;  // auto: the cluster kernel with one group per CTA first, where all its clusters fit
  bool cl4_first = false;  // auto (bit 16): 33 where all its clusters fit
  bool cta4_first = false;  // auto (bit 512): 34 where it runs
  bool cta4s_first = false;  // auto (bit 1024): 36 where it runs
  bool ll_first = false;  // auto (bit 2048): 37 where it runs
  bool ll4_first = false;  // auto (bit 4096): 38 where 34 would run
  bool cl2_first = false;  // auto (bit 8192): 25 where all its clusters are resident
  bool cl4b_first = false;  // auto (bit 16384): 33 at B >= 2 where all its clusters are resident
  bool pair_nopdl = false;  // auto (bit 32768): 28 chosen for two waves of 31's CTAs, launched without PDL
  bool cl4b_pdl = false;  // auto (bit 65536): bit 16384's 33 launched with PDL
  bool c2_first = false;  // auto (bit 131072): 39 where all its clusters are resident
  bool c2_nopdl = false;  // auto (bit 262144): bit 131072's 39 launched without PDL
  int route = -1;  // (auto: the route bits in force, logged)
  if (v == 20) {  // auto (see kPairMinEff, kRouteDefault)
    route = decode_route();
    const int64_t ngmax = (int64_t(a.nsplit) + 7) / 8, sms = dmma::sm_count();
    const int64_t waves = (pairs + sms - 1) / sms;
    // 31: cs CTAs of 8 warps per pair (one warp per group)
    const int64_t cs = ngmax <= 8 ? 1 : 2;
    const bool fill = ngmax >= 8 && ngmax <= 16 && 4 * ngmax >= 3 * 8 * cs;  // >= 3/4 of 31's warps have a group
    const bool pcl = fill && pairs * cs <= sms && pairs * ngmax >= ((route & 1) ? 2 : 3) * sms;
    const bool wave2 = fill && pairs * cs > sms && pairs * cs <= 2 * sms;  // two waves of 31's CTAs
    const bool wave2_28 = (route & 2) || (!(route & 4) && (route & 32) && 4 * (pairs * cs - sms) <= sms);
    const bool cta2 = pairs * ngmax > sms && pairs * ngmax <= 2 * sms;  // two waves of CTA group units
    const bool pfull = ngmax >= 8 && ngmax <= 16 && double(pairs) >= kPairMinEff * double(waves * sms);
    v = pairs * ngmax <= sms                                                             ? 18
        : pfull                                                                           ? 28
        : pcl                                                                             ? 31
        : wave2 && wave2_28                                                               ? 28
        : wave2 && (route & (4 | 32))                                                     ? 31
        : cta2 && (ngmax < 8 ? (route & 64) : (route & 128))                              ? 18
                                                                                          : 23;
    cl_first = a.B == 1 ? pairs * ngmax <= sms : (route & 8) && a.B <= 8;
    cl4_first = (route & 16) && a.B == 1 && pairs * ngmax <= sms && a.capacity <= 4096;
    cta4_first = (route & 512) && a.B >= 2 && cta2;
    cta4s_first = (route & 1024) && a.B >= 2 && pairs * ngmax > 2 * sms && pairs * ngmax <= 3 * sms;
    if (v == 18 && (route & 256)) v = 35;  // 18 with one fence per CTA (same kernel, same bits)
    ll_first = (v == 18 || v == 35) && (route & 2048);  // 37 where it runs (else 18 / 35 as chosen)
    ll4_first = (route & 4096) && a.B >= 2 && cta2;
    const bool short2 = a.B >= 2 && ngmax >= 2 && ngmax <= 16 && pairs * ngmax <= 2 * sms;
    cl2_first = (route & 8192) && short2;
    cl4b_first = (route & 16384) && short2;
    pair_nopdl = (route & 32768) && v == 28 && !pfull;  // 28 in place of two waves of 31's CTAs (B9, B10)
    cl4b_pdl = (route & 65536) != 0;
    c2_first = (route & 131072) && a.B >= 2 && ngmax >= 2 && ngmax <= 16 && pairs * ngmax <= 3 * sms;
    c2_nopdl = (route & 262144) != 0;
  }
  const char* path = nullptr;
  if (cl_first && attention_decode_fold_cl(a, st, 3)) {
    path = "cluster, one group per CTA (24)";
  } else if (cl4_first && attention_decode_fold_cl(a, st, 5)) {
    path = "cluster of 4-warp CTAs (33)";
  } else if (cl4b_first && attention_decode_fold_cl(a, st, cl4b_pdl ? 10 : 5)) {
    path = cl4b_pdl ? "cluster of 4-warp CTAs (33), PDL" : "cluster of 4-warp CTAs (33)";
  } else if (cl2_first && attention_decode_fold_cl(a, st, 9)) {
    path = "cluster, two groups per CTA (25)";
  } else if ((c2_first && attention_decode_fold_c2(a, st, true, !c2_nopdl)) ||
             (v == 39 && attention_decode_fold_c2(a, st, false, true))) {
    path = c2_first && c2_nopdl ? "cluster of 4-warp CTAs, two groups per CTA (39), no PDL"
                                : "cluster of 4-warp CTAs, two groups per CTA (39)";
  } else if ((ll4_first || v == 38) && attention_decode_fold_cl(a, st, 8)) {
    path = "4-warp CTA groups, tagged merge (38)";
  } else if ((cta4_first || v == 34 || v == 38) && attention_decode_fold_cl(a, st, 6)) {
    path = "counter-merged 4-warp CTA groups (34)";
  } else if ((cta4s_first || v == 36) && attention_decode_fold_cl(a, st, 7)) {
    path = "counter-merged 4-warp CTA groups, 2 stages (36)";
  } else if (v == 33 && attention_decode_fold_cl(a, st, 4)) {
    path = "cluster of 4-warp CTAs (33)";
  } else if ((v == 24 || v == 25) && attention_decode_fold_cl(a, st, v == 24 ? 1 : 2)) {
    path = "cluster (24)";
  } else if ((v == 28 || v == 29) && attention_decode_fold_pair(a, st, v == 29, !pair_nopdl)) {
    path = v == 29 ? "pair CTAs, evict-first (29)" : pair_nopdl ? "pair CTAs (28), no PDL" : "pair CTAs (28)";
  } else if (v >= 30 && v <= 32 && attention_decode_fold_pcl(a, st, v == 31 ? 8 : 4, v == 32)) {
    path = v == 30 ? "pair clusters, 4 warps per CTA (30)"
           : v == 31 ? "pair clusters, 8 warps per CTA (31)" : "pair clusters, 4 warps per CTA, deep ring (32)";
  } else if ((v == 37 || ll_first) && attention_decode_fold_cta_ll(a, st)) {
    path = "cta, tagged merge (37)";
  } else if ((v == 18 || v == 35 || v == 37) && attention_decode_fold_cta(a, st, v == 35)) {
    path = v == 35 ? "cta, one fence per CTA (35)" : "cta (18)";  // (37 where it does not run: 18)
  } else if (v >= 14 && v <= 39 && v != 16) {
    // (18, 24, 25, 28-39 when not covered: 23, as the default would)
    const int force = v == 14 ? 1 : v == 15 ? 2 : v == 17 ? 3 : v == 21 ? 4 : v == 22 ? 4 | 8 : v == 19 ? 0
                      : v == 26 ? 16 : v == 27 ? 16 | 8 : 8;
    if (attention_decode_fold(a, st, force)) path = force & 8 ? "fold + merge kernel, evict-first (23)"
                                                              : "fold + merge kernel (19)";
  } else if (v != 1 && attention_decode_mma(a, st)) {
    path = "mma (16)";
  }
  if (const char* e = std::getenv("GPUKIT_DECODE_LOG"); e && *e && std::strcmp(e, "0") != 0) {
    char rb[32] = "";
    if (route >= 0) std::snprintf(rb, sizeof rb, " route %d", route);
    std::fprintf(stderr, "attention_decode: B=%d hq=%d hkv=%d D=%d capacity=%lld variant %d%s: %s\n", a.B, a.hq,
                 a.hkv, a.D, static_cast<long long>(a.capacity), v, rb, path ? path : "cuda-core (1)");
  }
  if (path) return;
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    auto go = [&](auto c) {
      using C = decltype(c);
      switch (a.D) {
        case 64: return launch_g<T, C, 64>(a, st);
        case 128: return launch_g<T, C, 128>(a, st);
        case 256: return launch_g<T, C, 256>(a, st);
        default: throw ValueError("q: head_dim must be 64, 128 or 256");
      }
    };
    if (a.cache_dtype == DType::f8e4m3) go(f8e4m3{});
    else go(T{});
  });
}

}  // namespace gk::cuda
