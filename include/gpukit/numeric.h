// Scalar storage types that have no C++ equivalent: float16, bfloat16 and the
// two fp8 formats. The conversions are written once, as host/device bit
// manipulation, so the CPU reference and the CUDA kernels round identically:
// float -> narrow rounds to nearest even; fp8 saturates finite overflow and
// infinities to the largest finite value and keeps NaN.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define GK_HD __host__ __device__ __forceinline__
#else
#define GK_HD inline
#endif

namespace gk {

GK_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
GK_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bfloat16 ---------------------------------------------------------------
struct bf16 {
  uint16_t bits;
  bf16() = default;
  GK_HD static bf16 from_bits(uint16_t b) { bf16 r; r.bits = b; return r; }
  GK_HD explicit bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = uint16_t((u >> 16) | 0x40); return; }  // quiet NaN
#if defined(__CUDA_ARCH__)
    bits = __bfloat16_as_ushort(__float2bfloat16_rn(f));  // one instruction, same rounding
    return;
#endif
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    bits = uint16_t(u >> 16);
  }
  GK_HD operator float() const { return bits_f32(uint32_t(bits) << 16); }
};

// ---- float16 (IEEE binary16) ------------------------------------------------
struct f16 {
  uint16_t bits;
  f16() = default;
  GK_HD static f16 from_bits(uint16_t b) { f16 r; r.bits = b; return r; }
  GK_HD explicit f16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) { bits = uint16_t(sign | 0x7e00u); return; }  // NaN
#if defined(__CUDA_ARCH__)
    bits = __half_as_ushort(__float2half_rn(f));  // one instruction, same rounding
    return;
#endif
    if (a >= 0x477ff000u) { bits = uint16_t(sign | 0x7c00u); return; }  // rounds to inf
    if (a < 0x38800000u) {  // subnormal or zero in half: scale by 2^24 in float math
      // result = round(|f| * 2^24) as integer half-subnormal mantissa (RNE via float add)
      float af = bits_f32(a);
      float t = af + 0.5f;  // 0.5 = 2^-1: adding forces rounding at 2^-24 granularity
      uint32_t tu = f32_bits(t) - 0x3f000000u;
      bits = uint16_t(sign | tu);
      return;
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
    bits = uint16_t(sign | (a >> 13));
  }
  GK_HD operator float() const {
    uint32_t sign = uint32_t(bits & 0x8000u) << 16;
    uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
      float v = float(m) * 5.9604644775390625e-08f;  // m * 2^-24, exact
      return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
  }
};

// ---- fp8 (OCP formats): e4m3fn (no inf, NaN = S.1111.111) and e5m2 --------
namespace detail {
// Round a finite float magnitude to a format with `mbits` mantissa bits, exponent
// bias `bias`, returning the biased exponent/mantissa code (no sign). `maxcode` is
// the largest finite code; results above it saturate to it.
GK_HD uint32_t fp8_encode_mag(float af, int mbits, int bias, uint32_t maxcode) {
  uint32_t a = f32_bits(af);
  int e = int(a >> 23) - 127;  // unbiased exponent of the float
  int min_e = 1 - bias;        // smallest normal exponent of the target
  uint32_t code;
  if (e < min_e) {
    // subnormal in target: value / 2^(min_e - mbits) rounded to an integer (RNE)
    int shift = min_e - mbits;  // ulp exponent
    // scale: af * 2^-shift, compute with float math exactly (power of two)
    float scaled = af * bits_f32(uint32_t(127 - shift) << 23);
    // round half to even for scaled in [0, 2^mbits]
    float fl = float(int(scaled));
    float diff = scaled - fl;
    uint32_t q = uint32_t(fl);
    if (diff > 0.5f || (diff == 0.5f && (q & 1u))) q += 1;
    code = q;  // q == 2^mbits rolls over into the smallest normal, as it should
  } else {
    uint32_t mant = a & 0x7fffffu;
    int drop = 23 - mbits;
    uint32_t keep = mant >> drop;
    uint32_t rem = mant & ((1u << drop) - 1u);
    uint32_t half = 1u << (drop - 1);
    uint32_t c = (uint32_t(e + bias) << mbits) | keep;
    if (rem > half || (rem == half && (keep & 1u))) c += 1;
    code = c;
  }
  return code > maxcode ? maxcode : code;
}
}  // namespace detail

struct f8e4m3 {
  uint8_t bits;
  f8e4m3() = default;
  GK_HD static f8e4m3 from_bits(uint8_t b) { f8e4m3 r; r.bits = b; return r; }
  GK_HD explicit f8e4m3(float f) {
    uint32_t u = f32_bits(f);
    uint8_t sign = uint8_t((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) { bits = uint8_t(sign | 0x7f); return; }
    if (a == 0x7f800000u) { bits = uint8_t(sign | 0x7e); return; }  // inf saturates to 448
    bits = uint8_t(sign | detail::fp8_encode_mag(bits_f32(a), 3, 7, 0x7e));
  }
  GK_HD operator float() const {
    uint32_t sign = uint32_t(bits & 0x80u) << 24;
    uint32_t e = (bits >> 3) & 0xfu, m = bits & 0x7u;
    if (e == 0xf && m == 0x7) return bits_f32(sign | 0x7fc00000u);
    if (e == 0) {
      float v = float(m) * 0.001953125f;  // 2^-9
      return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
  }
};

struct f8e5m2 {
  uint8_t bits;
  f8e5m2() = default;
  GK_HD static f8e5m2 from_bits(uint8_t b) { f8e5m2 r; r.bits = b; return r; }
  GK_HD explicit f8e5m2(float f) {
    uint32_t u = f32_bits(f);
    uint8_t sign = uint8_t((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) { bits = uint8_t(sign | 0x7e); return; }
    if (a == 0x7f800000u) { bits = uint8_t(sign | 0x7b); return; }  // inf saturates to 57344
    bits = uint8_t(sign | detail::fp8_encode_mag(bits_f32(a), 2, 15, 0x7b));
  }
  GK_HD operator float() const {
    uint32_t sign = uint32_t(bits & 0x80u) << 24;
    uint32_t e = (bits >> 2) & 0x1fu, m = bits & 0x3u;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 21));
    if (e == 0) {
      float v = float(m) * 1.52587890625e-05f;  // 2^-16
      return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 21));
  }
};

}  // namespace gk
