// CUDA attention_decode on the tensor cores, chunk partials merged with a global maximum: the
// previous default for bf16 / fp16 caches (q and cache of the same type), head_dim 64, 128 and 256,
// any GQA group size; now reached through GPUKIT_DECODE_SPLIT variants 2-13 and 16 (the default is
// attention_decode_fold.cu, which shares this kernel's pipeline).
//
// Work items: (chunk of one sequence, kv head, group of up to 8 query heads). The
// chunking is the flash-decoding split of attention_decode.cu (decode_chunk: a
// function of the sequence's attended length and the fixed split parameters only).
// Every warp is independent: the grid holds one CTA per SM (at most; 8 warps, two
// per scheduler, for D = 64 and 128), the warps of all CTAs take the items
// round-robin (item gw, gw + NW, gw + 2 NW, ... for global warp gw of NW; items are
// ordered sequence-major and the kv heads of one chunk are consecutive, so the warps
// running at one time read few, neighbouring regions of the cache), and each warp
// streams the tiles of its items through its own ring of S shared-memory stages,
// filled by 16-byte cp.async copies S - 1 tiles ahead, across item boundaries. A
// stage holds 16 keys of K and V (rows swizzled: 16-byte chunk c of row r sits at
// c ^ (r & 7), so ldmatrix is conflict-free); an item's query rows go to one of
// S - 1 query slots with its first tile. The cache rows of the next tile to copy
// (block table look-ups for a paged cache) are loaded one step early.
//
// Per tile (warp, 16 keys):
//  - S = Q K^T with mma.m16n8k16 (fp32 accumulation): A = the query heads (rows
//    0..7, rows 8..15 zero), B = K via ldmatrix; two accumulator chains (even and
//    odd k-steps) added in a fixed order.
//  - online softmax in the log2 domain (scale * log2(e) folded into the logits;
//    soft-cap before), masked keys (past the length, block ids outside the pool)
//    at -inf; the running max and sum are kept per head.
//  - O^T += V^T P^T with mma.m16n8k16: A = V^T via ldmatrix.trans, B = P, whose
//    accumulator layout of the first product is already B's operand layout
//    (lane 4g + t holds head g, keys 2t, 2t + 1), so P never leaves registers.
//    P is rounded to the cache type for the product; the sum uses fp32 P.
// A sequence of one chunk is normalized and written directly; otherwise a chunk
// writes its unnormalized output, max (log2 domain) and sum to the workspace and
// k_merge_mma (launched with programmatic dependence, so its launch overlaps the
// chunks) combines the chunks of each (sequence, head) in a fixed order.
// Each item's arithmetic depends only on its own sequence, chunk and heads, never
// on which warp runs it or what else is in the batch: bitwise reproducible and
// batch independent.
//
// Tuning variants (GPUKIT_DECODE_SPLIT's 4th field; not defaults): 2-4 other warps x
// stages (bf16, D = 128), 5 partials stored in the cache type, 6 split-major item
// order, 8-9 "CTA mode": the warps of a CTA split each chunk into sub-chunks and
// combine them in warp order through shared memory (other bits than the default,
// still a function of the sequence alone).
#include <atomic>
#include <cfloat>
#include <map>
#include <mutex>
#include <tuple>

#include "cuda/common/attention.cuh"
#include "cuda/common/decode_mma.cuh"
#include "cuda/common/decode_mma_items.cuh"
#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace dmma;

