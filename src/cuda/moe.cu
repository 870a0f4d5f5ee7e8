// CUDA kernels of the mixture-of-experts ops (see include/gpukit/moe.h). They follow
// the CPU reference (src/cpu/moe.cpp) step for step:
// - gating: one thread per token; experts picked by logit in a total order (larger
//   first, NaN last, ties to the lower expert), softmax sum in increasing expert order;
// - permute: one block of 1024 threads does a stable counting sort of the T*k slots
//   (integer counters only), then a copy kernel moves the rows;
// - grouped GEMM: 64x64 output tiles over the rows sorted by expert; a tile that
//   straddles experts runs one pass per expert over the rows that expert owns; each
//   output is an fp32 fma chain over k in increasing order (bf16/f16 products are exact,
//   so the CPU's mul + add gives the same bits); for bf16/f16 on Hopper the wgmma kernel of
//   moe_sm90.cu runs instead, elsewhere (or for K % 8 != 0, odd N, unaligned operands) the
//   mma.sync kernel below;
// - un-permute: one thread per output element, choices added in order j with _rn ops.
// The offsets are read on the device; indices are clamped so that even unchecked input
// cannot make a kernel read or write out of bounds.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/cuda_util.h"
#include "cuda/common/mma_sync_ld.cuh"
#include "gpukit/numeric.h"
#include "ops/moe_args.h"
#include "ops/registry.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("moe_topk_gating", "moe_permute", "moe_unpermute", "moe_grouped_gemm");

namespace {

constexpr unsigned kMaxGrid = 65535;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// a precedes b: larger first, NaN last, ties (and NaN pairs) to the lower index
__device__ bool precedes(float va, int ia, float vb, int ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return !na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

template <class T>
__global__ void k_gating(const T* __restrict__ logits, int64_t t, int e, int k, bool renorm, int32_t* __restrict__ ids,
                         float* __restrict__ weights) {
  for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < t; row += int64_t(gridDim.x) * blockDim.x) {
    const T* lg = logits + row * e;
    float mx = -INFINITY;
    for (int i = 0; i < e; ++i) mx = fmaxf(mx, float(lg[i]));
    float sum = 0.0f;
    for (int i = 0; i < e; ++i) sum = __fadd_rn(sum, expf(__fsub_rn(float(lg[i]), mx)));
    float pv = 0.0f, chosen = 0.0f;
    int pi = -1;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      float bv = 0.0f;
      for (int i = 0; i < e; ++i) {
        float v = float(lg[i]);
        if (pi >= 0 && !precedes(pv, pi, v, i)) continue;  // already taken
        if (best < 0 || precedes(v, i, bv, best)) {
          best = i;
          bv = v;
        }
      }
      ids[row * k + j] = best;
      float w = __fdiv_rn(expf(__fsub_rn(bv, mx)), sum);
      weights[row * k + j] = w;
      chosen = __fadd_rn(chosen, w);
      pv = bv;
      pi = best;
    }
    if (renorm)
      for (int j = 0; j < k; ++j) weights[row * k + j] = __fdiv_rn(weights[row * k + j], chosen);
  }
}

// Stable counting sort of slots by expert, one block of 1024 threads.
constexpr int kSortThreads = 1024;
__global__ void __launch_bounds__(kSortThreads) k_sort(const int32_t* __restrict__ ids, int64_t slots, int64_t k,
                                                       int e, int32_t* __restrict__ offsets,
                                                       int32_t* __restrict__ slot_pos,
                                                       int32_t* __restrict__ sorted_token) {
  __shared__ int32_t cnt[1025];
  __shared__ int32_t base[1024];
  __shared__ int32_t chunk[kSortThreads];
  const int tid = threadIdx.x;
  for (int i = tid; i <= e; i += kSortThreads) cnt[i] = 0;
  __syncthreads();
  for (int64_t s = tid; s < slots; s += kSortThreads) atomicAdd(&cnt[min(max(ids[s], 0), e - 1)], 1);  // integer counts
  __syncthreads();
  if (tid == 0) {
    int32_t run = 0;
    for (int i = 0; i < e; ++i) {
      offsets[i] = run;
      base[i] = run;
      run += cnt[i];
    }
    offsets[e] = run;
  }
  __syncthreads();
  for (int64_t c0 = 0; c0 < slots; c0 += kSortThreads) {
    const int64_t s = c0 + tid;
    const int n = int(min64(kSortThreads, slots - c0));
    const int my = s < slots ? min(max(ids[s], 0), e - 1) : -1;
    chunk[tid] = my;
    __syncthreads();
    int before = 0;
    bool last = true;
    if (my >= 0) {
      for (int j = 0; j < n; ++j) {
        if (chunk[j] != my) continue;
        if (j < tid) ++before;
        if (j > tid) last = false;
      }
      const int32_t pos = base[my] + before;
      slot_pos[s] = pos;
      sorted_token[pos] = int32_t(s / k);
    }
    __syncthreads();
    if (my >= 0 && last) base[my] += before + 1;
    __syncthreads();
  }
}

