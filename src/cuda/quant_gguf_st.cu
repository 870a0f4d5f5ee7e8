// GEMV over the GGUF block formats Q4_0, Q4_1, Q8_0, Q4_K and Q6_K on the tensor cores,
// read directly from the file's blocks (layouts: ops/gguf_blocks.h), with the access
// pattern of the staged bf16 kernel (gemv_w8.cuh): long contiguous runs of every row per
// stage, each warp copy instruction moving 4 rows x 128 contiguous bytes.
//
// A row of K weights is one contiguous byte range of whole blocks. The kernel cuts it into
// units of whole blocks (Q4_0 / Q4_1 / Q8_0: 8 blocks = 256 weights, 144 / 160 / 272 bytes;
// Q4_K: one block, 144 bytes; Q6_K: two blocks, 420 bytes, 512 weights) and a stage into
// U units (288 / 320 / 272 / 288 / 420 bytes per row). A CTA owns 16 rows (the m16 of
// mma.m16n8k16) and nw warps; warp w sweeps its own contiguous run of units (of its
// split-K slice) through a ring of D stages of 16 rows in shared memory, copied with
// 16-byte cp.async (lane l: chunk l % 8 + 8 i of rows l / 8 + 4 r; D - 1 stages in flight;
// only __syncwarp). Rows start 16-byte aligned (checked), so a stage's bytes are the
// 16-byte chunks from floor(start / 16); Q6_K's 420-byte units start at a phase of
// 0 / 4 / 8 / 12 bytes in their first chunk (the decode adds it; its blocks stay 4- and
// 2-byte aligned as at phase 0). Shared rows are P bytes apart, P = 16 / 48 mod 128, so
// the fragment reads (lane (g, t): 4 bytes at 4t of rows g = 0..7) hit 32 banks.
//
// Decode (lane (g, t) takes rows g and g + 8, one mma k-step = 16 weights of one block or
// sub-block): Q4_0 / Q4_1 / Q8_0 take weights 4t..4t+3 (k-step 0) and 16+4t.. (k-step 1)
// of every block (the 4-bit codes: low / high nibbles of bytes 4t..4t+3; Q8_0: bytes 4t..
// and 16+4t..), x row g at the same k; codes become exact bf16/fp16 pairs by byte permutes
// under a magic exponent and one packed subtraction (Q8_0 with bf16 x: through fp32).
// Per block the fp32 mma sum times d (plus Q4_1's m times the block's sum of x, an mma
// with ones). Q4_K / Q6_K: the decodes of quant_gguf_k.cu (sub-block scales formed once per
// block, exact). x rows g >= M read row M - 1 (their columns are dropped).
//
// The warps' sums are added in warp order, split-K slices by the second pass; the plan
// (warps per CTA, split) is a function of (N, K, format) only: the same bits every run and
// for a row alone or in a batch.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/gemv_gguf.cuh"
#include "common/gemv_stage.cuh"
#include "core/cuda_util.h"

