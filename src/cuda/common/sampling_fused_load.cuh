// The load + process phase of the fused sampling kernel (src/cuda/sampling_fused.cu): a
// slice's logits read 16 bytes at a time (groups of G = 16 / sizeof(T) entries), and the
// history counts / bans / EOS marks accumulated with integer atomics in the slice's shared
// words before the logits replace them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/sampling_args.h"
#include "cuda/common/sampling_cluster.cuh"

namespace gk::cuda::fused {

template <class T>
__device__ __forceinline__ float elem(const uint4& q, int k) {
  if constexpr (sizeof(T) == 4) {
    const uint32_t u = k == 0 ? q.x : (k == 1 ? q.y : (k == 2 ? q.z : q.w));
    return __uint_as_float(u);
  } else {
    const uint32_t word = (k >> 1) == 0 ? q.x : ((k >> 1) == 1 ? q.y : ((k >> 1) == 2 ? q.z : q.w));
    return float(T::from_bits(uint16_t((k & 1) ? word >> 16 : word & 0xffffu)));
  }
}

// The group's entries rotated by r (0 <= r < G): entry k of the result is entry (k + r) mod G.
template <class T>
__device__ __forceinline__ uint4 rotate_group(uint4 q, int r) {
  constexpr int G = 16 / int(sizeof(T));
  const int wr = G == 4 ? r : r >> 1;  // whole words
  if (wr & 1) q = make_uint4(q.y, q.z, q.w, q.x);
  if (wr & 2) q = make_uint4(q.z, q.w, q.x, q.y);
  if (G == 8 && (r & 1))  // half a word more
    q = make_uint4(__funnelshift_r(q.x, q.y, 16), __funnelshift_r(q.y, q.z, 16), __funnelshift_r(q.z, q.w, 16),
                   __funnelshift_r(q.w, q.x, 16));
  return q;
}

template <class T>
__device__ __forceinline__ uint32_t raw_bits(T x) {
  if constexpr (sizeof(T) == 4) return __float_as_uint(x);
  else return uint32_t(x.bits);
}

// G consecutive entries [e, e + G) of the slice (entries >= n read as 0, never used).
template <class T>
__device__ __forceinline__ uint4 load_group(const T* p, int64_t e, int64_t n, bool aligned) {
  constexpr int G = 16 / int(sizeof(T));
  if (aligned && e + G <= n) return *reinterpret_cast<const uint4*>(p + e);
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int k = 0; k < G; ++k) {
    if (e + k < n) {
      if constexpr (sizeof(T) == 4) w[k] = raw_bits(p[e + k]);
      else w[k >> 1] |= raw_bits(p[e + k]) << (16 * (k & 1));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Zeroes the slice's n shared words, then counts the row's history tokens that fall in the
// slice [c0, c0 + n) (kCntMask bits) and marks its banned tokens, and its EOS tokens while
// eos_on (kBan). Thread t of NT; ends with the block synchronized.
template <int NT>
__device__ __forceinline__ void mark_slice(const SampleArgs& a, int64_t r, uint32_t* vals, int64_t c0, int n, int t,
                                           bool eos_on) {
  for (int i = t * 4; i < n; i += NT * 4) *reinterpret_cast<uint4*>(vals + i) = make_uint4(0u, 0u, 0u, 0u);
  __syncthreads();
  if (a.history) {
    int64_t len = a.hist_len.at(r);
    len = len < 0 ? 0 : (len > a.hist_max ? a.hist_max : len);
    const int32_t* h = a.history + r * a.hist_stride;
    for (int64_t j0 = 0; j0 < len; j0 += 4 * NT) {  // 4 loads in flight per thread
      int32_t tk[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t j = j0 + u * NT + t;
        tk[u] = j < len ? h[j] : -1;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (tk[u] >= c0 && tk[u] < c0 + n) atomicAdd(&vals[tk[u] - c0], 1u);
    }
  }
  if (a.banned)
    for (int64_t j = t; j < a.n_banned; j += NT) {
      const int32_t tk = a.banned[r * a.banned_row_stride + j];
      if (tk >= c0 && tk < c0 + n) atomicOr(&vals[tk - c0], unsigned(kBan));
    }
  if (eos_on)
    for (int64_t j = t; j < a.n_eos; j += NT) {
      const int32_t tk = a.eos[j];
      if (tk >= c0 && tk < c0 + n) atomicOr(&vals[tk - c0], unsigned(kBan));
    }
  __syncthreads();
}

}  // namespace gk::cuda::fused
