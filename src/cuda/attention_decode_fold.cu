// CUDA attention_decode on the tensor cores, the default for bf16 / fp16 caches: chunk partials
// combined by a fixed sequential fold, so that how the work is cut never changes the bits.
//
// The result of a sequence (of n attended keys) is defined by
//  - chunks of c(n) keys (fold_chunk: the smallest chunk_min * 2^k <= chunk_max giving at most
//    target_splits chunks; a function of n and the split constants only), each reduced by one warp
//    tile by tile (16 keys) with an online softmax: its partial (max m in the log2 domain, sum l,
//    unnormalized output o),
//  - groups of kGroup consecutive chunks, each folded sequentially (fold_w / fold_v: acc = acc (+) p),
//    then the groups folded sequentially, then O / L.
// A work unit is one chunk ("chunk units": partials go to the workspace, k_merge_fold folds the groups
// and then the groups' results) or one group ("group units": the warp folds its chunks in registers and
// writes the group's result, or the output when the sequence has one group; then either k_merge_fold
// folds the groups, or, with counters (the default for head_dim 64 / 128), the warp that completes a
// head group's count of groups folds them in the kernel: warp_top_fold, one launch). The fold is the
// same arithmetic in registers and in the merge kernel, so all give the same bits: the kernel picks
// group units when there are enough of them to occupy the warps (fewer partials: less traffic at large
// batches) and chunk units otherwise (parallelism for a few long sequences), per launch, without
// changing any sequence's result. Everything else (the stage ring of
// cp.async copies, mma.sync for Q K^T and P V, the dense item enumeration) follows
// attention_decode_mma.cu.
#include <atomic>
#include <cfloat>

#include "cuda/common/attention.cuh"
#include "cuda/common/decode_fold.cuh"
#include "cuda/common/decode_fold_units.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace dmma;
using namespace dfold;