namespace gk::cuda {

namespace {

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
template <int F, int UX>
struct GL {
  static constexpr int U = GS<F>::U * UX;
  static constexpr int NC = kPhased<F> ? (U * GS<F>::UB + 12 + 15) / 16 : U * GS<F>::UB / 16;
  static constexpr int P = NC * 16 % 32 == 16 ? NC * 16 : NC * 16 + 16;
};

// 4 bytes at shared address a (a % 4 == 2 when ODD, else 0; known at compile time).
template <bool ODD>
__device__ __forceinline__ uint32_t ld4(uint32_t a) {
  if constexpr (ODD) return __byte_perm(lds_u16(a), lds_u16(a + 2), 0x5410u);
  else return lds_u32(a);
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
__device__ __forceinline__ void int8x4_bf16(uint32_t u, uint32_t magic, uint32_t& lo, uint32_t& hi) {
  const uint32_t l7 = u & 0x7f7f7f7fu, sg = u & 0x80808080u;
  lo = hsub2u<bf16>(__byte_perm(l7, magic, 0x4140u), __byte_perm(sg, magic, 0x4140u));
  hi = hsub2u<bf16>(__byte_perm(l7, magic, 0x4342u), __byte_perm(sg, magic, 0x4342u));
}

// One unit of a 32-weight format: rows g (shared address a) and g + 8 (b), x of row g at the
// unit's first weight + 4t (xj), lane t. acc: (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
// B8 (Q8_0, bf16 x): the codes through int8x4_bf16 instead of fp32.
template <class T, int F, bool B8 = false>
__device__ __forceinline__ void unit32(uint32_t a, uint32_t b, const T* xj, int t, uint32_t magic, float (&acc)[4]) {
  constexpr int BB = GS<F>::BB;
  constexpr bool kQ8 = F == int(QFormat::q8_0), kMin = F == int(QFormat::q4_1);
  constexpr int QOFF = kMin ? 4 : 2;
  constexpr uint32_t kSub4 = kMin ? (std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u)
                                  : (std::is_same_v<T, bf16> ? 0x43084308u : 0x64086408u);
  const uint32_t ones = splat<T>(1.0f);
#pragma unroll
  for (int bk = 0; bk < 8; ++bk) {
    const uint2 x0 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * bk));
    const uint2 x1 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * bk + 16));
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
        int8x4_bf16(ua0, magic, a0[0], a0[2]);
        int8x4_bf16(ub0, magic, a0[1], a0[3]);
        int8x4_bf16(ua1, magic, a1[0], a1[2]);
        int8x4_bf16(ub1, magic, a1[1], a1[3]);
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
      a0[0] = hsub2u<T>(__byte_perm(La, magic, 0x4140u), kSub4);
      a0[1] = hsub2u<T>(__byte_perm(Lb, magic, 0x4140u), kSub4);
      a0[2] = hsub2u<T>(__byte_perm(La, magic, 0x4342u), kSub4);
      a0[3] = hsub2u<T>(__byte_perm(Lb, magic, 0x4342u), kSub4);
      a1[0] = hsub2u<T>(__byte_perm(Ha, magic, 0x4140u), kSub4);
      a1[1] = hsub2u<T>(__byte_perm(Hb, magic, 0x4140u), kSub4);
      a1[2] = hsub2u<T>(__byte_perm(Ha, magic, 0x4342u), kSub4);
      a1[3] = hsub2u<T>(__byte_perm(Hb, magic, 0x4342u), kSub4);
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
      const float ma = f16f(hva >> 16), mb = f16f(hvb >> 16);
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

// One Q4_K block (144 bytes at a / b, 16-byte aligned).
template <class T>
__device__ __forceinline__ void unit_q4k(uint32_t a, uint32_t b, const T* xj, int t, uint32_t magic, float (&acc)[4]) {
  constexpr uint32_t kM0 = std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u;  // magic: q
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
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t ad = (r ? b : a) + uint32_t(16 + 32 * c + 4 * t);
      w[r][0] = lds_u32(ad);
      w[r][1] = lds_u32(ad + 16);
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {  // sub-block 2c + hi
      const int sb = 2 * c + hi;
      const uint2 x0 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * sb));
      const uint2 x1 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * sb + 16));
      float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
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
      float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma16816<T>(cc, A0, x0.x, x0.y);
      mma16816<T>(cc, A1, x1.x, x1.y);
      acc[0] = fmaf(-m1[0][sb], xs[0], fmaf(d1[0][sb], cc[0], acc[0]));
      acc[1] = fmaf(-m1[0][sb], xs[1], fmaf(d1[0][sb], cc[1], acc[1]));
      acc[2] = fmaf(-m1[1][sb], xs[2], fmaf(d1[1][sb], cc[2], acc[2]));
      acc[3] = fmaf(-m1[1][sb], xs[3], fmaf(d1[1][sb], cc[3], acc[3]));
    }
  }
}

// One Q6_K unit: two blocks at a / b (4-byte aligned; block 1 at + 210, 2 mod 4).
template <class T>
__device__ __forceinline__ void unit_q6k(uint32_t a, uint32_t b, const T* xj, int t, uint32_t magic, float (&acc)[4]) {
  constexpr uint32_t kM32 = std::is_same_v<T, bf16> ? 0x43204320u : 0x64206420u;  // magic + 32
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
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t sel = uint32_t(e) | (4u << 4) | (4u << 8) | (7u << 12);
          ds[r][4 * q4 + e] = d * (__uint_as_float(__byte_perm(u, 0x4B000000u, sel)) - 8388736.0f);
        }
      }
    }
