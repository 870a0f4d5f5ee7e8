// The engine's projection GEMV (see src/llm/fused.h; with a SwiGLU, a RoPE + KV append or
// a residual add + RMSNorm epilogue); the small decode kernels (q/k RoPE + paged KV
// append, residual add + RMSNorm, SwiGLU, the step's input update) are in llm_small.cu.
// Each is written for programmatic dependent launch (PDL):
//   1. issue the loads that do not depend on the previous kernel (weights),
//   2. griddepcontrol.launch_dependents: the next kernel may start launching now,
//   3. griddepcontrol.wait: the previous kernel has finished and its writes are visible,
//   4. read the activations, compute, write.
// Nothing is written before step 3, so a kernel that starts early never disturbs the
// one still running; without the launch attribute both instructions are no-ops.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/cuda_util.h"
#include "cuda/common/attention.cuh"
#include "cuda/common/rows.cuh"
#include "cuda/llm_common.cuh"
#include "llm/fused.h"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
using namespace llmk;

// The greedy key of logit v at index j: larger for a larger value, then for a lower index
// (sampling::argmax's rule: NaN counts as -inf, -0 as +0); never 0.
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t j) {
  if (v != v) v = -INFINITY;
  if (v == 0.f) v = 0.f;
  const uint32_t u = __float_as_uint(v);
  const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(ord) << 32) | (0xffffffffu - static_cast<uint32_t>(j));
}

template <class T>
__device__ __forceinline__ void f8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, bf16>) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      __half2 h;
      memcpy(&h, &w[i], 4);
      const float2 x = __half22float2(h);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
}

// ---- projection GEMV ----
// A block of kPT threads owns kPR = 4 weight rows (swiglu: gate rows j0, j0+1 and the up
// rows n+j0, n+j0+1; rope: two units of two rows); thread t takes the 16-byte chunks t,
// t + kPT, ... of each row, kPU chunks per row in flight. Sums: per thread in chunk
// order, warp butterfly, warps in order: a fixed order that does not depend on M.
constexpr int kPT = 256, kPR = 4, kPU = 2, kPW = kPT / 32;

// MODE 2 (q/k/v with RoPE and the KV append): the rows of the [Q + 2 KV] output come in
// units of two (a rotary pair of a q or k head, two rows of a k tail, two v rows); a
// block owns two units.
struct QkvUnit {
  int64_t row1, row2;
  int kind, head, i1, i2, j;  // kind 0 q, 1 k, 2 v; i1, i2 inside the head; j: rotary pair or -1
};
__device__ __forceinline__ QkvUnit qkv_unit(const llm::ProjArgs& a, int64_t uidx) {
  const int half = a.D / 2, n2 = a.rd / 2;
  const int hd = int(uidx / half), u = int(uidx - int64_t(hd) * half);
  QkvUnit q;
  int64_t base;
  if (hd < a.hq) {
    q.kind = 0, q.head = hd, base = int64_t(hd) * a.D;
  } else if (hd < a.hq + a.hkv) {
    q.kind = 1, q.head = hd - a.hq, base = (int64_t(a.hq) + q.head) * a.D;
  } else {
    q.kind = 2, q.head = hd - a.hq - a.hkv, base = (int64_t(a.hq) + a.hkv + q.head) * a.D;
  }
  if (q.kind != 2 && u < n2) {
    q.i1 = a.interleaved ? 2 * u : u;
    q.i2 = a.interleaved ? 2 * u + 1 : u + n2;
    q.j = u;
  } else if (q.kind != 2) {
    q.i1 = a.rd + 2 * (u - n2), q.i2 = q.i1 + 1, q.j = -1;
  } else {
    q.i1 = 2 * u, q.i2 = 2 * u + 1, q.j = -1;
  }
  q.row1 = base + q.i1;
  q.row2 = base + q.i2;
  return q;
}

struct NoExtra {
  int unused;
};

