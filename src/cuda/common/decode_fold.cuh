// Pieces of the fold decode-attention kernels (attention_decode_fold*.cu): the chunking, the fold of
// partial results (the same arithmetic in registers, shared memory and the merge kernel: the bits of a
// sequence never depend on how the work is cut), the per-launch unit choice and the tile step.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/attention.cuh"
#include "cuda/common/decode_mma.cuh"
#include "ops/nn_args.h"

namespace gk::cuda::dfold {
using namespace dmma;

constexpr int kGroup = 8;      // chunks per group
constexpr int kMaxDenseF = 512;  // sequences of the dense enumeration (prefix in shared memory)

// log2 of the chunk length for n > 0 keys (chunk_min, chunk_max: powers of two): shifts, no 64-bit division
// (this runs for every work unit).
__device__ __forceinline__ int fold_chunk_log2(int64_t n, int cmin, int cmax, int target) {
  int k = 0;
  while ((1 << k) < cmin) ++k;
  while ((int64_t(1) << k) < cmax && ((n + (int64_t(1) << k) - 1) >> k) > target) ++k;
  return k;
}

// One fold step acc (+) (m, l, o) of one (head, dim): new max, the two weights, then each value.
__device__ __forceinline__ void fold_w(float& M, float m, float& wa, float& wb) {
  const float Mn = fmaxf(M, m);
  wa = M == -INFINITY ? 0.f : exp2f(M - Mn);
  wb = m == -INFINITY ? 0.f : exp2f(m - Mn);
  M = Mn;
}
__device__ __forceinline__ float fold_v(float acc, float wa, float v, float wb) { return fmaf(v, wb, acc * wa); }
__device__ __forceinline__ float finalize(float O, float L) { return L > 0.f ? O / L : 0.f; }

// The chunk length of n keys: the smallest chunk_min * 2^k <= chunk_max giving at most target_splits chunks.
// Chunk and unit counts of sequence b.
struct SeqPlan {
  int64_t start, n, chunk;
  int nsp, ng;
};
__device__ __forceinline__ SeqPlan seq_plan(const DecodeArgs& a, int b) {
  SeqPlan p;
  int64_t L;
  decode_span(a, b, L, p.start);
  p.n = L - p.start;
  const int k = p.n > 0 ? fold_chunk_log2(p.n, a.chunk_min, a.chunk_max, a.target_splits) : 0;
  p.chunk = int64_t(1) << k;
  p.nsp = p.n > 0 ? int((p.n + p.chunk - 1) >> k) : 0;
  p.ng = (p.nsp + kGroup - 1) / kGroup;
  return p;
}

// Group units (1) or chunk units (0) for this launch: chunk units for head_dim 256 (the register budget of
// the group accumulator), else forced (force 1: chunks, 2: groups), else group units when there are at least half as many as warps.
// All sequences are read (block-wide, ends with a barrier); the same answer in every CTA of both kernels.
__device__ __forceinline__ int pick_mode(const DecodeArgs& a, int H, int force, int nwarps, int* red) {
  if (a.D == 256) return 0;
  if (force) return force - 1;
  if (threadIdx.x == 0) *red = 0;
  __syncthreads();
  int s = 0;
  for (int b = threadIdx.x; b < a.B; b += blockDim.x) s += seq_plan(a, b).ng;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
  if ((threadIdx.x & 31) == 0 && s) atomicAdd(red, s);  // integer: exact in any order
  __syncthreads();
  const int64_t units = int64_t(*red) * H;
  __syncthreads();  // red may be reused
  return 2 * units >= nwarps ? 1 : 0;
}

// pre[0..B]: exclusive prefix of the units of each sequence (shared memory); returns the unit count.
__device__ __forceinline__ int unit_prefix(const DecodeArgs& a, int H, int mode, int* pre) {
  for (int b = threadIdx.x; b < a.B; b += blockDim.x) {
    const SeqPlan p = seq_plan(a, b);
    pre[b + 1] = mode ? p.ng : p.nsp;
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, per = (a.B + 31) / 32;
    int s = 0;
    for (int j = 0; j < per; ++j) {
      const int i = lane * per + j;
      if (i < a.B) s += pre[i + 1];
    }
    int x = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFull, x, o);
      if (lane >= o) x += y;
    }
    int run = x - s;
    for (int j = 0; j < per; ++j) {
      const int i = lane * per + j;
      if (i < a.B) {
        run += pre[i + 1];
        pre[i + 1] = run;
      }
    }
    if (lane == 0) pre[0] = 0;
  }
  __syncthreads();
  return pre[a.B] * H;
}