#pragma unroll
    for (int hq = 0; hq < 4; ++hq) {
      const int h = hq >> 1, q = hq & 1;
      uint32_t l0[2], l1[2], lh[2];
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
#pragma unroll
      for (int sb = 0; sb < 4; ++sb) {
        const int si = 8 * h + 2 * sb + q;  // sub-block: one k-step, one scale
        const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xj + 256 * bk + 16 * si));
        uint32_t cv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t lo = ((sb & 1) ? l1[r] : l0[r]) >> (4 * (sb >> 1));
          const uint32_t hb = 2 * sb <= 4 ? (lh[r] << (4 - 2 * sb)) : (lh[r] >> (2 * sb - 4));
          cv[r] = (lo & 0x0f0f0f0fu) | (hb & 0x30303030u);
        }
        const uint32_t a4[4] = {hsub2u<T>(__byte_perm(cv[0], magic, 0x4140u), kM32),
                                hsub2u<T>(__byte_perm(cv[1], magic, 0x4140u), kM32),
                                hsub2u<T>(__byte_perm(cv[0], magic, 0x4342u), kM32),
                                hsub2u<T>(__byte_perm(cv[1], magic, 0x4342u), kM32)};
        float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16816<T>(cc, a4, xv.x, xv.y);
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
  constexpr uint32_t kM0 = std::is_same_v<T, bf16> ? 0x43004300u : 0x64006400u;
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
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t ad = (r ? b : a) + uint32_t(16 + 32 * c + 4 * t);
      w[r][0] = lds_u32(ad);
      w[r][1] = lds_u32(ad + 16);
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {  // sub-block 2c + hi
      const int sb = 2 * c + hi;
      const uint2 x0 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * sb));
      const uint2 x1 = __ldg(reinterpret_cast<const uint2*>(xj + 32 * sb + 16));
      float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
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
      float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma16816<T>(cc, A0, x0.x, x0.y);
      mma16816<T>(cc, A1, x1.x, x1.y);
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
template <class T>
__device__ __forceinline__ void unit_q6k_ss(uint32_t a, uint32_t b, const T* xj, int g, int t, uint32_t magic,
                                            uint32_t scr, float (&acc)[4]) {
  constexpr uint32_t kM32 = std::is_same_v<T, bf16> ? 0x43204320u : 0x64206420u;
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
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t sel = uint32_t(e) | (4u << 4) | (4u << 8) | (7u << 12);
          v[4 * q4 + e] = d * (__uint_as_float(__byte_perm(u, 0x4B000000u, sel)) - 8388736.0f);
        }
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
#pragma unroll
      for (int sb = 0; sb < 4; ++sb) {
        const int si = 8 * h + 2 * sb + q;
        const uint2 xv = __ldg(reinterpret_cast<const uint2*>(xj + 256 * bk + 16 * si));
        uint32_t cv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t lo = ((sb & 1) ? l1[r] : l0[r]) >> (4 * (sb >> 1));
          const uint32_t hb = 2 * sb <= 4 ? (lh[r] << (4 - 2 * sb)) : (lh[r] >> (2 * sb - 4));
          cv[r] = (lo & 0x0f0f0f0fu) | (hb & 0x30303030u);
        }
        const uint32_t a4[4] = {hsub2u<T>(__byte_perm(cv[0], magic, 0x4140u), kM32),
                                hsub2u<T>(__byte_perm(cv[1], magic, 0x4140u), kM32),
                                hsub2u<T>(__byte_perm(cv[0], magic, 0x4342u), kM32),
                                hsub2u<T>(__byte_perm(cv[1], magic, 0x4342u), kM32)};
        float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16816<T>(cc, a4, xv.x, xv.y);
        acc[0] = fmaf(dsa[sb], cc[0], acc[0]);
        acc[1] = fmaf(dsa[sb], cc[1], acc[1]);
        acc[2] = fmaf(dsb[sb], cc[2], acc[2]);
        acc[3] = fmaf(dsb[sb], cc[3], acc[3]);
      }
    }
  }
}

// PROBE: the copies and waits only, no decode (wrong results: the access pattern's ceiling).
// L2 prefetch of n bytes at a 16-byte aligned global address (n % 16 == 0).
__device__ __forceinline__ void prefetch_l2(const void* a, uint32_t n) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
}

// pf: stages of each row prefetched into L2 beyond the ring's first D - 1 (one bulk prefetch per
// row and warp before waiting for the previous kernel; 0: none).
// MINB: CTAs of 256 threads per SM the registers are sized for (2: 128 registers, 3: 80). B8:
// Q8_0 with bf16 x decoded by int8x4_bf16.
// ROLL: the stage loop and the loop over a stage's units not unrolled (the ring slot and the
// unit's offset computed at run time; one copy of a unit's decode in the code instead of D x U:
// less instruction-cache pressure, same arithmetic in the same order: the same bits).
// SS: Q4_K / Q6_K with the scales formed once per quad (unit_q4k_ss / unit_q6k_ss; 1 KB of
// scratch per warp after the rings).
template <class T, int F, int D, int UX = 1, bool PROBE = false, int MINB = 2, bool B8 = false, bool ROLL = false,
          bool SS = false>