template <class T>
__global__ void k_gather_rows(const T* __restrict__ x, int64_t x_rs, int64_t h, int64_t rows, int64_t t,
                              const int32_t* __restrict__ sorted_token, T* __restrict__ out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t tok = min64(max(sorted_token[r], 0), t - 1);
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) out[r * h + c] = x[tok * x_rs + c];
  }
}

template <class I, class O>
__global__ void k_unpermute(const I* __restrict__ y, const int32_t* __restrict__ pos, const float* __restrict__ w,
                            int64_t t, int64_t k, int64_t h, int64_t r, O* __restrict__ out) {
  const int64_t total = t * h;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tok = idx / h, c = idx - tok * h;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = min64(max(pos[tok * k + j], 0), r - 1);
      acc = __fadd_rn(acc, __fmul_rn(w[tok * k + j], float(y[p * h + c])));
    }
    out[idx] = convert<O>(acc);
  }
}

constexpr int kTile = 64, kDepth = 16, kThreads = 256, kMicro = 4;

__device__ int expert_of(const int32_t* off, int e, int64_t row) {  // last e with off[e] <= row
  int lo = 0, hi = e - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (off[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

template <class T, class O>
__global__ void __launch_bounds__(kThreads) k_grouped(const T* __restrict__ x, const T* __restrict__ w,
                                                      const int32_t* __restrict__ off_in, O* __restrict__ y, int64_t r,
                                                      int e, int64_t n, int64_t kd) {
  __shared__ float As[kDepth][kTile + 1];
  __shared__ float Bs[kDepth][kTile + 1];
  __shared__ int32_t off[1025];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  for (int i = tid; i <= e; i += kThreads) off[i] = min64(max(off_in[i], 0), r);  // clamped
  __syncthreads();
  const int64_t col0 = int64_t(blockIdx.x) * kTile;
  for (int64_t row0 = int64_t(blockIdx.y) * kTile; row0 < r; row0 += int64_t(gridDim.y) * kTile) {
    const int64_t row1 = min64(r, row0 + kTile);
    const int64_t end = off[e];
    // rows past the last expert's end are zeros
#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
      int64_t gr = row0 + ty + 16 * i;
      if (gr < row1 && gr >= end)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) {
          int64_t gc = col0 + tx + 16 * j;
          if (gc < n) y[gr * n + gc] = convert<O>(0.0f);
        }
    }
    if (row0 >= end) continue;
    const int e0 = expert_of(off, e, row0), e1 = expert_of(off, e, min64(row1, end) - 1);
    for (int ex = e0; ex <= e1; ++ex) {
      const int64_t lo = max64(row0, off[ex]), hi = min64(row1, off[ex + 1]);
      if (lo >= hi) continue;  // uniform across the block: no divergence around __syncthreads
      const T* we = w + int64_t(ex) * n * kd;
      float acc[kMicro][kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) acc[i][j] = 0.0f;
      for (int64_t k0 = 0; k0 < kd; k0 += kDepth) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          int el = tid + u * kThreads;
          int rr = el / kDepth, kk = el % kDepth;
          int64_t gr = row0 + rr, gc = col0 + rr, gk = k0 + kk;
          As[kk][rr] = (gr >= lo && gr < hi && gk < kd) ? float(x[gr * kd + gk]) : 0.0f;
          Bs[kk][rr] = (gc < n && gk < kd) ? float(we[gc * kd + gk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kDepth; ++kk) {
          float av[kMicro], bv[kMicro];
#pragma unroll
          for (int i = 0; i < kMicro; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
          for (int j = 0; j < kMicro; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < kMicro; ++i)
#pragma unroll
            for (int j = 0; j < kMicro; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
        int64_t gr = row0 + ty + 16 * i;
        if (gr < lo || gr >= hi) continue;
#pragma unroll
        for (int j = 0; j < kMicro; ++j) {
          int64_t gc = col0 + tx + 16 * j;
          if (gc < n) y[gr * n + gc] = convert<O>(acc[i][j]);
        }
      }
    }
  }
}

// Tensor-core form for bf16/f16 (K a multiple of 8, 16-byte aligned operands), the
// structure of src/cuda/int8_gemm.cu: 128x128 tiles, 8 warps of 64x32, each 4x4
// mma.sync m16n8k16 tiles with fp32 accumulators; K walked 32 deep through two
// shared-memory stages filled by cp.async (zero-filled outside the expert's rows and past
// K) while ldmatrix feeds the other. Each output depends only on its own row of x and
// column of w (the MMA computes every element independently) and the k order is fixed:
// the same bits on every run, whatever else is in the batch. Not the CPU's bits (the
// tensor core adds in its own order and precision); within fp32 accuracy of it.
constexpr int kTcM = 128, kTcN = 128, kTcK = 32, kTcLd = 40, kTcThreads = 256;  // kTcLd: 80-byte rows

using tc::cp_async16;
using tc::ldmatrix_x4;
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <class T, class O>
__global__ void __launch_bounds__(kTcThreads) k_grouped_tc(const T* __restrict__ x, const T* __restrict__ w,
                                                           const int32_t* __restrict__ off_in, O* __restrict__ y,
                                                           int64_t r, int e, int64_t n, int64_t kd) {
  __shared__ __align__(128) T As[2][kTcM * kTcLd];
  __shared__ __align__(128) T Ws[2][kTcN * kTcLd];
  __shared__ int32_t off[1025];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / 4, wn = warp % 4;  // the warp's rows wm*64.., columns wn*32..
  for (int i = tid; i <= e; i += kTcThreads) off[i] = int32_t(min64(max(off_in[i], 0), r));
  __syncthreads();
  const int64_t col0 = int64_t(blockIdx.x) * kTcN;
  const int64_t nk = (kd + kTcK - 1) / kTcK;
  for (int64_t row0 = int64_t(blockIdx.y) * kTcM; row0 < r; row0 += int64_t(gridDim.y) * kTcM) {
    const int64_t row1 = min64(r, row0 + kTcM), end = off[e];
    for (int t = tid; t < kTcM * kTcN; t += kTcThreads) {  // rows past the last expert's end are zeros
      const int64_t gr = row0 + t / kTcN, gc = col0 + t % kTcN;
      if (gr < row1 && gr >= end && gc < n) y[gr * n + gc] = convert<O>(0.0f);
    }
    if (row0 >= end) continue;
    const int e0 = expert_of(off, e, row0), e1 = expert_of(off, e, min64(row1, end) - 1);
    for (int ex = e0; ex <= e1; ++ex) {
      const int64_t lo = max64(row0, off[ex]), hi = min64(row1, off[ex + 1]);
      if (lo >= hi) continue;  // block-uniform
      const T* we = w + int64_t(ex) * n * kd;
      float acc[4][4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
      auto load = [&](int stage, int64_t k0) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {  // 128 rows x 32 elements = 512 chunks of 16 bytes, per operand
          const int c = tid + u * kTcThreads, rr = c / 4, kc = (c % 4) * 8;
          const int64_t gk = k0 + kc, gr = row0 + rr, gc = col0 + rr;
          const bool va = gr >= lo && gr < hi && gk < kd, vw = gc < n && gk < kd;
          cp_async16(&As[stage][rr * kTcLd + kc], va ? x + gr * kd + gk : x, va);
          cp_async16(&Ws[stage][rr * kTcLd + kc], vw ? we + gc * kd + gk : we, vw);
        }
        asm volatile("cp.async.commit_group;\n" ::);
      };
      load(0, 0);
      for (int64_t kt = 0; kt < nk; ++kt) {
        const int st = int(kt & 1);
        if (kt + 1 < nk) {
          load(st ^ 1, (kt + 1) * kTcK);
          asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
          asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTcK; kk += 16) {
          uint32_t af[4][4], bfr[2][4];
#pragma unroll
          for (int i = 0; i < 4; ++i)
            ldmatrix_x4(af[i], &As[st][(wm * 64 + i * 16 + (lane % 16)) * kTcLd + kk + 8 * (lane / 16)]);
#pragma unroll
          for (int j = 0; j < 2; ++j)
            ldmatrix_x4(bfr[j], &Ws[st][(wn * 32 + j * 16 + (lane % 8) + 8 * (lane / 16)) * kTcLd + kk +
                                        8 * ((lane / 8) % 2)]);
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              mma_16816<T>(acc[i][j], af[i], bfr[j / 2][(j % 2) * 2], bfr[j / 2][(j % 2) * 2 + 1]);
        }
        __syncthreads();
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // c0, c1: row lane/4, columns 2*(lane%4) + {0, 1}; c2, c3: row + 8
            const int64_t gr = row0 + wm * 64 + i * 16 + lane / 4 + 8 * h;
            const int64_t gc = col0 + wn * 32 + j * 8 + 2 * (lane % 4);
            if (gr < lo || gr >= hi) continue;
            if (gc < n) y[gr * n + gc] = convert<O>(acc[i][j][2 * h]);
            if (gc + 1 < n) y[gr * n + gc + 1] = convert<O>(acc[i][j][2 * h + 1]);
          }
    }
  }
}

template <class F>
void by_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f16: return f(f16{});
    case DType::bf16: return f(bf16{});
    default: throw TypeError(cat(op, ": unsupported dtype ", dtype_name(t)));
  }
}

// GPUKIT_MOE_NO_TENSOR_CORES=1: bf16/f16 grouped GEMMs on the CUDA-core kernel (the
// CPU reference's exact fma order) instead of the tensor-core one.
bool tensor_cores_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("GPUKIT_MOE_NO_TENSOR_CORES");
    return !(v && *v && std::string(v) != "0");
  }();
  return on;
}