// force: 0 auto, 1 chunk units, 2 group units; nwarps: the warps of the launch (the mode's input).
template <class T, int D>
__global__ void __launch_bounds__(MCfg<D>::W * 32, 1)
    k_decode_fold(const __grid_constant__ DecodeArgs a, int nitems, int force, int* counters) {
  using Cf = MCfg<D>;
  constexpr int W = Cf::W, S = Cf::S, ROWB = Cf::ROWB, CH = Cf::CH, KVB = Cf::KVB, STAGE = Cf::STAGE,
                CPL = Cf::CPL, QPL = Cf::QPL, KSTEP = Cf::KSTEP;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned msk[W][S];
  __shared__ int pre_s[kMaxDenseF + 1];
  __shared__ int red;

  gdc_wait();  // (launched with PDL: q, the cache and the lengths may come from the previous kernel)
  gdc_launch();
  const bool ef = force & 8;  // K / V loads tagged L2 evict-first
  const bool tr = force & 16;  // the W warps of a CTA take W consecutive units (the kv heads of a chunk or group)
  force &= 7;
  const uint64_t pol = ef ? l2_evict_first() : 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int stride = int(gridDim.x) * W;
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8, H = a.hkv * ngb;
  constexpr bool kGroupOK = D <= 128;
  const int mode = !kGroupOK ? 0 : a.B <= kMaxDenseF ? pick_mode(a, H, force, stride, &red) : (force ? force - 1 : 1);
  const int* pre = nullptr;
  if (a.B <= kMaxDenseF) {
    nitems = unit_prefix(a, H, mode, pre_s);
    pre = pre_s;
  }
  const int nslots = mode ? (a.nsplit + kGroup - 1) / kGroup : a.nsplit;
  if (!pre) nitems = nslots * a.B * H;  // sparse order: B * nslots units (the host's bound is for chunk units)
  for (int b = blockIdx.x; b < a.B; b += gridDim.x) {  // sequences without keys: 0 (no unit writes them)
    if (seq_plan(a, b).nsp > 0) continue;
    for (int i = threadIdx.x; i < a.hq * D; i += W * 32)
      static_cast<T*>(a.out)[int64_t(b) * a.hq * D + i] = convert<T>(0.f);
  }
  unsigned char* ring = smem + size_t(warp) * Cf::WARPB;
  unsigned char* qslots = ring + S * STAGE;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)), qslots_s = ring_s + S * STAGE;
  const T* kc = static_cast<const T*>(a.kc);
  const T* vc = static_cast<const T*>(a.vc);
  const T* qp = static_cast<const T*>(a.q);

  FCursor P;
  P.item = tr ? int(blockIdx.x) * W + warp : warp * int(gridDim.x) + blockIdx.x;
  P.qi = 0;
  find_unit(a, ngb, nitems, stride, mode, pre, nslots, P);
  if (P.item >= nitems) return;
  FCursor C = P;
  int prow = tile_row_f(a, nitems, P, lane);

  auto issue = [&](int ps) {
    if (P.item < nitems) {
      unsigned char* st = ring + ps * STAGE;
      const unsigned m = __ballot_sync(kFull, prow >= 0) & 0xffffu;
      if (lane == 0) msk[warp][ps] = m;
      const int64_t hoff = int64_t(P.kvh) * D;
#pragma unroll
      for (int u = 0; u < CPL; ++u) {
        const int c = lane + 32 * u, r = c / CH, cc = c % CH;
        const int row = __shfl_sync(kFull, prow, r);
        const bool ok = row >= 0;
        const int64_t off = ok ? int64_t(row) * a.hkv * D + hoff + cc * 8 : 0;
        if (ef) {
          cp_async16_ef(st + swz(r, cc, ROWB), kc + off, ok, pol);
          cp_async16_ef(st + KVB + swz(r, cc, ROWB), vc + off, ok, pol);
        } else {
          cp_async16(st + swz(r, cc, ROWB), kc + off, ok);
          cp_async16(st + KVB + swz(r, cc, ROWB), vc + off, ok);
        }
      }
      if (P.tile == 0) {
        const T* q = qp + int64_t(P.b) * a.q_bs + int64_t(P.h0) * a.q_hs;
#pragma unroll
        for (int u = 0; u < QPL; ++u) {
          const int c = lane + 32 * u, r = c / CH, cc = c % CH;
          const bool ok = r < P.nh;
          cp_async16(qslots + P.qi * Cf::QB + swz(r, cc, ROWB), ok ? q + int64_t(r) * a.q_hs + cc * 8 : qp, ok);
        }
      }
    }
    cp_async_commit();
  };
  auto advance = [&](FCursor& c) {
    if (c.item >= nitems) return;
    if (++c.tile < c.ntile) return;
    c.item += stride;
    find_unit(a, ngb, nitems, stride, mode, pre, nslots, c);
    c.qi = c.qi + 1 == Cf::NQ ? 0 : c.qi + 1;
  };

#pragma unroll 1
  for (int i = 0; i < S - 1; ++i) {
    issue(i);
    advance(P);
    prow = tile_row_f(a, nitems, P, lane);
  }

  const float sl2 = a.scale * kLog2e;
  const bool capped = a.softcap > 0.f;
  const float cap_in = capped ? a.scale / a.softcap : 0.f, cap_out = a.softcap * kLog2e;
  uint32_t qa[KSTEP][2];
  float o[KSTEP][4], go[KSTEP][4];
#pragma unroll
  for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = go[mt][e] = 0.f;
  float mrow = -INFINITY, lsum = 0.f;
  float gmA = -INFINITY, gmB = -INFINITY, glA = 0.f, glB = 0.f;  // group accumulator (heads 2t4, 2t4 + 1)
  const int hA = 2 * t4, hB = 2 * t4 + 1;

  int cs = 0, ps = S - 1;
