// Shared pieces of the Hopper prefill-attention kernels (attention_prefill_sm90*.cu):
// the (sequence, query tile) lookup, the per-row key ranges, and one step of
// the online softmax on a wgmma S accumulator (fp32, exp2 units).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "ops/nn_args.h"

namespace gk::cuda::sm90 {

// Run-time choices of the warp-specialized kernel (attention_prefill_sm90_ws.cu), read
// from the environment by the dispatch: prof runs the cycle-profile build of the persistent
// bf16 head_dim 128 kernel (bench / diagnosis only), hs the heads per section of the
// persistent order (0: all heads, -1: sized for L2).
struct WsTuning {
  bool prof = false;
  int hs = 0;
};

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (BF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

struct SeqTile {
  int64_t q0, k0;  // token offsets of the sequence in q / k
  int64_t Lq, Lk;
  int m0;  // first query row of the tile (sequence-relative)
};

// Finds the (sequence, query tile) of tile index y: sequences in order, each
// sequence's tiles last-first. Warp 0 scans cu_seqlens_q (a warp prefix sum per
// 32 sequences); every thread of the block must call it. false: no tile. A
// sequence with an out-of-range query range has no tiles; one with an
// out-of-range key range gets Lk = 0 (its rows are written as zeros).
template <int BM>
__device__ bool find_tile(const PrefillArgs& a, int y, SeqTile& t, int* sh) {
  if (!a.cu_q) {
    const int nblk = int((a.Tq + BM - 1) / BM);
    if (y >= nblk) return false;
    t = SeqTile{0, 0, a.Tq, a.Tk, (nblk - 1 - y) * BM};
    return true;
  }
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid < 32) {
    int found_b = -1, found_local = 0;
    int64_t run = 0;
    for (int base = 0; base < a.B; base += 32) {
      const int b = base + lane;
      int64_t cnt = 0;
      if (b < a.B) {
        const int64_t q0 = a.cu_q[b], q1 = a.cu_q[b + 1];
        if (q0 >= 0 && q1 >= q0 && q1 <= a.Tq) cnt = (q1 - q0 + BM - 1) / BM;
      }
      int64_t incl = cnt;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int64_t lo = run + incl - cnt, hi = run + incl;
      const unsigned hit = __ballot_sync(0xffffffffu, y >= lo && y < hi);
      if (hit) {
        const int src = __ffs(hit) - 1;
        found_b = base + src;
        found_local = int(y - __shfl_sync(0xffffffffu, lo, src));
        break;
      }
      run += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      sh[0] = found_b;
      sh[1] = found_local;
    }
  }
  __syncthreads();
  const int b = sh[0], local = sh[1];
  if (b < 0) return false;
  const int64_t q0 = a.cu_q[b], q1 = a.cu_q[b + 1], k0 = a.cu_k[b], k1 = a.cu_k[b + 1];
  const bool kv_ok = k0 >= 0 && k1 >= k0 && k1 <= a.Tk;
  const int nblk = int((q1 - q0 + BM - 1) / BM);
  t = SeqTile{q0, kv_ok ? k0 : 0, q1 - q0, kv_ok ? k1 - k0 : 0, (nblk - 1 - local) * BM};
  return true;
}

// Key range [lo, hi) of sequence-relative query row i (see prefill_range),
// clamped to [0, Lk] (empty when hi <= lo). Lk < 2^31 (checked at launch).
struct RowRange {
  int64_t off, Lk, window;
  bool causal;
  __device__ int hi(int64_t i) const {
    const int64_t h = causal ? min(i + off + 1, Lk) : Lk;
    return int(max(h, int64_t(0)));
  }
  __device__ int lo(int64_t i) const {
    const int64_t l = window > 0 ? max(i + off - window + 1, int64_t(0)) : int64_t(0);
    return int(min(l, Lk));
  }
};

// Softmax parameters: logits become log2-scaled (x * scale * log2 e), or
// softcap * tanh(x * scale / softcap) * log2 e with a soft-cap.
struct SoftmaxParams {
  bool cap;
  float sc, cap_l2e;
  __device__ explicit SoftmaxParams(const PrefillArgs& a) {
    const float l2e = 1.4426950408889634f;
    cap = a.softcap > 0.f;
    sc = cap ? a.scale / a.softcap : a.scale * l2e;
    cap_l2e = a.softcap * l2e;
  }
};

// t[0] = max of t[0 .. N) by halving (unrolled; N known at compile time).
template <int N, int M>
__device__ __forceinline__ void fold_max(float (&t)[M]) {
  if constexpr (N > 1) {
    constexpr int H = (N + 1) / 2;
#pragma unroll
    for (int k = 0; k + H < N; ++k) t[k] = fmaxf(t[k], t[k + H]);
    fold_max<H>(t);
  }
}

// Running max / sum of this thread's two rows (row and row + 8 of the fragment).
struct RowState {
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
};

// One online-softmax step on the S accumulator p of a 64 x BN tile: masks (MASK)
// keys outside [lo, hi) of each row (tile-relative: row r0 uses lo0/hi0, row
// r0 + 8 lo1/hi1), scales and caps, turns p into exp2(x - new max) and returns
// the rescale factors of the old state. MODE 0: scale > 0, no cap (the scale is
// folded into the exponent's FMA); 1: any scale, no cap; 2: soft-cap.
// STALE: the running maximum m of a row is raised only when the tile's maximum exceeds it by
// more than kStaleLog2 (log2 units), so that O and l are rescaled (al != 1) only on such jumps;
// otherwise exponentials are taken against the older, smaller m and P may reach 2^kStaleLog2
// (bf16 / fp16 keep their relative precision; O, l stay in fp32). Depends only on the row's
// own scores: deterministic, and the result is the same softmax up to rounding.
constexpr float kStaleLog2 = 8.f;
template <int BN, int MODE, bool MASK, bool STALE = false>
__device__ __forceinline__ void softmax_step_t(float (&p)[BN / 2], RowState& st, const SoftmaxParams& sp, int cq,
                                               int lo0, int hi0, int lo1, int hi1, float& al0, float& al1) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) {
    float x = p[i];
    if constexpr (MODE == 2) x = sp.cap_l2e * tanhf(x * sp.sc);
    else if constexpr (MODE == 1) x *= sp.sc;
    if constexpr (MASK) {
      const int j = 8 * (i / 4) + cq + (i & 1);
      const bool second = (i & 2) != 0;
      if (j < (second ? lo1 : lo0) || j >= (second ? hi1 : hi0)) x = -INFINITY;
    }
    p[i] = x;
  }
  // Row maxima as a tree (depth log2(BN / 8) + 1 instead of a chain of BN / 8): the
  // exponentials wait for them. (Same value in any order.)
  float t0[BN / 8], t1[BN / 8];