// TAIL (plain projections): the block that finishes last (an integer counter; every block
// makes its outputs visible first) adds the residual and RMS-normalizes the whole output
// rows: r = round(y + res), out = round(r * rsqrt(mean(r^2) + eps) * w), with the
// per-thread order and block sum of add_rms_norm (the same bits), in place of its launch.
template <class T>
__device__ void tail_norm(const llm::ProjArgs& a) {
  __shared__ int s_last;
  __shared__ float sh[32];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(a.tail_counter, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  constexpr int N = 8;
  const int64_t H = a.n, step = int64_t(blockDim.x) * N;
  const T* w = static_cast<const T*>(a.tail_w);
  for (int64_t i = 0; i < a.m; ++i) {
    const T* y = static_cast<const T*>(a.y) + i * H;
    const T* res = static_cast<const T*>(a.tail_res) + i * a.tail_res_rs;
    T* ro = static_cast<T*>(a.tail_res_out) + i * H;
    T* out = static_cast<T*>(a.tail_out) + i * H;
    float ss = 0.f;
    for (int64_t e = int64_t(threadIdx.x) * N; e < H; e += step) {
      const uint4 yr = __ldcg(reinterpret_cast<const uint4*>(y + e));  // written by the other blocks
      Vec<T, N> yv, rv;
      memcpy(&yv, &yr, 16);
      rv = *reinterpret_cast<const Vec<T, N>*>(res + e);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        rv.v[j] = convert<T>(float(yv.v[j]) + float(rv.v[j]));
        const float f = float(rv.v[j]);
        ss = fmaf(f, f, ss);
      }
      *reinterpret_cast<Vec<T, N>*>(ro + e) = rv;
    }
    const float inv = rsqrtf(row_sum(ss, sh) / float(H) + a.tail_eps);
    for (int64_t e = int64_t(threadIdx.x) * N; e < H; e += step) {
      const Vec<T, N> rv = *reinterpret_cast<const Vec<T, N>*>(ro + e);  // this thread's own writes
      const Vec<T, N> wv = *reinterpret_cast<const Vec<T, N>*>(w + e);
      Vec<T, N> o;
#pragma unroll
      for (int j = 0; j < N; ++j) o.v[j] = convert<T>(float(rv.v[j]) * inv * float(wv.v[j]));
      *reinterpret_cast<Vec<T, N>*>(out + e) = o;
    }
  }
  if (threadIdx.x == 0) *a.tail_counter = 0;  // ready for the next launch
}

// kv_l2 (ProjArgs::kv_k): warp 0 of each of the grid's last 32 blocks issues its share of
// the L2 bulk prefetches of the KV pages of positions 0 .. kv_pos[i] of each sequence.
// Not inlined: its registers stay out of the GEMV main loop.
__device__ __noinline__ void kv_prefetch_l2(const llm::ProjArgs& a, int lane) {
  const int parts = gridDim.x < 32 ? int(gridDim.x) : 32;
  const int part = int(blockIdx.x) - (int(gridDim.x) - parts);
  const int64_t P = int64_t(parts) * 32, t = int64_t(part) * 32 + lane;
  int64_t it0 = 0;  // items (page, cache) of the sequences before i
  for (int64_t i = 0; i < a.m; ++i) {
    const int64_t len = int64_t(a.kv_pos[i]) + 1;  // step inputs: written before the step
    int64_t np = len <= 0 ? 0 : (len + a.kv_bs - 1) / a.kv_bs;
    if (np > a.kv_max_blocks) np = a.kv_max_blocks;
    for (int64_t it = it0 + (((t - it0) % P) + P) % P; it < it0 + 2 * np; it += P) {
      const int64_t j = (it - it0) >> 1;
      const int32_t blk = a.kv_bt[i * a.kv_bt_stride + j];
      if (blk < 0 || blk >= a.kv_nb) continue;
      const char* base = static_cast<const char*>(((it - it0) & 1) ? a.kv_v : a.kv_k);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + int64_t(blk) * a.kv_page_bytes),
                   "r"(uint32_t(a.kv_page_bytes))
                   : "memory");
    }
    it0 += 2 * np;
  }
}

