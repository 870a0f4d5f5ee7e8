// One decode-GEMV kernel family for the weight formats read as independent 16-byte
// chunks on the CUDA cores (bf16/fp16, fp8, int8; int4 and NVF4 when K % 128 != 0;
// the tensor-core kernel of gemv_mma.cuh takes them otherwise): y[m, j] =
// sum_k x[m, k] * w[j, k] for M <= 8 rows of bf16/fp16 x, fp32 accumulation.
//
// Plan (the weight read is the whole cost):
// - a CTA of kThreads threads holds kWarps / wpg row groups; the wpg warps of a group own
//   kRows consecutive output rows and sweep their k range (or one slice of it, split-K):
//   thread t of the group takes 16-byte chunks t, t + 32 wpg, ... of each of the rows,
//   copied with cp.async into the thread's own ring of kStages stages in shared memory
//   (kStages - 1 chunks per row in flight while one is decoded; no registers held, no
//   barrier: a thread reads only what it copied). wpg (warps_per_group) gives each thread
//   about 2 chunks per row, so short rows (4-bit formats) use every thread;
// - each chunk is decoded in registers by the format functor F in pieces of 8
//   weights (F::piece) and multiplied with 8 x values read once for all R rows
//   (16-byte loads through the read-only cache: x is small and shared by all CTAs);
// - formats with a scale per group of pieces (int4 groups, NVF4 blocks) sum the exact
//   products of a group first, then fma(scale, sum, acc);
//   per-row scales (fp8, int8 channels, NVF4's tensor scale) multiply the final sum;
// - reduction: xor-butterfly inside each warp, then the group's wpg warp sums added in
//   warp order by one thread per output: a fixed order, the same bits every run;
// - split-K (small N): slice s writes fp32 partial sums; k_gemv_sum adds the slices in
//   slice order. The split is a function of (N, K, format) only, never of M, so a row
//   of x gives the same bits alone or in a batch. No atomics.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/cuda_util.h"
#include "gpukit/dtype.h"
#include "gpukit/errors.h"
#include "gpukit/numeric.h"

namespace gk::cuda::gemv_detail {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// Everything a kernel of the family reads; the meaning of scales/aux per format is
// in the functor that reads them.
struct KArgs {
  const void* x = nullptr;     // [m, k] bf16/fp16, rows x_rs elements apart, 16-byte aligned rows
  const uint8_t* q = nullptr;  // weight rows, q_rs bytes apart, 16-byte aligned
  const float* scales = nullptr;
  const uint8_t* aux = nullptr;
  const float* gscale = nullptr;
  void* y = nullptr;      // [m, n] out dtype
  float* part = nullptr;  // [split, m, n] when split > 1
  int64_t m = 0, n = 0, k = 0, x_rs = 0, q_rs = 0, group = 0;
  DType out = DType::bf16;
  int wpg = kWarps;  // warps per row group (a CTA holds kWarps / wpg groups of R rows)
  int variant = 0;   // host side: 1 = twice the loads in flight per thread
};

// ---- small device helpers ----

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// cp.async: 16 bytes global -> shared, bypassing L1 (weights are read once), in groups.
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ float lds_f32(uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a));
  return v;
}

// Programmatic dependent launch (all variants but 2): a kernel lets the next one launch at
// once and waits for the previous one's writes only after issuing its first weight copies
// (weights are never written by a kernel); it reads x and writes y, partial sums only after
// the wait. No-ops when the launch did not ask for it.
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <class T>
__device__ __forceinline__ float2 pair2(uint32_t v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
  } else {
    __half2 h = *reinterpret_cast<__half2*>(&v);
    return __half22float2(h);
  }
}

template <class T>
__device__ __forceinline__ void to_float8(const uint4& v, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 a = pair2<T>(word(v, i));
    f[2 * i] = a.x;
    f[2 * i + 1] = a.y;
  }
}

__device__ __forceinline__ float2 half2_to_float2(uint32_t v) {
  __half2 h = *reinterpret_cast<__half2*>(&v);
  return __half22float2(h);
}

