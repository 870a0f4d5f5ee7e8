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
// from the environment by the dispatch: opt selects a timing experiment (0: none),
// hs the heads per section of the persistent order (0: all heads, -1: sized for L2),
// bn the keys per tile of the persistent bf16 head_dim 128 kernel (0: default 128).
struct WsTuning {
  int opt = 0;
  int hs = 0;
  int bn = 0;
};

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x for x <= 0 on the FMA and integer pipes (no MUFU): x = n + f with n = round(x),
// f in [-0.5, 0.5]; 2^f by a cubic (relative error 1.1e-4, far below the bf16 / fp16 rounding
// of P); n added to the exponent. x is clamped to -125 (2^-125 for smaller x: not 0).
__device__ __forceinline__ float ex2_poly(float x) {
  x = fmaxf(x, -125.f);
  const float t = x + 12582912.f;  // 1.5 * 2^23: round(x) lands in the low mantissa bits
  const float f = x - (t - 12582912.f);
  float y = fmaf(0.05592203512787819f, f, 0.24264007806777954f);
  y = fmaf(y, f, 0.6931210160255432f);
  y = fmaf(y, f, 0.9999244809150696f);
  return __int_as_float(__float_as_int(y) + (__float_as_int(t) << 23));
}

// mbarrier wait that sleeps in try_wait (suspend-time hint, ns) instead of spinning; gives up
// after about 2^20 tries, like mbar_wait (tma.cuh) does after 2^25 spins.
__device__ __forceinline__ void mbar_wait_sleep(uint32_t bar, uint32_t parity) {
  for (int tries = 0; tries < (1 << 20); ++tries) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity), "r"(1000000u)
        : "memory");
    if (done) return;
  }
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
// folded into the exponent's FMA); 1: any scale, no cap; 2: soft-cap. TRUNC (bf16 P):
// p is cut to its upper 16 bits (a bf16 value, rounded toward 0) before the row sum, so
// that to_a_frags<.., TRUNC> packs it with one byte permute and the sum l matches the P
// the product uses (per-weight error within one bf16 unit, like rounding).
// STALE: the running maximum m of a row is raised only when the tile's maximum exceeds it by
// more than kStaleLog2 (log2 units), so that O and l are rescaled (al != 1) only on such jumps;
// otherwise exponentials are taken against the older, smaller m and P may reach 2^kStaleLog2
// (bf16 / fp16 keep their relative precision; O, l stay in fp32). Depends only on the row's
// own scores: deterministic, and the result is the same softmax up to rounding.
constexpr float kStaleLog2 = 8.f;
template <int BN, int MODE, bool MASK, bool POLY = false, bool TRUNC = false, bool CHAINMAX = false, bool STALE = false>
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
  if constexpr (CHAINMAX) {  // (the previous form, kept for timing comparisons)
#pragma unroll
    for (int k = 1; k < BN / 8; ++k) {
      t0[0] = fmaxf(t0[0], t0[k]);
      t1[0] = fmaxf(t1[0], t1[k]);
    }
  } else {
    fold_max<BN / 8>(t0);
    fold_max<BN / 8>(t1);
  }
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
    // POLY (unmasked tiles only, so masked keys still get exactly 0): a quarter of the
    // exponentials on the FMA pipe, to unload the MUFU pipe.
    constexpr bool kPoly = POLY && !MASK;
    const bool poly = kPoly && ((i / 4) & 1);
    p[i] = ex2(fmaf(p[i], f, -mu0));
    p[i + 1] = poly ? ex2_poly(fmaf(p[i + 1], f, -mu0)) : ex2(fmaf(p[i + 1], f, -mu0));
    p[i + 2] = ex2(fmaf(p[i + 2], f, -mu1));
    p[i + 3] = poly ? ex2_poly(fmaf(p[i + 3], f, -mu1)) : ex2(fmaf(p[i + 3], f, -mu1));
    if constexpr (TRUNC) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[i + e] = __uint_as_float(__float_as_uint(p[i + e]) & 0xFFFF0000u);
    }
    s0 += p[i] + p[i + 1];
    s1 += p[i + 2] + p[i + 3];
  }
  st.l0 = st.l0 * al0 + s0;
  st.l1 = st.l1 * al1 + s1;
}

