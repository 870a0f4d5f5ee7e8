// CUDA rope (NeoX and interleaved, partial rotary, in or out of place), the
// sinusoidal position encodings and the ALiBi bias.
//
// rope: one block per token. Thread c-lanes own a fixed chunk of P rotary pairs
// and compute its cos/sin once (sincosf of the fp32 angle, the table in the
// kernel arguments), then walk the q and k heads of the token with 16-byte
// vector accesses (a scalar variant handles unaligned layouts).
#include <algorithm>

#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("rope", "sinusoidal_positions", "alibi_bias");

namespace {

__device__ __forceinline__ int64_t pos_at(const void* p, bool p64, int64_t t) {
  return p64 ? static_cast<const int64_t*>(p)[t] : int64_t(static_cast<const int32_t*>(p)[t]);
}

template <class T, int M, bool VEC>
__device__ __forceinline__ void ld(const T* p, T (&r)[M]) {
  if constexpr (VEC) {
    Vec<T, M> v = *reinterpret_cast<const Vec<T, M>*>(p);
#pragma unroll
    for (int j = 0; j < M; ++j) r[j] = v.v[j];
  } else {
#pragma unroll
    for (int j = 0; j < M; ++j) r[j] = p[j];
  }
}
template <class T, int M, bool VEC>
__device__ __forceinline__ void st(T* p, const T (&r)[M]) {
  if constexpr (VEC) {
    Vec<T, M> v;
#pragma unroll
    for (int j = 0; j < M; ++j) v.v[j] = r[j];
    *reinterpret_cast<Vec<T, M>*>(p) = v;
  } else {
#pragma unroll
    for (int j = 0; j < M; ++j) p[j] = r[j];
  }
}

// P pairs per thread; blockDim.x is a multiple of nch = rd / 2 / P.
template <class T, bool IL, int P, bool VEC>
__global__ void __launch_bounds__(1024) k_rope(const __grid_constant__ RopeArgs a) {
  const int64_t t = blockIdx.x;
  const int n = a.rd / 2, nch = n / P;
  const int c = int(threadIdx.x) % nch, lanes = int(blockDim.x) / nch;
  const float p = float(pos_at(a.pos, a.pos64, t));
  float cs[P], sn[P];
#pragma unroll
  for (int j = 0; j < P; ++j) {
    sincosf(p * a.inv_freq[c * P + j], &sn[j], &cs[j]);
    cs[j] *= a.mscale;
    sn[j] *= a.mscale;
  }
  const int nh = a.hq + a.hk;
  for (int h = int(threadIdx.x) / nch; h < nh; h += lanes) {
    const bool isq = h < a.hq;
    const int hh = isq ? h : h - a.hq;
    const T* x = isq ? static_cast<const T*>(a.q) + t * a.q_ts + hh * a.q_hs
                     : static_cast<const T*>(a.k) + t * a.k_ts + hh * a.k_hs;
    T* o = isq ? static_cast<T*>(a.q_out) + t * a.qo_ts + hh * a.qo_hs
               : static_cast<T*>(a.k_out) + t * a.ko_ts + hh * a.ko_hs;
    if constexpr (IL) {
      T v[2 * P];
      ld<T, 2 * P, VEC>(x + 2 * c * P, v);
#pragma unroll
      for (int j = 0; j < P; ++j) {
        float x1 = float(v[2 * j]), x2 = float(v[2 * j + 1]);
        v[2 * j] = convert<T>(x1 * cs[j] - x2 * sn[j]);
        v[2 * j + 1] = convert<T>(x2 * cs[j] + x1 * sn[j]);
      }
      st<T, 2 * P, VEC>(o + 2 * c * P, v);
    } else {
      T v1[P], v2[P];
      ld<T, P, VEC>(x + c * P, v1);
      ld<T, P, VEC>(x + n + c * P, v2);
#pragma unroll
      for (int j = 0; j < P; ++j) {
        float x1 = float(v1[j]), x2 = float(v2[j]);
        v1[j] = convert<T>(x1 * cs[j] - x2 * sn[j]);
        v2[j] = convert<T>(x2 * cs[j] + x1 * sn[j]);
      }
      st<T, P, VEC>(o + c * P, v1);
      st<T, P, VEC>(o + n + c * P, v2);
    }
  }
  if (a.copy_tail) {  // out of place with rotary_dim < head_dim: copy the rest
    const int tail = a.D - a.rd;
    for (int u = threadIdx.x; u < nh * tail; u += blockDim.x) {
      const int h = u / tail, e = a.rd + u % tail;
      if (h < a.hq) static_cast<T*>(a.q_out)[t * a.qo_ts + h * a.qo_hs + e] = static_cast<const T*>(a.q)[t * a.q_ts + h * a.q_hs + e];
      else static_cast<T*>(a.k_out)[t * a.ko_ts + (h - a.hq) * a.ko_hs + e] = static_cast<const T*>(a.k)[t * a.k_ts + (h - a.hq) * a.k_hs + e];
    }
  }
}

template <class T, bool IL, int P, bool VEC>
void launch_rope(const RopeArgs& a, cudaStream_t st) {
  const int nch = a.rd / 2 / P;
  const int lanes = std::max(1, std::min(128 / nch, a.hq + a.hk));
  const int threads = nch * lanes;
  if (a.T > int64_t(INT32_MAX)) throw ValueError("q: too many tokens for one launch");
  k_rope<T, IL, P, VEC><<<unsigned(a.T), unsigned(threads), 0, st>>>(a);
  GK_LAUNCH_CHECK("rope");
}

template <class T>
void rope_t(const RopeArgs& a, cudaStream_t st) {
  constexpr int N = 16 / sizeof(T);
  bool vec = aligned16(a.q) && aligned16(a.q_out) && (a.hk == 0 || (aligned16(a.k) && aligned16(a.k_out)));
  for (int64_t s : {a.q_ts, a.q_hs, a.qo_ts, a.qo_hs}) vec = vec && s % N == 0;
  if (a.hk) for (int64_t s : {a.k_ts, a.k_hs, a.ko_ts, a.ko_hs}) vec = vec && s % N == 0;
  const int n = a.rd / 2;
  if (a.interleaved) {
    if (vec && n % (N / 2) == 0) return launch_rope<T, true, N / 2, true>(a, st);
    return launch_rope<T, true, 1, false>(a, st);
  }
  if (vec && n % N == 0) return launch_rope<T, false, N, true>(a, st);
  return launch_rope<T, false, 1, false>(a, st);
}

template <class T>
__global__ void k_sinusoid(const __grid_constant__ SinusoidArgs a) {
  const int64_t total = a.T * (a.dim / 2);
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = u / (a.dim / 2);
    const int i = int(u - t * (a.dim / 2));
    float s, c;
    sincosf(float(pos_at(a.pos, a.pos64, t)) * a.inv_freq[i], &s, &c);
    T* o = static_cast<T*>(a.out) + t * a.dim + 2 * i;
    o[0] = convert<T>(s);
    o[1] = convert<T>(c);
  }
}