// CTA mode: the W warps' results for one item (their sub-chunks) combined in warp order through shared
// memory cmb: [W][8][D] floats, then [W][8] maxima and [W][8] sums; then written by all threads of the CTA
// (coalesced): the output (one chunk) or the chunk's partial.
template <class T, int D, int W>
__device__ __forceinline__ void combine(const DecodeArgs& a, const Cursor& C, int flags, const float (&o)[D / 16][4],
                                        float mrow, float l, float* cmb) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
  float* cm = cmb + W * 8 * D;
  float* cl = cm + W * 8;
  float* my = cmb + warp * 8 * D;
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) my[(2 * t4 + (e & 1)) * D + mt * 16 + g + (e >= 2 ? 8 : 0)] = o[mt][e];
  if (t4 == 0) {
    cm[warp * 8 + g] = mrow;
    cl[warp * 8 + g] = l;
  }
  __syncthreads();
  const int64_t hrow = int64_t(C.b) * a.hq + C.h0;
  for (int idx = threadIdx.x; idx < C.nh * D; idx += W * 32) {
    const int h = idx / D, d = idx - h * D;
    float M = cm[h];
#pragma unroll
    for (int w = 1; w < W; ++w) M = fmaxf(M, cm[w * 8 + h]);
    float O = 0.f, L = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float mw = cm[w * 8 + h], f = mw == -INFINITY ? 0.f : exp2f(mw - M);
        O = fmaf(f, cmb[(w * 8 + h) * D + d], O);
        L = fmaf(f, cl[w * 8 + h], L);
      }
    }
    const int64_t r = hrow + h;
    if (C.nsp == 1) {
      static_cast<T*>(a.out)[r * D + d] = convert<T>(L > 0.f ? O / L : 0.f);
    } else {
      if (flags & kTPartials)
        reinterpret_cast<T*>(a.ws_o)[(r * a.nsplit + C.split) * D + d] = convert<T>(L > 0.f ? O / L : 0.f);
      else
        a.ws_o[(r * a.nsplit + C.split) * D + d] = O;
      if (d == 0) {
        float* ml = a.ws_ml + (r * a.nsplit + C.split) * 2;
        ml[0] = M;
        ml[1] = L;
      }
    }
  }
  __syncthreads();  // cmb is free again
}

// In-kernel merge (CTA mode with counters): after writing its chunk's partial, a CTA counts itself in on
// the (sequence, kv head, head group) counter; the CTA that completes the count (its partials all written
// and fenced) merges the nsp chunks of those heads in chunk order and resets the counter to 0 for the next
// launch. The arithmetic is k_merge_mma's for R = 1 (one fixed sequential order), whichever CTA runs it.
// sh: at least 2 * 8 * nsp floats of shared memory (the chunks' maxima and sums), or the loop reloads.
template <class T, int D, int W>
__device__ __forceinline__ void merge_last(const DecodeArgs& a, const Cursor& C, int* counters, int ngb,
                                           float* sh, int shn, int* flag) {
  const int ci = (C.b * a.hkv + C.kvh) * ngb + (C.h0 - C.kvh * (a.hq / a.hkv)) / 8;
  __threadfence();  // this thread's partial writes, device-wide, before the count
  __syncthreads();
  if (threadIdx.x == 0) *flag = atomicAdd(counters + ci, 1) == C.nsp - 1;
  __syncthreads();
  if (!*flag) return;
  __threadfence();  // the other CTAs' partials (fenced before their counts) are visible
  const int64_t hrow = int64_t(C.b) * a.hq + C.h0;
  const int nsp = C.nsp;
  const bool cached = 2 * C.nh * nsp <= shn;
  if (cached) {
    for (int i = threadIdx.x; i < C.nh * nsp; i += W * 32) {
      const int h = i / nsp, s = i - h * nsp;
      const float2 v = __ldcg(reinterpret_cast<const float2*>(a.ws_ml + ((hrow + h) * a.nsplit + s) * 2));
      sh[2 * i] = v.x;
      sh[2 * i + 1] = v.y;
    }
    __syncthreads();
  }
  for (int idx = threadIdx.x; idx < C.nh * D; idx += W * 32) {
    const int h = idx / D, d = idx - h * D;
    const int64_t r = hrow + h;
    const float* ml = a.ws_ml + r * a.nsplit * 2;
    auto mlv = [&](int s, int k) { return cached ? sh[2 * (h * nsp + s) + k] : __ldcg(ml + 2 * s + k); };
    const float* po = a.ws_o + r * a.nsplit * D + d;
    float M = -INFINITY;
    for (int s = 0; s < nsp; ++s) M = fmaxf(M, mlv(s, 0));
    float num = 0.f, den = 0.f;
    if (M != -INFINITY) {
#pragma unroll 8
      for (int s = 0; s < nsp; ++s) {
        const float ms = mlv(s, 0), w = ms == -INFINITY ? 0.f : exp2f(ms - M);
        num = fmaf(w, __ldcg(po + int64_t(s) * D), num);
        den = fmaf(w, mlv(s, 1), den);
      }
    }
    static_cast<T*>(a.out)[r * D + d] = convert<T>(den > 0.f ? num / den : 0.f);
  }
  if (threadIdx.x == 0) counters[ci] = 0;  // every CTA of this count has arrived: ready for the next launch
  __syncthreads();  // sh is free again
}