// The warps' 4 partial sums of one lane, [nw][32] float4 in shared memory at base (16-byte
// aligned; float4 w of the lane at base + w * wstride floats), added in warp order: every
// warp's float4 is loaded first (up to 8 warps, one 16-byte load each, all in flight at
// once), then s = p0 + p1 + ... + p(nw-1) element by element, the order of a loop over w:
// the same bits as that loop, without a load's latency per warp (session 12).
__device__ __forceinline__ float4 warps_sum4(const float* base, int wstride, int nw) {
  float4 v[8];
#pragma unroll
  for (int w = 0; w < 8; ++w)
    if (w < nw) v[w] = *reinterpret_cast<const float4*>(base + w * wstride);
  float4 s = v[0];
#pragma unroll
  for (int w = 1; w < 8; ++w)
    if (w < nw) s = make_float4(s.x + v[w].x, s.y + v[w].y, s.z + v[w].z, s.w + v[w].w);
  return s;
}
__device__ __forceinline__ float f4_get(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

// The CTA's sums of the staged 16-row kernels (k_w4, k_w4i, the GGUF staged kernels): every
// thread puts its 4 sums into `red` (shared memory for [nw][32] float4, free by then; nothing
// with one warp); then the other warps return and warp 0 adds them in warp order with
// warps_sum4(red + lane * 4, 32 * 4, nw). (Each kernel keeps its own form of that last step:
// folded into a helper, the compiler laid the kernels out otherwise.)
__device__ __forceinline__ void cta_sums4_put(float* red, const float (&acc)[4], int warp, int lane, int nw) {
  if (nw > 1) {
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(warp * 32 + lane) * 4 + e] = acc[e];
    __syncthreads();
  }
}

__device__ __forceinline__ void store_out(void* y, DType t, int64_t i, float v) {
  if (t == DType::f32) static_cast<float*>(y)[i] = v;
  else if (t == DType::bf16) static_cast<bf16*>(y)[i] = convert<bf16>(v);
  else static_cast<f16*>(y)[i] = convert<f16>(v);
}

// ---- format functors ----
struct Simple {
  static constexpr int kMinBlocks = 3;  // CTAs per SM the M = 1 kernel is compiled for
};
// E: weights per 16-byte chunk. Side: what a chunk needs besides its bytes (loaded by
// side()). piece(raw, side, h, w): weights 8h..8h+7 of the chunk, exact, without the
// group scale. kSpan: pieces per group scale (0: no group scale); scale(side, g) the
// scale of group g of the chunk. row_scale: the factor of the whole row's sum.

struct NoSide {};

template <class W>  // bf16 / fp16 weights
struct FDense : Simple {
  static constexpr int E = 8, kSpan = 0, kMinBlocks = 4;
  using Side = NoSide;
  __device__ static Side side(const KArgs&, int64_t, int64_t) { return {}; }
  __device__ static void piece(const uint4& raw, const Side&, int, float (&w)[8]) { to_float8<W>(raw, w); }
  __device__ static float scale(const Side&, int) { return 1.0f; }
  __device__ static float row_scale(const KArgs&, int64_t) { return 1.0f; }
};

struct FFp8 : Simple {  // float8_e4m3fn codes, scales[row]
  static constexpr int E = 16, kSpan = 0;
  using Side = NoSide;
  __device__ static Side side(const KArgs&, int64_t, int64_t) { return {}; }
  __device__ static void piece(const uint4& raw, const Side&, int h, float (&w)[8]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t u = word(raw, 2 * h + i);
      __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u & 0xffffu), __NV_E4M3);
      __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u >> 16), __NV_E4M3);
      float2 a = __half22float2(*reinterpret_cast<__half2*>(&lo));
      float2 b = __half22float2(*reinterpret_cast<__half2*>(&hi));
      w[4 * i] = a.x;
      w[4 * i + 1] = a.y;
      w[4 * i + 2] = b.x;
      w[4 * i + 3] = b.y;
    }
  }
  __device__ static float scale(const Side&, int) { return 1.0f; }
  __device__ static float row_scale(const KArgs& p, int64_t row) { return __ldg(p.scales + row); }
};

