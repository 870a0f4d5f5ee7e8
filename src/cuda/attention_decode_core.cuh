// CUDA attention_decode, the CUDA-core kernels (variant 1, and the fallback of every other route) with their
// launch (launch_g); attention_decode.cu, the only includer, routes among all the decode kernels.
// Flash-decoding on CUDA cores with a cp.async pipeline.
//
// Kernel 1 (k_decode_chunk): one CTA of 128 threads per (chunk x group of up to
// GB query heads, kv head, sequence). The chunk's keys (decode_chunk: a length
// that depends only on the sequence's attended length) stream through shared
// memory in tiles of TK rows: first all K tiles, then all V tiles, in a ring of
// kStages buffers filled by 16-byte cp.async copies several tiles ahead, so the
// V loads are already in flight while the softmax statistics are computed. Each
// K and V byte of the chunk is read from global memory once for all GB heads.
//  - logits: LPT = D/16 lanes share one key row, 16 elements each (vectors
//    interleaved across the lanes, rotated per token so that the 8 lanes of a
//    shared-memory phase hit distinct banks); the query slice sits in registers;
//    a butterfly over the LPT lanes gives the dot product. Logits of the chunk
//    are kept in shared memory (fp32).
//  - softmax: max and sum over the chunk per head (one warp per head).
//  - values: the same lane layout accumulates p_j * v_j in registers; token
//    groups are reduced by a butterfly inside a warp, then across the 4 warps in
//    shared memory, in a fixed order.
// A sequence with a single chunk writes its output directly; otherwise the chunk
// writes its unnormalized output, max and sum to a float32 workspace and kernel 2
// (k_decode_merge) combines the chunks of each (sequence, head) in chunk order.
// Every reduction has a fixed order and the chunking is a function of the
// sequence alone, so results are bitwise reproducible and batch independent.
#pragma once
#include <algorithm>
#include <cfloat>

