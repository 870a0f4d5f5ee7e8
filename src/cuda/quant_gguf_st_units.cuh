// The decode side of the staged GGUF kernel (src/cuda/quant_gguf_st.cu): the unit and stage
// layouts of each format and the decode of one unit of 16 rows from shared memory into the
// mma accumulators (included by quant_gguf_st.cu only).
#pragma once
#include <type_traits>

#include "common/gemv_stage.cuh"
#include "ops/gguf_blocks.h"
#include "ops/quant_args.h"

namespace gk::cuda::gguf_st {

using namespace gemv_detail;

// UB / UW: bytes / weights of a unit; U: units per stage; D: default ring depth (2: H200, session 5
// checkpoint A, M = 1, % of copy at (K, N) = (4096, 14336) / (14336, 4096) / (4096, 128256) with 2
// stages against 3: Q8_0 62 / 62 / 79 against 60 / 60 / 78, Q4_0 54 / 52 / 78 against 49 / 49 / 71,
// Q4_1 49 / 49 / 74 against 48 / 49 / 65, Q4_K 44 / 43 / 61 against 41 / 42 / 51, Q6_K 52 / 52 / 69
// against 44 / 46 / 58: half the shared memory per warp, more warps resident, more room for L1).
template <int F>
struct GS;
template <>
struct GS<int(QFormat::q4_0)> {
  static constexpr int BB = gguf::kQ4_0Bytes, UB = 8 * BB, UW = 256, U = 2, D = 2;
};
template <>
struct GS<int(QFormat::q4_1)> {
  static constexpr int BB = gguf::kQ4_1Bytes, UB = 8 * BB, UW = 256, U = 2, D = 2;
};
template <>
struct GS<int(QFormat::q8_0)> {
  static constexpr int BB = gguf::kQ8_0Bytes, UB = 8 * BB, UW = 256, U = 1, D = 2;
};
template <>
struct GS<int(QFormat::q4_k)> {
  static constexpr int BB = gguf::kQ4_KBytes, UB = BB, UW = 256, U = 2, D = 2;
};
template <>
struct GS<int(QFormat::q6_k)> {  // 420-byte units: phases 0, 4, 8, 12; 27 chunks cover any of them
  static constexpr int BB = gguf::kQ6_KBytes, UB = 2 * BB, UW = 512, U = 1, D = 2;
};
template <int F>
constexpr bool kPhased = GS<F>::UB % 16 != 0;

// The stage layout with UX times the units: U units per stage, NC 16-byte chunks copied per
// row and stage at most (phased units: up to 12 bytes of phase more), P the shared row pitch
// (P % 32 == 16: rows g = 0..7 at 8 distinct 16-byte bank groups).
// UX 0 (session 6): half the units (Q4_0 / Q4_1 / Q4_K: one unit per stage; the others keep one).
template <int F, int UX>
struct GL {
  static constexpr int U = UX == 0 ? (GS<F>::U > 1 ? GS<F>::U / 2 : 1) : GS<F>::U * UX;
  static constexpr int NC = kPhased<F> ? (U * GS<F>::UB + 12 + 15) / 16 : U * GS<F>::UB / 16;
  static constexpr int P = NC * 16 % 32 == 16 ? NC * 16 : NC * 16 + 16;
};

// 4 bytes at shared address a (a % 4 == 2 when ODD, else 0; known at compile time).
template <bool ODD>
__device__ __forceinline__ uint32_t ld4(uint32_t a) {
  if constexpr (ODD) return __byte_perm(lds_u16(a), lds_u16(a + 2), 0x5410u);
  else return lds_u32(a);
}

// PI (session 6): byte permutes with the selector as an immediate and the second source (the
// magic exponent bytes, 0x4B000000) in a register that ptxas cannot constant-fold (k_ggst makes
// them from a kernel argument). ptxas otherwise folds the magic into the immediate slot and keeps
// every selector in a register of its own; with many selectors live (Q4_K) it re-materialised them
// from uniform registers before each permute (~62 moves per Q4_K block: 13% of its instructions).
// Same values: the same bits. Caveat (session 8 prep SASS): with bf16 x the magic is 0x43434343, whose
// bytes already have bit 0 set, so or-ing p.m >> 31 into it changes nothing and ptxas folds it all the
// same (the permutes then show selectors in registers and the magic as the immediate); k_ggst_aw2's
// kOptOpq ors the bit into bit 3 instead (clear in 0x43 and 0x64).
template <bool PI, uint32_t SEL>
__device__ __forceinline__ uint32_t bpm(uint32_t a, uint32_t b) {
  if constexpr (PI) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "n"(SEL));
    return d;
  } else {
    return __byte_perm(a, b, SEL);
  }
}