// softmax_step_t for the key tile starting at key j0: masks only when the tile
// crosses a key-range edge of the CTA's rows (need_mask), with the thread's row
// ranges [lo0, hi0), [lo1, hi1) (keys of the sequence, clamped to [0, Lk]).
template <int BN, bool POLY = false, bool TRUNC = false, bool CM = false, bool ST = false>
__device__ __forceinline__ void softmax_step(float (&p)[BN / 2], RowState& st, const SoftmaxParams& sp,
                                             bool need_mask, int j0, int cq, int lo0, int hi0, int lo1, int hi1,
                                             float& al0, float& al1) {
  auto rel = [&](int x) { return min(max(x - j0, -1), BN + 1); };
  const int l0 = rel(lo0), h0 = rel(hi0), l1 = rel(lo1), h1 = rel(hi1);
  const int mode = sp.cap ? 2 : (sp.sc > 0.f ? 0 : 1);
  if (mode == 0) {
    if (need_mask) softmax_step_t<BN, 0, true, false, TRUNC, CM, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
    else softmax_step_t<BN, 0, false, POLY, TRUNC, CM, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
  } else if (mode == 1) {
    if (need_mask) softmax_step_t<BN, 1, true, false, TRUNC, CM, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
    else softmax_step_t<BN, 1, false, false, TRUNC, CM, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
  } else {
    if (need_mask) softmax_step_t<BN, 2, true, false, TRUNC, CM, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
    else softmax_step_t<BN, 2, false, false, TRUNC, CM, ST>(p, st, sp, cq, l0, h0, l1, h1, al0, al1);
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

// P (fp32 accumulator layout) -> register A fragments of BN / 16 k16 steps. TRUNC (bf16,
// p already cut to bf16 values by softmax_step<.., TRUNC>): the upper halves, one byte permute.
template <int BN, bool BF16, bool TRUNC = false>
__device__ __forceinline__ void to_a_frags(const float (&p)[BN / 2], uint32_t (&pa)[BN / 16][4]) {
  static_assert(!TRUNC || BF16, "truncated P is bf16 only");
#pragma unroll
  for (int j = 0; j < BN / 16; ++j) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float lo = p[8 * j + 2 * r], hi = p[8 * j + 2 * r + 1];
      if constexpr (TRUNC) pa[j][r] = __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
      else pa[j][r] = pack2<BF16>(lo, hi);
    }
  }
}

// D (64 x N, fp32) (+)= A (64 x 16, registers) * B (16 x N, smem, K-major): S = Q K^T with the Q
// fragments held in registers (one wgmma variant of the prefill kernel; N = 128 only).
template <int N, bool BF16>
__device__ __forceinline__ void mma_rs_k(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int acc);
template <>
__device__ __forceinline__ void mma_rs_k<128, true>(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

template <>
__device__ __forceinline__ void mma_rs_k<128, false>(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

// The register A fragments of one k16 step of a 64-row block of a 128-byte-swizzled tile (rows of
// 128 bytes per 64-column block, blocks `block_bytes` apart): ldmatrix.x4 of the warp's 16 rows,
// columns 16 kk .. 16 kk + 15. Lane i addresses row 16 w + 8 (j & 1) + i % 8 of matrix j = i / 8,
// column chunk 2 (kk % 4) + (j >> 1) (16 bytes), XOR-swizzled with the row.
__device__ __forceinline__ void load_a_frag(uint32_t (&a)[4], uint32_t tile, int block_bytes, int kk, int warp,
                                            int lane) {
  const int j = lane >> 3, row = 16 * warp + 8 * (j & 1) + (lane & 7);
  const int chunk = (2 * (kk & 3) + (j >> 1)) ^ (row & 7);
  const uint32_t at = tile + uint32_t((kk >> 2) * block_bytes + row * 128 + chunk * 16);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(at)
               : "memory");
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