// NIN (norm in): x holds the raw residual rows r; the product is taken with r * norm_w
// (fp32, not rounded) and scaled by rsqrt(mean(r^2) + eps) of the whole row at the end:
// the sum of squares rides along the product's loads (no pass before it).
// EF (ProjArgs::w_ef, weights_evict_first): the weight loads carry an L2 evict-first policy.
template <class T, int MT, int MODE, class X, bool TAIL = false, bool NIN = false, bool KV = false, bool EF = false>
__global__ void __launch_bounds__(kPT, MT == 1 ? 4 : 1)
    k_project(const __grid_constant__ llm::ProjArgs a, const __grid_constant__ X extra) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t nch = a.k / 8;
  const int64_t rbytes = a.w_rs * int64_t(sizeof(T));
  constexpr int R = kPR, P = R / 2;  // swiglu: outputs per block; rope: units per block
  const uint8_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int64_t row;
    if constexpr (MODE == 1) {
      const int64_t j = std::min<int64_t>(int64_t(blockIdx.x) * P + (r % P), a.n - 1);
      row = r < P ? j : a.n + j;
    } else if constexpr (MODE == 2) {
      const QkvUnit q = qkv_unit(a, std::min<int64_t>(int64_t(blockIdx.x) * P + r / 2, a.n / 2 - 1));
      row = (r & 1) ? q.row2 : q.row1;
    } else {
      row = std::min<int64_t>(int64_t(blockIdx.x) * R + r, a.n - 1);
    }
    wr[r] = static_cast<const uint8_t*>(a.w) + row * rbytes;
  }
  float acc[MT][R];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.f;
  uint4 raw[kPU][R];
  [[maybe_unused]] uint64_t pol = 0;
  if constexpr (EF) pol = l2_evict_first_policy();
  auto load = [&](int64_t c) {
#pragma unroll
    for (int u = 0; u < kPU; ++u) {
      const int64_t cc = c + int64_t(u) * kPT;
      if (cc < nch) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if constexpr (EF) raw[u][r] = ld_weight_hint(wr[r] + cc * 16, pol);
          else raw[u][r] = ld_weight(wr[r] + cc * 16);
        }
      }
    }
  };
  if constexpr (KV) {  // kv_l2: the last 32 blocks bring the KV pages the attention reads into L2
    if (warp == 0 && int64_t(blockIdx.x) + 32 >= int64_t(gridDim.x)) kv_prefetch_l2(a, lane);
  }
  int64_t c = tid;
  load(c);  // the first weights in flight before waiting for x
  pdl_trigger();
  pdl_wait();
  const T* x = static_cast<const T*>(a.x);
  float ss[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) ss[i] = 0.f;
  auto load_x = [&](int i, int64_t cc, float (&xf)[8]) {
    f8<T>(ld_act(x + i * a.x_rs + cc * 8), xf);
    if constexpr (NIN) {
      float wn[8];
      f8<T>(ld_weight(static_cast<const T*>(a.norm_w) + cc * 8), wn);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        ss[i] = fmaf(xf[e], xf[e], ss[i]);
        xf[e] = __fmul_rn(xf[e], wn[e]);
      }
    }
  };
  while (true) {
#pragma unroll
    for (int u = 0; u < kPU; ++u) {
      const int64_t cc = c + int64_t(u) * kPT;
      if (cc < nch) {
        if constexpr (MT <= 2) {  // few rows of x: hold x, decode one weight row at a time
          float xf[MT][8];
#pragma unroll
          for (int i = 0; i < MT; ++i)
            if (i < a.m) load_x(i, cc, xf[i]);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float w[8];
            f8<T>(raw[u][r], w);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
              if (i < a.m) {
                float d = acc[i][r];
#pragma unroll
                for (int e = 0; e < 8; ++e) d = fmaf(xf[i][e], w[e], d);
                acc[i][r] = d;
              }
            }
          }
        } else {  // many rows of x: hold the decoded weights, stream x
          float w[R][8];
#pragma unroll
          for (int r = 0; r < R; ++r) f8<T>(raw[u][r], w[r]);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            if (i < a.m) {
              float xf[8];
              load_x(i, cc, xf);
#pragma unroll
              for (int r = 0; r < R; ++r) {
                float d = acc[i][r];
#pragma unroll
                for (int e = 0; e < 8; ++e) d = fmaf(xf[e], w[r][e], d);
                acc[i][r] = d;
              }
            }
          }
        }
      }
    }
    c += int64_t(kPT) * kPU;
    if (c >= nch) break;
    load(c);
  }
  __shared__ float red[kPW][MT * R + (NIN ? MT : 0)];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[i][r]);
      if (lane == 0) red[warp][i * R + r] = v;
    }
  if constexpr (NIN) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const float v = warp_sum(ss[i]);
      if (lane == 0) red[warp][MT * R + i] = v;
    }
  }
  __syncthreads();
  auto total = [&](int o) {
    float v = red[0][o];
#pragma unroll
    for (int w = 1; w < kPW; ++w) v += red[w][o];
    if constexpr (NIN) {  // row i = o / R: the norm of the whole row
      const int i = o / R;
      float q = red[0][MT * R + i];
#pragma unroll
      for (int w = 1; w < kPW; ++w) q += red[w][MT * R + i];
      v *= rsqrtf(q / float(a.k) + a.norm_eps);
    }
    return v;
  };
  T* y = static_cast<T*>(a.y);
  if constexpr (MODE == 2) {
    if (tid < MT * P) {
      const int i = tid / P, uu = tid % P;
      const int64_t uidx = int64_t(blockIdx.x) * P + uu;
      if (i < a.m && uidx < a.n / 2) {
        const QkvUnit q = qkv_unit(a, uidx);
        const T* bias = static_cast<const T*>(a.bias);
        T v1 = convert<T>(total(i * R + 2 * uu)), v2 = convert<T>(total(i * R + 2 * uu + 1));
        if (bias) {
          v1 = convert<T>(float(v1) + float(bias[q.row1]));
          v2 = convert<T>(float(v2) + float(bias[q.row2]));
        }
        const int32_t p = a.pos[i];
        if (q.j >= 0) {
          float sn, cs, r1, r2;
          sincosf(float(p) * extra.inv_freq[q.j], &sn, &cs);
          rotate(float(v1), float(v2), __fmul_rn(cs, a.mscale), __fmul_rn(sn, a.mscale), r1, r2);
          v1 = convert<T>(r1);
          v2 = convert<T>(r2);
        }
        int64_t slot;
        if (q.kind == 0) {
          T* o = static_cast<T*>(a.q_out) + (int64_t(i) * a.hq + q.head) * a.D;
          o[q.i1] = v1;
          o[q.i2] = v2;
        } else if (llm_slot(a, i, p, slot)) {
          T* c = static_cast<T*>(q.kind == 1 ? a.kc : a.vc) + (slot * a.hkv + q.head) * a.D;
          c[q.i1] = v1;
          c[q.i2] = v2;
        }
      }
    }
  } else if constexpr (MODE == 1) {
    if (tid < MT * P) {
      const int i = tid / P, jj = tid % P;
      const int64_t j = int64_t(blockIdx.x) * P + jj;
      if (i < a.m && j < a.n) {
        const float g = float(convert<T>(total(i * R + jj))), u = float(convert<T>(total(i * R + P + jj)));
        y[i * a.n + j] = convert<T>(gated_fn<nn::GatedAct::SwiGLU, float>(g, u));
      }
    }
  } else {
    if (tid < MT * R) {
      const int i = tid / R, r = tid % R;
      const int64_t row = int64_t(blockIdx.x) * R + r;
      unsigned long long key = 0;
      if (i < a.m && row < a.n) {
        const float s = total(i * R + r);
        if (a.out_f32) {  // float32 output (the lm head's logits): the sum unrounded
          const float v = a.bias ? s + float(static_cast<const T*>(a.bias)[row]) : s;
          static_cast<float*>(a.y)[i * a.n + row] = v;
          if (a.argmax_keys) key = argmax_key(v, row);
        } else {
          T v = convert<T>(s);
          if (a.bias) v = convert<T>(float(v) + float(static_cast<const T*>(a.bias)[row]));
          if (a.res) v = convert<T>(float(v) + float(static_cast<const T*>(a.res)[i * a.res_rs + row]));
          y[i * a.n + row] = v;
        }
      }
      if (a.argmax_keys) {  // the block's best of row i over its R rows (lanes 4i..4i+3), one atomic
        constexpr unsigned mask = MT * R >= 32 ? 0xffffffffu : (1u << (MT * R)) - 1u;
#pragma unroll
        for (int o = 1; o < R; o <<= 1) {
          const unsigned long long other = __shfl_xor_sync(mask, key, o);
          key = other > key ? other : key;
        }
        if (r == 0 && key) atomicMax(a.argmax_keys + i, key);
      }
    }
    if constexpr (TAIL) tail_norm<T>(a);
  }
}

