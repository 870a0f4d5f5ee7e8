// Building blocks of the one-launch cluster sampling kernel (src/cuda/sampling_fused.cu):
// per-CTA shared state, block reductions with fixed trees, branch-free weights, and the
// 8-bit radix select whose per-group integer histograms are summed over the thread-block
// cluster through distributed shared memory (Hopper, sm_90+). The slice loads and the
// history / ban marks: src/cuda/common/sampling_fused_load.cuh.
#pragma once
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "cuda/common/block_reduce.cuh"
#include "ops/sampling_args.h"
#include "cuda/common/sampling_weight.cuh"

namespace gk::cuda::fused {
namespace cg = cooperative_groups;

constexpr int kBins = 256, kU = 4, kMaxCL = 16;
constexpr int kCntMask = 0x3fffffff, kBan = 0x40000000;
// Mass selects with early stops carry min(count, 2) of the weighted entries of each CTA bin in
// bits 58-63 of its mass word (row masses stay below 2^58 while V < 2^18; summed over at most
// 16 CTAs the counts stay below 64).
constexpr int kCntShift = 58;
constexpr unsigned long long kMassMask = (1ull << kCntShift) - 1;
constexpr int kMaxE = 63;  // 64 threads x 63 entries x 2^20 < 2^32: a group's 32-bit words cannot overflow
constexpr int kMaxDyn = 160 * 1024;          // slice bytes in shared memory
constexpr double kLn2x40 = 27.725887222397812377;  // 40 ln 2

struct FGeo {
  int64_t S;    // slice entries per CTA (multiple of 8)
  int E;        // contiguous entries per thread in the on-chip passes (odd: no bank conflicts)
  int CL;       // cluster size = CTAs per row
  int aligned;  // 16-byte vector loads allowed
  int early;    // radix select stops at a level whose picked bin is kept whole: 1 (default)
  int stop;     // development probe: 0 full; 1/2/3 return the argmax after load / max exchange / selects
  int cache;    // a second slice array holds each entry's relative exp from the first mass level
  int compact;  // levels > 0: each lane's selected entries from a bit mask, one per round
  int qsel;     // top-p select on linear keys (QMap) instead of float keys
  int rot;      // load pass: lanes take their G entries in rotated order (no bank conflicts)
  int cmask;    // compacted levels >= 2 test only the entries the previous level selected
  int tmask;    // kept masses (no exp cache): the smaller of the kept / dropped sets, compacted
  int pipe;     // load pass: the next batch's loads issued while this batch is processed
};

// ---------------------------------------------------------------- linear keys of the mass select
// The float order key spends most of its top bits on exponents: level 0 puts a flat row's
// entries into a handful of bins (atomic contention) and its threshold bin holds a tenth of
// the row (a dense level 1). The mass select may run its levels on a key LINEAR in the
// distance to the max instead: q(s) = floor(fsub_rn(m, s) 2^k), 2^k chosen from the row's
// live span (m - max(min, m - 28)) so that q < 2^32, qkey = ~q (larger s: larger qkey).
// q is monotone in s (rounding is monotone), so every qkey bin is an interval of s: the
// levels find the qkey group where the target falls. q may map distinct s to one value
// (fsub rounding): a group kept partly is then resolved on the float keys of its members.
// Every CTA derives the same (m, 2^k) from the cluster's max and min: partition-independent.
struct QMap {  // (no initializers: a member of the shared Sh)
  float m, scale;
  int on;
};
__device__ __forceinline__ uint32_t qkey(float s, const QMap& q) {
  // s = -inf or far below the live range: the product saturates (weight 0 there anyway)
  const float v = smp::fmul_rn(smp::fsub_rn(q.m, s), q.scale);
  return ~__float2uint_rz(v);
}
// The window of a row from its max and the smallest finite processed logit.
__device__ __forceinline__ QMap make_qmap(float m, float mn) {
  QMap q{m, 0.f, 0};
  float span = smp::fsub_rn(m, mn);
  if (!(span <= 28.f)) span = 28.f;  // beyond: weight 0
  const int e = int((__float_as_uint(span) >> 23) & 0xffu) - 127;  // span in [2^e, 2^(e+1))
  if (!(span >= 0x1p-90f)) return q;  // (almost) all equal: the float keys
  const int k = 31 - e;               // x <= span < 2^(e+1): x 2^k < 2^32
  q.scale = __uint_as_float(uint32_t(127 + k) << 23);
  q.on = 1;
  return q;
}
// Which entries a finished select keeps: key >= kk (top-k), and for top-p either key >= kp
// (float keys) or qkey > qt, or qkey == qt with key >= kq (linear keys; kq = 0: the group whole).
struct Keep {
  uint32_t kk, kp, qt, kq;
  int qon;
  QMap q;
  __device__ __forceinline__ bool operator()(float s) const {
    const uint32_t key = smp::order_key(s);
    if (key < kk) return false;
    if (!qon) return key >= kp;
    const uint32_t qk = qkey(s, q);
    return qk > qt || (qk == qt && key >= kq);
  }
};

template <int NT>
struct Sh {
  // histogram copies: lane l of every warp adds into copy l % kHG (64 threads per copy, as the
  // overflow bound needs), so lanes of one warp collide on an address only within a class of
  // 32 / kHG lanes; rows padded by one word so a bin's copies sit in different banks
  static constexpr int kW = NT / 32, kHG = NT / 64, kHS = kBins + 1;
  unsigned int hi[kHG][kHS], lo[kHG][kHS];  // mass >> 20 and mass & (2^20 - 1)
  unsigned int cnt[kBins];                     // entries per bin (mass selects: weighted entries)
  unsigned long long chist[2][kBins];          // CTA histogram, read by the cluster (double-buffered)
  unsigned long long part[NT / kBins][kBins];  // partial cluster sums of the bins
  unsigned long long u[kW];
  float fv[kW];
  int fi[kW];
  // cluster exchange slots (read by the other CTAs) and their merged values
  float xm, xmn;  // (xmn: the smallest finite processed logit)
  int xi;
  unsigned long long xw, xz;
  float gm, gmn;
  int gam;
  unsigned long long gW, gpre, gZ;
  unsigned long long ptarget, pkept;
  // linear-key levels >= 1: min / max float key of the weighted candidates (double-buffered as
  // chist; reset by level_pick), and their cluster merge: equal = one float key, kept whole
  unsigned int lmn[2], lmx[2], gkmn, gkmx;
  QMap qm;    // the row's linear keys (uniform; written by thread 0)
  Keep keep;  // the kept set of the selects (uniform; written by thread 0)
  int pick, pexit;
};

using blk::better;

template <int NT>
__device__ __forceinline__ void block_argmax(Sh<NT>& sh, float& v, int& i) {
  blk::argmax<NT / 32>(sh.fv, sh.fi, v, i);
}
template <int NT>
__device__ __forceinline__ unsigned long long block_sum(Sh<NT>& sh, unsigned long long v) {
  return blk::sum_u64<NT / 32>(sh.u, v);
}
// Exclusive prefix over the threads in thread order; *total gets the block sum.
template <int NT>
__device__ __forceinline__ unsigned long long block_scan(Sh<NT>& sh, unsigned long long v,
                                                         unsigned long long* total) {
  return blk::excl_scan_u64<NT / 32>(sh.u, v, total);
}

// floor(det_exp(s - m) 2^40) without branches (unrolled loops interleave several entries).
// Below s - m = -28 the weight is 0 for certain (exp(-28) < 2^-40 by far; det_exp is within
// ulps of exp), so the result is discarded there. *e gets the relative exp (0 there).
// s <= m always (m is the row max). live_weight: no conversion instructions, the same bits.
__device__ __forceinline__ unsigned long long weight_nb(float s, float m, float* e = nullptr) {
  const float d = smp::fsub_rn(s, m);
  const bool live = d >= -28.f;
  float ev;
  const unsigned long long w = smp::live_weight(live ? d : -28.f, &ev);
  if (e) *e = live ? ev : 0.f;
  return live ? w : 0ull;
}
// The weight of a cached relative exp (0 for entries below the live range).
__device__ __forceinline__ unsigned long long weight_of_e(float e) {
  return smp::floor_u64_of(smp::fmul_rn(e, smp::kWeightScale));
}
__device__ __forceinline__ float val(const uint32_t* v, int i) { return __uint_as_float(v[i]); }

// ---------------------------------------------------------------- radix select
// Per-lane flush of a run (cur bin, mass cv, entries cc) into the group's histogram.
// cnt: count the entries too (deeper levels only: at level 0 every lane would hit the same
// 256 words; the early stop needs the counts of the picked bin from level 1 on).
template <int NT, bool kMass>
__device__ __forceinline__ void hflush(Sh<NT>& sh, int w, int d, unsigned long long v, unsigned c, bool cnt) {
  const unsigned h = unsigned(v >> 20);
  if (h) atomicAdd(&sh.hi[w][d], h);
  atomicAdd(&sh.lo[w][d], unsigned(v & 0xfffffu));
  if (kMass && cnt) atomicAdd(&sh.cnt[d], c);
}

// One level's histogram of this CTA's entries (key >= lowkey, matching the prefix). The
// thread's E contiguous entries go 4 at a time (E is the same for every thread, so the warp
// votes are uniform): the weights of a group are computed without branches, and only when
// some lane of the warp needs one. z: also sum every entry's weight (logprob normalizer).
// Each lane keeps a run (bin, mass, count) and flushes it when the bin changes (a warp-
// aggregated flush, match_any + redux, measured ~2x slower on the H200).
// ec (mass selects, when the slice has room): level 0 stores each computed relative exp,
// the deeper levels read it instead of computing it again.
// QM: 0 float keys; 1 linear keys (qkey); 2 float keys of the entries whose qkey is qsel.
template <int NT, bool kMass, int QM = 0>
__device__ __forceinline__ void level_pass(Sh<NT>& sh, const uint32_t* vals, int i0, int E, int n, float m,
                                           uint32_t lowkey, int L, uint32_t prefix, unsigned long long* z, float* ec,
                                           bool compact, const QMap& qm = QMap{0.f, 0.f, 0}, uint32_t qsel = 0,
                                           unsigned long long* cmask = nullptr, int kb = 0,
                                           unsigned long long* ts = nullptr) {
  const int w = threadIdx.x & (Sh<NT>::kHG - 1);  // histogram copy (zeroed by the previous level's merge)
  const int sh_ = 24 - 8 * L;
  int cur = -1;
  unsigned long long cv = 0, zl = 0, tl = 0;
  unsigned cc = 0;
  if (compact && L > 0 && !z) {
    // the deeper levels select few entries: each lane marks its selected entries in a mask
    // (E <= 63) and the warp takes one per lane per round, in index order (the same runs),
    // so the weights cost max-over-lanes rounds instead of E
    // (from level 2 on, only the entries the previous level selected: a subset)
    auto test = [&](int j) {
      const int idx = i0 + j;
      const float sv = idx < n ? val(vals, idx) : -INFINITY;
      const uint32_t key = smp::order_key(sv);
      const uint32_t dk = QM == 1 ? qkey(sv, qm) : key;
      return idx < n && key >= lowkey && (dk >> (sh_ + 8)) == prefix && (QM != 2 || qkey(sv, qm) == qsel);
    };
    unsigned long long msk = 0;
    if (cmask && L >= 2) {
      for (unsigned long long pm = *cmask; pm; pm &= pm - 1) {
        const int j = __ffsll(static_cast<long long>(pm)) - 1;
        if (test(j)) msk |= 1ull << j;
      }
    } else {
      for (int j = 0; j < E; ++j)
        if (test(j)) msk |= 1ull << j;
    }
    if (cmask) *cmask = msk;
    uint32_t kmn = 0xffffffffu, kmx = 0u;  // linear keys: the float keys of the weighted candidates
    while (__any_sync(0xffffffffu, msk != 0)) {
      bool has = false;
      int d = 0;
      unsigned long long v = 0;
      if (msk) {
        const int idx = i0 + __ffsll(static_cast<long long>(msk)) - 1;
        msk &= msk - 1;
        const float sv = val(vals, idx);
        v = !kMass ? 1ull : (ec ? weight_of_e(ec[idx]) : weight_nb(sv, m));
        has = v != 0;
        d = int(((QM == 1 ? qkey(sv, qm) : smp::order_key(sv)) >> sh_) & 255u);
        if (QM == 1 && has) {
          const uint32_t fk = smp::order_key(sv);
          kmn = fk < kmn ? fk : kmn, kmx = fk > kmx ? fk : kmx;
        }
      }
      if (has && d != cur && cur >= 0) hflush<NT, kMass>(sh, w, cur, cv, cc, QM == 1 || L > 0);
      if (has) {
        if (d != cur) cur = d, cv = 0, cc = 0;
        cv += v;
        ++cc;
      }
    }
    if (cur >= 0) hflush<NT, kMass>(sh, w, cur, cv, cc, QM == 1 || L > 0);
    if (QM == 1) {  // CTA min / max (integer atomics: order-free), merged over the cluster by level_pick
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const uint32_t a = __shfl_xor_sync(0xffffffffu, kmn, o), b = __shfl_xor_sync(0xffffffffu, kmx, o);
        kmn = a < kmn ? a : kmn, kmx = b > kmx ? b : kmx;
      }
      if ((threadIdx.x & 31) == 0 && kmn <= kmx) atomicMin(&sh.lmn[kb], kmn), atomicMax(&sh.lmx[kb], kmx);
    }
    return;
  }
  for (int j = 0; j < E; j += 4) {
    float sv[4];
    uint32_t key[4];
    bool sel[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int idx = i0 + j + u;
      const bool valid = j + u < E && idx < n;
      sv[u] = valid ? val(vals, idx) : -INFINITY;
      const uint32_t fk = smp::order_key(sv[u]);
      key[u] = QM == 1 ? qkey(sv[u], qm) : fk;
      sel[u] = valid && fk >= lowkey && (L == 0 || (key[u] >> (sh_ + 8)) == prefix) &&
               (QM != 2 || qkey(sv[u], qm) == qsel);
    }
    unsigned long long v[4] = {1ull, 1ull, 1ull, 1ull};
    if (kMass && ec && L > 0) {
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = sel[u] ? weight_of_e(ec[i0 + j + u]) : 0ull;
    } else if (kMass || z) {
      // every entry needed (the normalizer, or a dense group): the 4 weights without branches,
      // interleaved; otherwise entry by entry, only where some lane of the warp selected it
      // (sparse candidates at the deeper levels: no exps for the others)
      float ev[4];
      if (z || __all_sync(0xffffffffu, sel[0] && sel[1] && sel[2] && sel[3])) {
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = weight_nb(sv[u], m, &ev[u]);  // invalid entries (-inf) weigh 0
        if (kMass && ec)
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (j + u < E && i0 + j + u < n) ec[i0 + j + u] = ev[u];
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          v[u] = 0ull;
          if (__any_sync(0xffffffffu, sel[u])) {
            v[u] = weight_nb(sv[u], m, &ev[u]);
            if (kMass && ec && j + u < E && i0 + j + u < n) ec[i0 + j + u] = ev[u];
          }
        }
      }
      if (z)
#pragma unroll
        for (int u = 0; u < 4; ++u) zl += v[u];
      if (kMass && ts)  // this thread's weights over key >= lowkey (level 0 only)
#pragma unroll
        for (int u = 0; u < 4; ++u) tl += sel[u] ? v[u] : 0ull;
      if (!kMass)
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = 1ull;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const bool has = sel[u] && v[u] != 0;
      const int d = int((key[u] >> sh_) & 255u);
      if (has && d != cur && cur >= 0) hflush<NT, kMass>(sh, w, cur, cv, cc, QM == 1 || L > 0);
      if (has) {
        if (d != cur) cur = d, cv = 0, cc = 0;
        cv += v[u];
        ++cc;
      }
    }
  }
  if (cur >= 0) hflush<NT, kMass>(sh, w, cur, cv, cc, QM == 1 || L > 0);
  if (z) *z += zl;
  if (kMass && ts) *ts += tl;
}