template <int D, int W>
constexpr size_t combine_bytes() {
  return size_t(W) * 8 * (D + 2) * sizeof(float);
}

// CI: CTA mode (the W warps of a CTA share each item, their results combined through shared memory in
// warp order); otherwise every warp runs items of its own.
// counters (CTA mode only; null: k_merge_mma merges): the in-kernel merge of merge_last, one zeroed int
// per (sequence, kv head, head group), left zeroed.
template <class T, int D, int W_, int S_, bool CI>
__global__ void __launch_bounds__(MCfg<D, W_, S_>::W * 32, 1)
    k_decode_mma(const __grid_constant__ DecodeArgs a, int nitems, int flags, int* counters) {
  using Cf = MCfg<D, W_, S_>;
  constexpr int W = Cf::W, S = Cf::S, ROWB = Cf::ROWB, CH = Cf::CH, KVB = Cf::KVB, STAGE = Cf::STAGE,
                CPL = Cf::CPL, QPL = Cf::QPL, KSTEP = Cf::KSTEP;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned msk[W][S];  // valid keys of each stage (bit k: key k)
  __shared__ int pre_s[kMaxDense + 1];
  __shared__ int last_flag;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the merge kernel may start (and wait)
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int stride = CI ? int(gridDim.x) : int(gridDim.x) * W;
  const int wsub = CI ? warp : -1;
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int* pre = nullptr;
  if ((flags & kBMajor) && a.B <= kMaxDense) {  // dense item enumeration (see find_item)
    nitems = dense_prefix(a, a.hkv * ngb, pre_s);
    pre = pre_s;
  }
  if (CI && counters) {  // no merge kernel: the outputs of sequences without keys are zeroed here
    for (int b = blockIdx.x; b < a.B; b += gridDim.x) {
      int64_t L, start;
      decode_span(a, b, L, start);
      if (L - start > 0) continue;
      for (int i = threadIdx.x; i < a.hq * D; i += W * 32) static_cast<T*>(a.out)[int64_t(b) * a.hq * D + i] = convert<T>(0.f);
    }
  }
  unsigned char* ring = smem + size_t(warp) * Cf::WARPB;
  unsigned char* qslots = ring + S * STAGE;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring)), qslots_s = ring_s + S * STAGE;
  const T* kc = static_cast<const T*>(a.kc);
  const T* vc = static_cast<const T*>(a.vc);
  const T* qp = static_cast<const T*>(a.q);

  Cursor P;
  // Warp mode: item gw + k * stride for global warp gw = warp * grid + CTA (the items running at one time
  // spread over all SMs); kGrouped with at least two rounds of items: gw = CTA * W + warp (the kv heads of
  // one chunk on the warps of one SM: whole cache rows per SM).
  P.item = CI ? int(blockIdx.x)
              : (flags & kGrouped) && nitems >= 2 * stride ? int(blockIdx.x) * W + warp
                                                          : warp * int(gridDim.x) + blockIdx.x;
  P.qi = 0;
  find_item(a, ngb, nitems, stride, flags, pre, P, wsub, W);
  if (P.item >= nitems) return;
  Cursor C = P;  // (qi = 0 too)
  int prow = tile_row(a, nitems, P, lane);

  // Copies the producer's tile into stage ps (an empty group once the items are done).
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
        cp_async16(st + swz(r, cc, ROWB), kc + off, ok);
        cp_async16(st + KVB + swz(r, cc, ROWB), vc + off, ok);
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
  auto step_producer = [&]() {
    advance(a, ngb, nitems, stride, flags, pre, P, wsub, W, Cf::NQ);
    prow = tile_row(a, nitems, P, lane);
  };