__global__ void __launch_bounds__(256, MINB) k_ggst(const QGemvArgs p, int pf) {
  using L = GL<F, UX>;
  constexpr int UB = GS<F>::UB, UW = GS<F>::UW, U = L::U, NC = L::NC, P = L::P, NK = (NC + 7) / 8;
  constexpr int SB = 16 * P;  // bytes per stage
  static_assert(kPhased<F> || NC * 16 == U * UB, "whole chunks per stage");
  static_assert(P >= NC * 16 && (P % 128 == 16 || P % 128 == 48 || P % 128 == 80 || P % 128 == 112), "pitch");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t nu = p.k / UW;
  const int64_t parts = int64_t(gridDim.y) * nw, pi = int64_t(blockIdx.y) * nw + warp;
  const int64_t u0 = nu * pi / parts, u1 = nu * (pi + 1) / parts;

  extern __shared__ uint4 smem[];
  const uint32_t ring = smem_addr(smem) + uint32_t(warp) * uint32_t(D * SB);
  const uint32_t scr = smem_addr(smem) + uint32_t(nw) * uint32_t(D * SB) + uint32_t(warp) * 1024u;  // SS only
  // copies: lane l takes chunks l % 8 + 8 k of rows l / 8 + 4 i of each stage
  const int ch = lane & 7, rr = lane >> 3;
  // the lane's chunk of each of its rows: at the next stage's first chunk (whole-chunk units),
  // at the warp's first unit (phased units: the stage's chunk offset added per stage)
  const uint8_t* qp[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + rr + 4 * i < p.n ? row0 + rr + 4 * i : p.n - 1;
    qp[i] = static_cast<const uint8_t*>(p.q) + row * p.q_rs + ch * 16 + (kPhased<F> ? 0 : u0 * UB);
  }
  const uint32_t cdst = ring + uint32_t(rr * P + ch * 16);
  int64_t un = u0;  // the next unit to copy
  auto issue = [&](int st) {
    if (un < u1) {
      const uint32_t d0 = cdst + uint32_t(st * SB);
      if constexpr (!kPhased<F>) {
        if (un + U <= u1) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int k = 0; k < NK; ++k)
              if (NC % 8 == 0 || ch + 8 * k < NC) cp_async16(d0 + uint32_t(4 * i * P + 128 * k), qp[i] + 128 * k);
        } else {
          const int need = int((u1 - un) * (UB / 16));
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int k = 0; k < NK; ++k)
              if (ch + 8 * k < need) cp_async16(d0 + uint32_t(4 * i * P + 128 * k), qp[i] + 128 * k);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) qp[i] += U * UB;
      } else {  // U units of UB bytes from phase (un UB) % 16 (U = 1 here: NC chunks always needed)
        static_assert(!kPhased<F> || (U == 1 && NC * 16 == 12 + UB) || UX == 2, "phased units: one per stage");
        const int64_t b0 = un * UB, off = b0 & ~int64_t(15);
        const int64_t nun = u1 - un < U ? u1 - un : U;
        const int need = int(((b0 & 15) + nun * UB + 15) >> 4);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int k = 0; k < NK; ++k)
            if ((U == 1 ? ch + 8 * k < NC : ch + 8 * k < need))
              cp_async16(d0 + uint32_t(4 * i * P + 128 * k), qp[i] + off + 128 * k);
      }
    }
    cp_commit();
    un += U;
  };

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int xrow = g < p.m ? g : int(p.m) - 1;
  const T* xr = static_cast<const T*>(p.x) + int64_t(xrow) * p.x_rs + 4 * t;  // + the lane's k offset in a block
  uint32_t magic = std::is_same_v<T, bf16> ? 0x43434343u : 0x64646464u;
  asm volatile("" : "+r"(magic));  // a register: the byte permutes take it as their second source

  pdl_trigger();
