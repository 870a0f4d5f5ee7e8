// The session-6 Q4_K decodes of the staged GGUF kernel (src/cuda/quant_gguf_st.cu, variants
// 30-35): unit_q4k / unit_q4k_ss of quant_gguf_st_units.cuh with the byte permutes through bpm
// (PI) and the codes optionally entering the mma as 128 + q (FOLD). Kept apart from the default
// decodes so that the default kernels' code stays as it was measured.
#pragma once
#include "quant_gguf_st_units.cuh"

namespace gk::cuda::gguf_st {

// scale4 with bpm (session 6).
// k4b: 0x4B000000 (a register with PI).
template <bool PI = false>
__device__ __forceinline__ void scale4_s6(uint32_t v, float d, float dneg, float* o, uint32_t k4b = 0x4B000000u) {
  const uint32_t kb = PI ? k4b : 0x4B000000u;
  o[0] = fmaf(d, __uint_as_float(bpm<PI, 0x7440u>(v, kb)), dneg);
  o[1] = fmaf(d, __uint_as_float(bpm<PI, 0x7441u>(v, kb)), dneg);
  o[2] = fmaf(d, __uint_as_float(bpm<PI, 0x7442u>(v, kb)), dneg);
  o[3] = fmaf(d, __uint_as_float(bpm<PI, 0x7443u>(v, kb)), dneg);
}

// Sub-block sb = 2c + hi of a Q4_K block's pair of rows (unit_q4k_s6, unit_q4k_ss_s6; w: the
// lane's code words of chunk c, [row][step]): xs = the mma of x with ones (the sums of x), cc =
// the mma of x with the codes (q + magic - kM0: q exactly; FOLD, bf16 x: 128 + q, no
// subtraction). PI: bpm's immediate form.
template <class T, bool PI, bool FOLD>
__device__ __forceinline__ void q4k_sub_mma(const uint32_t (&w)[2][2], int c, int hi, const T* xj, uint32_t ones,
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
  uint32_t A0[4], A1[4];
  A0[0] = bpm<PI, 0x4140u>(v[0][0], magic);
  A0[1] = bpm<PI, 0x4140u>(v[1][0], magic);
  A0[2] = bpm<PI, 0x4342u>(v[0][0], magic);
  A0[3] = bpm<PI, 0x4342u>(v[1][0], magic);
  A1[0] = bpm<PI, 0x4140u>(v[0][1], magic);
  A1[1] = bpm<PI, 0x4140u>(v[1][1], magic);
  A1[2] = bpm<PI, 0x4342u>(v[0][1], magic);
  A1[3] = bpm<PI, 0x4342u>(v[1][1], magic);
  if constexpr (!FOLD) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      A0[i] = hsub2u<T>(A0[i], kM0);
      A1[i] = hsub2u<T>(A1[i], kM0);
    }
  }
  mma16816<T>(cc, A0, x0.x, x0.y);
  mma16816<T>(cc, A1, x1.x, x1.y);
}