// d * b for the 4 bytes of v (each 0..255), as fma(d, 2^23 + b, -d 2^23): exact product, one rounding.
__device__ __forceinline__ void scale4(uint32_t v, float d, float dneg, float* o) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = uint32_t(i) | (4u << 4) | (4u << 8) | (7u << 12);
    o[i] = fmaf(d, __uint_as_float(__byte_perm(v, 0x4B000000u, sel)), dneg);
  }
}

// The four int8 codes of u as two exact bf16 pairs (codes 0, 1 in lo; 2, 3 in hi) without fp32:
// q = low7 - 128 s = (128 + low7) - (128 + 128 s), both terms exact bf16 (magic 0x43 above the
// byte low7, resp. above the byte 0x80 s), their difference exact (an integer of 8 bits).
template <bool PI = false>
__device__ __forceinline__ void int8x4_bf16(uint32_t u, uint32_t magic, uint32_t& lo, uint32_t& hi) {
  const uint32_t l7 = u & 0x7f7f7f7fu, sg = u & 0x80808080u;
  lo = hsub2u<bf16>(bpm<PI, 0x4140u>(l7, magic), bpm<PI, 0x4140u>(sg, magic));
  hi = hsub2u<bf16>(bpm<PI, 0x4342u>(l7, magic), bpm<PI, 0x4342u>(sg, magic));
}

// The int8 codes of u as exact fp16 pairs (as int8_pair<f16>: (1024 + 128 + b) - 1152).
template <bool PI>
__device__ __forceinline__ void int8x4_f16(uint32_t u, uint32_t magic, uint32_t& lo, uint32_t& hi) {
  const uint32_t v = u ^ 0x80808080u;
  lo = hsub2u<f16>(bpm<PI, 0x4140u>(v, magic), 0x64806480u);
  hi = hsub2u<f16>(bpm<PI, 0x4342u>(v, magic), 0x64806480u);
}

