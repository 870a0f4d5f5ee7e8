// CUDA argmax (chunked, two launches) and top-k (one 1024-thread block per row) over rows of logits.
// top-k: radix select of the k-th largest order key, then the entries above it
// plus the lowest-index entries equal to it are gathered and bitonic-sorted in
// shared memory by (value descending, index ascending). NaN is treated as -inf.
#include "core/cuda_util.h"
#include "cuda/common/sampling.cuh"
#include "ops/backend.h"

namespace gk::cuda {

namespace {
using namespace smpk;

template <class T>
__device__ __forceinline__ float load_val(const T* p, int64_t i) {
  float v = float(p[i]);
  return v != v ? -INFINITY : v;
}

// argmax: one 256-thread CTA per 4096-entry chunk writes its (max, index); a second
// launch merges the chunks of each row (ties -> lowest index; order-independent).
constexpr int kArgThreads = 256, kArgChunk = 4096;

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
}

__device__ __forceinline__ void cta_argmax(float& v, int& i) {
  __shared__ float fv[kArgThreads / 32];
  __shared__ int fi[kArgThreads / 32];
  warp_argmax(v, i);
  if ((threadIdx.x & 31) == 0) fv[threadIdx.x >> 5] = v, fi[threadIdx.x >> 5] = i;
  __syncthreads();
  v = fv[0], i = fi[0];
#pragma unroll
  for (int k = 1; k < kArgThreads / 32; ++k)
    if (better(fv[k], fi[k], v, i)) v = fv[k], i = fi[k];
}

template <class T>
__global__ void __launch_bounds__(kArgThreads) k_argmax_part(const T* logits, int64_t V, int64_t stride,
                                                            float2* part, int64_t C) {
  const T* p = logits + int64_t(blockIdx.y) * stride;
  const int64_t c0 = int64_t(blockIdx.x) * kArgChunk, c1 = min(V, c0 + kArgChunk);
  float bv = -INFINITY;
  int bi = INT32_MAX;
#pragma unroll 4
  for (int64_t i = c0 + threadIdx.x; i < c1; i += kArgThreads) {
    float v = float(p[i]);
    if (v != v) v = -INFINITY;
    if (better(v, int(i), bv, bi)) bv = v, bi = int(i);
  }
  cta_argmax(bv, bi);
  if (threadIdx.x == 0) part[int64_t(blockIdx.y) * C + blockIdx.x] = make_float2(bv, __int_as_float(bi));
}

__global__ void __launch_bounds__(kArgThreads) k_argmax_merge(const float2* part, int64_t C, int32_t* out) {
  const float2* p = part + int64_t(blockIdx.x) * C;
  float bv = -INFINITY;
  int bi = INT32_MAX;
  for (int64_t k = threadIdx.x; k < C; k += kArgThreads) {
    const float2 q = p[k];
    if (better(q.x, __float_as_int(q.y), bv, bi)) bv = q.x, bi = __float_as_int(q.y);
  }
  cta_argmax(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi == INT32_MAX ? 0 : bi;
}

constexpr int kMaxK = 1024;

template <class T>
__global__ void __launch_bounds__(kRowThreads, 1) k_topk(const T* logits, int64_t V, int64_t stride, int k,
                                                      float* values, int32_t* indices) {
  __shared__ Shared sh;
  __shared__ uint32_t skey[kMaxK];
  __shared__ int32_t sidx[kMaxK];
  __shared__ int ngt;
  const T* p = logits + int64_t(blockIdx.x) * stride;
  const uint32_t kap = radix_select(
                           sh, p, V, [k](unsigned long long) { return (unsigned long long)k; },
                           [](int64_t, float v, uint32_t& key) {
                             key = smp::order_key(v != v ? -INFINITY : v);
                             return true;
                           },
                           [](int64_t, float) { return 1ull; })
                           .key;
  int P = 1;
  while (P < k) P <<= 1;
  for (int j = threadIdx.x; j < P; j += kRowThreads) skey[j] = 0u, sidx[j] = INT32_MAX;
  if (threadIdx.x == 0) ngt = 0;
  __syncthreads();
  row_for_each(p, V, [&](int64_t i, float v) {
    uint32_t key = smp::order_key(v != v ? -INFINITY : v);
    if (key > kap) {
      int pos = atomicAdd(&ngt, 1);  // < k by construction; order fixed by the sort below
      if (pos < k) skey[pos] = key, sidx[pos] = int32_t(i);
    }
  });
  __syncthreads();
  const int gt = ngt < k ? ngt : k;
  const int need = k - gt;
  // the `need` lowest indices whose key equals kappa, in index order
  int base = 0;
  for (int64_t tile = 0; tile < V && base < need; tile += int64_t(kRowThreads) * 4) {
    const int64_t i0 = tile + int64_t(threadIdx.x) * 4;
    bool eq[4];
    unsigned long long loc = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      eq[j] = i0 + j < V && smp::order_key(load_val(p, i0 + j)) == kap;
      loc += eq[j];
    }
    unsigned long long tot;
    int pos = base + int(block_excl_scan(sh, loc, &tot));
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (eq[j]) {
        if (pos < need) skey[gt + pos] = kap, sidx[gt + pos] = int32_t(i0 + j);
        ++pos;
      }
    base += int(tot);
  }
  __syncthreads();
  // bitonic sort of P entries: key descending, index ascending
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride_ = size >> 1; stride_ > 0; stride_ >>= 1) {
      for (int t = threadIdx.x; t < P; t += kRowThreads) {
        int u = t ^ stride_;
        if (u > t) {
          bool desc = (t & size) == 0;
          uint32_t ka = skey[t], kb = skey[u];
          int32_t ia = sidx[t], ib = sidx[u];
          bool a_first = ka > kb || (ka == kb && ia < ib);
          if (a_first != desc) skey[t] = kb, skey[u] = ka, sidx[t] = ib, sidx[u] = ia;
        }
      }
      __syncthreads();
    }
  }
  for (int j = threadIdx.x; j < k; j += kRowThreads) {
    int32_t i = sidx[j];
    indices[int64_t(blockIdx.x) * k + j] = i;
    if (values) values[int64_t(blockIdx.x) * k + j] = load_val(p, i);
  }
}