// One Q4_K block (144 bytes at a / b, 16-byte aligned; as unit_q4k, session 6). PI: bpm's register magic (k4b:
// 0x4B000000 in a register). FOLD (bf16 x; session 6): the codes enter the mma as 128 + q (no
// packed subtraction) and the min term takes the 128 sum(x) out: d1 sum((128 + q) x) -
// (m1 + 128 d1) sum(x) (not the default's bits; bound: dmin mn + 271 d sc per sub-block).
template <class T, bool PI = false, bool FOLD = false>
__device__ __forceinline__ void unit_q4k_s6(uint32_t a, uint32_t b, const T* xj, int t, uint32_t magic, float (&acc)[4],
                                         uint32_t k4b = 0x4B000000u) {
  constexpr bool kFold = FOLD && std::is_same_v<T, bf16>;
  const uint32_t ones = splat<T>(1.0f);
  float d1[2][8], m1[2][8];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint4 hv = lds16(r ? b : a);
    const float d = f16f(hv.x & 0xffffu), dm = f16f(hv.x >> 16);
    const uint32_t sc0 = hv.y & 0x3f3f3f3fu, mn0 = hv.z & 0x3f3f3f3fu;
    const uint32_t sc1 = (hv.w & 0x0f0f0f0fu) | ((hv.y >> 2) & 0x30303030u);
    const uint32_t mn1 = ((hv.w >> 4) & 0x0f0f0f0fu) | ((hv.z >> 2) & 0x30303030u);
    scale4_s6<PI>(sc0, d, d * -8388608.0f, &d1[r][0], k4b);
    scale4_s6<PI>(sc1, d, d * -8388608.0f, &d1[r][4], k4b);
    scale4_s6<PI>(mn0, dm, dm * -8388608.0f, &m1[r][0], k4b);
    scale4_s6<PI>(mn1, dm, dm * -8388608.0f, &m1[r][4], k4b);
    if constexpr (kFold) {
#pragma unroll
      for (int i = 0; i < 8; ++i) m1[r][i] = fmaf(d1[r][i], 128.0f, m1[r][i]);
    }
  }
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint32_t w[2][2];  // [row][step]
    q4k_words(a, b, c, t, w);
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {  // sub-block 2c + hi
      const int sb = 2 * c + hi;
      float xs[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      q4k_sub_mma<T, PI, kFold>(w, c, hi, xj, ones, magic, xs, cc);
      acc[0] = fmaf(-m1[0][sb], xs[0], fmaf(d1[0][sb], cc[0], acc[0]));
      acc[1] = fmaf(-m1[0][sb], xs[1], fmaf(d1[0][sb], cc[1], acc[1]));
      acc[2] = fmaf(-m1[1][sb], xs[2], fmaf(d1[1][sb], cc[2], acc[2]));
      acc[3] = fmaf(-m1[1][sb], xs[3], fmaf(d1[1][sb], cc[3], acc[3]));
    }
  }
}

// One Q4_K block (as unit_q4k_ss, session 6): chunk c of a row = d1[2c], d1[2c + 1], m1[2c], m1[2c + 1]
// (FOLD: m1 + 128 d1 in place of m1).
template <class T, bool PI = false, bool FOLD = false>
__device__ __forceinline__ void unit_q4k_ss_s6(uint32_t a, uint32_t b, const T* xj, int g, int t, uint32_t magic,
                                            uint32_t scr, float (&acc)[4], uint32_t k4b = 0x4B000000u) {
  constexpr bool kFold = FOLD && std::is_same_v<T, bf16>;
  const uint32_t ones = splat<T>(1.0f);
  {
    const int r = t >> 1, h = t & 1;  // row half, sub-blocks 4h..4h+3
    const uint4 hv = lds16(r ? b : a);
    const float d = f16f(hv.x & 0xffffu), dm = f16f(hv.x >> 16);
    const uint32_t sc = h ? ((hv.w & 0x0f0f0f0fu) | ((hv.y >> 2) & 0x30303030u)) : (hv.y & 0x3f3f3f3fu);
    const uint32_t mn = h ? (((hv.w >> 4) & 0x0f0f0f0fu) | ((hv.z >> 2) & 0x30303030u)) : (hv.z & 0x3f3f3f3fu);
    float dv[4], mv[4];
    scale4_s6<PI>(sc, d, d * -8388608.0f, dv, k4b);
    scale4_s6<PI>(mn, dm, dm * -8388608.0f, mv, k4b);
    if constexpr (kFold) {
#pragma unroll
      for (int i = 0; i < 4; ++i) mv[i] = fmaf(dv[i], 128.0f, mv[i]);
    }
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
      q4k_sub_mma<T, PI, kFold>(w, c, hi, xj, ones, magic, xs, cc);
      const float d1a = hi ? s0.y : s0.x, m1a = hi ? s0.w : s0.z;
      const float d1b = hi ? s1.y : s1.x, m1b = hi ? s1.w : s1.z;
      acc[0] = fmaf(-m1a, xs[0], fmaf(d1a, cc[0], acc[0]));
      acc[1] = fmaf(-m1a, xs[1], fmaf(d1a, cc[1], acc[1]));
      acc[2] = fmaf(-m1b, xs[2], fmaf(d1b, cc[2], acc[2]));
      acc[3] = fmaf(-m1b, xs[3], fmaf(d1b, cc[3], acc[3]));
    }
  }
}

}  // namespace gk::cuda::gguf_st
