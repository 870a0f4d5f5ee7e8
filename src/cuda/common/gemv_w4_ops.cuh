// The staged 4-bit GEMV's device helpers (common/gemv_w4.cuh's kernel k_w4): copies with zero
// fill, shared-memory reads of 4 / 8 / 16 bytes, the int4 nibble-pair lop3, and the
// NVF4 decode (e2m1 magnitudes as subnormal-scaled bf16 / fp16 times the block scale).
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "gemv_stage.cuh"

namespace gk::cuda::gemv_detail {

// cp.async of U (4, 8, 16) bytes, of which `valid` (0..U) are read and the rest zero-filled.
template <int U>
__device__ __forceinline__ void cp_async_z(uint32_t dst, const void* src, int valid) {
  if constexpr (U == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(U), "r"(valid) : "memory");
}

__device__ __forceinline__ uint2 lds8(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}
// N (4, 8, 16) bytes of shared memory as a uint4 (the rest zero)
template <int N>
__device__ __forceinline__ uint4 lds_n(uint32_t a) {
  if constexpr (N == 16) return lds16(a);
  else if constexpr (N == 8) {
    const uint2 v = lds8(a);
    return make_uint4(v.x, v.y, 0u, 0u);
  } else return make_uint4(lds_u32(a), 0u, 0u, 0u);
}

__device__ __forceinline__ uint32_t w4_lop(uint32_t a, uint32_t c) {  // (a & 0x000f000f) | c
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "n"(0x000f000f), "r"(c));
  return r;
}
__device__ __forceinline__ uint32_t w4_opaque(uint32_t v) {  // kept in a register (lop3's third operand)
  asm volatile("" : "+r"(v));
  return v;
}

template <class T>
struct W4NvfBits {
  static constexpr int kMagShift = std::is_same_v<T, bf16> ? 6 : 9;  // where e1 e0 m go
  static constexpr uint32_t kMagMask = 0x7u << kMagShift | 0x7u << (16 + kMagShift);
  static constexpr float kScaleUp = std::is_same_v<T, bf16> ? 0x1p118f : 0x1p7f;
  static constexpr float kRowScale = std::is_same_v<T, bf16> ? 256.0f : 128.0f;
};
template <int S>
__device__ __forceinline__ uint32_t w4_shl(uint32_t u) {  // u << S, or u >> -S
  if constexpr (S >= 0) return u << S;
  else return u >> (-S);
}
// The codes (Q, Q + 4) of word u as T values e2m1 * scale * 2^-8 (bf16) / 2^-7 (fp16), exact;
// s2 = the block scale * kScaleUp, twice.
template <class T, int Q>
__device__ __forceinline__ uint32_t w4_nvf_pair(uint32_t u, uint32_t s2) {
  using NB = W4NvfBits<T>;
  const uint32_t m = w4_shl<NB::kMagShift - 4 * Q>(u) & NB::kMagMask;
  const uint32_t sg = w4_shl<12 - 4 * Q>(u);
  return hmul2u<T>(m, s2 ^ (sg & 0x80008000u));
}
// Two e4m3 bytes (b0 low) as T pairs (v0, v0) and (v1, v1) of value * kScaleUp (exact).
template <class T>
__device__ __forceinline__ void w4_nvf_scales(uint32_t b2, uint32_t& s0, uint32_t& s1) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(b2 & 0xffffu), __NV_E4M3);
  const float f0 = __half2float(*reinterpret_cast<__half*>(&h.x)) * W4NvfBits<T>::kScaleUp;
  const float f1 = __half2float(*reinterpret_cast<__half*>(&h.y)) * W4NvfBits<T>::kScaleUp;
  s0 = splat<T>(f0);
  s1 = splat<T>(f1);
}

template <int S>
__device__ __forceinline__ uint32_t w4_shr(uint32_t u) {
  if constexpr (S == 0) return u;
  else return u >> S;
}
__device__ __forceinline__ uint32_t w4_shift4(uint32_t u, int qq) {  // u >> 4 qq, qq = 0..3 (unrolled)
  return qq == 0 ? u : (qq == 1 ? w4_shr<4>(u) : (qq == 2 ? w4_shr<8>(u) : w4_shr<12>(u)));
}

// The B registers of one code word's two k-steps from the 8 x values at its physical k (xv.x =
// x0, x1, ...): natural nibble order (nibble i = weight i; pairs (p, p + 4)): (x0, x4), (x1, x5),
// (x2, x6), (x3, x7) by byte permutes; ORD (nibble p = weight 2p, p + 4 = 2p + 1): the words as loaded.
template <bool ORD>
__device__ __forceinline__ void w4_xpairs(const uint4& xv, uint32_t& bA0, uint32_t& bA1, uint32_t& bB0,
                                          uint32_t& bB1) {
  if constexpr (ORD) {
    bA0 = xv.x, bA1 = xv.y, bB0 = xv.z, bB1 = xv.w;
  } else {
    bA0 = __byte_perm(xv.x, xv.z, 0x5410u), bA1 = __byte_perm(xv.x, xv.z, 0x7632u);
    bB0 = __byte_perm(xv.y, xv.w, 0x5410u), bB1 = __byte_perm(xv.y, xv.w, 0x7632u);
  }
}

__device__ __forceinline__ void cp_async16_ca(uint32_t dst, const void* src) {  // cached in L1 too
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void sts16(uint32_t a, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// cp.async of U (4, 8, 16) whole bytes
template <int U>
__device__ __forceinline__ void cp_async_u(uint32_t dst, const void* src) {
  if constexpr (U == 16) cp_async16(dst, src);
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src), "n"(U) : "memory");
}