unsigned blocks_for(int64_t n, int threads) {
  return unsigned(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65535));
}

}  // namespace

void moe_topk_gating(const MoeGatingArgs& p, void* stream) {
  if (p.t <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  by_float(p.dtype, "moe_topk_gating", [&](auto tag) {
    using T = decltype(tag);
    k_gating<T><<<blocks_for(p.t, 128), 128, 0, s>>>(static_cast<const T*>(p.logits), p.t, int(p.e), int(p.k),
                                                      p.renormalize, p.ids, p.weights);
  });
  GK_LAUNCH_CHECK("moe_topk_gating");
}

void moe_permute(const MoePermuteArgs& p, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t slots = p.t * p.k;
  k_sort<<<1, kSortThreads, 0, s>>>(p.ids, slots, p.k, int(p.e), p.offsets, p.slot_pos, p.sorted_token);
  GK_LAUNCH_CHECK("moe_permute (sort)");
  if (slots == 0 || p.h == 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(slots, kMaxGrid));
  auto run = [&](auto tag) {
    using T = decltype(tag);
    k_gather_rows<T><<<grid, 256, 0, s>>>(static_cast<const T*>(p.x), p.x_rs, p.h, slots, p.t, p.sorted_token,
                                          static_cast<T*>(p.x_sorted));
  };
  switch (itemsize(p.dtype)) {
    case 1: run(uint8_t{}); break;
    case 2: run(uint16_t{}); break;
    case 4: run(uint32_t{}); break;
    case 8: run(uint64_t{}); break;
    default: throw TypeError(cat("moe_permute: unsupported dtype ", dtype_name(p.dtype)));
  }
  GK_LAUNCH_CHECK("moe_permute (rows)");
}

void moe_unpermute(const MoeUnpermuteArgs& p, void* stream) {
  if (p.t <= 0 || p.h <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  by_float(p.in_dtype, "moe_unpermute", [&](auto itag) {
    using I = decltype(itag);
    by_float(p.out_dtype, "moe_unpermute", [&](auto otag) {
      using O = decltype(otag);
      k_unpermute<I, O><<<blocks_for(p.t * p.h, 256), 256, 0, s>>>(static_cast<const I*>(p.y_sorted), p.slot_pos,
                                                                    p.weights, p.t, p.k, p.h, std::max<int64_t>(p.r, 1),
                                                                    static_cast<O*>(p.out));
    });
  });
  GK_LAUNCH_CHECK("moe_unpermute");
}

// moe_sm90.cu: the Hopper kernel (wgmma, TMA, persistent); false where it does not apply
bool moe_grouped_gemm_sm90(const MoeGemmArgs& a, void* stream);

// GPUKIT_MOE_FUSED_SWIGLU=0: moe_mlp runs the gate-up product and the SwiGLU epilogue apart
bool moe_grouped_gemm_swiglu(const MoeGemmArgs& p, void* stream) {
  const char* v = std::getenv("GPUKIT_MOE_FUSED_SWIGLU");  // read per call: tests switch it
  const bool off = v && std::string(v) == "0";
  if (off || !p.swiglu || !tensor_cores_enabled() || (p.dtype != DType::bf16 && p.dtype != DType::f16)) return false;
  return moe_grouped_gemm_sm90(p, stream);
}

void moe_grouped_gemm(const MoeGemmArgs& p, void* stream) {
  if (p.r <= 0 || p.n <= 0) return;
  if (p.swiglu) throw ValueError("moe_grouped_gemm: the fused SwiGLU form runs through moe_grouped_gemm_swiglu");
  auto s = static_cast<cudaStream_t>(stream);
  if ((p.dtype == DType::bf16 || p.dtype == DType::f16) && tensor_cores_enabled() && moe_grouped_gemm_sm90(p, stream))
    return;
  const bool aligned = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
  if ((p.dtype == DType::bf16 || p.dtype == DType::f16) && p.kdim % 8 == 0 && aligned && tensor_cores_enabled()) {
    const int64_t gx = (p.n + kTcN - 1) / kTcN, gy = (p.r + kTcM - 1) / kTcM;
    if (gx > int64_t(INT32_MAX)) throw ValueError("moe_grouped_gemm: n is too large for the CUDA kernel");
    dim3 grid(unsigned(gx), unsigned(std::min<int64_t>(gy, kMaxGrid)));
    auto run = [&](auto ttag) {
      using T = decltype(ttag);
      by_float(p.out_dtype, "moe_grouped_gemm", [&](auto otag) {
        using O = decltype(otag);
        k_grouped_tc<T, O><<<grid, kTcThreads, 0, s>>>(static_cast<const T*>(p.x), static_cast<const T*>(p.w),
                                                        p.offsets, static_cast<O*>(p.y), p.r, int(p.e), p.n, p.kdim);
      });
    };
    if (p.dtype == DType::bf16) run(bf16{});
    else run(f16{});
    GK_LAUNCH_CHECK("moe_grouped_gemm (tensor cores)");
    return;
  }
  const int64_t gx = (p.n + kTile - 1) / kTile, gy = (p.r + kTile - 1) / kTile;
  if (gx > int64_t(INT32_MAX)) throw ValueError("moe_grouped_gemm: n is too large for the CUDA kernel");
  dim3 grid(unsigned(gx), unsigned(std::min<int64_t>(gy, kMaxGrid)));
  by_float(p.dtype, "moe_grouped_gemm", [&](auto ttag) {
    using T = decltype(ttag);
    by_float(p.out_dtype, "moe_grouped_gemm", [&](auto otag) {
      using O = decltype(otag);
      k_grouped<T, O><<<grid, kThreads, 0, s>>>(static_cast<const T*>(p.x), static_cast<const T*>(p.w), p.offsets,
                                                static_cast<O*>(p.y), p.r, int(p.e), p.n, p.kdim);
    });
  });
  GK_LAUNCH_CHECK("moe_grouped_gemm");
}

}  // namespace gk::cuda