// Merge the warps, sum over the cluster, pick the bin (descending key order) where the
// cumulative count/mass reaches the target. Returns false if no bin does (keep all).
// *whole: the picked bin is kept whole (count select: the target is its whole count; mass
// select: it holds one weighted entry, or the target is its whole mass), so the threshold
// may stop at the bin's lowest key: the kept set is the same.
// Five block barriers and one cluster barrier: the 256 bin sums sit in warps 0-7, which
// scan them (and this CTA's own bins, for *kept) with shuffles; one barrier for the warp
// totals, one for the per-warp first candidates, one for the picked bin's values.
template <int NT, bool kMass>
__device__ __forceinline__ bool level_pick(Sh<NT>& sh, const cg::cluster_group& cl, int CL, int buf, int L, float p,
                                           unsigned long long k, uint32_t& prefix, unsigned long long& target,
                                           unsigned long long* kept, bool early, bool* whole, bool counts,
                                           bool first, bool full_last, bool single_ok = false) {
  constexpr int kHW = kBins / 32;  // warps holding the bins
  static_assert(Sh<NT>::kW >= 2 * kHW, "the warp totals of two scans share sh.u");
  __syncthreads();
  const int t = threadIdx.x, lane = t & 31, wid = t >> 5;
  if (t < kBins) {
    unsigned long long tot = 0;
#pragma unroll
    for (int w = 0; w < Sh<NT>::kHG; ++w) {
      tot += (static_cast<unsigned long long>(sh.hi[w][t]) << 20) + sh.lo[w][t];
      sh.hi[w][t] = 0u, sh.lo[w][t] = 0u;  // ready for the next level
    }
    if (kMass) {
      const unsigned cn = sh.cnt[t];
      sh.cnt[t] = 0u;
      if (counts) tot |= static_cast<unsigned long long>(cn < 2u ? cn : 2u) << kCntShift;
    }
    sh.chist[buf][t] = tot;
  }
  cl.sync();
  if (t == 0) sh.lmn[buf ^ 1] = 0xffffffffu, sh.lmx[buf ^ 1] = 0u;  // for the next level (nobody reads it now)
  if (single_ok && t < 32) {  // lane q: CTA q's candidate float-key range
    uint32_t a = 0xffffffffu, b = 0u;
    if (t < CL) {
      const Sh<NT>* o = cl.map_shared_rank(&sh, t);
      a = o->lmn[buf], b = o->lmx[buf];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint32_t x = __shfl_xor_sync(0xffffffffu, a, o), y = __shfl_xor_sync(0xffffffffu, b, o);
      a = x < a ? x : a, b = y > b ? y : b;
    }
    if (t == 0) sh.gkmn = a, sh.gkmx = b;
  }
  // cluster sum of each bin: threads t and t + 256 share bin rank t (descending order), each
  // summing every other rank's copy; all their remote loads are in flight at once
  {
    const int rr = t & (kBins - 1), h = t / kBins, b = kBins - 1 - rr;
    constexpr int kLoads = kMaxCL / (NT / kBins);
    unsigned long long v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int q = h + j * (NT / kBins);
      v[j] = q < CL ? cl.map_shared_rank(&sh.chist[buf][0], q)[b] : 0ull;
    }
    unsigned long long acc = 0;
#pragma unroll
    for (int j = 0; j < kLoads; ++j) acc += v[j];  // (packed counts add up in the top bits)
    sh.part[h][rr] = acc;
  }
  __syncthreads();
  unsigned long long g = 0, own = 0;
  unsigned gc = 0;
  if (t < kBins) {
#pragma unroll
    for (int h = 0; h < NT / kBins; ++h) g += sh.part[h][t];
    own = sh.chist[buf][kBins - 1 - t];
    if (counts) gc = unsigned(g >> kCntShift), g &= kMassMask, own &= kMassMask;
  }
  unsigned long long gi = g, oi = own;  // inclusive warp scans (rank order)
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long a = __shfl_up_sync(0xffffffffu, gi, o), b = __shfl_up_sync(0xffffffffu, oi, o);
    if (lane >= o) gi += a, oi += b;
  }
  if (t < kBins && lane == 31) sh.u[wid] = gi, sh.u[kHW + wid] = oi;
  __syncthreads();
  unsigned long long before = 0, obefore = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kHW; ++w) {
    const unsigned long long uw = sh.u[w], ow = sh.u[kHW + w];
    if (w < wid) before += uw, obefore += ow;
    total += uw;
  }
  const unsigned long long ex = before + gi - g, oex = obefore + oi - own;
  const unsigned long long tgt = first ? (kMass ? smp::frac_target(p, total) : k) : target;
  const unsigned bal = __ballot_sync(0xffffffffu, t < kBins && g > 0 && ex + g >= tgt);
  if (t < kBins && lane == 0) sh.fi[wid] = bal ? wid * 32 + __ffs(bal) - 1 : INT_MAX;
  __syncthreads();
  int pick = INT_MAX;