#pragma unroll 1
  while (C.item < nitems) {
    cp_async_wait<S - 2>();
    __syncwarp();
    const uint32_t st = ring_s + cs * STAGE;
    if (C.tile == 0) {
#pragma unroll
      for (int k2 = 0; k2 < KSTEP / 2; ++k2) {
        uint32_t x[4];
        ldsm_x4(x, qslots_s + C.qi * Cf::QB + swz(lane & 7, 4 * k2 + (lane >> 3), ROWB));
        qa[2 * k2][0] = x[0];
        qa[2 * k2][1] = x[1];
        qa[2 * k2 + 1][0] = x[2];
        qa[2 * k2 + 1][1] = x[3];
      }
      __syncwarp();
    }
    issue(ps);
    advance(P);
    prow = tile_row_f(a, nitems, P, lane);
    ps = ps + 1 == S ? 0 : ps + 1;
    tile_step<T, D>(st, qa, msk[warp][cs], sl2, capped, cap_in, cap_out, o, mrow, lsum, lane);

    const bool unit_end = C.tile + 1 == C.ntile;
    if (unit_end || (C.tile + 1) % C.ctiles == 0) {  // a chunk ends
      float l = lsum;
      l += __shfl_xor_sync(kFull, l, 1);
      l += __shfl_xor_sync(kFull, l, 2);
      const float mA = __shfl_sync(kFull, mrow, 8 * t4), mB = __shfl_sync(kFull, mrow, 8 * t4 + 4);
      const float lA = __shfl_sync(kFull, l, 8 * t4), lB = __shfl_sync(kFull, l, 8 * t4 + 4);
      const int64_t hrow = int64_t(C.b) * a.hq + C.h0;
      if (kGroupOK && mode) {  // group units: acc (+)= this chunk
        float waA, wbA, waB, wbB;
        fold_w(gmA, mA, waA, wbA);
        fold_w(gmB, mB, waB, wbB);
        glA = fold_v(glA, waA, lA, wbA);
        glB = fold_v(glB, waB, lB, wbB);
#pragma unroll
        for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            go[mt][e] = e & 1 ? fold_v(go[mt][e], waB, o[mt][e], wbB) : fold_v(go[mt][e], waA, o[mt][e], wbA);
      }
      if (unit_end) {
        // the unit's result: (gm, gl, go) for group units, the chunk itself for chunk units
        float rA = mode ? gmA : mA, rB = mode ? gmB : mB, sA = mode ? glA : lA, sB = mode ? glB : lB;
        if (C.single) {  // (a single group folded into an empty top accumulator is itself)
          T* out = static_cast<T*>(a.out) + hrow * D;
#pragma unroll
          for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e & 1 ? hB : hA, d = mt * 16 + g + (e >= 2 ? 8 : 0);
              const float v = kGroupOK && mode ? go[mt][e] : o[mt][e];
              if (h < C.nh) out[h * D + d] = convert<T>(finalize(v, e & 1 ? sB : sA));
            }
        } else {
          float* wo = a.ws_o + (hrow * a.nsplit + C.slot) * D;
          const int64_t hs = int64_t(a.nsplit) * D;
#pragma unroll
          for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e & 1 ? hB : hA, d = mt * 16 + g + (e >= 2 ? 8 : 0);
              if (h < C.nh) wo[h * hs + d] = kGroupOK && mode ? go[mt][e] : o[mt][e];
            }
          if (lane < 4) {  // lanes 0..3 (row 0, t4 = lane) hold the statistics of heads 2 t4, 2 t4 + 1
            if (hA < C.nh) {
              float* ml = a.ws_ml + ((hrow + hA) * a.nsplit + C.slot) * 2;
              ml[0] = rA;
              ml[1] = sA;
            }
            if (hB < C.nh) {
              float* ml = a.ws_ml + ((hrow + hB) * a.nsplit + C.slot) * 2;
              ml[0] = rB;
              ml[1] = sB;
            }
          }
          if (kGroupOK && mode && counters) {  // in-kernel merge: the warp completing the head group's count folds
            __threadfence();
            __syncwarp();
            const int ci = (C.b * a.hkv + C.kvh) * ngb + (C.h0 - C.kvh * G) / 8;
            int lastw = 0;
            if (lane == 0) lastw = atomicAdd(counters + ci, 1) == C.ng - 1;
            lastw = __shfl_sync(kFull, lastw, 0);
            if (lastw) {
              __threadfence();
              warp_top_fold<T, D>(a, hrow, C.nh, C.ng, lane);
              __syncwarp();
              if (lane == 0) counters[ci] = 0;  // every group has arrived: ready for the next launch
            }
          }
        }
        gmA = gmB = -INFINITY;
        glA = glB = 0.f;
#pragma unroll
        for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) go[mt][e] = 0.f;
      }
#pragma unroll
      for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][e] = 0.f;
      mrow = -INFINITY;
      lsum = 0.f;
    }
    advance(C);
    cs = cs + 1 == S ? 0 : cs + 1;
  }
  cp_async_wait<0>();
}