#pragma unroll 1
  for (int i = 0; i < S - 1; ++i) {
    issue(i);
    step_producer();
  }

  const float sl2 = a.scale * kLog2e;
  const bool capped = a.softcap > 0.f;
  const float cap_in = capped ? a.scale / a.softcap : 0.f, cap_out = a.softcap * kLog2e;
  uint32_t qa[KSTEP][2];
  float o[KSTEP][4];
#pragma unroll
  for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[mt][e] = 0.f;
  float mrow = -INFINITY, lsum = 0.f;
  // ldmatrix row address of this lane for a 16 x 16 block (keys x dims): matrices (keys 0-7, chunk 2x),
  // (keys 0-7, chunk 2x + 1), (keys 8-15, chunk 2x), (keys 8-15, chunk 2x + 1).
  const int lr = (lane & 7) + ((lane >> 4) << 3), lc = (lane >> 3) & 1;

  int cs = 0, ps = S - 1;
#pragma unroll 1
  while (C.item < nitems) {
    cp_async_wait<S - 2>();
    __syncwarp();
    const uint32_t st = ring_s + cs * STAGE;
    if (C.tile == 0) {  // the item's query rows: A fragments of each k-step (a0: dims 2t.., a2: dims 2t + 8..)
#pragma unroll
      for (int k2 = 0; k2 < KSTEP / 2; ++k2) {
        uint32_t x[4];
        ldsm_x4(x, qslots_s + C.qi * Cf::QB + swz(lane & 7, 4 * k2 + (lane >> 3), ROWB));
        qa[2 * k2][0] = x[0];
        qa[2 * k2][1] = x[1];
        qa[2 * k2 + 1][0] = x[2];
        qa[2 * k2 + 1][1] = x[3];
      }
      __syncwarp();  // the slot is read before this iteration's copies may refill it
    }
    issue(ps);
    step_producer();
    ps = ps + 1 == S ? 0 : ps + 1;
    // S = Q K^T: s?[n] = heads x keys n*8 .. n*8 + 7 (lane: head g, keys 2t, 2t + 1 in [0], [1]).
    float sa[2][4] = {}, sb[2][4] = {};
#pragma unroll
    for (int k = 0; k < KSTEP; ++k) {
      uint32_t kb[4];
      ldsm_x4(kb, st + swz(lr, 2 * k + lc, ROWB));
      if (k & 1) {
        mma<T>(sb[0], qa[k][0], 0u, qa[k][1], 0u, kb[0], kb[1]);
        mma<T>(sb[1], qa[k][0], 0u, qa[k][1], 0u, kb[2], kb[3]);
      } else {
        mma<T>(sa[0], qa[k][0], 0u, qa[k][1], 0u, kb[0], kb[1]);
        mma<T>(sa[1], qa[k][0], 0u, qa[k][1], 0u, kb[2], kb[3]);
      }
    }
    const unsigned mk = msk[warp][cs];
    float x[2][2];
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = sa[n][e] + sb[n][e];
        v = capped ? cap_out * tanhf(v * cap_in) : v * sl2;
        v = (mk >> (n * 8 + 2 * t4 + e)) & 1u ? v : -INFINITY;
        x[n][e] = v;
        mx = fmaxf(mx, v);
      }
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
    const float mnew = fmaxf(mrow, mx);
    const bool none = mnew == -INFINITY;
    const float alpha = none ? 1.f : ex2(mrow - mnew);
    float p[2][2], ps_ = 0.f;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[n][e] = none ? 0.f : ex2(x[n][e] - mnew);
        ps_ += p[n][e];
      }
    lsum = fmaf(lsum, alpha, ps_);
    mrow = mnew;
    const float a0 = __shfl_sync(kFull, alpha, 8 * t4), a1 = __shfl_sync(kFull, alpha, 8 * t4 + 4);
    const uint32_t pb0 = pack2<T>(p[0][0], p[0][1]), pb1 = pack2<T>(p[1][0], p[1][1]);
    // O^T += V^T P^T: o[mt] = dims mt*16 + (g, g + 8) x heads (2t, 2t + 1).