#include "cuda/common/attention.cuh"
#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {
namespace {
constexpr int kThr = 128;  // 4 warps
constexpr int kWarps = kThr / 32;
constexpr int kStages = 4;
constexpr int kTileBytes = 8192;  // at most, per stage

void launch_decode_merge(const DecodeArgs& a, cudaStream_t st);

// Compile-time layout of one (cache type, head_dim) pair.
template <class C, int D, int TILEB = kTileBytes>
struct Layout {
  static constexpr int SZ = int(sizeof(C));
  static constexpr int N = 16 / SZ;                 // elements per 16-byte vector
  static constexpr int ROWB = D * SZ;               // bytes of one head row
  static constexpr int NV = ROWB / 16;              // vectors per row
  static constexpr int LPT = D / 16;                // lanes per row (16 elements each)
  static constexpr int VPL = NV / LPT;              // vectors per lane (= SZ)
  static constexpr int NT = kThr / LPT;             // rows per CTA step
  static constexpr int TK = TILEB / ROWB < 64 ? TILEB / ROWB : 64;  // rows per tile
  static constexpr int TILE = TK * ROWB;
  static constexpr int CPT = TK * NV / kThr;        // 16-byte copies per thread per tile
  static_assert(TK >= NT && TK % NT == 0, "a tile holds whole CTA steps");
  static_assert(TK * NV % kThr == 0, "copies divide evenly");
  static_assert(VPL * N == 16, "16 elements per lane");
};

// Shared memory of one CTA: the stage ring (reused for the final reduction),
// then the chunk's logits [GB][chunk_max] and cache rows [chunk_max].
template <class C, int D, int GB, int S, int TILEB>
size_t smem_bytes(int chunk_max) {
  using Lt = Layout<C, D, TILEB>;
  size_t ring = std::max<size_t>(size_t(S) * Lt::TILE, size_t(kWarps) * GB * D * sizeof(float));
  return ring + size_t(GB) * chunk_max * sizeof(float) + size_t(chunk_max) * sizeof(int);
}

// T: q / out storage type; C: cache storage type (T, or f8e4m3 with per-head scales).
// S stages of TILEB-byte tiles (kStages, kTileBytes; other values are tuning variants).
template <class T, class C, int D, int GB, int S, int TILEB>
__global__ void __launch_bounds__(kThr) k_decode_chunk(const __grid_constant__ DecodeArgs a) {
  constexpr int kStages = S;
  using Lt = Layout<C, D, TILEB>;
  constexpr int SZ = Lt::SZ, N = Lt::N, ROWB = Lt::ROWB, NV = Lt::NV, LPT = Lt::LPT, VPL = Lt::VPL, NT = Lt::NT,
                TK = Lt::TK, TILE = Lt::TILE, CPT = Lt::CPT;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float sm_m[GB], sm_l[GB];

  // Grid order 0: blockIdx.x = split * ngb + gb, blockIdx.y = kv head (the head groups of one chunk run side
  // by side: their K/V reads meet in L2). Order 1: blockIdx.x = (split * ngb + gb) * hkv + kv head (also the kv
  // heads of one chunk side by side, so the rows of a token are read at about the same time).
  const int G = a.hq / a.hkv, ngb = (G + GB - 1) / GB;
  const int b = blockIdx.z;
  int split, gb, kvh;
  if (a.grid_order == 1) {
    kvh = blockIdx.x % a.hkv;
    const int r = blockIdx.x / a.hkv;
    split = r / ngb;
    gb = r % ngb;
  } else {
    split = blockIdx.x / ngb;
    gb = blockIdx.x % ngb;
    kvh = blockIdx.y;
  }
  const int h0 = kvh * G + gb * GB, nh = min(GB, G - gb * GB);
  int64_t L, start;
  decode_span(a, b, L, start);
  const int64_t n = L - start;
  const int64_t chunk = decode_chunk(n, a.chunk_min, a.chunk_max, a.target_splits);
  const int64_t nsp = n > 0 ? (n + chunk - 1) / chunk : 0;
  if (split >= nsp) return;
  const int64_t j0 = start + int64_t(split) * chunk;
  const int len = int(min(chunk, L - j0));
  const int ntile = (len + TK - 1) / TK;

  const int ring = int(std::max<size_t>(size_t(kStages) * TILE, size_t(kWarps) * GB * D * sizeof(float)));
  unsigned char* stage = smem;
  float* sc = reinterpret_cast<float*>(smem + ring);  // [GB][chunk_max]
  int* rows = reinterpret_cast<int*>(sc + GB * a.chunk_max);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ld = lane % LPT, tok = tid / LPT;
  // With LPT < 8 lanes per row, the 8 lanes of one shared-memory phase read two or more rows: each
  // row's lanes start at another vector (rotation) so that the phase covers distinct banks.
  constexpr bool ROT = LPT < 8 && VPL > 1;
  const int rot = ROT ? (lane / LPT) % VPL : 0;
  const C* kc = static_cast<const C*>(a.kc);
  const C* vc = static_cast<const C*>(a.vc);

  for (int t = tid; t < len; t += kThr) rows[t] = int(decode_row(a, b, j0 + t));  // -1: masked
  __syncthreads();

  // Tile i < ntile: K rows [i*TK, i*TK + TK) of the chunk; ntile <= i < 2*ntile: V rows.
  auto issue = [&](int i) {
    if (i < 2 * ntile) {
      const bool isv = i >= ntile;
      const int r0 = (isv ? i - ntile : i) * TK;
      const C* base = isv ? vc : kc;
      unsigned char* dst = stage + (i % kStages) * TILE;
#pragma unroll
      for (int u = 0; u < CPT; ++u) {
        const int c = tid + u * kThr, r = c / NV, v = c - r * NV;
        const int row = r0 + r < len ? rows[r0 + r] : -1;
        const C* src = row >= 0 ? base + (int64_t(row) * a.hkv + kvh) * D + v * N : base;
        cp_async16(dst + r * ROWB + v * 16, src, row >= 0);
      }
    }
    cp_async_commit();
  };
  // Byte offset of this lane's u-th vector inside a row.
  auto voff = [&](int u) { return (((u + rot) % VPL) * LPT + ld) * 16; };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);

  const float ksc = a.k_scale ? a.k_scale[kvh] : 1.f, vsc = a.v_scale ? a.v_scale[kvh] : 1.f;
  float acc[GB][16];
  {
    float qf[GB][16];
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      const T* q = static_cast<const T*>(a.q) + int64_t(b) * a.q_bs + int64_t(h0 + (g < nh ? g : 0)) * a.q_hs;
#pragma unroll
      for (int u = 0; u < VPL; ++u)
#pragma unroll
        for (int j = 0; j < N; ++j)
          qf[g][u * N + j] = g < nh ? float(q[voff(u) / SZ + j]) * a.scale * ksc : 0.f;
    }
    // Phase 1: logits of the chunk.
    for (int i = 0; i < ntile; ++i) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      issue(i + kStages - 1);
      const unsigned char* buf = stage + (i % kStages) * TILE;
#pragma unroll
      for (int s0 = 0; s0 < TK; s0 += NT) {
        const int r = s0 + tok;
        float kf[16];
#pragma unroll
        for (int u = 0; u < VPL; ++u) vec16_to_float<C>(buf + r * ROWB + voff(u), kf + u * N);
        float dot[GB];
#pragma unroll
        for (int g = 0; g < GB; ++g) {
          float s0 = 0.f, s1 = 0.f;  // two chains: half the dependent FMA latency
#pragma unroll
          for (int e = 0; e < 16; e += 2) {
            s0 = fmaf(qf[g][e], kf[e], s0);
            s1 = fmaf(qf[g][e + 1], kf[e + 1], s1);
          }
          float s = s0 + s1;
#pragma unroll
          for (int o = LPT / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          dot[g] = s;
        }
        const int t = i * TK + r;
        if (ld == 0 && t < len) {
          const bool ok = rows[t] >= 0;
#pragma unroll
          for (int g = 0; g < GB; ++g) {
            float s = dot[g];
            if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
            if (g < nh) sc[g * a.chunk_max + t] = ok ? s : -INFINITY;
          }
        }
      }
    }
  }
  __syncthreads();
  // Softmax statistics of the chunk: warp w takes heads w, w + 4, ...
  for (int g = warp; g < nh; g += kWarps) {
    float* s = sc + g * a.chunk_max;
    float m = -INFINITY;
    for (int t = lane; t < len; t += 32) m = fmaxf(m, s[t]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int t = lane; t < len; t += 32) {
      const float p = m == -INFINITY ? 0.f : expf(s[t] - m);
      s[t] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      sm_m[g] = m;
      sm_l[g] = l;
    }
  }
  // (the barrier at the top of the first V tile orders these writes before their reads)
  // Phase 2: sum_j p_j v_j over the chunk.