#pragma unroll
  for (int st = 0; st < D - 1; ++st) issue(st);
  if (pf > 0 && lane < 16 && row0 + lane < p.n) {
    const int64_t ua = u0 + int64_t(D - 1) * U, ue = ua + int64_t(pf) * U < u1 ? ua + int64_t(pf) * U : u1;
    if (ue > ua) {  // whole chunks (rows are whole 16-byte chunks)
      const int64_t b0 = (ua * UB) & ~int64_t(15), b1 = (ue * UB + 15) & ~int64_t(15);
      prefetch_l2(static_cast<const uint8_t*>(p.q) + (row0 + lane) * p.q_rs + b0, uint32_t(b1 - b0));
    }
  }
  pdl_wait();

  const int64_t nst = (u1 - u0 + U - 1) / U;
  // stage j in ring slot st (st == j % D)
  auto stage = [&](int64_t j, int st) {
    cp_wait<D - 2>();
    __syncwarp();  // every lane's copies of this stage are visible; every lane is done with the previous stage
    issue(st == 0 ? D - 1 : st - 1);
    if constexpr (PROBE) return;
    const int64_t ub = u0 + j * U;  // first unit of the stage
    const uint32_t sb = ring + uint32_t(st * SB + g * P) + uint32_t(kPhased<F> ? ((ub * UB) & 15) : 0);
    const T* xs = xr + ub * UW;
    auto unit = [&](int v) {
      const uint32_t a = sb + uint32_t(v * UB), b = a + uint32_t(8 * P);
      const T* xj = xs + v * UW;
      if constexpr (SS && F == int(QFormat::q4_k)) unit_q4k_ss<T>(a, b, xj, g, t, magic, scr, acc);
      else if constexpr (SS && F == int(QFormat::q6_k)) unit_q6k_ss<T>(a, b, xj, g, t, magic, scr, acc);
      else if constexpr (F == int(QFormat::q4_k)) unit_q4k<T>(a, b, xj, t, magic, acc);
      else if constexpr (F == int(QFormat::q6_k)) unit_q6k<T>(a, b, xj, t, magic, acc);
      else unit32<T, F, B8>(a, b, xj, t, magic, acc);
    };
    if constexpr (ROLL) {
#pragma unroll 1
      for (int v = 0; v < U; ++v)
        if (v == 0 || ub + v < u1) unit(v);
    } else {
#pragma unroll
      for (int v = 0; v < U; ++v)
        if (v == 0 || ub + v < u1) unit(v);
    }
  };
  if constexpr (ROLL) {
    int st = 0;
#pragma unroll 1
    for (int64_t j = 0; j < nst; ++j) {
      stage(j, st);
      st = st + 1 == D ? 0 : st + 1;
    }
  } else {
    for (int64_t j0 = 0; j0 < nst; j0 += D) {
#pragma unroll
      for (int st = 0; st < D; ++st) {
        const int64_t j = j0 + st;
        if (j < nst) stage(j, st);
        else issue(st == 0 ? D - 1 : st - 1);  // keeps the group count uniform (empty groups)
      }
    }
  }
  cp_wait<0>();

  // the warps' sums, added in warp order (through the ring memory, free now)
  const int S = gridDim.y, sl = blockIdx.y;
  float* red = reinterpret_cast<float*>(smem);  // [nw][32][4]
  if (nw > 1) {
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * 32 + lane) * 4 + e] = acc[e];
    __syncthreads();
  }
  if (warp != 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v = acc[e];
    if (nw > 1) {
      v = red[lane * 4 + e];
      for (int w = 1; w < nw; ++w) v += red[(w * 32 + lane) * 4 + e];
    }
    const int m = 2 * t + (e & 1);
    const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
    if (m < p.m && row < p.n) {
      if (p.xinv) v *= __ldg(p.xinv + m);  // 2^-c_m of the scaled fp16 copy of bf16 x: exact
      if (S == 1) store_out(p.y, p.out_dtype, m * p.n + row, v);
      else p.part[(int64_t(sl) * p.m + m) * p.n + row] = v;
    }
  }
}

// ---- Q8_0 with bf16 x: an fp16 copy of x scaled by 2^c per row (the codes then decode in
// fp16 with one byte permute and one subtraction per pair instead of going through fp32) ----

// The power of two c that puts a row's largest |x| (bf16 bits mx, sign cleared) in
// [2^14, 2^15); 0 for a zero, inf or NaN maximum; within [-126, 126]. Every bf16 value down
// to 2^-31 of the maximum is then exact in fp16.
__device__ __forceinline__ int x_exponent(uint32_t mx) {
  if (mx == 0 || mx >= 0x7f80u) return 0;
  const int c = 14 - ilogbf(__uint_as_float(mx << 16));
  return c < -126 ? -126 : (c > 126 ? 126 : c);
}
__device__ __forceinline__ uint32_t x_scale_h2(uint32_t u, float sc) {
  __half2 h = __floats2half2_rn(__uint_as_float(u << 16) * sc, __uint_as_float(u & 0xffff0000u) * sc);
  return *reinterpret_cast<uint32_t*>(&h);
}