#pragma unroll
  for (int k = 0; k < BN / 8; ++k) {
    t0[k] = fmaxf(p[4 * k], p[4 * k + 1]);
    t1[k] = fmaxf(p[4 * k + 2], p[4 * k + 3]);
  }
  fold_max<BN / 8>(t0);
  fold_max<BN / 8>(t1);
  float mx0 = t0[0], mx1 = t1[0];
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
  }
  if constexpr (MODE == 0) {  // raw maxima: the scaled maximum is max * scale (scale > 0)
    mx0 *= sp.sc;
    mx1 *= sp.sc;
  }
  float mn0, mn1, mu0, mu1;
  if constexpr (STALE) {
    // (st.m = -inf: raised by any finite maximum; al = 0 then, and O, l are still 0.)
    const bool up0 = mx0 > st.m0 + kStaleLog2, up1 = mx1 > st.m1 + kStaleLog2;
    mn0 = up0 ? mx0 : st.m0;
    mn1 = up1 ? mx1 : st.m1;
    mu0 = mn0 == -INFINITY ? 0.f : mn0;
    mu1 = mn1 == -INFINITY ? 0.f : mn1;
    al0 = up0 ? ex2(st.m0 - mu0) : 1.f;
    al1 = up1 ? ex2(st.m1 - mu1) : 1.f;
  } else {
    mn0 = fmaxf(st.m0, mx0);
    mn1 = fmaxf(st.m1, mx1);
    mu0 = mn0 == -INFINITY ? 0.f : mn0;
    mu1 = mn1 == -INFINITY ? 0.f : mn1;
    al0 = ex2(st.m0 - mu0);
    al1 = ex2(st.m1 - mu1);
  }
  st.m0 = mn0;
  st.m1 = mn1;
  const float f = MODE == 0 ? sp.sc : 1.f;
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int i = 0; i < BN / 2; i += 4) {
    p[i] = ex2(fmaf(p[i], f, -mu0));
    p[i + 1] = ex2(fmaf(p[i + 1], f, -mu0));
    p[i + 2] = ex2(fmaf(p[i + 2], f, -mu1));
    p[i + 3] = ex2(fmaf(p[i + 3], f, -mu1));
    s0 += p[i] + p[i + 1];
    s1 += p[i + 2] + p[i + 3];
  }
  st.l0 = st.l0 * al0 + s0;
  st.l1 = st.l1 * al1 + s1;
}

// softmax_step_t for the key tile starting at key j0: masks only when the tile
// crosses a key-range edge of the CTA's rows (need_mask), with the thread's row
// ranges [lo0, hi0), [lo1, hi1) (keys of the sequence, clamped to [0, Lk]).
template <int BN, bool ST = false>
__device__ __forceinline__ void softmax_step(float (&p)[BN / 2], RowState& st, const SoftmaxParams& sp,
                                             bool need_mask, int j0, int cq, int lo0, int hi0, int lo1, int hi1,
                                             float& al0, float& al1) {
  auto rel = [&](int x) { return min(max(x - j0, -1), BN + 1); };
  const int l0 = rel(lo0), h0 = rel(hi0), l1 = rel(lo1), h1 = rel(hi1);
  const int mode = sp.cap ? 2 : (sp.sc > 0.f ? 0 : 1);
  if (mode == 0) {
    if (need_mask) softmax_step_t<BN, 0, true, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
    else softmax_step_t<BN, 0, false, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
  } else if (mode == 1) {
    if (need_mask) softmax_step_t<BN, 1, true, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
    else softmax_step_t<BN, 1, false, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
  } else {
    if (need_mask) softmax_step_t<BN, 2, true, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
    else softmax_step_t<BN, 2, false, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
  }
}