// One unit of a 32-weight format: rows g (shared address a) and g + 8 (b), x of row g at the
// unit's first weight + 4t (xj), lane t. acc: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
// B8 (Q8_0, bf16 x): the codes through int8x4_bf16 instead of fp32. PI: bpm's register magic.
// FOLD (Q4_1, bf16 x; session 6): the codes enter the mma as 128 + q (one permute, no packed
// subtraction); the 128 sum(x) this adds is taken out with the min term: d sum((128 + q) x) +
// (m - 128 d) sum(x). Not the default's bits (the sums are larger before the correction: the
// tests' bound has 143 d + |m| per block).
// XR (session 7, k_ggst_aw2): x already in registers, xr[2 bk] / xr[2 bk + 1] the two loads of block bk
// (loaded before the wait for the unit's copies); otherwise (xr null) loaded here as before.
template <class T, int F, bool B8 = false, bool PI = false, bool FOLD = false, bool XR = false>
__device__ __forceinline__ void unit32(uint32_t a, uint32_t b, const T* xj, int t, uint32_t magic, float (&acc)[4],
                                       const uint2* xr = nullptr) {
  constexpr int BB = GS<F>::BB;
  constexpr bool kQ8 = F == int(QFormat::q8_0), kMin = F == int(QFormat::q4_1);
  constexpr bool kFold = FOLD && kMin && std::is_same_v<T, bf16>;
  constexpr int QOFF = kMin ? 4 : 2;
  constexpr uint32_t kSub4 = kMin ? (std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u)
                                  : (std::is_same_v<T, bf16> ? 0x43084308u : 0x64086408u);
  const uint32_t ones = splat<T>(1.0f);
#pragma unroll
  for (int bk = 0; bk < 8; ++bk) {
    const uint2 x0 = XR ? xr[2 * bk] : __ldg(reinterpret_cast<const uint2*>(xj + 32 * bk));
    const uint2 x1 = XR ? xr[2 * bk + 1] : __ldg(reinterpret_cast<const uint2*>(xj + 32 * bk + 16));
    const uint32_t ba = a + uint32_t(bk * BB), bb = b + uint32_t(bk * BB);
    uint32_t a0[4], a1[4];
    const bool odd = ((bk * BB + QOFF) & 2) != 0;
    if constexpr (kQ8) {
      uint32_t ua0, ua1, ub0, ub1;
      if (odd) {
        ua0 = ld4<true>(ba + QOFF + 4 * t), ua1 = ld4<true>(ba + QOFF + 16 + 4 * t);
        ub0 = ld4<true>(bb + QOFF + 4 * t), ub1 = ld4<true>(bb + QOFF + 16 + 4 * t);
      } else {
        ua0 = ld4<false>(ba + QOFF + 4 * t), ua1 = ld4<false>(ba + QOFF + 16 + 4 * t);
        ub0 = ld4<false>(bb + QOFF + 4 * t), ub1 = ld4<false>(bb + QOFF + 16 + 4 * t);
      }
      if constexpr (B8 && std::is_same_v<T, bf16>) {
        int8x4_bf16<PI>(ua0, magic, a0[0], a0[2]);
        int8x4_bf16<PI>(ub0, magic, a0[1], a0[3]);
        int8x4_bf16<PI>(ua1, magic, a1[0], a1[2]);
        int8x4_bf16<PI>(ub1, magic, a1[1], a1[3]);
      } else if constexpr (PI && std::is_same_v<T, f16>) {
        int8x4_f16<PI>(ua0, magic, a0[0], a0[2]);
        int8x4_f16<PI>(ub0, magic, a0[1], a0[3]);
        int8x4_f16<PI>(ua1, magic, a1[0], a1[2]);
        int8x4_f16<PI>(ub1, magic, a1[1], a1[3]);
      } else {
        a0[0] = int8_pair<T>(ua0, 0);
        a0[1] = int8_pair<T>(ub0, 0);
        a0[2] = int8_pair<T>(ua0, 2);
        a0[3] = int8_pair<T>(ub0, 2);
        a1[0] = int8_pair<T>(ua1, 0);
        a1[1] = int8_pair<T>(ub1, 0);
        a1[2] = int8_pair<T>(ua1, 2);
        a1[3] = int8_pair<T>(ub1, 2);
      }
    } else {
      uint32_t ua, ub;
      if (odd) {
        ua = ld4<true>(ba + QOFF + 4 * t);
        ub = ld4<true>(bb + QOFF + 4 * t);
      } else {
        ua = ld4<false>(ba + QOFF + 4 * t);
        ub = ld4<false>(bb + QOFF + 4 * t);
      }
      const uint32_t La = ua & 0x0f0f0f0fu, Ha = (ua >> 4) & 0x0f0f0f0fu;
      const uint32_t Lb = ub & 0x0f0f0f0fu, Hb = (ub >> 4) & 0x0f0f0f0fu;
      if constexpr (kFold) {
        a0[0] = bpm<PI, 0x4140u>(La, magic);
        a0[1] = bpm<PI, 0x4140u>(Lb, magic);
        a0[2] = bpm<PI, 0x4342u>(La, magic);
        a0[3] = bpm<PI, 0x4342u>(Lb, magic);
        a1[0] = bpm<PI, 0x4140u>(Ha, magic);
        a1[1] = bpm<PI, 0x4140u>(Hb, magic);
        a1[2] = bpm<PI, 0x4342u>(Ha, magic);
        a1[3] = bpm<PI, 0x4342u>(Hb, magic);
      } else {
        a0[0] = hsub2u<T>(bpm<PI, 0x4140u>(La, magic), kSub4);
        a0[1] = hsub2u<T>(bpm<PI, 0x4140u>(Lb, magic), kSub4);
        a0[2] = hsub2u<T>(bpm<PI, 0x4342u>(La, magic), kSub4);
        a0[3] = hsub2u<T>(bpm<PI, 0x4342u>(Lb, magic), kSub4);
        a1[0] = hsub2u<T>(bpm<PI, 0x4140u>(Ha, magic), kSub4);
        a1[1] = hsub2u<T>(bpm<PI, 0x4140u>(Hb, magic), kSub4);
        a1[2] = hsub2u<T>(bpm<PI, 0x4342u>(Ha, magic), kSub4);
        a1[3] = hsub2u<T>(bpm<PI, 0x4342u>(Hb, magic), kSub4);
      }
    }
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma16816<T>(c, a0, x0.x, x0.y);
    mma16816<T>(c, a1, x1.x, x1.y);
    float da, db;
    if constexpr (kMin) {  // d, m: one aligned 4-byte load (20-byte blocks)
      float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const uint32_t o[4] = {ones, ones, ones, ones};
      mma16816<T>(xs, o, x0.x, x0.y);
      mma16816<T>(xs, o, x1.x, x1.y);
      const uint32_t hva = lds_u32(ba), hvb = lds_u32(bb);
      da = f16f(hva & 0xffffu), db = f16f(hvb & 0xffffu);
      float ma = f16f(hva >> 16), mb = f16f(hvb >> 16);
      if constexpr (kFold) {
        ma = fmaf(da, -128.0f, ma);
        mb = fmaf(db, -128.0f, mb);
      }
      acc[0] = fmaf(ma, xs[0], fmaf(da, c[0], acc[0]));
      acc[1] = fmaf(ma, xs[1], fmaf(da, c[1], acc[1]));
      acc[2] = fmaf(mb, xs[2], fmaf(db, c[2], acc[2]));
      acc[3] = fmaf(mb, xs[3], fmaf(db, c[3], acc[3]));
    } else {
      da = f16f(lds_u16(ba)), db = f16f(lds_u16(bb));
      acc[0] = fmaf(da, c[0], acc[0]);
      acc[1] = fmaf(da, c[1], acc[1]);
      acc[2] = fmaf(db, c[2], acc[2]);
      acc[3] = fmaf(db, c[3], acc[3]);
    }
  }
}

