// 16-byte vectors for the bandwidth-bound kernels, kept as raw words in
// registers until the arithmetic needs them (so that every load of a thread is
// issued before the first conversion), and their conversion to and from fp32.
//
// Rounding is the one of gk::convert (src/cpu references): fp32 -> bf16 rounds
// to nearest even with the hardware's paired conversion, and a NaN keeps its
// sign and payload and is made quiet, exactly as bf16(float) in numeric.h.
//
// Also: a 32-bit divide-by-constant for row/column indices, and a tuning knob
// (GPUKIT_TUNE) the benchmarks use to compare launch shapes in one process.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "gpukit/dtype.h"

namespace gk::cuda {

using raw16 = uint4;

template <class T>
inline constexpr int kVecN = 16 / int(sizeof(T));  // elements per 16-byte vector

__device__ __forceinline__ raw16 ld16(const void* p) { return *static_cast<const raw16*>(p); }
// Read-only for the whole kernel (weights, inputs that no thread of the kernel writes).
__device__ __forceinline__ raw16 ld16_ro(const void* p) { return __ldg(static_cast<const raw16*>(p)); }
// Streamed once: evict-first in L1/L2.
__device__ __forceinline__ raw16 ld16_stream(const void* p) { return __ldcs(static_cast<const raw16*>(p)); }
__device__ __forceinline__ void st16(void* p, raw16 v) { *static_cast<raw16*>(p) = v; }
__device__ __forceinline__ void st16_stream(void* p, raw16 v) { __stcs(static_cast<raw16*>(p), v); }

__device__ __forceinline__ uint32_t word(const raw16& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ void set_word(raw16& v, int i, uint32_t w) {
  if (i == 0) v.x = w;
  else if (i == 1) v.y = w;
  else if (i == 2) v.z = w;
  else v.w = w;
}

// bf16 NaN as numeric.h rounds it: sign and payload kept, quiet bit set.
__device__ __forceinline__ uint32_t bf16_bits_exact(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Two floats -> one word of two bf16 (lo in the low half), rounded as convert<bf16>.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // one cvt.rn.bf16x2.f32
  uint32_t r;
  memcpy(&r, &h, 4);
  if (lo != lo || hi != hi) r = bf16_bits_exact(lo) | (bf16_bits_exact(hi) << 16);  // rare: NaN payloads
  return r;
}

// The N = kVecN<T> elements of a raw vector as floats, and back.
template <class T>
__device__ __forceinline__ void unpack(const raw16& v, float (&f)[kVecN<T>]) {
  if constexpr (std::is_same_v<T, float>) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
  } else if constexpr (std::is_same_v<T, bf16>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t w = word(v, i);
      f[2 * i] = __uint_as_float(w << 16);
      f[2 * i + 1] = __uint_as_float(w & 0xffff0000u);
    }
  } else {
    static_assert(std::is_same_v<T, f16>, "unpack: f32, bf16 or f16");
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t w = word(v, i);
      __half2 h;
      memcpy(&h, &w, 4);
      float2 p = __half22float2(h);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
}

template <class T>
__device__ __forceinline__ raw16 pack(const float (&f)[kVecN<T>]) {
  raw16 v;
  if constexpr (std::is_same_v<T, float>) {
    v.x = __float_as_uint(f[0]), v.y = __float_as_uint(f[1]), v.z = __float_as_uint(f[2]), v.w = __float_as_uint(f[3]);
  } else if constexpr (std::is_same_v<T, bf16>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) set_word(v, i, pack_bf16x2(f[2 * i], f[2 * i + 1]));
  } else {
    static_assert(std::is_same_v<T, f16>, "pack: f32, bf16 or f16");
#pragma unroll
    for (int i = 0; i < 4; ++i)
      set_word(v, i, uint32_t(convert<f16>(f[2 * i]).bits) | (uint32_t(convert<f16>(f[2 * i + 1]).bits) << 16));
  }
  return v;
}

// Element i of a raw vector as float (for code that walks a vector lane by lane).
template <class T>
__device__ __forceinline__ float elem(const raw16& v, int i) {
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(word(v, i));
  } else if constexpr (std::is_same_v<T, bf16>) {
    uint32_t w = word(v, i >> 1);
    return __uint_as_float((i & 1) ? (w & 0xffff0000u) : (w << 16));
  } else {
    uint32_t w = word(v, i >> 1);
    return float(f16::from_bits(uint16_t((i & 1) ? (w >> 16) : (w & 0xffffu))));
  }
}

// n / d for 0 <= n < 2^31 and 1 <= d < 2^31, by a multiply and a shift:
// s = ceil(log2 d), m = floor(2^32 (2^s - d) / d) + 1, q = (umulhi(n, m) + n) >> s.
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t div) : d(div) {
    while ((uint64_t(1) << s) < d) ++s;
    m = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << s) - d)) / d + 1);
  }
  GK_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, m);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * m) >> 32);
#endif
    return uint32_t((uint64_t(hi) + n) >> s);
  }
};

// Multiprocessors of the current device (cached per device).
inline int sm_count() {
  static int cache[64] = {};  // benign race: every writer stores the same value
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  int& n = cache[dev & 63];
  if (!n && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) n = 132;
  return n;
}

// Blocks of kernel K with `threads` threads that are resident at once on the
// device (one wave), for persistent grids. Cached per kernel and block size
// (the first device's answer).
template <auto K>
inline int64_t resident_blocks(int threads) {
  static int cache[33] = {};  // benign race: every writer stores the same value
  int& per = cache[std::min(32, std::max(0, threads / 32))];
  if (!per) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, K, threads, 0) != cudaSuccess) n = 2048 / threads;
    per = std::max(1, n);
  }
  return int64_t(sm_count()) * per;
}

// Launch-shape overrides for benchmarking: GPUKIT_TUNE="key=value,key=value".
// Returns dflt when the key is absent (the normal case). Read at each launch
// (a getenv and a short scan), so a benchmark can change it between timings.
inline int tune(const char* key, int dflt) {
  const char* e = std::getenv("GPUKIT_TUNE");
  if (!e || !*e) return dflt;
  const size_t kl = std::strlen(key);
  for (const char* p = e; *p;) {
    const char* end = std::strchr(p, ',');
    if (!end) end = p + std::strlen(p);
    if (size_t(end - p) > kl && std::strncmp(p, key, kl) == 0 && p[kl] == '=') return std::atoi(p + kl + 1);
    p = *end ? end + 1 : end;
  }
  return dflt;
}

}  // namespace gk::cuda