#pragma unroll
  for (int g = 0; g < GB; ++g)
#pragma unroll
    for (int e = 0; e < 16; ++e) acc[g][e] = 0.f;
  for (int i = ntile; i < 2 * ntile; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    issue(i + kStages - 1);
    const unsigned char* buf = stage + (i % kStages) * TILE;
#pragma unroll
    for (int s0 = 0; s0 < TK; s0 += NT) {
      const int r = s0 + tok, t = (i - ntile) * TK + r;
      float p[GB];
#pragma unroll
      for (int g = 0; g < GB; ++g) p[g] = g < nh && t < len ? sc[g * a.chunk_max + t] : 0.f;
      float vf[16];
#pragma unroll
      for (int u = 0; u < VPL; ++u) vec16_to_float<C>(buf + r * ROWB + voff(u), vf + u * N);
#pragma unroll
      for (int g = 0; g < GB; ++g)
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[g][e] = fmaf(p[g], vf[e], acc[g][e]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: reuse it for the reduction
  if constexpr (ROT) {  // slot u of this lane holds vector (u + rot) % VPL: back to the order of rot = 0
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      float t[16];
#pragma unroll
      for (int cu = 0; cu < VPL; ++cu)
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float x = 0.f;
#pragma unroll
          for (int u = 0; u < VPL; ++u) x = (u + rot) % VPL == cu ? acc[g][u * N + j] : x;
          t[cu * N + j] = x;
        }
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[g][e] = t[e];
    }
  }
  // Reduce the token groups of a warp (lanes with the same ld), then the warps.
#pragma unroll
  for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
    for (int g = 0; g < GB; ++g)
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
  float* red = reinterpret_cast<float*>(stage);  // [kWarps][GB][D]
  if (lane < LPT) {
#pragma unroll
    for (int g = 0; g < GB; ++g)
#pragma unroll
      for (int u = 0; u < VPL; ++u)
#pragma unroll
        for (int j = 0; j < N; ++j) red[(warp * GB + g) * D + (u * LPT + ld) * N + j] = acc[g][u * N + j];
  }
  __syncthreads();
  const bool single = nsp == 1;
  for (int idx = tid; idx < nh * D; idx += kThr) {
    const int g = idx / D, d = idx - g * D;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += red[(w * GB + g) * D + d];
    o *= vsc;
    const int64_t hrow = int64_t(b) * a.hq + h0 + g;
    if (single) {
      const float l = sm_l[g];
      static_cast<T*>(a.out)[hrow * D + d] = convert<T>(l > 0.f ? o / l : 0.f);
    } else {
      a.ws_o[(hrow * a.nsplit + split) * D + d] = o;
    }
  }
  if (!single && tid < nh) {
    float* ml = a.ws_ml + ((int64_t(b) * a.hq + h0 + tid) * a.nsplit + split) * 2;
    ml[0] = sm_m[tid];
    ml[1] = sm_l[tid];
  }
}

// One CTA per (query head, sequence), one thread per output element: combines
// the chunks in chunk order. Sequences with one chunk were written by kernel 1;
// sequences without keys get 0. The chunk maxima and weights are loaded and
// reduced by all threads at once (fixed-order trees), the weighted sum of the
// partial outputs runs over independent loads, so the merge is not a chain of
// dependent memory round trips.
constexpr int kMergeBlock = 1024;