// The end of k_ggst / k_ggst_aw2 / k_ggst_aw6: the warps' sums of the CTA (acc of lane (g, t): rows row0 + g (+ 8),
// columns 2t, 2t + 1) added in warp order through red ([nw][32][4] floats of the kernel's shared memory, free by
// then), stored by warp 0 (split-K: its slice's partial sums); the kernel returns after it.
__device__ __forceinline__ void warp_sums_out(const QGemvArgs& p, const float (&acc)[4], float* red, int warp, int lane,
                                              int nw, int g, int t, int64_t row0) {
  const int S = gridDim.y, sl = blockIdx.y;
  cta_sums4_put(red, acc, warp, lane, nw);
  if (warp != 0) return;
  float4 ws = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (nw > 1) ws = warps_sum4(red + lane * 4, 32 * 4, nw);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v = acc[e];
    if (nw > 1) v = f4_get(ws, e);
    const int m = 2 * t + (e & 1);
    const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
    if (m < p.m && row < p.n) {
      if (p.xinv) v *= __ldg(p.xinv + m);  // 2^-c_m of the scaled fp16 copy of bf16 x: exact
      if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
      else p.part[(int64_t(sl) * p.m + m) * p.n + row] = v;
    }
  }
}

// The code words of chunk c of a Q4_K block's pair of rows (at a / b) that lane t takes:
// w[row][step] at 16 + 32c + 4t and + 16.
__device__ __forceinline__ void q4k_words(uint32_t a, uint32_t b, int c, int t, uint32_t (&w)[2][2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t ad = (r ? b : a) + uint32_t(16 + 32 * c + 4 * t);
    w[r][0] = lds_u32(ad);
    w[r][1] = lds_u32(ad + 16);
  }
}