struct FInt8 : Simple {  // int8 codes, scales[row]
  static constexpr int E = 16, kSpan = 0;
  using Side = NoSide;
  __device__ static Side side(const KArgs&, int64_t, int64_t) { return {}; }
  __device__ static void piece(const uint4& raw, const Side&, int h, float (&w)[8]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // (b ^ 0x80) placed in the low byte of 2^23: the float is 2^23 + 128 + b exactly
      const uint32_t u = word(raw, 2 * h + i) ^ 0x80808080u;
#pragma unroll
      for (int b = 0; b < 4; ++b)
        w[4 * i + b] = __uint_as_float(__byte_perm(u, 0x4B00u, 0x5440u + b)) - 8388736.0f;
    }
  }
  __device__ static float scale(const Side&, int) { return 1.0f; }
  __device__ static float row_scale(const KArgs& p, int64_t row) { return __ldg(p.scales + row); }
};

// int4: q [N, K/2] (element 2i low nibble of byte i), scales/zeros [N, K/G], G % 32 == 0:
// a 32-weight chunk lies in one group. w = (q - z) * s.
struct FInt4 : Simple {
  static constexpr int E = 32, kSpan = 4, kMinBlocks = 2;
  struct Side {
    uint32_t z2;  // half2 (1024 + z, 1024 + z)
    float s;
  };
  __device__ static Side side(const KArgs& p, int64_t row, int64_t chunk) {
    const int64_t ng = p.k / p.group;
    const int64_t g = row * ng + (chunk * E) / p.group;
    const uint32_t zh = 0x6400u | uint32_t(__ldg(p.aux + g));  // 1024 + z as fp16 bits
    return {zh | (zh << 16), __ldg(p.scales + g)};
  }
  __device__ static void piece(const uint4& raw, const Side& sd, int h, float (&w)[8]) {
    const uint32_t u = word(raw, h);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      // nibbles s and s + 4 as fp16 1024 + q; minus (1024 + z): q - z exactly
      uint32_t t = ((u >> (4 * s)) & 0x000f000fu) | 0x64006400u;
      __half2 d = __hsub2(*reinterpret_cast<__half2*>(&t), *reinterpret_cast<const __half2*>(&sd.z2));
      float2 f = __half22float2(d);
      w[s] = f.x;
      w[s + 4] = f.y;
    }
  }
  __device__ static float scale(const Side& sd, int) { return sd.s; }
  __device__ static float row_scale(const KArgs&, int64_t) { return 1.0f; }
};

// NVF4: q [N, K/2] e2m1 codes (element 2i low nibble), aux = e4m3 block scales [N, K/16],
// gscale: one fp32 for the tensor. w = e2m1(q) * e4m3(b) * gs. A 32-weight chunk holds two
// blocks (pieces 0-1 and 2-3).
struct FNvf4 : Simple {
  static constexpr int E = 32, kSpan = 2, kMinBlocks = 2;
  struct Side {
    float s0, s1;  // the two block scales times 2^14 (the fp16 trick below leaves 2^-14)
  };
  __device__ static float e4m3(uint32_t b) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(b), __NV_E4M3);
    return __half2float(*reinterpret_cast<__half*>(&h.x));
  }
  __device__ static Side side(const KArgs& p, int64_t row, int64_t chunk) {
    const uint8_t* b = p.aux + row * (p.k / 16) + chunk * 2;
    return {e4m3(__ldg(b)) * 16384.0f, e4m3(__ldg(b + 1)) * 16384.0f};
  }
  __device__ static void piece(const uint4& raw, const Side&, int h, float (&w)[8]) {
    const uint32_t u = word(raw, h);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      // nibble (sign, e1, e0, m) -> fp16 bits sign << 15 | (e1 e0 m) << 9: value e2m1 * 2^-14,
      // exact for the subnormal code (0.5) too
      const uint32_t t = (u >> (4 * s)) & 0x000f000fu;
      const uint32_t hb = ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
      float2 f = half2_to_float2(hb);
      w[s] = f.x;
      w[s + 4] = f.y;
    }
  }
  __device__ static float scale(const Side& sd, int g) { return g == 0 ? sd.s0 : sd.s1; }
  __device__ static float row_scale(const KArgs& p, int64_t) { return __ldg(p.gscale); }
};

// ---- the kernel ----