template <class F>
void by_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::f16: return f(f16{});
    default: throw TypeError("logits: dtype must be float32, bfloat16 or float16");
  }
}

}  // namespace

int64_t argmax_workspace_bytes(int64_t B, int64_t V) { return B * ((V + kArgChunk - 1) / kArgChunk) * 8; }

void argmax_rows(const void* logits, DType dt, int64_t B, int64_t V, int64_t row_stride, int32_t* out, void* ws,
                 void* stream) {
  if (B > 65535) throw ValueError(cat("logits: at most 65535 rows per call on CUDA, got ", B));
  const int64_t C = (V + kArgChunk - 1) / kArgChunk;
  auto st = static_cast<cudaStream_t>(stream);
  float2* part = static_cast<float2*>(ws);
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    k_argmax_part<T><<<dim3(unsigned(C), unsigned(B)), kArgThreads, 0, st>>>(static_cast<const T*>(logits), V,
                                                                            row_stride, part, C);
  });
  GK_LAUNCH_CHECK("sampling_argmax");
  k_argmax_merge<<<unsigned(B), kArgThreads, 0, st>>>(part, C, out);
  GK_LAUNCH_CHECK("sampling_argmax_merge");
}

void topk_rows(const void* logits, DType dt, int64_t B, int64_t V, int64_t row_stride, int64_t k, float* values,
               int32_t* indices, void* stream) {
  if (k > kMaxK) throw ValueError(cat("k: at most ", kMaxK, " on CUDA, got ", k));
  by_dtype(dt, [&](auto t) {
    using T = decltype(t);
    k_topk<T><<<unsigned(B), kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const T*>(logits), V,
                                                                                  row_stride, int(k), values, indices);
  });
  GK_LAUNCH_CHECK("sampling_topk");
}

}  // namespace gk::cuda