// One CTA of 1024 threads per (query head, sequence): in passes of R * GPR groups, row r = thread / D of R
// computes the results of GPR consecutive groups (chunk units: folding each group's chunks, all their loads
// issued first; group units: read), then row 0 folds the pass's groups in order into the running result;
// finally O / L.
template <class T, int D>
__global__ void __launch_bounds__(1024) k_merge_fold(const __grid_constant__ DecodeArgs a, int force, int nwarps) {
  constexpr int R = 1024 / D, GPR = 2, NP = R * GPR;
  __shared__ float sho[NP][D], shm[NP], shl[NP];
  __shared__ int red;
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x % D, r = threadIdx.x / D;
  gdc_wait();  // the partials of k_decode_fold (every CTA waits: this grid completes after that one)
  gdc_launch();
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int mode = D == 256 ? 0 : a.B <= kMaxDenseF ? pick_mode(a, a.hkv * ngb, force, nwarps, &red)
                                                    : (force ? force - 1 : 1);
  const SeqPlan p = seq_plan(a, b);
  const int nunits = mode ? p.ng : p.nsp;
  if (nunits == 1) return;  // written by k_decode_fold
  const int64_t row = int64_t(b) * a.hq + h;
  T* out = static_cast<T*>(a.out) + row * D + d;
  if (nunits == 0) return;  // written by k_decode_fold
  const float* ml = a.ws_ml + row * a.nsplit * 2;
  const float* po = a.ws_o + row * a.nsplit * D + d;
  float TM = -INFINITY, TL = 0.f, TO = 0.f;  // top accumulator (row 0)
  for (int g0 = 0; g0 < p.ng; g0 += NP) {
    const int gb0 = g0 + r * GPR;  // this row's first group
    if (mode) {
#pragma unroll
      for (int j = 0; j < GPR; ++j) {
        const int gi = gb0 + j;
        if (gi < p.ng) {
          sho[r * GPR + j][d] = po[int64_t(gi) * D];
          if (d == 0) {
            shm[r * GPR + j] = ml[2 * gi];
            shl[r * GPR + j] = ml[2 * gi + 1];
          }
        }
      }
    } else {
      float mv[GPR][kGroup], lv[GPR][kGroup], ov[GPR][kGroup];
#pragma unroll
      for (int j = 0; j < GPR; ++j)
#pragma unroll
        for (int i = 0; i < kGroup; ++i) {
          const int c = (gb0 + j) * kGroup + i;
          const bool ok = c < p.nsp;
          mv[j][i] = ok ? ml[2 * c] : -INFINITY;
          lv[j][i] = ok ? ml[2 * c + 1] : 0.f;
          ov[j][i] = ok ? po[int64_t(c) * D] : 0.f;
        }
#pragma unroll
      for (int j = 0; j < GPR; ++j) {
        if (gb0 + j < p.ng) {
          float M = -INFINITY, L = 0.f, O = 0.f;
#pragma unroll
          for (int i = 0; i < kGroup; ++i) {
            if ((gb0 + j) * kGroup + i < p.nsp) {
              float wa, wb;
              fold_w(M, mv[j][i], wa, wb);
              L = fold_v(L, wa, lv[j][i], wb);
              O = fold_v(O, wa, ov[j][i], wb);
            }
          }
          sho[r * GPR + j][d] = O;
          if (d == 0) {
            shm[r * GPR + j] = M;
            shl[r * GPR + j] = L;
          }
        }
      }
    }
    __syncthreads();
    if (r == 0) {
      const int n = min(NP, p.ng - g0);
      for (int i = 0; i < n; ++i) {
        float wa, wb;
        fold_w(TM, shm[i], wa, wb);
        TL = fold_v(TL, wa, shl[i], wb);
        TO = fold_v(TO, wa, sho[i][d], wb);
      }
    }
    __syncthreads();
  }
  if (r == 0) *out = convert<T>(finalize(TO, TL));
}