// Sub-block sb = 2c + hi of a Q4_K block's pair of rows (unit_q4k, unit_q4k_ss; w: the lane's
// code words of chunk c, [row][step]): xs = the mma of x with ones (the sums of x), cc = the mma
// of x with the codes (q + magic - kM0: q exactly).
template <class T>
__device__ __forceinline__ void q4k_sub_mma_s5(const uint32_t (&w)[2][2], int c, int hi, const T* xj, uint32_t ones,
                                               uint32_t magic, float (&xs)[4], float (&cc)[4]) {
  constexpr uint32_t kM0 = std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u;  // magic: q
  const int sb = 2 * c + hi;
  const uint2 x0 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * sb));
  const uint2 x1 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * sb + 16));
  const uint32_t o4[4] = {ones, ones, ones, ones};
  mma16816<T>(xs, o4, x0.x, x0.y);
  mma16816<T>(xs, o4, x1.x, x1.y);
  uint32_t v[2][2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < 2; ++k) v[r][k] = (hi ? (w[r][k] >> 4) : w[r][k]) & 0x0f0f0f0fu;
  const uint32_t A0[4] = {hsub2u<T>(__byte_perm(v[0][0], magic, 0x4140u), kM0),
                          hsub2u<T>(__byte_perm(v[1][0], magic, 0x4140u), kM0),
                          hsub2u<T>(__byte_perm(v[0][0], magic, 0x4342u), kM0),
                          hsub2u<T>(__byte_perm(v[1][0], magic, 0x4342u), kM0)};
  const uint32_t A1[4] = {hsub2u<T>(__byte_perm(v[0][1], magic, 0x4140u), kM0),
                          hsub2u<T>(__byte_perm(v[1][1], magic, 0x4140u), kM0),
                          hsub2u<T>(__byte_perm(v[0][1], magic, 0x4342u), kM0),
                          hsub2u<T>(__byte_perm(v[1][1], magic, 0x4342u), kM0)};
  mma16816<T>(cc, A0, x0.x, x0.y);
  mma16816<T>(cc, A1, x1.x, x1.y);
}

// One Q4_K block (144 bytes at a / b, 16-byte aligned).
template <class T>
__device__ __forceinline__ void unit_q4k(uint32_t a, uint32_t b, const T* xj, int t, uint32_t magic, float (&acc)[4]) {
  const uint32_t ones = splat<T>(1.0f);
  float d1[2][8], m1[2][8];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint4 hv = lds16(r ? b : a);
    const float d = f16f(hv.x & 0xffffu), dm = f16f(hv.x >> 16);
    const uint32_t sc0 = hv.y & 0x3f3f3f3fu, mn0 = hv.z & 0x3f3f3f3fu;
    const uint32_t sc1 = (hv.w & 0x0f0f0f0fu) | ((hv.y >> 2) & 0x30303030u);
    const uint32_t mn1 = ((hv.w >> 4) & 0x0f0f0f0fu) | ((hv.z >> 2) & 0x30303030u);
    scale4(sc0, d, d * -8388608.0f, &d1[r][0]);
    scale4(sc1, d, d * -8388608.0f, &d1[r][4]);
    scale4(mn0, dm, dm * -8388608.0f, &m1[r][0]);
    scale4(mn1, dm, dm * -8388608.0f, &m1[r][4]);
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint32_t w[2][2];  // [row][step]
    q4k_words(a, b, c, t, w);
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {  // sub-block 2c + hi
      const int sb = 2 * c + hi;
      float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      q4k_sub_mma_s5<T>(w, c, hi, xj, ones, magic, xs, cc);
      acc[0] = fmaf(-m1[0][sb], xs[0], fmaf(d1[0][sb], cc[0], acc[0]));
      acc[1] = fmaf(-m1[0][sb], xs[1], fmaf(d1[0][sb], cc[1], acc[1]));
      acc[2] = fmaf(-m1[1][sb], xs[2], fmaf(d1[1][sb], cc[2], acc[2]));
      acc[3] = fmaf(-m1[1][sb], xs[3], fmaf(d1[1][sb], cc[3], acc[3]));
    }
  }
}