#pragma unroll
  for (int w = 0; w < kHW; ++w) pick = sh.fi[w] < pick ? sh.fi[w] : pick;
  if (pick == INT_MAX) return false;  // (uniform) the next writes of sh.u / sh.fi follow barriers
  if (t == pick) {
    // (full_last: the last level resolves every key; a linear-key group may need its float keys)
    // single_ok: every weighted candidate of this level has one float key (the bins are one group)
    const bool single = single_ok && sh.gkmn == sh.gkmx;
    const bool ex_whole = early && (L < 3 || !full_last) && (tgt == ex + g || (counts && gc == 1u) || single);
    sh.ptarget = tgt - ex;
    sh.pexit = ex_whole ? 1 : 0;
    sh.pkept = oex + ((L == 3 && full_last) || ex_whole ? own : 0ull);  // own mass above the bin (and in it when last)
  }
  __syncthreads();
  const bool last = (L == 3 && full_last) || sh.pexit != 0;
  if (kept) *kept += sh.pkept;
  target = sh.ptarget;
  prefix = (prefix << 8) | uint32_t(kBins - 1 - pick);
  *whole = last;
  return true;
}

// The threshold key of a select (0: keep everything).
template <int NT, bool kMass>
__device__ uint32_t radix_select(Sh<NT>& sh, const cg::cluster_group& cl, int CL, const uint32_t* vals, int i0, int E,
                                 int n, float m, uint32_t lowkey, float p, unsigned long long k, int& buf,
                                 unsigned long long* z, unsigned long long* kept, bool& done, bool early,
                                 float* ec, bool compact, int64_t n_row, bool cmask_on,
                                 unsigned long long* ts = nullptr) {
  uint32_t prefix = 0;
  unsigned long long target = 0, cmask = 0;
  done = false;
  for (int L = 0; L < 4; ++L) {
    level_pass<NT, kMass>(sh, vals, i0, E, n, m, lowkey, L, prefix, L == 0 ? z : nullptr, ec, compact, QMap{0.f, 0.f, 0},
                          0u, cmask_on ? &cmask : nullptr, 0, L == 0 ? ts : nullptr);
    bool last = false;
    const bool ok = level_pick<NT, kMass>(sh, cl, CL, buf, L, p, k, prefix, target, kept, early, &last,
                                          kMass && early && n_row < (1 << 18), L == 0, true);
    buf ^= 1;
    if (!ok) return 0u;
    if (last) {
      done = true;
      return prefix << (8 * (3 - L));  // the picked bin's lowest key
    }
  }
  return prefix;  // not reached
}

