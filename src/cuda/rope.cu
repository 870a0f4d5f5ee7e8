// CUDA rope (NeoX and interleaved, partial rotary, in or out of place), the
// sinusoidal position encodings and the ALiBi bias.
//
// rope: one block per token, q and k heads in one launch, cos/sin computed once
// per (token, pair) into shared memory; 16-byte accesses when aligned, a scalar
// variant for any layout. See k_rope.
#include <algorithm>

#include "cuda/common/rows.cuh"
#include "cuda/common/vec.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("rope", "sinusoidal_positions", "alibi_bias");

namespace {

__device__ __forceinline__ int64_t pos_at(const void* p, bool p64, int64_t t) {
  return p64 ? static_cast<const int64_t*>(p)[t] : int64_t(static_cast<const int32_t*>(p)[t]);
}

// One block per token; block (nch, hl): threadIdx.x owns a chunk of P rotary
// pairs, threadIdx.y walks the token's q and k heads, K heads per pass. Each
// pass first issues the loads of its K heads (raw 16-byte vectors when VEC),
// then (first pass only) the block computes the token's cos/sin table once per
// pair (sincosf of the fp32 angle, into shared memory) while they are in
// flight, then rotates and stores. Every element is read and written by the
// same thread, so in-place calls are safe.
template <class T, bool IL, int P, bool VEC, int K>
__global__ void __launch_bounds__(VEC ? 256 : 1024) k_rope(const __grid_constant__ RopeArgs a) {
  __shared__ float tab[2 * kMaxRopeFreqs];  // cos then sin, scaled by mscale
  constexpr int M = IL ? 2 * P : P;         // elements per access (NeoX: two accesses per chunk)
  static_assert(!VEC || M == kVecN<T>, "vector accesses are 16 bytes");
  using RW = std::conditional_t<VEC, raw16, Vec<T, M>>;
  const int64_t t = blockIdx.x;
  const int n = a.rd / 2, c = threadIdx.x, nh = a.hq + a.hk;
  const int step = int(blockDim.y) * K;
  auto src = [&](int h) {
    return h < a.hq ? static_cast<const T*>(a.q) + t * a.q_ts + h * a.q_hs
                    : static_cast<const T*>(a.k) + t * a.k_ts + (h - a.hq) * a.k_hs;
  };
  auto dst = [&](int h) {
    return h < a.hq ? static_cast<T*>(a.q_out) + t * a.qo_ts + h * a.qo_hs
                    : static_cast<T*>(a.k_out) + t * a.ko_ts + (h - a.hq) * a.ko_hs;
  };
  auto load = [&](const T* p) {
    RW r;
    if constexpr (VEC) r = ld16(p);
    else {
#pragma unroll
      for (int j = 0; j < M; ++j) r.v[j] = p[j];
    }
    return r;
  };
  auto getf = [&](const RW& r, float (&f)[M]) {
    if constexpr (VEC) unpack<T>(r, f);
    else {
#pragma unroll
      for (int j = 0; j < M; ++j) f[j] = float(r.v[j]);
    }
  };
  auto store = [&](T* p, const float (&f)[M]) {
    if constexpr (VEC) st16(p, pack<T>(f));
    else {
#pragma unroll
      for (int j = 0; j < M; ++j) p[j] = convert<T>(f[j]);
    }
  };
  bool have_tab = false;
  for (int h0 = 0; h0 < nh; h0 += step) {
    RW v1[K], v2[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int h = h0 + int(threadIdx.y) + k * int(blockDim.y);
      if (h < nh) {
        const T* x = src(h);
        if constexpr (IL) v1[k] = load(x + 2 * c * P);
        else v1[k] = load(x + c * P), v2[k] = load(x + n + c * P);
      }
    }
    if (!have_tab) {  // uniform over the block
      const float p = float(pos_at(a.pos, a.pos64, t));
      for (int j = int(threadIdx.y * blockDim.x + threadIdx.x); j < n; j += int(blockDim.x * blockDim.y)) {
        float sn, cs;
        sincosf(p * a.inv_freq[j], &sn, &cs);
        tab[j] = cs * a.mscale;
        tab[kMaxRopeFreqs + j] = sn * a.mscale;
      }
      __syncthreads();
      have_tab = true;
    }
    float cs[P], sn[P];
#pragma unroll
    for (int j = 0; j < P; ++j) cs[j] = tab[c * P + j], sn[j] = tab[kMaxRopeFreqs + c * P + j];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int h = h0 + int(threadIdx.y) + k * int(blockDim.y);
      if (h < nh) {
        T* o = dst(h);
        if constexpr (IL) {
          float f[M];
          getf(v1[k], f);
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const float x1 = f[2 * j], x2 = f[2 * j + 1];
            f[2 * j] = x1 * cs[j] - x2 * sn[j];
            f[2 * j + 1] = x2 * cs[j] + x1 * sn[j];
          }
          store(o + 2 * c * P, f);
        } else {
          float f1[M], f2[M];
          getf(v1[k], f1);
          getf(v2[k], f2);
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const float x1 = f1[j], x2 = f2[j];
            f1[j] = x1 * cs[j] - x2 * sn[j];
            f2[j] = x2 * cs[j] + x1 * sn[j];
          }
          store(o + c * P, f1);
          store(o + n + c * P, f2);
        }
      }
    }
  }
  if (a.copy_tail) {  // out of place with rotary_dim < head_dim: copy the rest
    const int tail = a.D - a.rd;
    const int tid = int(threadIdx.y * blockDim.x + threadIdx.x), nthr = int(blockDim.x * blockDim.y);
    for (int u = tid; u < nh * tail; u += nthr) {
      const int h = u / tail, e = a.rd + u % tail;
      dst(h)[e] = src(h)[e];
    }
  }
}

template <class T, bool IL, int P, bool VEC>
void launch_rope(const RopeArgs& a, cudaStream_t st) {
  const int nch = a.rd / 2 / P, nh = a.hq + a.hk;
  int k = VEC ? tune("rope.k", sizeof(T) == 4 ? 4 : 2) : 4;
  k = k >= 8 ? 8 : k >= 4 ? 4 : k >= 2 ? 2 : 1;
  const int hl = std::max(1, std::min((nh + k - 1) / k, (VEC ? 256 : 1024) / nch));  // see k_rope's bounds
  if (a.T > int64_t(INT32_MAX)) throw ValueError("q: too many tokens for one launch");
  dim3 block{unsigned(nch), unsigned(hl), 1u};
  if constexpr (!VEC) {
    k_rope<T, IL, P, VEC, 4><<<unsigned(a.T), block, 0, st>>>(a);
  } else {
    switch (k) {
      case 1: k_rope<T, IL, P, VEC, 1><<<unsigned(a.T), block, 0, st>>>(a); break;
      case 2: k_rope<T, IL, P, VEC, 2><<<unsigned(a.T), block, 0, st>>>(a); break;
      case 4: k_rope<T, IL, P, VEC, 4><<<unsigned(a.T), block, 0, st>>>(a); break;
      default: k_rope<T, IL, P, VEC, 8><<<unsigned(a.T), block, 0, st>>>(a); break;
    }
  }
  GK_LAUNCH_CHECK("rope");
}

template <class T>
void rope_t(const RopeArgs& a, cudaStream_t st) {
  if (a.T <= 0 || a.hq + a.hk <= 0) return;
  constexpr int N = kVecN<T>;
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