template <class F, class T, int MT, int R>
__device__ __forceinline__ void do_chunk(const KArgs& p, const int64_t (&rows)[R], int64_t cc,
                                         const uint4 (&raw)[R], float (&acc)[MT][R]) {
  constexpr int P = F::E / 8;
  constexpr int SP = F::kSpan;
  typename F::Side sd[R];
#pragma unroll
  for (int r = 0; r < R; ++r) sd[r] = F::side(p, rows[r], cc);
  const T* x = static_cast<const T*>(p.x) + cc * F::E;
  float part[MT][R];
#pragma unroll
  for (int h = 0; h < P; ++h) {
    auto fma_piece = [&](int i, int r, const float (&xf)[8], const float (&w)[8]) {
      float d = SP == 0 ? acc[i][r] : (h % SP == 0 ? 0.0f : part[i][r]);
#pragma unroll
      for (int e = 0; e < 8; ++e) d = fmaf(xf[e], w[e], d);
      if constexpr (SP == 0) acc[i][r] = d;
      else part[i][r] = d;
    };
    auto load_x = [&](int i, float (&xf)[8]) {
      to_float8<T>(__ldg(reinterpret_cast<const uint4*>(x + i * p.x_rs + 8 * h)), xf);
    };
    if constexpr (MT <= 2) {  // few rows of x: hold x, decode one weight row at a time
      float xf[MT][8];
#pragma unroll
      for (int i = 0; i < MT; ++i)
        if (i < p.m) load_x(i, xf[i]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float w[8];
        F::piece(raw[r], sd[r], h, w);
#pragma unroll
        for (int i = 0; i < MT; ++i)
          if (i < p.m) fma_piece(i, r, xf[i], w);
      }
    } else {  // many rows of x: hold the decoded weights, stream x
      float w[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) F::piece(raw[r], sd[r], h, w[r]);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (i < p.m) {
          float xf[8];
          load_x(i, xf);
#pragma unroll
          for (int r = 0; r < R; ++r) fma_piece(i, r, xf, w[r]);
        }
      }
    }
    if constexpr (SP != 0) {
      if (h % SP == SP - 1) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int r = 0; r < R; ++r)
            if (i < p.m) acc[i][r] = fmaf(F::scale(sd[r], h / SP), part[i][r], acc[i][r]);
      }
    }
  }
}

template <class F, class T, int MT, int R, int D>
__global__ void __launch_bounds__(kThreads, MT == 1 ? F::kMinBlocks : 1) k_gemv(const KArgs p) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wpg = p.wpg, gsz = wpg * 32, G = kWarps / wpg;
  const int gt = tid % gsz;  // thread index inside the row group
  const int64_t row0 = (int64_t(blockIdx.x) * G + warp / wpg) * R;
  int64_t rows[R];
  const uint8_t* qr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    rows[r] = row0 + r < p.n ? row0 + r : p.n - 1;
    qr[r] = p.q + rows[r] * p.q_rs;
  }
  const int64_t nch = p.k / F::E;
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t cps = (nch + S - 1) / S;
  const int64_t c0 = int64_t(s) * cps, c1 = std::min(nch, c0 + cps);
  float acc[MT][R];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;

  // the thread's ring: D stages of R chunks, [stage][row][thread] (its own 16 bytes only,
  // so no barrier: cp.async.wait_group makes them visible to the thread that copied them)
  extern __shared__ uint4 ring[];
  const uint32_t base = smem_addr(ring) + uint32_t(tid) * 16u;
  auto slot = [&](int st, int r) { return base + uint32_t((st * R + r) * kThreads) * 16u; };
  const int64_t cb = c0 + gt;
  auto issue = [&](int st, int64_t j) {
    const int64_t cc = cb + j * gsz;
    if (cc < c1) {
#pragma unroll
      for (int r = 0; r < R; ++r) cp_async16(slot(st, r), qr[r] + cc * 16);
    }
    cp_commit();
  };
  pdl_trigger();
#pragma unroll
  for (int st = 0; st < D - 1; ++st) issue(st, st);
  pdl_wait();
  for (int64_t j0 = 0; cb + j0 * gsz < c1; j0 += D) {
#pragma unroll
    for (int st = 0; st < D; ++st) {
      issue((st + D - 1) % D, j0 + st + D - 1);
      cp_wait<D - 1>();
      const int64_t cc = cb + (j0 + st) * gsz;
      if (cc < c1) {
        uint4 raw[R];
#pragma unroll
        for (int r = 0; r < R; ++r) raw[r] = lds16(slot(st, r));
        do_chunk<F, T, MT, R>(p, rows, cc, raw, acc);
      }
    }
  }
  cp_wait<0>();

  __shared__ float red[kWarps][MT * R];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[i][r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) red[warp][i * R + r] = v;
    }
  __syncthreads();
  if (tid < G * MT * R) {
    const int g = tid / (MT * R), o = tid % (MT * R), i = o / R, r = o % R;
    const int64_t row = (int64_t(blockIdx.x) * G + g) * R + r;
    if (i < p.m && row < p.n) {
      float v = red[g * wpg][o];
      for (int w = 1; w < wpg; ++w) v += red[g * wpg + w][o];
      v *= F::row_scale(p, row);
      if (S == 1) store_out(p.y, p.out, i * p.n + row, v);
      else p.part[(int64_t(s) * p.m + i) * p.n + row] = v;
    }
  }
}