__device__ __forceinline__ float block_reduce(float v, float* sh, bool is_max) {
  // blockDim.x = D (64, 128 or 256): a warp butterfly, then the warps in index order.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // sh may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0) sh[warp] = v;
  __syncthreads();
  float r = sh[0];
  for (int i = 1; i < nw; ++i) r = is_max ? fmaxf(r, sh[i]) : r + sh[i];
  return r;
}

template <class T>
__global__ void k_decode_merge(const __grid_constant__ DecodeArgs a) {
  __shared__ float w[kMergeBlock];
  __shared__ float sh[8];
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x, nthr = blockDim.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // the last kernel of the call (plain launches: the chunk kernel has completed): the next kernel of the
  // stream may start launching (it waits for this grid's completion before reading the output)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  int64_t L, start;
  decode_span(a, b, L, start);
  const int nsp = int(decode_nsplit(L - start, a.chunk_min, a.chunk_max, a.target_splits));
  const int64_t row = int64_t(b) * a.hq + h;
  T* out = static_cast<T*>(a.out) + row * a.D + d;
  if (nsp == 1) return;
  if (nsp == 0) {
    *out = convert<T>(0.f);
    return;
  }
  const float* ml = a.ws_ml + row * a.nsplit * 2;
  const float* po = a.ws_o + row * a.nsplit * a.D + d;
  float m = -INFINITY;
  for (int s = d; s < nsp; s += nthr) m = fmaxf(m, ml[2 * s]);
  const float M = block_reduce(m, sh, true);
  if (M == -INFINITY) {  // every key masked
    *out = convert<T>(0.f);
    return;
  }
  float num = 0.f, den = 0.f;
  for (int s0 = 0; s0 < nsp; s0 += kMergeBlock) {
    const int n = min(kMergeBlock, nsp - s0);
    __syncthreads();  // w of the previous block is consumed
    for (int s = d; s < n; s += nthr) {
      const float ms = ml[2 * (s0 + s)];
      const float ws = ms == -INFINITY ? 0.f : expf(ms - M);
      w[s] = ws;
      den = fmaf(ws, ml[2 * (s0 + s) + 1], den);
    }
    __syncthreads();
#pragma unroll 8
    for (int s = 0; s < n; ++s) num = fmaf(w[s], po[int64_t(s0 + s) * a.D], num);
  }
  den = block_reduce(den, sh, false);
  *out = convert<T>(den > 0.f ? num / den : 0.f);
}

template <class T, class C, int D, int GB, int S = kStages, int TILEB = kTileBytes>
void launch(const DecodeArgs& a, cudaStream_t st) {
  const int G = a.hq / a.hkv, ngb = (G + GB - 1) / GB;
  if (a.B > 65535) throw ValueError("q: more than 65535 sequences in one decode call");
  if (a.hkv > 65535) throw ValueError("k_cache: too many kv heads");
  if (int64_t(a.nsplit) * ngb > INT32_MAX) throw ValueError("q: too many heads x chunks");
  if (a.nb * a.bs > int64_t(INT32_MAX)) throw ValueError("k_cache: more than 2^31 - 1 cache rows");
  auto kern = k_decode_chunk<T, C, D, GB, S, TILEB>;
  const size_t smem = smem_bytes<C, D, GB, S, TILEB>(a.chunk_max);
  if (smem > 32 * 1024)  // (+ static shared memory) past 48 KB needs the opt-in: a per-device attribute, set each time
    GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (a.grid_order == 1 && int64_t(a.nsplit) * ngb * a.hkv > INT32_MAX) throw ValueError("q: too many heads x chunks");
  dim3 grid = a.grid_order == 1 ? dim3{unsigned(a.nsplit * ngb * a.hkv), 1u, unsigned(a.B)}
                                : dim3{unsigned(a.nsplit * ngb), unsigned(a.hkv), unsigned(a.B)};
  kern<<<grid, kThr, smem, st>>>(a);
  GK_LAUNCH_CHECK("attention_decode_chunk");
  launch_decode_merge(a, st);
}

template <class T, class C, int D>
void launch_g(const DecodeArgs& a, cudaStream_t st) {
  const int G = a.hq / a.hkv;
  if (G == 1) return launch<T, C, D, 1>(a, st);
  if (G == 2) return launch<T, C, D, 2>(a, st);
  return launch<T, C, D, 4>(a, st);
}
void launch_decode_merge(const DecodeArgs& a, cudaStream_t st) {
  dim3 mgrid{unsigned(a.hq), unsigned(a.B), 1u};
  dispatch_float(a.dtype, [&](auto t) { k_decode_merge<decltype(t)><<<mgrid, unsigned(a.D), 0, st>>>(a); });
  GK_LAUNCH_CHECK("attention_decode_merge");
}
}  // namespace
}  // namespace gk::cuda