// STAGE2 (ProjArgs::stage2, EngineOptions::o_proj_stage): one row of x, a plain
// projection whose rows fit in one round of loads (k / 8 <= kPT * kPU). A block owns 2 R
// rows: rows 0..R-1 are loaded into registers as k_project's, rows R..2R-1 into shared
// memory (cp.async), both before the PDL wait, so that a grid that is resident at once
// (the output projection, launched early beside the attention) has twice the weight
// bytes in flight before the attention ends. Each row's thread / chunk mapping, sum
// order, warp butterfly and warp order are k_project's: the same bits.
template <class T>
__global__ void __launch_bounds__(kPT, 4) k_project_stage2(const __grid_constant__ llm::ProjArgs a) {
  constexpr int R = kPR, R2 = 2 * kPR;
  __shared__ __align__(16) uint4 stg[R][kPU][kPT];  // rows R..2R-1: 32 KiB
  __shared__ float red[kPW][R2];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t nch = a.k / 8;
  const int64_t rbytes = a.w_rs * int64_t(sizeof(T));
  const uint8_t* wr[R2];
#pragma unroll
  for (int r = 0; r < R2; ++r)
    wr[r] = static_cast<const uint8_t*>(a.w) + std::min<int64_t>(int64_t(blockIdx.x) * R2 + r, a.n - 1) * rbytes;
  uint4 raw[kPU][R];
#pragma unroll
  for (int u = 0; u < kPU; ++u) {
    const int64_t cc = tid + int64_t(u) * kPT;
    if (cc < nch) {
#pragma unroll
      for (int r = 0; r < R; ++r) raw[u][r] = ld_weight(wr[r] + cc * 16);
    }
  }
#pragma unroll
  for (int u = 0; u < kPU; ++u) {
    const int64_t cc = tid + int64_t(u) * kPT;
#pragma unroll
    for (int r = 0; r < R; ++r) cp_async16(&stg[r][u][tid], wr[R + r] + (cc < nch ? cc : 0) * 16, cc < nch);
  }
  cp_async_commit();
  pdl_trigger();
  pdl_wait();
  const T* x = static_cast<const T*>(a.x);
  float acc[R2];
#pragma unroll
  for (int r = 0; r < R2; ++r) acc[r] = 0.f;
  float xf[kPU][8];
#pragma unroll
  for (int u = 0; u < kPU; ++u) {
    const int64_t cc = tid + int64_t(u) * kPT;
    if (cc < nch) {
      f8<T>(ld_act(x + cc * 8), xf[u]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float w[8];
        f8<T>(raw[u][r], w);
        float d = acc[r];
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(xf[u][e], w[e], d);
        acc[r] = d;
      }
    }
  }
  cp_async_wait<0>();  // this thread's own copies: it reads back only stg[.][.][tid]
#pragma unroll
  for (int u = 0; u < kPU; ++u) {
    const int64_t cc = tid + int64_t(u) * kPT;
    if (cc < nch) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float w[8];
        f8<T>(stg[r][u][tid], w);
        float d = acc[R + r];
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(xf[u][e], w[e], d);
        acc[R + r] = d;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R2; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (tid < R2) {
    const int64_t row = int64_t(blockIdx.x) * R2 + tid;
    if (row < a.n) {
      float s = red[0][tid];
#pragma unroll
      for (int w = 1; w < kPW; ++w) s += red[w][tid];
      T v = convert<T>(s);
      if (a.bias) v = convert<T>(float(v) + float(static_cast<const T*>(a.bias)[row]));
      if (a.res) v = convert<T>(float(v) + float(static_cast<const T*>(a.res)[row]));
      static_cast<T*>(a.y)[row] = v;
    }
  }
}

template <class T, int MODE>
void project_m(const llm::ProjArgs& a, const llm::ProjRope* rope, cudaStream_t st) {
  constexpr int R = kPR, P = R / 2;
  const int64_t blocks = MODE == 1 ? (a.n + P - 1) / P : MODE == 2 ? (a.n / 2 + P - 1) / P : (a.n + R - 1) / R;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("project: n is too large");
  const dim3 g{unsigned(blocks)}, b{unsigned(kPT)};
  using X = std::conditional_t<MODE == 2, llm::ProjRope, NoExtra>;
  X extra{};
  if constexpr (MODE == 2) {
    if (!rope) throw ValueError("llm_project: rope frequencies missing");
    extra = *rope;
  }
  auto go = [&](auto kernel) { launch_ex(kernel, g, b, st, a.pdl, "llm_project", a, extra); };
  if (a.norm_w) {
    if (a.m <= 1) go(k_project<T, 1, MODE, X, false, true>);
    else if (a.m <= 2) go(k_project<T, 2, MODE, X, false, true>);
    else if (a.m <= 4) go(k_project<T, 4, MODE, X, false, true>);
    else go(k_project<T, 8, MODE, X, false, true>);
    return;
  }
  if constexpr (MODE == 0) {
    if (a.tail) {
      if (a.m <= 1) go(k_project<T, 1, MODE, X, true>);
      else if (a.m <= 2) go(k_project<T, 2, MODE, X, true>);
      else if (a.m <= 4) go(k_project<T, 4, MODE, X, true>);
      else go(k_project<T, 8, MODE, X, true>);
      return;
    }
  }
  if constexpr (MODE == 0) {
    if (a.kv_k) {  // kv_l2: its own instantiation (the plain GEMV's code unchanged)
      if (a.m <= 1) go(k_project<T, 1, MODE, X, false, false, true>);
      else if (a.m <= 2) go(k_project<T, 2, MODE, X, false, false, true>);
      else if (a.m <= 4) go(k_project<T, 4, MODE, X, false, false, true>);
      else go(k_project<T, 8, MODE, X, false, false, true>);
      return;
    }
  }
  if constexpr (MODE == 0) {
    if (a.stage2 && a.m == 1 && !a.out_f32 && !a.argmax_keys && !a.w_ef && a.k / 8 <= int64_t(kPT) * kPU) {
      const dim3 g2{unsigned((a.n + 2 * R - 1) / (2 * R))};
      launch_ex(k_project_stage2<T>, g2, b, st, a.pdl, "llm_project", a);
      return;
    }
  }
  if (a.m <= 1 && a.w_ef) go(k_project<T, 1, MODE, X, false, false, false, true>);  // its own instantiation
  else if (a.m <= 1) go(k_project<T, 1, MODE, X>);
  else if (a.m <= 2) go(k_project<T, 2, MODE, X>);
  else if (a.m <= 4) go(k_project<T, 4, MODE, X>);
  else go(k_project<T, 8, MODE, X>);
}

template <class T>
void project_t(const llm::ProjArgs& a, const llm::ProjRope* rope, cudaStream_t st) {
  if (a.rope) project_m<T, 2>(a, rope, st);
  else if (a.swiglu) project_m<T, 1>(a, rope, st);
  else project_m<T, 0>(a, rope, st);
}

}  // namespace

void llm_project(const llm::ProjArgs& a, const llm::ProjRope* rope, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.m > 8 || !a.vec || a.k % 8 != 0) throw ValueError("llm_project: needs m <= 8, aligned rows and k % 8 == 0");
  auto st = static_cast<cudaStream_t>(stream);
  if (a.dtype == DType::bf16) project_t<bf16>(a, rope, st);
  else if (a.dtype == DType::f16) project_t<f16>(a, rope, st);
  else throw TypeError(cat("llm_project: unsupported dtype ", dtype_name(a.dtype)));
}

}  // namespace gk::cuda