constexpr int kRows = 4;  // rows per group

// Warps per row group for rows of `chunks` 16-byte chunks: about 2 chunks per thread
// (a power of two, 1..kWarps), so short rows (4-bit formats) keep every thread busy.
inline int warps_per_group(int64_t chunks) {
  int w = 1;
  while (w < kWarps && int64_t(w) * 2 * 64 <= chunks) w *= 2;
  return w;
}

// The split-K factor for rows of `chunks` chunks: enough CTAs to fill the GPU several
// times, at least 2 chunks per thread per slice. A function of (N, K, format) only.
inline int split_for(int64_t n, int64_t chunks) {
  const int wpg = warps_per_group(chunks);
  const int64_t rows_per_cta = int64_t(kWarps / wpg) * kRows;
  const int64_t ctas = (n + rows_per_cta - 1) / rows_per_cta;
  const int64_t target = 132 * 6;
  if (ctas >= target) return 1;
  int64_t sp = (target + ctas - 1) / ctas;
  sp = std::min<int64_t>({sp, 16, std::max<int64_t>(chunks / (2 * 32 * wpg), 1)});
  return int(std::max<int64_t>(sp, 1));
}

// The second pass of split-K (src/cuda/gemv.cu): y = sum of the slices in slice order.
void launch_sum(const KArgs& p, int split, cudaStream_t st);

template <class F>
int64_t chunks_per_row(int64_t k) {
  return k / F::E;
}

// Raise a kernel's dynamic shared memory limit once per device (above the 48 KB default).
template <auto Kernel>
void smem_limit(int bytes) {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (done.load(std::memory_order_relaxed) & bit) return;
  GK_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit);
}

// A launch with the programmatic-serialization attribute when pdl (every variant but 2).
template <class K, class... A>
void launch_ex(K kernel, dim3 grid, int threads, int smem, cudaStream_t st, bool pdl, const A&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  GK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <class F, class T, int MT, int D>
void launch_k(const KArgs& p, dim3 grid, cudaStream_t st) {
  constexpr int smem = D * kRows * kThreads * 16;
  smem_limit<k_gemv<F, T, MT, kRows, D>>(smem);
  launch_ex(k_gemv<F, T, MT, kRows, D>, grid, kThreads, smem, st, p.variant != 2, p);
}

template <class F, class T, int D>
void launch_m(const KArgs& p, dim3 grid, cudaStream_t st) {
  if (p.m <= 1) launch_k<F, T, 1, D>(p, grid, st);
  else if (p.m <= 2) launch_k<F, T, 2, D>(p, grid, st);
  else if (p.m <= 4) launch_k<F, T, 4, D>(p, grid, st);
  else launch_k<F, T, 8, D>(p, grid, st);
}

// variant 0: a ring of kStages stages of kRows chunks per thread; 1: two stages; 2: as 0,
// launched without programmatic dependent launch.
constexpr int kStages = 4;

template <class F, class T>
void launch_family(const KArgs& p_in, int split, cudaStream_t st) {
  KArgs p = p_in;
  p.wpg = warps_per_group(chunks_per_row<F>(p.k));
  const int64_t rows_per_cta = int64_t(kWarps / p.wpg) * kRows;
  const int64_t blocks = (p.n + rows_per_cta - 1) / rows_per_cta;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, split)));
  if (p.variant == 1) launch_m<F, T, 2>(p, grid, st);
  else launch_m<F, T, kStages>(p, grid, st);
  GK_LAUNCH_CHECK("gemv");
  if (split > 1) launch_sum(p, split, st);
}

}  // namespace gk::cuda::gemv_detail