#pragma unroll
    for (int mt = 0; mt < KSTEP; ++mt) {
      uint32_t va[4];
      ldsm_x4_t(va, st + KVB + swz(lr, 2 * mt + lc, ROWB));
      o[mt][0] *= a0;
      o[mt][1] *= a1;
      o[mt][2] *= a0;
      o[mt][3] *= a1;
      mma<T>(o[mt], va[0], va[1], va[2], va[3], pb0, pb1);
    }

    if (C.tile + 1 == C.ntile) {  // the item's last tile: write its result
      float l = lsum;
      l += __shfl_xor_sync(kFull, l, 1);
      l += __shfl_xor_sync(kFull, l, 2);
      if constexpr (CI) {
        float* cmb = reinterpret_cast<float*>(smem + Cf::SMEM);
        combine<T, D, W>(a, C, flags, o, mrow, l, cmb);
        if (counters && C.nsp > 1)
          merge_last<T, D, W>(a, C, counters, ngb, cmb, int(combine_bytes<D, W>() / sizeof(float)), &last_flag);
      } else {
        const float l0 = __shfl_sync(kFull, l, 8 * t4), l1 = __shfl_sync(kFull, l, 8 * t4 + 4);
        const int hA = 2 * t4, hB = 2 * t4 + 1;
        const int64_t hrow = int64_t(C.b) * a.hq + C.h0;
        if (C.nsp == 1) {
          T* out = static_cast<T*>(a.out) + hrow * D;
          const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
          for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e & 1 ? hB : hA, d = mt * 16 + g + (e >= 2 ? 8 : 0);
              if (h < C.nh) out[h * D + d] = convert<T>(o[mt][e] * (e & 1 ? i1 : i0));
            }
        } else if (flags & kTPartials) {  // normalized, in the cache type (a convex combination of V rows)
          T* wo = reinterpret_cast<T*>(a.ws_o) + (hrow * a.nsplit + C.split) * D;
          const int64_t hs = int64_t(a.nsplit) * D;
          const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
          for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e & 1 ? hB : hA, d = mt * 16 + g + (e >= 2 ? 8 : 0);
              if (h < C.nh) wo[h * hs + d] = convert<T>(o[mt][e] * (e & 1 ? i1 : i0));
            }
        } else {
          float* wo = a.ws_o + (hrow * a.nsplit + C.split) * D;
          const int64_t hs = int64_t(a.nsplit) * D;
#pragma unroll
          for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int h = e & 1 ? hB : hA, d = mt * 16 + g + (e >= 2 ? 8 : 0);
              if (h < C.nh) wo[h * hs + d] = o[mt][e];
            }
        }
        if (C.nsp > 1 && t4 == 0 && g < C.nh) {
          float* ml = a.ws_ml + ((hrow + g) * a.nsplit + C.split) * 2;
          ml[0] = mrow;
          ml[1] = l;
        }
      }