// x [m, k] bf16 -> xh [m, k] fp16 = x * 2^c_m, xinv[m] = 2^-c_m. One CTA of 512 threads per row;
// k % 8 == 0, 16-byte aligned rows.
__global__ void __launch_bounds__(512) k_gg_xprep(const bf16* __restrict__ x, int64_t x_rs, int64_t k,
                                                  f16* __restrict__ xh, float* __restrict__ xinv) {
  pdl_trigger();
  pdl_wait();
  const int64_t m = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + m * x_rs);
  uint4* out = reinterpret_cast<uint4*>(xh + m * k);
  const int64_t nv = k / 8;
  uint32_t mx = 0;
  for (int64_t i = threadIdx.x; i < nv; i += 512) {
    const uint4 v = xr[i];
    mx = max(mx, max(max(v.x & 0x7fffu, (v.x >> 16) & 0x7fffu), max(v.y & 0x7fffu, (v.y >> 16) & 0x7fffu)));
    mx = max(mx, max(max(v.z & 0x7fffu, (v.z >> 16) & 0x7fffu), max(v.w & 0x7fffu, (v.w >> 16) & 0x7fffu)));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  __shared__ uint32_t wm[16];
  if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = wm[0];
  for (int i = 1; i < 16; ++i) mx = max(mx, wm[i]);
  const int c = x_exponent(mx);
  const float sc = __uint_as_float(uint32_t(c + 127) << 23);
  if (threadIdx.x == 0) xinv[m] = __uint_as_float(uint32_t(127 - c) << 23);
  for (int64_t i = threadIdx.x; i < nv; i += 512) {
    const uint4 v = xr[i];
    out[i] = make_uint4(x_scale_h2(v.x, sc), x_scale_h2(v.y, sc), x_scale_h2(v.z, sc), x_scale_h2(v.w, sc));
  }
}

// ---- the launch plan ----

struct GCfg {
  int d = 3, wt = 12, ux = 1, wmin = 1;  // ring depth, target warps per SM, units per stage x1 / x2, warps per CTA at least
  int pf = 0;                            // stages per row prefetched into L2 at the start
  int minb = 2;                          // registers sized for 2 (128) or 3 (80) CTAs of 256 threads per SM
  int roll = 0;                          // 1: the stage and unit loops not unrolled (k_ggst's ROLL)
};

int default_depth(QFormat f) {
  switch (f) {
    case QFormat::q4_0: return GS<int(QFormat::q4_0)>::D;
    case QFormat::q4_1: return GS<int(QFormat::q4_1)>::D;
    case QFormat::q8_0: return GS<int(QFormat::q8_0)>::D;
    case QFormat::q4_k: return GS<int(QFormat::q4_k)>::D;
    default: return GS<int(QFormat::q6_k)>::D;
  }
}

// GPUKIT_GEMV_GGUF="D,WT[,UX[,WMIN[,PF[,MINB[,R]]]]]": the benchmarking knob (ring depth 2..4, target
// warps per SM, 2: twice the units per stage (D 2 or 3), at least WMIN (1..8) warps per CTA:
// shorter CTAs when there are many, e.g. the lm-head's 8016; PF (0..4096) stages of each row
// prefetched into L2 at the start; MINB 3: registers for 24 warps per SM (80) instead of 16;
// R 1: the rolled stage loop (as variant 21; UX 1 and the default D only)).
GCfg gcfg_env(QFormat f) {
  GCfg c;
  c.d = default_depth(f);
  const char* e = std::getenv("GPUKIT_GEMV_GGUF");
  if (!e || !*e) return c;
  int d = 0, wt = 0, ux = 1, wmin = 1, pf = 0, minb = 2, roll = 0;
  const int got = std::sscanf(e, "%d,%d,%d,%d,%d,%d,%d", &d, &wt, &ux, &wmin, &pf, &minb, &roll);
  const bool dflt = ux == 1 && d == default_depth(f);
  if (got < 2 || d < 2 || d > 4 || wt < 1 || wt > 64 || (ux != 1 && ux != 2) || (ux == 2 && d == 4) || wmin < 1 ||
      wmin > 8 || pf < 0 || pf > 4096 || (minb != 2 && minb != 3) || (minb == 3 && !dflt) || (roll != 0 && roll != 1) ||
      (roll == 1 && !dflt))
    throw ValueError(cat("GPUKIT_GEMV_GGUF: expected D,WT[,UX[,WMIN[,PF[,MINB[,R]]]]] with D in 2..4, WT in 1..64, UX 1 ",
                         "or 2 (D <= 3), WMIN in 1..8, PF in 0..4096, MINB 2 or 3, R 0 or 1 (MINB 3, R 1: UX 1 and the ",
                         "default D), got '", e, "'"));
  c.minb = minb;
  c.roll = roll;
  c.d = d;
  c.wt = wt;
  c.ux = ux;
  c.wmin = wmin;
  c.pf = pf;
  return c;
}