// The top-p mass select on linear keys (QMap): the same kept set as radix_select<NT, true>
// (every decision is the same integer comparison on a monotone key), as a Keep (qt, kq).
// Levels on qkey; where the last qkey level keeps a group partly (several weighted entries
// with one qkey), up to four levels on the float keys of that group's members.
template <int NT>
__device__ void radix_select_q(Sh<NT>& sh, const cg::cluster_group& cl, int CL, const uint32_t* vals, int i0, int E,
                               int n, float m, uint32_t lowkey, float p, int& buf, unsigned long long* z,
                               unsigned long long* kept, bool& done, bool early, float* ec, bool compact,
                               int64_t n_row, const QMap& qm, Keep& out, bool cmask_on,
                               unsigned long long* ts = nullptr) {
  uint32_t prefix = 0;
  unsigned long long target = 0, cmask = 0;
  unsigned long long* const cm = cmask_on ? &cmask : nullptr;
  done = false;
  // out (shared) is written by thread 0 only; the caller syncs before reading it
  const bool w0 = threadIdx.x == 0;
  if (w0) out.qon = 1, out.q = qm, out.qt = 0, out.kq = 0;  // keep all (no bin reaches the target)
  const bool counts = early && n_row < (1 << 18);
  for (int L = 0; L < 4; ++L) {
    level_pass<NT, true, 1>(sh, vals, i0, E, n, m, lowkey, L, prefix, L == 0 ? z : nullptr, ec, compact, qm, 0u, cm,
                            buf, L == 0 ? ts : nullptr);
    bool last = false;
    const bool ok = level_pick<NT, true>(sh, cl, CL, buf, L, p, 0ull, prefix, target, kept, early, &last, counts,
                                         L == 0, false, L > 0 && compact);
    buf ^= 1;
    if (!ok) return;
    if (last) {
      done = true;
      if (w0) out.qt = prefix << (8 * (3 - L));  // the picked bin's lowest qkey, kq = 0: kept whole
      return;
    }
  }
  const uint32_t qg = prefix;  // one qkey, kept partly: its members' float keys
  prefix = 0;
  for (int L = 0; L < 4; ++L) {
    level_pass<NT, true, 2>(sh, vals, i0, E, n, m, lowkey, L, prefix, nullptr, ec, compact, qm, qg, cm);
    bool last = false;
    const bool ok = level_pick<NT, true>(sh, cl, CL, buf, L, p, 0ull, prefix, target, kept, early, &last, counts,
                                         false, true);
    buf ^= 1;
    if (!ok) {  // not reached (the group holds the target): keep the group whole
      if (w0) out.qt = qg, out.kq = 0;
      return;
    }
    if (last) {
      done = true;
      if (w0) out.qt = qg, out.kq = prefix << (8 * (3 - L));
      return;
    }
  }
}


}  // namespace gk::cuda::fused