#pragma unroll
      for (int mt = 0; mt < KSTEP; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][e] = 0.f;
      mrow = -INFINITY;
      lsum = 0.f;
    }
    advance(a, ngb, nitems, stride, flags, pre, C, wsub, W, Cf::NQ);
    cs = cs + 1 == S ? 0 : cs + 1;
  }
  cp_async_wait<0>();
}

// One CTA of 1024 threads per (query head, sequence): thread (r, d) folds the chunks s = r (mod R) of
// output element d, then the R partial sums are added in r order. Chunk maxima are in the log2 domain.
// P: the partial outputs' type: float (unnormalized) or T (normalized by their sums).
template <class T, int D, class P>
__global__ void __launch_bounds__(1024) k_merge_mma(const __grid_constant__ DecodeArgs a) {
  constexpr int R = 1024 / D;
  __shared__ float shm[R], shd[R], shn[R][D];
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x % D, r = threadIdx.x / D;
  int64_t L, start;
  decode_span(a, b, L, start);
  const int nsp = int(decode_nsplit(L - start, a.chunk_min, a.chunk_max, a.target_splits));
  if (nsp == 1) return;  // written by k_decode_mma
  const int64_t row = int64_t(b) * a.hq + h;
  T* out = static_cast<T*>(a.out) + row * D + d;
  if (nsp == 0) {
    if (r == 0) *out = convert<T>(0.f);
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // launched early (programmatic dependence): the partials
#endif
  const float* ml = a.ws_ml + row * a.nsplit * 2;
  const P* po = reinterpret_cast<const P*>(a.ws_o) + row * a.nsplit * D + d;
  float m = -INFINITY;
  for (int s = r; s < nsp; s += R) m = fmaxf(m, ml[2 * s]);
  if (d == 0) shm[r] = m;
  __syncthreads();
  float M = shm[0];
#pragma unroll
  for (int i = 1; i < R; ++i) M = fmaxf(M, shm[i]);
  if (M == -INFINITY) {  // every key masked
    if (r == 0) *out = convert<T>(0.f);
    return;
  }
  float num = 0.f, den = 0.f;
#pragma unroll 4
  for (int s = r; s < nsp; s += R) {
    const float ms = ml[2 * s];
    const float w = ms == -INFINITY ? 0.f : exp2f(ms - M), ls = ml[2 * s + 1];
    if constexpr (std::is_same_v<P, float>) {
      num = fmaf(w, po[int64_t(s) * D], num);
    } else {
      num = fmaf(w * ls, float(po[int64_t(s) * D]), num);
    }
    den = fmaf(w, ls, den);
  }
  shn[r][d] = num;
  if (d == 0) shd[r] = den;
  __syncthreads();
  if (r == 0) {
    float n = shn[0][d], dd = shd[0];
#pragma unroll
    for (int i = 1; i < R; ++i) {
      n += shn[i][d];
      dd += shd[i];
    }
    *out = convert<T>(dd > 0.f ? n / dd : 0.f);
  }
}

// MERGE: CTA mode with the in-kernel merge (merge_last) instead of k_merge_mma.
template <class T, int D, int W_ = 0, int S_ = 0, bool CI = false, bool MERGE = false>
void launch_mma(const DecodeArgs& a, cudaStream_t st) {
  using Cf = MCfg<D, W_, S_>;
  constexpr size_t smem = Cf::SMEM + (CI ? combine_bytes<D, Cf::W>() : 0);
  static_assert(smem + Cf::W * Cf::S * 4 + 4 * (kMaxDense + 1) <= 227 * 1024, "shared memory of one CTA");
  const int G = a.hq / a.hkv, ngb = (G + 7) / 8;
  const int64_t nitems = int64_t(a.nsplit) * a.B * a.hkv * ngb;
  if (nitems + int64_t(1024) * 132 * Cf::W > INT32_MAX) throw ValueError("q: too many heads x chunks");
  auto kern = k_decode_mma<T, D, W_, S_, CI>;
  // A per-device attribute: set on each call (cheap next to the launch).
  GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int nsm = sm_count();
  const unsigned grid = unsigned(std::min<int64_t>(nsm, nitems));
  const int flags = (a.variant == 5 || a.variant == 7 || a.variant == 9 ? kTPartials : 0) |
                    (a.variant == 6 || a.variant == 7 ? 0 : kBMajor) | (a.variant == 11 ? kGrouped : 0);
  int* counters = nullptr;
  if constexpr (MERGE && CI) counters = merge_counters(st, int64_t(a.B) * a.hkv * ngb);
  kern<<<grid, Cf::W * 32, smem, st>>>(a, int(nitems), flags, counters);
  GK_LAUNCH_CHECK("attention_decode_mma");
  if (counters) return;  // merged in the kernel
  // The merge kernel with programmatic dependence: its CTAs are launched while the chunks run and wait
  // (griddepcontrol.wait) for the whole chunk grid and its memory; a plain launch where that is refused.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3{unsigned(a.hq), unsigned(a.B), 1u};
  cfg.blockDim = dim3{1024u, 1u, 1u};
  cfg.dynamicSmemBytes = 0;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (a.variant == 10) return;  // timing only (bench): the chunk kernel alone, multi-chunk outputs left unset
  auto merge = flags & kTPartials ? k_merge_mma<T, D, T> : k_merge_mma<T, D, float>;
  if (cudaLaunchKernelEx(&cfg, merge, a) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it and launch plainly
    merge<<<cfg.gridDim, cfg.blockDim, 0, st>>>(a);
  }
  GK_LAUNCH_CHECK("attention_decode_mma_merge");
}
}  // namespace