// An L2 policy that evicts the lines it tags first (the cache streams through L2 once), and a 16-byte
// cp.async (as cp_async16) tagged with it.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
#endif
  return p;
}
__device__ __forceinline__ void cp_async16_ef(void* dst, const void* src, bool valid, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(s), "l"(src), "r"(n), "l"(pol)
               : "memory");
#else
  cp_async16(dst, src, valid);
#endif
}

// One 16-key tile in the stage at shared address st (K, then V at + 16 * D * 2 bytes; rows swizzled): S = Q K^T
// on mma.sync (query rows 0..7: heads, fragments qa), the online softmax update of (mrow, lsum) with the
// stage's key mask mk (log2 domain, soft-cap), then O = O * alpha + P V (P rounded to T).
template <class T, int D>
__device__ __forceinline__ void tile_step(uint32_t st, const uint32_t (&qa)[D / 16][2], unsigned mk, float sl2,
                                          bool capped, float cap_in, float cap_out, float (&o)[D / 16][4],
                                          float& mrow, float& lsum, int lane) {
  constexpr int KSTEP = D / 16, ROWB = D * 2, KVB = 16 * ROWB;
  const int t4 = lane & 3;
  const int lr = (lane & 7) + ((lane >> 4) << 3), lc = (lane >> 3) & 1;
  float sa[2][4] = {}, sb[2][4] = {};
#pragma unroll
  for (int k = 0; k < KSTEP; ++k) {
    uint32_t kb[4];
    ldsm_x4(kb, st + swz(lr, 2 * k + lc, ROWB));
    if (k & 1) {
      mma<T>(sb[0], qa[k][0], 0u, qa[k][1], 0u, kb[0], kb[1]);
      mma<T>(sb[1], qa[k][0], 0u, qa[k][1], 0u, kb[2], kb[3]);
    } else {
      mma<T>(sa[0], qa[k][0], 0u, qa[k][1], 0u, kb[0], kb[1]);
      mma<T>(sa[1], qa[k][0], 0u, qa[k][1], 0u, kb[2], kb[3]);
    }
  }
  float x[2][2];
  float mx = -INFINITY;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = sa[n][e] + sb[n][e];
      v = capped ? cap_out * tanhf(v * cap_in) : v * sl2;
      v = (mk >> (n * 8 + 2 * t4 + e)) & 1u ? v : -INFINITY;
      x[n][e] = v;
      mx = fmaxf(mx, v);
    }
  mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
  const float mnew = fmaxf(mrow, mx);
  const bool none = mnew == -INFINITY;
  const float alpha = none ? 1.f : ex2(mrow - mnew);
  float p[2][2], ps_ = 0.f;
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      p[n][e] = none ? 0.f : ex2(x[n][e] - mnew);
      ps_ += p[n][e];
    }
  lsum = fmaf(lsum, alpha, ps_);
  mrow = mnew;
  const float a0 = __shfl_sync(kFull, alpha, 8 * t4), a1 = __shfl_sync(kFull, alpha, 8 * t4 + 4);
  const uint32_t pb0 = pack2<T>(p[0][0], p[0][1]), pb1 = pack2<T>(p[1][0], p[1][1]);
#pragma unroll
  for (int mt = 0; mt < KSTEP; ++mt) {
    uint32_t va[4];
    ldsm_x4_t(va, st + KVB + swz(lr, 2 * mt + lc, ROWB));
    o[mt][0] *= a0;
    o[mt][1] *= a1;
    o[mt][2] *= a0;
    o[mt][3] *= a1;
    mma<T>(o[mt], va[0], va[1], va[2], va[3], pb0, pb1);
  }
}

}  // namespace gk::cuda::dfold