// ---- variant 61 (session 9; k_w4 MODE 14): bf16 x as fp16 x 2^e, the int4 codes decoded as fp16 ----
// max(|m|, |v|) per bf16 half, the sign bits xor-ed (masked off by the caller); a NaN in v is dropped
// (it stays NaN in the conversion)
__device__ __forceinline__ uint32_t w4_absmax_bf16x2(uint32_t m, uint32_t v) {
  uint32_t r;
  asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(v));
  return r;
}
__device__ __forceinline__ uint32_t w4_pack_h2(float lo, float hi) {  // fp16 (lo, hi), round to nearest
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// The stage's x (NC 16-byte chunks per lane at xa + 16 (lane + 32 i), bf16, 32 NC chunks in all) in place as fp16
// x * 2^e paired as w4_xpairs<false> pairs them: (x0, x4), (x1, x5), (x2, x6), (x3, x7) of each chunk. e (one per
// warp and stage) puts the largest |x| of the stage in [2^14, 2^15): every bf16 value of magnitude >= 2^-14 after
// scaling (>= 2^-28 of the stage's largest) converts exactly (8 significant bits into fp16's 11), smaller ones with
// an absolute error <= 2^-25 (fp16's subnormals), i.e. <= 2^-39 max |x|. e = 0 where the largest is inf / NaN,
// e <= 100 where it is below 2^-86 (or 0). Returns 2^-e (exact, normal). All 32 lanes call it.
template <int NC>
__device__ __forceinline__ float w4_xhalf(uint32_t xa, int lane) {
  uint4 v[NC];
  uint32_t mx = 0;
#pragma unroll
  for (int i = 0; i < NC; ++i) {
    v[i] = lds16(xa + uint32_t(16 * (lane + 32 * i)));
#pragma unroll
    for (int w = 0; w < 4; ++w) mx = w4_absmax_bf16x2(mx, word(v[i], w));
  }
  mx &= 0x7fff7fffu;
  mx = __reduce_max_sync(0xffffffffu, max(mx & 0xffffu, mx >> 16));  // |bf16| orders as its bits
  const int eb = int(mx >> 7);  // the largest's biased exponent (0: zero / subnormal, 255: inf / NaN)
  const int e = eb == 255 ? 0 : min(141 - eb, 100);
  const uint32_t s1 = uint32_t(e + 127) << 7, sc2 = s1 | (s1 << 16);  // 2^e twice (bf16)
#pragma unroll
  for (int i = 0; i < NC; ++i) {
    uint32_t h[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) h[w] = hmul2u<bf16>(word(v[i], w), sc2);  // exact where the result is normal
    uint4 o;
    o.x = w4_pack_h2(__uint_as_float(h[0] << 16), __uint_as_float(h[2] << 16));
    o.y = w4_pack_h2(__uint_as_float(h[0] & 0xffff0000u), __uint_as_float(h[2] & 0xffff0000u));
    o.z = w4_pack_h2(__uint_as_float(h[1] << 16), __uint_as_float(h[3] << 16));
    o.w = w4_pack_h2(__uint_as_float(h[1] & 0xffff0000u), __uint_as_float(h[3] & 0xffff0000u));
    sts16(xa + uint32_t(16 * (lane + 32 * i)), o);
  }
  return __uint_as_float(uint32_t(127 - e) << 23);
}
// fp16 -(64 + z) twice from z2 = bytes [z, 0x64, z, 0x64] (1024 + z twice): 960 - (1024 + z), exact (one HADD2)
__device__ __forceinline__ uint32_t w4_negz16(uint32_t z2) { return hsub2u<f16>(0x63806380u, z2); }
template <uint32_t MASK>
__device__ __forceinline__ uint32_t w4_lopm(uint32_t a, uint32_t c) {  // (a & MASK) | c
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "n"(MASK), "r"(c));
  return r;
}
__device__ __forceinline__ uint32_t w4_hfma2h(uint32_t a, uint32_t b, uint32_t c) {  // fp16x2 a b + c
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// The 4 fp16 pairs (q - z) of word u (pairs (p, p + 4), p = 0..3), exact: even pairs (1024 + q) - (1024 + z)
// (z2), odd pairs (nibbles at bits 4-7: 1024 + 16 q) (1024 + 16 q) / 16 - (64 + z) (n2) in one fma; mag = 1024
// twice. 1 shift, 4 lop3, 2 HADD2, 2 HFMA2 per word (48's bf16: 3 shifts, 4 lop3, 4 HADD2).
__device__ __forceinline__ void w4_half_pairs(uint32_t u, uint32_t mag, uint32_t z2, uint32_t n2, uint32_t (&pr)[4]) {
  constexpr uint32_t kSixteenth = 0x2c002c00u;  // 1/16 twice
  const uint32_t u8 = u >> 8;
  pr[0] = hsub2u<f16>(w4_lopm<0x000f000fu>(u, mag), z2);
  pr[1] = w4_hfma2h(w4_lopm<0x00f000f0u>(u, mag), kSixteenth, n2);
  pr[2] = hsub2u<f16>(w4_lopm<0x000f000fu>(u8, mag), z2);
  pr[3] = w4_hfma2h(w4_lopm<0x00f000f0u>(u8, mag), kSixteenth, n2);
}

}  // namespace gk::cuda::gemv_detail