bool attention_decode_mma(const DecodeArgs& a, cudaStream_t st) {
  const bool half = a.dtype == DType::bf16 || a.dtype == DType::f16;
  if (!half || a.cache_dtype != a.dtype) return false;
  if (!aligned16(a.q) || (a.q_bs * 2) % 16 || (a.q_hs * 2) % 16) return false;  // cp.async of query rows
  if (a.B > 65535 || a.nb * a.bs > int64_t(INT32_MAX)) return false;
  if (a.chunk_min % 16) return false;
  auto go = [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, bf16>) {  // tuning variants (GPUKIT_DECODE_SPLIT's 4th field), bf16 D = 128
      if (a.D == 128 && a.variant == 2) return launch_mma<T, 128, 4, 5>(a, st), true;
      if (a.D == 128 && a.variant == 3) return launch_mma<T, 128, 6, 3>(a, st), true;
      if (a.D == 128 && a.variant == 4) return launch_mma<T, 128, 12, 2>(a, st), true;
    }
    if (a.variant == 12 || a.variant == 13) {  // CTA mode with the in-kernel merge
      switch (a.D) {
        case 64: launch_mma<T, 64, 6, 6, true, true>(a, st); return true;
        case 128:
          if (a.variant == 13) launch_mma<T, 128, 6, 3, true, true>(a, st);
          else launch_mma<T, 128, 4, 5, true, true>(a, st);
          return true;
        case 256: launch_mma<T, 256, 2, 5, true, true>(a, st); return true;
        default: return false;
      }
    }
    if (a.variant == 8 || a.variant == 9) {  // CTA mode (warps share items)
      switch (a.D) {
        case 64: launch_mma<T, 64, 6, 6, true>(a, st); return true;
        case 128: launch_mma<T, 128, 4, 5, true>(a, st); return true;
        case 256: launch_mma<T, 256, 2, 5, true>(a, st); return true;
        default: return false;
      }
    }
    switch (a.D) {
      case 64: launch_mma<T, 64>(a, st); return true;
      case 128: launch_mma<T, 128>(a, st); return true;
      case 256: launch_mma<T, 256>(a, st); return true;
      default: return false;
    }
  };
  return a.dtype == DType::bf16 ? go(bf16{}) : go(f16{});
}

}  // namespace gk::cuda
