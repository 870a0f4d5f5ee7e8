// Building blocks of the multi-CTA sampling passes (src/cuda/sampling.cu): each row
// of the vocabulary is split into chunks of kChunk entries, one 256-thread CTA per
// chunk; per-row state, a global 2048-bin histogram (integer atomics only) and
// per-chunk partials live in a workspace. The last CTA of a row to finish a pass
// (integer counter) merges in a fixed order. Deterministic: float sums use fixed
// trees over fixed chunk boundaries (independent of the batch); integer sums are
// order-independent.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/block_reduce.cuh"
#include "ops/sampling_args.h"

namespace gk::cuda::wide {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPer = 8;                     // entries per thread per chunk
constexpr int kChunk = kThreads * kPer;     // 2048
constexpr int kBins = 2048;
constexpr uint32_t kNoThreshold = 0;        // key >= 0: keep everything

// Per-row state (zeroed by a memset before the first pass).
struct alignas(16) RowState {
  unsigned int counter;  // CTAs of this row done with the current pass
  int argmax;
  float m;               // max processed logit
  unsigned int kk, kp, kt;  // top-k, top-p, typical thresholds on their keys (0 = off)
  unsigned int prefix;   // radix prefix of the select in progress
  int dead;              // the select in progress found nothing (keep all)
  unsigned long long target;
  unsigned long long W1;  // typical: kept mass and sum of w (s - m) (integer atomics)
  long long S1;
  unsigned long long pad[9];
};
static_assert(sizeof(RowState) == 128, "RowState layout");

struct Partial {  // one per chunk
  float vmax;
  int imax;
  unsigned long long mass;
  unsigned long long z;  // sum of weight_of(exp(s - m)) over the chunk (logprob normalizer)
  unsigned long long pad;
};
static_assert(sizeof(Partial) == 32, "Partial layout");

struct Ws {
  RowState* state;            // [B]
  unsigned long long* hval;   // [B, kBins]
  unsigned int* hcnt;         // [B, kBins]
  Partial* part;              // [B, C]
  float* topv;                // [B, C, top_n]
  int* topi;                  // [B, C, top_n]
  int64_t C;
};

__host__ __device__ inline int64_t n_chunks(int64_t V) { return (V + kChunk - 1) / kChunk; }
// Bytes zeroed by the memset: states then histograms.
__host__ __device__ inline int64_t zero_bytes(int64_t B) {
  return B * int64_t(sizeof(RowState) + kBins * (sizeof(unsigned long long) + sizeof(unsigned int)));
}
__host__ __device__ inline int64_t ws_bytes(int64_t B, int64_t V, int top_n) {
  const int64_t C = n_chunks(V);
  return zero_bytes(B) + B * C * int64_t(sizeof(Partial)) + B * C * int64_t(top_n) * 8;
}
__host__ __device__ inline Ws ws_layout(void* base, int64_t B, int64_t V, int top_n) {
  Ws w;
  char* p = static_cast<char*>(base);
  w.C = n_chunks(V);
  w.state = reinterpret_cast<RowState*>(p);
  p += B * int64_t(sizeof(RowState));
  w.hval = reinterpret_cast<unsigned long long*>(p);
  p += B * kBins * int64_t(sizeof(unsigned long long));
  w.hcnt = reinterpret_cast<unsigned int*>(p);
  p += B * kBins * int64_t(sizeof(unsigned int));
  w.part = reinterpret_cast<Partial*>(p);
  p += B * w.C * int64_t(sizeof(Partial));
  w.topv = reinterpret_cast<float*>(p);
  p += B * w.C * int64_t(top_n) * 4;
  w.topi = reinterpret_cast<int*>(p);
  return w;
}

// Entry j of thread t in the chunk starting at c0 (work rows are padded to 16 bytes):
// j < 4: c0 + 4t + j, j >= 4: c0 + 1024 + 4t + j - 4 (two float4 loads per thread).
__device__ __forceinline__ int64_t ent(int64_t c0, int j) {
  return c0 + (j >> 2) * (kThreads * 4) + int64_t(threadIdx.x) * 4 + (j & 3);
}
// All 8 loads issued before any use (a loop with `break` would serialize them).
__device__ __forceinline__ void load_chunk(const float* row, int64_t c0, int64_t c1, float (&v)[kPer]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t b = ent(c0, 4 * h);
    if (b + 4 <= c1) {
      const float4 q = *reinterpret_cast<const float4*>(row + b);
      v[4 * h] = q.x, v[4 * h + 1] = q.y, v[4 * h + 2] = q.z, v[4 * h + 3] = q.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[4 * h + e] = b + e < c1 ? row[b + e] : -INFINITY;
    }
  }
}

using blk::better;

struct Scratch {
  float fv[kWarps];
  int fi[kWarps];
  unsigned long long u[kWarps + 2];
  double d[kWarps];
  int flag;
  int pick;
};

__device__ __forceinline__ void block_argmax(Scratch& sh, float& v, int& i) { blk::argmax<kWarps>(sh.fv, sh.fi, v, i); }
__device__ __forceinline__ unsigned long long block_sum_u(Scratch& sh, unsigned long long v) {
  return blk::sum_u64<kWarps>(sh.u, v);
}

// Fixed tree: the same bits whichever CTA runs it.
__device__ __forceinline__ double block_sum_d(Scratch& sh, double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.d[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = sh.d[0];
#pragma unroll
  for (int k = 1; k < kWarps; ++k) t += sh.d[k];
  __syncthreads();
  return t;
}

// Exclusive prefix of v over the threads in thread order; *total gets the block sum.
__device__ __forceinline__ unsigned long long block_excl_scan(Scratch& sh, unsigned long long v,
                                                             unsigned long long* total) {
  return blk::excl_scan_u64<kWarps>(sh.u, v, total);
}

// Last-CTA-done: every CTA calls it after its global writes; returns true in the one
// CTA that finished last (which then sees all the others' writes) and re-arms the counter.
// (The barrier then one cumulative fence by the signalling thread, as in cooperative
// groups' grid sync: the CTA's writes are ordered before the counter increment.)
__device__ __forceinline__ bool last_cta(Scratch& sh, unsigned int* counter, unsigned int n) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned int prev = atomicAdd(counter, 1u);
    sh.flag = prev == n - 1;
    if (sh.flag) *counter = 0;  // nobody else touches it until the next pass
  }
  __syncthreads();
  const bool last = sh.flag;
  if (last) __threadfence();
  return last;
}

}  // namespace gk::cuda::wide