// The narrow merge, for many (sequence, head) rows: one warp per row (8 per CTA), lane l owning dims
// [l * DL, l * DL + DL). The same folds in the same order as k_merge_fold (groups of chunks in chunk order,
// then the groups), so the same bits; its loads are issued 8 partials at a time.
template <class T, int D>
__global__ void __launch_bounds__(256) k_merge_fold_w(const __grid_constant__ DecodeArgs a, int force, int nwarps) {
  constexpr int DL = D / 32;
  __shared__ int red;
  const int lane = threadIdx.x & 31;
  gdc_wait();  // as k_merge_fold
  gdc_launch();
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int mode = D == 256 ? 0 : a.B <= kMaxDenseF ? pick_mode(a, a.hkv * ngb, force, nwarps, &red)
                                                    : (force ? force - 1 : 1);
  const int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (row >= int64_t(a.B) * a.hq) return;
  const int b = int(row / a.hq);
  const SeqPlan p = seq_plan(a, b);
  const int nunits = mode ? p.ng : p.nsp;
  if (nunits == 1) return;  // written by k_decode_fold
  T* out = static_cast<T*>(a.out) + row * D + lane * DL;
  if (nunits == 0) return;  // written by k_decode_fold
  const float* ml = a.ws_ml + row * a.nsplit * 2;
  const float* po = a.ws_o + row * a.nsplit * D + lane * DL;
  // 8 partials (slots s0 .. s0 + n - 1): loaded into registers (issued together), then folded into (M, L, O[])
  struct P8 {
    float m[8], l[8], o[8][DL];
  };
  auto load8 = [&](int s0, int n, P8& x) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool ok = i < n;
      const float2 v = ok ? __ldcg(reinterpret_cast<const float2*>(ml) + (s0 + i)) : make_float2(-INFINITY, 0.f);
      x.m[i] = v.x;
      x.l[i] = v.y;
      if constexpr (DL % 4 == 0) {
#pragma unroll
        for (int k = 0; k < DL; k += 4) {
          const float4 w = ok ? __ldcg(reinterpret_cast<const float4*>(po + int64_t(s0 + i) * D + k))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
          x.o[i][k] = w.x;
          x.o[i][k + 1] = w.y;
          x.o[i][k + 2] = w.z;
          x.o[i][k + 3] = w.w;
        }
      } else {
#pragma unroll
        for (int k = 0; k < DL; ++k) x.o[i][k] = ok ? __ldcg(po + int64_t(s0 + i) * D + k) : 0.f;
      }
    }
  };
  auto fold8 = [&](const P8& x, int n, float& M, float& L, float (&O)[DL]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (i < n) {
        float wa, wb;
        fold_w(M, x.m[i], wa, wb);
        L = fold_v(L, wa, x.l[i], wb);
#pragma unroll
        for (int k = 0; k < DL; ++k) O[k] = fold_v(O[k], wa, x.o[i][k], wb);
      }
    }
  };
  float TM = -INFINITY, TL = 0.f, TO[DL];
#pragma unroll
  for (int k = 0; k < DL; ++k) TO[k] = 0.f;
  // two batches of loads in flight: the next 8 partials are loaded while the current ones are folded
  P8 cur, nxt;
  if (mode) {  // the group results in slots 0 .. ng - 1: the top fold directly
    load8(0, min(8, p.ng), cur);
    for (int s0 = 0; s0 < p.ng; s0 += 8) {
      if (s0 + 8 < p.ng) load8(s0 + 8, min(8, p.ng - s0 - 8), nxt);
      fold8(cur, min(8, p.ng - s0), TM, TL, TO);
      cur = nxt;
    }
  } else {
    load8(0, min(kGroup, p.nsp), cur);
    for (int gi = 0; gi < p.ng; ++gi) {
      if (gi + 1 < p.ng) load8((gi + 1) * kGroup, min(kGroup, p.nsp - (gi + 1) * kGroup), nxt);
      float M = -INFINITY, L = 0.f, O[DL];
#pragma unroll
      for (int k = 0; k < DL; ++k) O[k] = 0.f;
      fold8(cur, min(kGroup, p.nsp - gi * kGroup), M, L, O);
      float wa, wb;
      fold_w(TM, M, wa, wb);
      TL = fold_v(TL, wa, L, wb);
#pragma unroll
      for (int k = 0; k < DL; ++k) TO[k] = fold_v(TO[k], wa, O[k], wb);
      cur = nxt;
    }
  }
#pragma unroll
  for (int k = 0; k < DL; ++k) out[k] = convert<T>(finalize(TO[k], TL));
}