// The variant switch (benchmarking only): 4 a 3-stage ring (the default is 2), 5 a 4-stage ring,
// 7 the copies without decode (the probe; wrong results), 12 Q8_0 with bf16 x through an fp16
// copy of x (k_gg_xprep), 13 Q8_0 with bf16 x decoded to bf16 by byte operations (int8x4_bf16),
// 21 the rolled stage loop (k_ggst's ROLL; with the knob's D and UX at their defaults), 22 Q4_K /
// Q6_K with the block scales formed once per quad (k_ggst's SS; the knob's D and UX at their defaults).
GCfg gcfg(int variant, QFormat f) {
  GCfg c = gcfg_env(f);
  if (variant == 21 && c.ux == 1 && c.d == default_depth(f)) c.roll = 1;
  if (variant == 4) c.d = default_depth(f) == 2 ? 3 : 2;
  if (variant == 5) c.d = 4;
  return c;
}

constexpr int kSmemMax = 227 * 1024;  // dynamic shared memory of one CTA at most
constexpr int64_t kSmSmem = 228 * 1024;
constexpr int kSMs = 132;

template <int F>
int stage_bytes_f(int ux) {
  return ux == 2 ? 16 * GL<F, 2>::P : 16 * GL<F, 1>::P;
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
int64_t units_per_stage(QFormat f, int ux) {
  switch (f) {
    case QFormat::q4_0: return GS<int(QFormat::q4_0)>::U * ux;
    case QFormat::q4_1: return GS<int(QFormat::q4_1)>::U * ux;
    case QFormat::q8_0: return GS<int(QFormat::q8_0)>::U * ux;
    case QFormat::q4_k: return GS<int(QFormat::q4_k)>::U * ux;
    default: return GS<int(QFormat::q6_k)>::U * ux;
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

template <class T, int F, int D, int UX = 1, bool PROBE = false, int MINB = 2, bool B8 = false, bool ROLL = false,
          bool SS = false>
void launch_d(const QGemvArgs& p, int nw, int pf, cudaStream_t st) {
  constexpr int SB = 16 * GL<F, UX>::P + (SS ? 1024 / D : 0);  // SS: the scratch counted in the stages
  static_assert(!SS || 1024 % D == 0, "scratch");
  smem_limit<k_ggst<T, F, D, UX, PROBE, MINB, B8, ROLL, SS>>(kSmemMax);
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  const int S = std::max(1, p.split);
  int smem = std::max(nw * D * SB, nw * 32 * 4 * 4);
  if (smem > kSmemMax) throw ValueError("gemv: the staged GGUF kernel's shared memory does not fit");
  // When all CTAs fit on the GPU at once, ask for enough shared memory that at most
  // ceil(CTAs / 132) of them fit on one SM, so the block scheduler spreads them evenly
  // (gemv_w8.cu: the H200 filled fewer SMs otherwise).
  const int64_t per_sm = (blocks * S + kSMs - 1) / kSMs;
  if (per_sm >= 1 && per_sm <= 16) {
    const int64_t cap = kSmSmem / (per_sm + 1) - 1024 + 256;  // just too much for per_sm + 1 CTAs
    if (per_sm * (cap + 1024) <= kSmSmem && cap > smem) smem = int(std::min<int64_t>(cap, kSmemMax));
  }
  launch_ex(k_ggst<T, F, D, UX, PROBE, MINB, B8, ROLL, SS>, dim3(unsigned(blocks), unsigned(S)), nw * 32, smem, st, p.variant != 2, p, pf);
  GK_LAUNCH_CHECK("qgemv_gguf_st");
}

template <class T, int F>
void launch_f(const QGemvArgs& p, cudaStream_t st) {
  const GCfg c = gcfg(p.variant, QFormat(F));
  const GPlan pl = gplan(p.n, p.k, QFormat(F), c);
  constexpr int D0 = GS<F>::D;
  constexpr bool kB8 = F == int(QFormat::q8_0) && std::is_same_v<T, bf16>;
  const bool b8 = kB8 && p.variant == 13 && c.ux == 1 && c.d == D0 && c.minb == 2;
  constexpr bool kSS = F == int(QFormat::q4_k) || F == int(QFormat::q6_k);
  if constexpr (kSS) {
    if (p.variant == 22 && c.ux == 1 && c.d == D0 && !c.roll) {
      if (c.minb == 3) launch_d<T, F, D0, 1, false, 3, false, false, true>(p, pl.nw, c.pf, st);
      else launch_d<T, F, D0, 1, false, 2, false, false, true>(p, pl.nw, c.pf, st);
      if (p.split > 1) launch_sum_q(p, st);
      return;
    }
  }
  if (b8 && c.roll) launch_d<T, F, D0, 1, false, 2, kB8, true>(p, pl.nw, c.pf, st);
  else if (b8) launch_d<T, F, D0, 1, false, 2, kB8>(p, pl.nw, c.pf, st);
  else if (c.roll && c.minb == 3) launch_d<T, F, D0, 1, false, 3, false, true>(p, pl.nw, c.pf, st);
  else if (c.roll) launch_d<T, F, D0, 1, false, 2, false, true>(p, pl.nw, c.pf, st);
  else if (c.minb == 3 && c.ux == 1 && c.d == D0) launch_d<T, F, D0, 1, false, 3>(p, pl.nw, c.pf, st);
  else if (c.ux == 2 && c.d == 2) launch_d<T, F, 2, 2>(p, pl.nw, c.pf, st);
  else if (c.ux == 2) launch_d<T, F, 3, 2>(p, pl.nw, c.pf, st);
  else if (p.variant == 7 && c.d == D0) launch_d<T, F, D0, 1, true>(p, pl.nw, c.pf, st);
  else if (c.d == 2) launch_d<T, F, 2>(p, pl.nw, c.pf, st);
  else if (c.d == 4) launch_d<T, F, 4>(p, pl.nw, c.pf, st);
  else launch_d<T, F, 3>(p, pl.nw, c.pf, st);
  if (p.split > 1) launch_sum_q(p, st);
}

}  // namespace

bool gguf_st_shape(int64_t k, QFormat f) {
  switch (f) {
    case QFormat::q4_0:
    case QFormat::q4_1:
    case QFormat::q8_0:
    case QFormat::q4_k: return k > 0 && k % 256 == 0;
    case QFormat::q6_k: return k > 0 && k % 2048 == 0;  // rows of 16-byte multiples (8 blocks = 1680 bytes)
    default: return false;
  }
}

bool gguf_st_applies(const QGemvArgs& p) {
  if (!gguf_st_shape(p.k, p.fmt)) return false;
  return reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_rs % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_rs % 8 == 0;
}

int gguf_st_split(int64_t n, int64_t k, QFormat f) { return gplan(n, k, f, gcfg(0, f)).split; }

// Q8_0 with bf16 x through the fp16 copy of x (variant 12; the workspaces xh, xinv given).
bool q8_xprep(const QGemvArgs& p) {
  return p.fmt == QFormat::q8_0 && p.x_dtype == DType::bf16 && p.xh && p.xinv && p.variant == 12;
}

template <class T>
void launch_gguf_st(const QGemvArgs& pa, cudaStream_t st) {
  QGemvArgs p = pa;
  p.xinv = nullptr;  // the kernel scales its sums by xinv only after k_gg_xprep
  if constexpr (std::is_same_v<T, bf16>) {
    if (q8_xprep(pa)) {
      if (pa.m > int64_t(INT32_MAX)) throw ValueError("gemv: m is too large");
      launch_ex(k_gg_xprep, dim3(unsigned(pa.m)), 512, 0, st, pa.variant != 2, static_cast<const bf16*>(pa.x), pa.x_rs,
                pa.k, static_cast<f16*>(pa.xh), pa.xinv);
      GK_LAUNCH_CHECK("qgemv_gguf_xprep");
      p.x = pa.xh;
      p.x_rs = pa.k;
      p.x_dtype = DType::f16;
      p.xinv = pa.xinv;
      return launch_f<f16, int(QFormat::q8_0)>(p, st);
    }
  }
  switch (p.fmt) {
    case QFormat::q4_0: return launch_f<T, int(QFormat::q4_0)>(p, st);
    case QFormat::q4_1: return launch_f<T, int(QFormat::q4_1)>(p, st);
    case QFormat::q8_0: return launch_f<T, int(QFormat::q8_0)>(p, st);
    case QFormat::q4_k: return launch_f<T, int(QFormat::q4_k)>(p, st);
    case QFormat::q6_k: return launch_f<T, int(QFormat::q6_k)>(p, st);
    default: throw ValueError("gemv: not a GGUF format of the staged kernel");
  }
}
template void launch_gguf_st<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_gguf_st<f16>(const QGemvArgs&, cudaStream_t);

}  // namespace gk::cuda