// Speculative online-softmax step under the STALE rule, for unmasked tiles with a positive scale and
// no soft-cap (softmax_step_t MODE 0): exponentials against each row's current maximum m (finite),
// written straight into the A fragments pa of P, with their fp32 row sums; the tile's row maxima are
// taken alongside instead of before. true: no row of the warp exceeds m + kStaleLog2 (m and O stay,
// the factors are 1, l gets the sums). false: some row does, or some m is still -inf; nothing has
// changed in st and p holds the scores: the caller runs softmax_step_t<.., STALE> and to_a_frags,
// which give each row the values it would have had here when its maximum did not jump.
template <int BN, bool BF16>
__device__ __forceinline__ bool softmax_spec(const float (&p)[BN / 2], RowState& st, const SoftmaxParams& sp,
                                             uint32_t (&pa)[BN / 16][4]) {
  if (__any_sync(0xffffffffu, st.m0 == -INFINITY || st.m1 == -INFINITY)) return false;
  const float f = sp.sc, mu0 = st.m0, mu1 = st.m1;
  float t0[BN / 8], t1[BN / 8];
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int j = 0; j < BN / 16; ++j) {
    // k16 step j: p[8 j .. 8 j + 7] = (row, col 2c..), (row + 8, ..), (row, col + 8 ..), (row + 8, ..)
    float e[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) e[r] = ex2(fmaf(p[8 * j + r], f, (r & 2) ? -mu1 : -mu0));
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[j][r] = pack2<BF16>(e[2 * r], e[2 * r + 1]);
    s0 += e[0] + e[1];  // (the order of softmax_step_t: same sums, same bits)
    s1 += e[2] + e[3];
    s0 += e[4] + e[5];
    s1 += e[6] + e[7];
    t0[2 * j] = fmaxf(p[8 * j], p[8 * j + 1]);
    t0[2 * j + 1] = fmaxf(p[8 * j + 4], p[8 * j + 5]);
    t1[2 * j] = fmaxf(p[8 * j + 2], p[8 * j + 3]);
    t1[2 * j + 1] = fmaxf(p[8 * j + 6], p[8 * j + 7]);
  }
  fold_max<BN / 8>(t0);
  fold_max<BN / 8>(t1);
  float mx0 = t0[0], mx1 = t1[0];
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
  }
  if (__any_sync(0xffffffffu, mx0 * f > mu0 + kStaleLog2 || mx1 * f > mu1 + kStaleLog2)) return false;
  st.l0 += s0;
  st.l1 += s1;
  return true;
}

template <int N>
__device__ __forceinline__ void rescale(float (&o)[N], float al0, float al1) {
#pragma unroll
  for (int i = 0; i < N; i += 4) {
    o[i] *= al0;
    o[i + 1] *= al0;
    o[i + 2] *= al1;
    o[i + 3] *= al1;
  }
}

// P (fp32 accumulator layout) -> register A fragments of BN / 16 k16 steps.
template <int BN, bool BF16>
__device__ __forceinline__ void to_a_frags(const float (&p)[BN / 2], uint32_t (&pa)[BN / 16][4]) {
#pragma unroll
  for (int j = 0; j < BN / 16; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[j][r] = pack2<BF16>(p[8 * j + 2 * r], p[8 * j + 2 * r + 1]);
  }
}

// Writes O / l for this thread's rows r0, r1 (< Lq) of a 64 x D fragment.
template <int D, bool BF16>
__device__ __forceinline__ void store_rows(const float (&o)[D / 2], RowState st, uint16_t* og, int64_t ors, int64_t r0,
                                           int64_t Lq, int cq) {
#pragma unroll
  for (int w = 1; w < 4; w <<= 1) {
    st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, w);
    st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, w);
  }
  const float inv0 = st.l0 > 0.f ? 1.f / st.l0 : 0.f, inv1 = st.l1 > 0.f ? 1.f / st.l1 : 0.f;
  const int64_t r1 = r0 + 8;
#pragma unroll
  for (int i = 0; i < D / 2; i += 4) {
    const int col = 8 * (i / 4) + cq;
    if (r0 < Lq) *reinterpret_cast<uint32_t*>(og + r0 * ors + col) = pack2<BF16>(o[i] * inv0, o[i + 1] * inv0);
    if (r1 < Lq) *reinterpret_cast<uint32_t*>(og + r1 * ors + col) = pack2<BF16>(o[i + 2] * inv1, o[i + 3] * inv1);
  }
}

}  // namespace gk::cuda::sm90