template <class T>
__global__ void k_alibi(AlibiArgs a) {
  const int64_t total = int64_t(a.H) * a.Lq * a.Lk;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < total; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = u % a.Lk, i = (u / a.Lk) % a.Lq, h = u / (a.Lk * a.Lq);
    static_cast<T*>(a.out)[u] = convert<T>(float(double(a.slopes[h]) * double(j - (i + a.Lk - a.Lq))));
  }
}

}  // namespace

void rope(const RopeArgs& a, void* stream) {
  dispatch_float(a.dtype, [&](auto t) { rope_t<decltype(t)>(a, static_cast<cudaStream_t>(stream)); });
}

void sinusoidal(const SinusoidArgs& a, void* stream) {
  dispatch_float(a.dtype, [&](auto t) {
    k_sinusoid<decltype(t)><<<grid_for(a.T * (a.dim / 2), kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
    GK_LAUNCH_CHECK("sinusoidal_positions");
  });
}

void alibi_bias(const AlibiArgs& a, void* stream) {
  dispatch_float(a.dtype, [&](auto t) {
    k_alibi<decltype(t)><<<grid_for(int64_t(a.H) * a.Lq * a.Lk, kThreads), kThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(a);
    GK_LAUNCH_CHECK("alibi_bias");
  });
}

}  // namespace gk::cuda