// d * int8 scale byte e of u (u already xor 0x80808080): (2^23 + 128 + s) - (2^23 + 128) exactly, times d.
template <bool PI, uint32_t SEL>
__device__ __forceinline__ float q6_scale(uint32_t u, float d, uint32_t k4b) {
  return d * (__uint_as_float(bpm<PI, SEL>(u, PI ? k4b : 0x4B000000u)) - 8388736.0f);
}

// The code words of a Q6_K unit's block bk (at a / b + 210 bk) that lane t needs for quarter
// (h, q): the low nibbles at 64h + 16q + 4t and + 32, the high bits at 128 + 32h + 16q + 4t.
__device__ __forceinline__ void q6k_codes(uint32_t a, uint32_t b, int bk, int h, int q, int t, uint32_t (&l0)[2],
                                          uint32_t (&l1)[2], uint32_t (&lh)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t ad = (r ? b : a) + uint32_t(210 * bk);
    const uint32_t ol = uint32_t(64 * h + 16 * q + 4 * t), oh = uint32_t(128 + 32 * h + 16 * q + 4 * t);
    if (bk == 0) {
      l0[r] = lds_u32(ad + ol), l1[r] = lds_u32(ad + ol + 32), lh[r] = lds_u32(ad + oh);
    } else {
      l0[r] = ld4<true>(ad + ol), l1[r] = ld4<true>(ad + ol + 32), lh[r] = ld4<true>(ad + oh);
    }
  }
}

// Sub-block sb of those words (x at xs16: its 16 weights): cc += the mma of x with the
// 6-bit codes q - 32 (exact: q + magic - (magic + 32)).
template <class T, bool PI>
__device__ __forceinline__ void q6k_sub_mma(const uint32_t (&l0)[2], const uint32_t (&l1)[2], const uint32_t (&lh)[2],
                                            int sb, const T* xs16, uint32_t magic, float (&cc)[4]) {
  constexpr uint32_t kM32 = std::is_same_v<T, bf16> ? 0x43204320u : 0x64206420u;  // magic + 32
  const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xs16));
  uint32_t cv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t lo = ((sb & 1) ? l1[r] : l0[r]) >> (4 * (sb >> 1));
    const uint32_t hb = 2 * sb <= 4 ? (lh[r] << (4 - 2 * sb)) : (lh[r] >> (2 * sb - 4));
    cv[r] = (lo & 0x0f0f0f0fu) | (hb & 0x30303030u);
  }
  const uint32_t a4[4] = {hsub2u<T>(bpm<PI, 0x4140u>(cv[0], magic), kM32),
                          hsub2u<T>(bpm<PI, 0x4140u>(cv[1], magic), kM32),
                          hsub2u<T>(bpm<PI, 0x4342u>(cv[0], magic), kM32),
                          hsub2u<T>(bpm<PI, 0x4342u>(cv[1], magic), kM32)};
  mma16816<T>(cc, a4, xv.x, xv.y);
}