// force 3: auto units without the merge kernel (timing only: the merge's share); force 4: group units
// merged in the kernel (head_dim 64 / 128; one launch; else as 0).
template <class T, int D>
void launch_fold(const DecodeArgs& a, cudaStream_t st, int force) {
  const int ef = force & 24;  // (K / V loads tagged L2 evict-first, transposed unit order)
  force &= 7;
  const bool merge = force != 3;
  if (!merge) force = 0;
  int* counters = nullptr;
  if (force == 4) {
    const int G = a.hq / a.hkv;
    counters = D <= 128 ? merge_counters(st, int64_t(a.B) * a.hkv * ((G + 7) / 8)) : nullptr;
    force = counters ? 2 : 0;
  }
  using Cf = MCfg<D>;
  static_assert(Cf::SMEM + Cf::W * Cf::S * 4 + 4 * (kMaxDenseF + 2) <= 227 * 1024, "shared memory of one CTA");
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int64_t nitems = int64_t(a.nsplit) * a.B * a.hkv * ngb;  // bound (sparse order; chunk units)
  if (nitems + int64_t(1024) * 132 * Cf::W > INT32_MAX) throw ValueError("q: too many heads x chunks");
  auto kern = k_decode_fold<T, D>;
  {  // the shared-memory opt-in: a per-device attribute, set once per device (host overhead of each call)
    static std::atomic<unsigned long long> done{0};
    int dev = 0;
    GK_CUDA_CHECK(cudaGetDevice(&dev));
    const unsigned long long bit = 1ull << (dev & 63);
    if (dev >= 64 || !(done.load(std::memory_order_relaxed) & bit)) {
      GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Cf::SMEM)));
      done.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  const unsigned grid = unsigned(std::min<int64_t>(sm_count(), nitems));
  const int nwarps = int(grid) * Cf::W;
  launch_maybe_pdl(kern, dim3{grid}, dim3{unsigned(Cf::W * 32)}, Cf::SMEM, st, decode_pdl(), a, int(nitems), force | ef,
                   counters);
  GK_LAUNCH_CHECK("attention_decode_fold");
  if (!merge || counters) return;
  // Few rows: a CTA of 1024 threads per (head, sequence) (latency); many: a warp per row (waves).
  const int64_t rows = int64_t(a.B) * a.hq;
  const bool wide = rows <= 2 * int64_t(sm_count());
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = wide ? dim3{unsigned(a.hq), unsigned(a.B), 1u} : dim3{unsigned((rows + 7) / 8), 1u, 1u};
  cfg.blockDim = dim3{wide ? 1024u : 256u, 1u, 1u};
  cfg.dynamicSmemBytes = 0;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  auto mk = wide ? k_merge_fold<T, D> : k_merge_fold_w<T, D>;
  {  // the merge kernels ask for the chunk kernel's shared-memory carveout: no L1 / shared reconfiguration
     // of the SMs between the two launches (once per device)
    static std::atomic<unsigned long long> done{0};
    int dev = 0;
    GK_CUDA_CHECK(cudaGetDevice(&dev));
    const unsigned long long bit = 1ull << (dev & 63);
    if (dev >= 64 || !(done.load(std::memory_order_relaxed) & bit)) {
      for (auto k : {k_merge_fold<T, D>, k_merge_fold_w<T, D>})
        GK_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           int(cudaSharedmemCarveoutMaxShared)));
      done.fetch_or(bit, std::memory_order_relaxed);
    }
  }
  if (cudaLaunchKernelEx(&cfg, mk, a, force, nwarps) != cudaSuccess) {
    (void)cudaGetLastError();
    mk<<<cfg.gridDim, cfg.blockDim, 0, st>>>(a, force, nwarps);
  }
  GK_LAUNCH_CHECK("attention_decode_fold_merge");
}
}  // namespace

bool attention_decode_fold(const DecodeArgs& a, cudaStream_t st, int force) {
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  if (!half || a.cache_dtype != a.dtype) return false;
  if (!aligned16(a.q) || (a.q_bs * 2) % 16 || (a.q_hs * 2) % 16) return false;
  if (a.B > 65535 || a.nb * a.bs > int64_t(INT32_MAX)) return false;
  if (a.chunk_min % 16) return false;
  auto go = [&](auto t) {
    using T = decltype(t);
    switch (a.D) {
      case 64: launch_fold<T, 64>(a, st, force); return true;
      case 128: launch_fold<T, 128>(a, st, force); return true;
      case 256: launch_fold<T, 256>(a, st, force); return true;
      default: return false;
    }
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

}  // namespace gk::cuda