// One Q6_K unit: two blocks at a / b (4-byte aligned; block 1 at + 210, 2 mod 4).
template <class T, bool PI = false>
__device__ __forceinline__ void unit_q6k(uint32_t a, uint32_t b, const T* xj, int t, uint32_t magic, float (&acc)[4],
                                         uint32_t k4b = 0x4B000000u) {
#pragma unroll
  for (int bk = 0; bk < 2; ++bk) {
    // d * scale[i] for the 16 sub-blocks of rows g, g + 8: scales at 192 (2-byte aligned
    // in block 1), d at 208
    float ds[2][16];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t ad = (r ? b : a) + uint32_t(210 * bk);
      const float d = f16f(lds_u16(ad + 208));
#pragma unroll
      for (int q4 = 0; q4 < 4; ++q4) {  // int8 scale s: (2^23 + 128 + s) - (2^23 + 128) exactly, times d
        uint32_t u;
        if (bk == 0) u = lds_u32(ad + 192 + 4 * q4);
        else u = ld4<true>(ad + 192 + 4 * q4);
        u ^= 0x80808080u;
        ds[r][4 * q4 + 0] = q6_scale<PI, 0x7440u>(u, d, k4b);
        ds[r][4 * q4 + 1] = q6_scale<PI, 0x7441u>(u, d, k4b);
        ds[r][4 * q4 + 2] = q6_scale<PI, 0x7442u>(u, d, k4b);
        ds[r][4 * q4 + 3] = q6_scale<PI, 0x7443u>(u, d, k4b);
      }
    }
#pragma unroll
    for (int hq = 0; hq < 4; ++hq) {
      const int h = hq >> 1, q = hq & 1;
      uint32_t l0[2], l1[2], lh[2];
      q6k_codes(a, b, bk, h, q, t, l0, l1, lh);
#pragma unroll
      for (int sb = 0; sb < 4; ++sb) {
        const int si = 8 * h + 2 * sb + q;  // sub-block: one k-step, one scale
        float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        q6k_sub_mma<T, PI>(l0, l1, lh, sb, xj + 256 * bk + 16 * si, magic, cc);
        acc[0] = fmaf(ds[0][si], cc[0], acc[0]);
        acc[1] = fmaf(ds[0][si], cc[1], acc[1]);
        acc[2] = fmaf(ds[1][si], cc[2], acc[2]);
        acc[3] = fmaf(ds[1][si], cc[3], acc[3]);
      }
    }
  }
}

// ---- SS (variant 22): Q4_K / Q6_K block scales formed once per quad instead of by each of its 4
// lanes: lane (g, t) forms a quarter of rows g / g + 8's scales (row half t >> 1, half t & 1 of
// the sub-blocks; the same expressions as above, so the same values) into a per-warp scratch of
// 1 KB (row (r, g): 4 chunks of 16 bytes at chunk c ^ ((g >> 1) & 3): the 8 rows of one read hit
// 8 distinct 16-byte bank groups), and reads them back 4 at a time. ----

__device__ __forceinline__ void sts_f4(uint32_t a, float x, float y, float z, float w) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(a), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
}
__device__ __forceinline__ float4 lds_f4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
  return v;
}
// chunk c of row half r of the lane's row g
__device__ __forceinline__ uint32_t scr_chunk(uint32_t scr, int r, int g, int c) {
  return scr + uint32_t(((r * 8 + g) * 4 + (c ^ ((g >> 1) & 3))) * 16);
}

// One Q4_K block (as unit_q4k): chunk c of a row = d1[2c], d1[2c + 1], m1[2c], m1[2c + 1].
template <class T>
__device__ __forceinline__ void unit_q4k_ss(uint32_t a, uint32_t b, const T* xj, int g, int t, uint32_t magic,
                                            uint32_t scr, float (&acc)[4]) {
  const uint32_t ones = splat<T>(1.0f);
  {
    const int r = t >> 1, h = t & 1;  // row half, sub-blocks 4h..4h+3
    const uint4 hv = lds16(r ? b : a);
    const float d = f16f(hv.x & 0xffffu), dm = f16f(hv.x >> 16);
    const uint32_t sc = h ? ((hv.w & 0x0f0f0f0fu) | ((hv.y >> 2) & 0x30303030u)) : (hv.y & 0x3f3f3f3fu);
    const uint32_t mn = h ? (((hv.w >> 4) & 0x0f0f0f0fu) | ((hv.z >> 2) & 0x30303030u)) : (hv.z & 0x3f3f3f3fu);
    float dv[4], mv[4];
    scale4(sc, d, d * -8388608.0f, dv);
    scale4(mn, dm, dm * -8388608.0f, mv);
    __syncwarp();  // every lane is done reading the previous block's scales
    sts_f4(scr_chunk(scr, r, g, 2 * h), dv[0], dv[1], mv[0], mv[1]);
    sts_f4(scr_chunk(scr, r, g, 2 * h + 1), dv[2], dv[3], mv[2], mv[3]);
    __syncwarp();
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float4 s0 = lds_f4(scr_chunk(scr, 0, g, c)), s1 = lds_f4(scr_chunk(scr, 1, g, c));
    uint32_t w[2][2];  // [row][step]
    q4k_words(a, b, c, t, w);
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {  // sub-block 2c + hi
      float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      q4k_sub_mma_s5<T>(w, c, hi, xj, ones, magic, xs, cc);
      const float d1a = hi ? s0.y : s0.x, m1a = hi ? s0.w : s0.z;
      const float d1b = hi ? s1.y : s1.x, m1b = hi ? s1.w : s1.z;
      acc[0] = fmaf(-m1a, xs[0], fmaf(d1a, cc[0], acc[0]));
      acc[1] = fmaf(-m1a, xs[1], fmaf(d1a, cc[1], acc[1]));
      acc[2] = fmaf(-m1b, xs[2], fmaf(d1b, cc[2], acc[2]));
      acc[3] = fmaf(-m1b, xs[3], fmaf(d1b, cc[3], acc[3]));
    }
  }
}

// One Q6_K unit (as unit_q6k): per block, chunk 2h + q of a row = the scales of sub-blocks
// 8h + q + 2 sb, sb = 0..3 (the order the decode takes them).
template <class T, bool PI = false>
__device__ __forceinline__ void unit_q6k_ss(uint32_t a, uint32_t b, const T* xj, int g, int t, uint32_t magic,
                                            uint32_t scr, float (&acc)[4], uint32_t k4b = 0x4B000000u) {
#pragma unroll
  for (int bk = 0; bk < 2; ++bk) {
    {
      const int r = t >> 1, j = t & 1;  // row half; sub-blocks 8j..8j+7 (scale bytes 8j..8j+7)
      const uint32_t ad = (r ? b : a) + uint32_t(210 * bk);
      const float d = f16f(lds_u16(ad + 208));
      float v[8];
#pragma unroll
      for (int q4 = 0; q4 < 2; ++q4) {
        uint32_t u;
        if (bk == 0) u = lds_u32(ad + 192 + 8 * j + 4 * q4);
        else u = ld4<true>(ad + 192 + 8 * j + 4 * q4);
        u ^= 0x80808080u;
        v[4 * q4 + 0] = q6_scale<PI, 0x7440u>(u, d, k4b);
        v[4 * q4 + 1] = q6_scale<PI, 0x7441u>(u, d, k4b);
        v[4 * q4 + 2] = q6_scale<PI, 0x7442u>(u, d, k4b);
        v[4 * q4 + 3] = q6_scale<PI, 0x7443u>(u, d, k4b);
      }
      __syncwarp();  // every lane is done reading the previous block's scales
      sts_f4(scr_chunk(scr, r, g, 2 * j), v[0], v[2], v[4], v[6]);
      sts_f4(scr_chunk(scr, r, g, 2 * j + 1), v[1], v[3], v[5], v[7]);
      __syncwarp();
    }
#pragma unroll
    for (int hq = 0; hq < 4; ++hq) {
      const int h = hq >> 1, q = hq & 1;
      const float4 s0 = lds_f4(scr_chunk(scr, 0, g, 2 * h + q)), s1 = lds_f4(scr_chunk(scr, 1, g, 2 * h + q));
      const float dsa[4] = {s0.x, s0.y, s0.z, s0.w}, dsb[4] = {s1.x, s1.y, s1.z, s1.w};
      uint32_t l0[2], l1[2], lh[2];
      q6k_codes(a, b, bk, h, q, t, l0, l1, lh);
#pragma unroll
      for (int sb = 0; sb < 4; ++sb) {
        const int si = 8 * h + 2 * sb + q;
        float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        q6k_sub_mma<T, PI>(l0, l1, lh, sb, xj + 256 * bk + 16 * si, magic, cc);
        acc[0] = fmaf(dsa[sb], cc[0], acc[0]);
        acc[1] = fmaf(dsa[sb], cc[1], acc[1]);
        acc[2] = fmaf(dsb[sb], cc[2], acc[2]);
        acc[3] = fmaf(dsb[sb], cc[3], acc[3]);
      }
    }
  }
}

}  // namespace gk::cuda::gguf_st
