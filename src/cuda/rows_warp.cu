// Row-wise fused kernels with the row in registers, written for the fewest
// instructions per element (the 16-bit rows of an H200 have ~2x the elements per
// byte of f32 rows, and the older register forms of norm.cu / reduce.cu issued
// ~19 instructions per bf16 element of layer_norm: per-pair NaN branches, guards
// and re-unpacks):
//  - wpr warps per row (1 to 16), rpc rows per block; lane l of the row's warp w
//    holds the 16-byte vectors w*32 + l + j*32*wpr, j < V, all loaded before any
//    arithmetic (optionally with L1::no_allocate / L2 evict_first hints);
//  - reductions: an xor-butterfly per warp (every lane gets the same bits), then,
//    with wpr > 1, a butterfly over the warps' values in shared memory (one
//    barrier per reduction, each reduction with its own slots);
//  - the fp32 -> bf16 rounding with the paired conversion, one NaN test per
//    16-byte vector, and the exact NaN rounding of vec.cuh only where a vector
//    holds a NaN (so the bits are those of pack<T>);
//  - softmax in two reductions (the row max, then the sum of exp(x - max)): a
//    NaN, a +inf or an all -inf row gives NaN through the arithmetic itself.
// Every row is computed the same way whatever the number of rows or the grid
// (the shape depends on the dtype and the row length only): bits do not depend
// on the batch, and they are the same run to run (no atomics).
// H200 (bench/fused.py, 4096 x 4096, % of a same-bytes copy; docs/fused.md): bf16
// softmax 96%, layer_norm 87-89%, rms_norm + residual 96%; f32 97-99%.
// GPUKIT_TUNE: rows.on (0: not this form), rows.v (target vectors per lane, which
// sets the default warps per row), rows.wpr, rows.rpc, rows.hint (bit 0: loads
// L1::no_allocate, bit 1: loads L2 evict_first, bit 2: stores .cs), rows.pers
// (1: the persistent form with the next rows loaded ahead; rows.grid forces its
// grid).
#include "cuda/rows_warp.h"

#include <algorithm>

#include "core/cuda_util.h"
#include "cuda/common/rows.cuh"
#include "cuda/common/rows_vec.cuh"
#include "cuda/common/softmax_rows.cuh"
#include "cuda/common/vec.cuh"

namespace gk::cuda {

namespace {

constexpr int kMaxThreads = 512;
constexpr int kMaxWarps = kMaxThreads / 32;
// Register budget by vectors per lane: at most 64 registers for V <= 4 (32 warps
// per SM), 128 for V = 8; V = 16 runs blocks of at most 256 threads.
template <int V>
inline constexpr int kBlockMax = V >= 16 ? 256 : kMaxThreads;
template <int V>
inline constexpr int kMinBlocks = V <= 4 ? 2 : 1;

struct Shape {
  int64_t rows = 0;
  int nvec = 0, wsh = 0, hint = 0;  // wsh: log2 of the warps per row
  float invH = 1.f;                 // 1 / H (norms)
};

// The lane's V vectors of a row (c0 + j * stride, j < V); vectors at or past nvec
// get `fill`. One loop per hint so that the loads stay back to back.
template <int V>
__device__ __forceinline__ void load_row(raw16 (&d)[V], const raw16* p, int c0, int stride, int nvec, int hint,
                                         uint64_t pol, raw16 fill) {
  if (hint & 2) {
#pragma unroll
    for (int j = 0; j < V; ++j) d[j] = c0 + j * stride < nvec ? ld_ef(p + c0 + j * stride, pol) : fill;
  } else if (hint & 1) {
#pragma unroll
    for (int j = 0; j < V; ++j) d[j] = c0 + j * stride < nvec ? ld_na(p + c0 + j * stride) : fill;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) d[j] = c0 + j * stride < nvec ? ld16(p + c0 + j * stride) : fill;
  }
}

template <class T>
__device__ __forceinline__ const raw16* row_in(const void* base, int64_t row, int64_t rs) {
  return reinterpret_cast<const raw16*>(static_cast<const T*>(base) + row * rs);
}
template <class T>
__device__ __forceinline__ raw16* row_out(void* base, int64_t row, int64_t rs) {
  return reinterpret_cast<raw16*>(static_cast<T*>(base) + row * rs);
}

// Reduction over the 2^wsh warps of a row (warps first .. first + 2^wsh - 1 of
// the block): a butterfly per warp, then a butterfly over the row's warp values
// (lane l reads warp l mod 2^wsh), so that every lane gets the same bits. sh:
// kMaxWarps floats used by this reduction only. All threads of the block call it.
template <class F>
__device__ __forceinline__ float group_all(float v, float* sh, int wsh, int first, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (wsh == 0) return v;
  const int lane = threadIdx.x & 31;
  if (lane == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = sh[first + (lane & ((1 << wsh) - 1))];
  for (int o = 1 << (wsh - 1); o > 0; o >>= 1) v = f(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Where this thread sits: its row, the row's first warp, its first vector.
struct Place {
  int64_t row;
  int first, c0, stride, nvec;
};
__device__ __forceinline__ int rows_per_block(const Shape& s) { return int(blockDim.x >> 5) >> s.wsh; }
__device__ __forceinline__ Place place(const Shape& s, int64_t group) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rloc = warp >> s.wsh, first = rloc << s.wsh;
  const int64_t row = group * rows_per_block(s) + rloc;
  // a dead row (the last block) has no vectors: it only joins the barriers
  return {row, first, (warp - first) * 32 + lane, 32 << s.wsh, row < s.rows ? s.nvec : 0};
}

// ---- rms_norm (KIND 0), rms_norm with the residual add (1), layer_norm (2) ----
// PERS: a grid of at most one wave loops over the row groups (block g takes the
// groups g, g + grid, ...), loading the next group's rows before it reduces and
// writes the current ones, with the weights loaded once.
template <class T, int V, int KIND, bool PERS>
struct NormRow {
  static constexpr int N = kVecN<T>;
  static constexpr bool PREW = PERS || (KIND != 2 && V <= 4);  // the weights in registers

  static __device__ __forceinline__ void load(const NormArgs& a, const Shape& s, const Place& p, uint64_t pol,
                                              raw16 (&xs)[V], raw16 (&rs)[V]) {
    const raw16 zero{0u, 0u, 0u, 0u};
    load_row<V>(xs, row_in<T>(a.x, p.row, a.x_rs), p.c0, p.stride, p.nvec, s.hint, pol, zero);
    if constexpr (KIND == 1)
      load_row<V>(rs, row_in<T>(a.res, p.row, a.res_rs), p.c0, p.stride, p.nvec, s.hint, pol, zero);
  }
  // the weight (and bias) vectors of this thread's columns
  static __device__ __forceinline__ void load_w(const NormArgs& a, const Shape& s, const Place& p, raw16 (&wv)[V],
                                                raw16 (&bv)[V]) {
    const raw16 zero{0u, 0u, 0u, 0u};
    const raw16* w = static_cast<const raw16*>(a.w);
    const raw16* b = static_cast<const raw16*>(a.b);
    const bool bias = KIND == 2 && b != nullptr;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = p.c0 + j * p.stride;
      wv[j] = c < s.nvec ? ld16_ro(w + c) : zero;
      bv[j] = bias && c < s.nvec ? ld16_ro(b + c) : zero;
    }
  }
  // sh0, sh1: the shared slots of the reductions (see group_all)
  static __device__ __forceinline__ void process(const NormArgs& a, const Shape& s, const Place& p, float* sh0,
                                                 float* sh1, raw16 (&xs)[V], const raw16 (&rs)[V],
                                                 const raw16 (&wv)[V], const raw16 (&bv)[V]) {
    const bool cs = s.hint & 4;
    const raw16* w = static_cast<const raw16*>(a.w);
    const raw16* b = static_cast<const raw16*>(a.b);
    const bool bias = KIND == 2 && b != nullptr;
    if constexpr (KIND == 1) {  // the new residual, rounded to T: the normalization sees this value
      raw16* ro = row_out<T>(a.res_out, p.row, a.res_out_rs);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int c = p.c0 + j * p.stride;
        if (c < p.nvec) {
          float xf[N], rf[N];
          unpack<T>(xs[j], xf);
          unpack<T>(rs[j], rf);
#pragma unroll
          for (int n = 0; n < N; ++n) xf[n] += rf[n];
          xs[j] = pack_out<T>(xf);
          st_out(ro + c, xs[j], cs);
        }
      }
    }
    const float invH = s.invH;
    float mean = 0.f, inv;
    if constexpr (KIND == 2) {  // the mean, then the squared deviations from it (from registers)
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int j = 0; j < V; ++j) {  // vectors past the row are zeros
        float f[N];
        unpack<T>(xs[j], f);
#pragma unroll
        for (int n = 0; n < N; n += 2) s0 += f[n], s1 += f[n + 1];
      }
      mean = group_all(s0 + s1, sh0, s.wsh, p.first, Add{}) * invH;
      float q0 = 0.f, q1 = 0.f;
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (p.c0 + j * p.stride < p.nvec) {
          float f[N];
          unpack<T>(xs[j], f);
#pragma unroll
          for (int n = 0; n < N; n += 2) {
            const float d0 = f[n] - mean, d1 = f[n + 1] - mean;
            q0 = fmaf(d0, d0, q0);
            q1 = fmaf(d1, d1, q1);
          }
        }
      inv = rsqrtf(group_all(q0 + q1, sh1, s.wsh, p.first, Add{}) * invH + float(a.eps));
    } else {
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float f[N];
        unpack<T>(xs[j], f);
#pragma unroll
        for (int n = 0; n < N; n += 2) s0 = fmaf(f[n], f[n], s0), s1 = fmaf(f[n + 1], f[n + 1], s1);
      }
      inv = rsqrtf(group_all(s0 + s1, sh0, s.wsh, p.first, Add{}) * invH + float(a.eps));
    }
    raw16* out = row_out<T>(a.out, p.row, a.out_rs);
    const float nmi = -mean * inv, wadd = a.gemma ? 1.f : 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = p.c0 + j * p.stride;
      if (c < p.nvec) {
        float f[N], wf[N];
        unpack<T>(xs[j], f);
        unpack<T>(PREW ? wv[j] : ld16_ro(w + c), wf);
        if (bias) {
          float bf[N];
          unpack<T>(PREW ? bv[j] : ld16_ro(b + c), bf);
#pragma unroll
          for (int n = 0; n < N; ++n) f[n] = fmaf(fmaf(f[n], inv, nmi), wf[n], bf[n]);
        } else if constexpr (KIND == 2) {
#pragma unroll
          for (int n = 0; n < N; ++n) f[n] = fmaf(f[n], inv, nmi) * wf[n];
        } else {
#pragma unroll
          for (int n = 0; n < N; ++n) f[n] = (f[n] * inv) * (wf[n] + wadd);
        }
        st_out(out + c, pack_out<T>(f), cs);
      }
    }
  }
};

template <class T, int V, int KIND, bool PERS>
__global__ void __launch_bounds__(PERS ? kMaxThreads : kBlockMax<V>, PERS ? 1 : kMinBlocks<V>)
    k_norm_warp(const NormArgs a, const Shape s) {
  using R = NormRow<T, V, KIND, PERS>;
  __shared__ float sh[2][kMaxWarps];
  const uint64_t pol = (s.hint & 2) ? evict_first_policy() : 0;
  int64_t g = blockIdx.x;
  Place p = place(s, g);
  raw16 xs[V], rs[V], wv[V], bv[V];
  R::load(a, s, p, pol, xs, rs);
  if constexpr (R::PREW) R::load_w(a, s, p, wv, bv);
  if constexpr (!PERS) {
    R::process(a, s, p, sh[0], sh[1], xs, rs, wv, bv);
  } else {
    const int rpc = rows_per_block(s);
    const int64_t groups = (s.rows + rpc - 1) / rpc;
    for (int it = 0;; ++it) {  // block-uniform trip count
      const int64_t gn = g + gridDim.x;
      const Place pn = place(s, gn);
      raw16 xn[V], rn[V];
      if (gn < groups) R::load(a, s, pn, pol, xn, rn);
      // one reduction: alternate the slots between groups (layer_norm's two
      // reductions are ordered by their own barriers; see group_all)
      if constexpr (KIND == 2) R::process(a, s, p, sh[0], sh[1], xs, rs, wv, bv);
      else R::process(a, s, p, sh[it & 1], sh[1], xs, rs, wv, bv);
      if (gn >= groups) break;
      g = gn;
      p = pn;
#pragma unroll
      for (int j = 0; j < V; ++j) xs[j] = xn[j], rs[j] = rn[j];
    }
  }
}

// ---- softmax / log_softmax: the row max, then the sum of exp(x - max) ----
template <class T>
__device__ __forceinline__ raw16 neg_inf_vec() {
  if constexpr (std::is_same_v<T, float>) return raw16{0xff800000u, 0xff800000u, 0xff800000u, 0xff800000u};
  else if constexpr (std::is_same_v<T, bf16>) return raw16{0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u};
  else return raw16{0xfc00fc00u, 0xfc00fc00u, 0xfc00fc00u, 0xfc00fc00u};
}

template <class T, int V, bool LOG>
struct SoftmaxRow {
  static constexpr int N = kVecN<T>;
  static constexpr bool KEEP = !LOG && V * N <= 32;  // keep the exponentials (else compute them again)

  static __device__ __forceinline__ void load(const T* in, int64_t irs, const Shape& s, const Place& p, uint64_t pol,
                                              raw16 (&xs)[V]) {
    load_row<V>(xs, row_in<T>(in, p.row, irs), p.c0, p.stride, p.nvec, s.hint, pol, neg_inf_vec<T>());
  }
  static __device__ __forceinline__ void process(T* out, int64_t ors, const Shape& s, const Place& p, float* sh0,
                                                 float* sh1, const raw16 (&xs)[V]) {
    const bool cs = s.hint & 4;
    float m0 = -INFINITY, m1 = -INFINITY;  // vectors past the row are -inf
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float f[N];
      unpack<T>(xs[j], f);
#pragma unroll
      for (int n = 0; n < N; n += 2) m0 = fmaxf(m0, f[n]), m1 = fmaxf(m1, f[n + 1]);
    }
    // NaN is skipped here and reaches the sum below; a row max of +inf or -inf makes
    // every exp(x - M) NaN or gives NaN through inf - inf: NaN rows, as on the CPU.
    const float M = group_all(fmaxf(m0, m1), sh0, s.wsh, p.first, Max{});
    float e[KEEP ? V : 1][N];
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float f[N];
      unpack<T>(xs[j], f);
#pragma unroll
      for (int n = 0; n < N; n += 2) {
        const float e0 = exp_t<T>(f[n] - M), e1 = exp_t<T>(f[n + 1] - M);
        s0 += e0;
        s1 += e1;
        if constexpr (KEEP) e[j][n] = e0, e[j][n + 1] = e1;
      }
    }
    const float S = group_all(s0 + s1, sh1, s.wsh, p.first, Add{});
    raw16* y = row_out<T>(out, p.row, ors);
    if constexpr (LOG) {
      const float ls = ::logf(S);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int c = p.c0 + j * p.stride;
        if (c < p.nvec) {
          float f[N];
          unpack<T>(xs[j], f);
#pragma unroll
          for (int n = 0; n < N; ++n) f[n] = (f[n] - M) - ls;
          st_out(y + c, pack_out<T>(f), cs);
        }
      }
    } else {
      const float r = 1.f / S;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int c = p.c0 + j * p.stride;
        if (c < p.nvec) {
          float f[N];
          if constexpr (KEEP) {
#pragma unroll
            for (int n = 0; n < N; ++n) f[n] = e[j][n] * r;
          } else {
            unpack<T>(xs[j], f);
#pragma unroll
            for (int n = 0; n < N; ++n) f[n] = exp_t<T>(f[n] - M) * r;
          }
          st_out(y + c, pack_out<T>(f), cs);
        }
      }
    }
  }
};

template <class T, int V, bool LOG, bool PERS>
__global__ void __launch_bounds__(PERS ? kMaxThreads : kBlockMax<V>, PERS ? 1 : kMinBlocks<V>)
    k_softmax_warp(const T* in, T* out, int64_t irs, int64_t ors, const Shape s) {
  using R = SoftmaxRow<T, V, LOG>;
  __shared__ float sh[2][kMaxWarps];
  const uint64_t pol = (s.hint & 2) ? evict_first_policy() : 0;
  int64_t g = blockIdx.x;
  Place p = place(s, g);
  raw16 xs[V];
  R::load(in, irs, s, p, pol, xs);
  if constexpr (!PERS) {
    R::process(out, ors, s, p, sh[0], sh[1], xs);
  } else {
    const int rpc = rows_per_block(s);
    const int64_t groups = (s.rows + rpc - 1) / rpc;
    for (;;) {  // block-uniform trip count; the two reductions order the slots (see group_all)
      const int64_t gn = g + gridDim.x;
      const Place pn = place(s, gn);
      raw16 xn[V];
      if (gn < groups) R::load(in, irs, s, pn, pol, xn);
      R::process(out, ors, s, p, sh[0], sh[1], xs);
      if (gn >= groups) break;
      g = gn;
      p = pn;
#pragma unroll
      for (int j = 0; j < V; ++j) xs[j] = xn[j];
    }
  }
}

// ---- launch shape ----
struct Pick {
  int v = 0, wpr = 1, rpc = 1;
  int wsh() const { return wpr == 1 ? 0 : wpr == 2 ? 1 : wpr == 4 ? 2 : wpr == 8 ? 3 : 4; }
};

// Vectors per lane (1, 2, 4, 8 or 16; 0: not taken), warps per row, rows per block
// for a row of nvec vectors. Default: the fewest warps per row (a power of two, at
// most 8) that leave at most rows.v (default 4) vectors per lane; 256-thread blocks.
Pick pick(int64_t nvec) {
  Pick k;
  if (nvec < 32 || nvec > int64_t(16) * 32 * kMaxWarps) return k;
  const int target = std::max(1, std::min(16, tune("rows.v", 4)));
  int wpr = 1;
  while (wpr < 8 && nvec > int64_t(32) * wpr * target) wpr *= 2;
  const int want = std::max(1, std::min(kMaxWarps, tune("rows.wpr", wpr)));
  for (wpr = 1; wpr * 2 <= want;) wpr *= 2;  // a power of two
  const int64_t need = (nvec + 32 * wpr - 1) / (32 * wpr);
  k.v = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : need <= 8 ? 8 : need <= 16 ? 16 : 0;
  k.wpr = wpr;
  const int maxw = k.v == 16 ? 8 : kMaxWarps;  // kBlockMax
  // blocks of 4 warps or one row (H200, checkpoint A: bf16 softmax 95% of the copy at 4 warps per
  // block against 93% at 8, layer_norm 82% against 80%)
  k.rpc = std::max(1, std::min(std::max(1, maxw / wpr), tune("rows.rpc", std::max(1, 4 / wpr))));
  if (k.wpr * k.rpc > maxw) k.v = 0;
  return k;
}

template <class F>
void with_v(int v, F f) {
  using std::integral_constant;
  switch (v) {
    case 1: f(integral_constant<int, 1>{}); break;
    case 2: f(integral_constant<int, 2>{}); break;
    case 4: f(integral_constant<int, 4>{}); break;
    case 8: f(integral_constant<int, 8>{}); break;
    default: f(integral_constant<int, 16>{}); break;
  }
}

// The persistent forms are built for rows of 2 or 4 vectors per lane.
template <class T, int V>
inline constexpr bool kPers = V == 2 || V == 4;

// Blocks of a persistent grid: at most one wave, and as many groups for every
// block as the wave allows (GPUKIT_TUNE rows.grid forces the wave, for the tests).
template <auto K>
unsigned pers_grid(int64_t groups, int threads) {
  int64_t res = resident_blocks<K>(threads);
  if (const int forced = tune("rows.grid", 0); forced > 0) res = forced;
  const int64_t per = (groups + res - 1) / res;
  return unsigned((groups + per - 1) / per);
}

// The default form of the row ops of 32 vectors or more (GPUKIT_TUNE rows.on=0:
// the older register forms of norm.cu / reduce.cu and the staged form).
bool wanted(DType) { return tune("rows.on", 1) != 0; }

// Cache hints for large operands (>= 8 MiB moved): loads L1::no_allocate + L2
// evict_first, stores .cs (H200, checkpoint A, 4096 x 4096: bf16 layer_norm 87% of
// the copy against 80% without, softmax 96% / 93%, f32 layer_norm 97% / 93%,
// softmax 99% / 97%). Small operands (decode steps) keep the default policy, so
// that a residual or a normalized row stays in L2 for the next kernel. Hints
// only: the bits do not depend on them.
int hints(int64_t bytes) { return tune("rows.hint", bytes >= (int64_t(8) << 20) ? 7 : 0); }

}  // namespace

bool rows_warp_norm(const NormArgs& a, cudaStream_t st) {
  if (!wanted(a.dtype)) return false;
  bool done = false;
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int N = kVecN<T>;
    const bool dense = a.H % N == 0 && a.x_rs % N == 0 && a.out_rs % N == 0 && aligned16(a.x) && aligned16(a.w) &&
                       aligned16(a.out) && (!a.b || aligned16(a.b)) &&
                       (!a.res || (a.res_rs % N == 0 && a.res_out_rs % N == 0 && aligned16(a.res) &&
                                   aligned16(a.res_out)));
    if (!dense) return;
    const Pick k = pick(a.H / N);
    if (!k.v) return;
    const int64_t blocks = (a.rows + k.rpc - 1) / k.rpc;
    if (blocks > int64_t(INT32_MAX)) return;
    const int64_t bytes = a.rows * a.H * int64_t(sizeof(T)) * (a.res ? 4 : 2);
    const Shape s{a.rows, int(a.H / N), k.wsh(), hints(bytes), 1.f / float(a.H)};
    const dim3 grid{unsigned(blocks), 1u, 1u}, block{unsigned(32 * k.wpr * k.rpc), 1u, 1u};
    // persistent for 16-bit layer_norm (checkpoint A: bf16 89% of the copy against 80%;
    // the weight and bias vectors are loaded once per thread, not once per row)
    const bool pers = tune("rows.pers", a.layer && sizeof(T) == 2) != 0;
    with_v(k.v, [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      auto go = [&](auto kind) {
        constexpr int KIND = decltype(kind)::value;
        if constexpr (kPers<T, V>) {
          if (pers) {
            constexpr auto K = k_norm_warp<T, V, KIND, true>;
            K<<<pers_grid<K>(blocks, int(block.x)), block, 0, st>>>(a, s);
            return;
          }
        }
        k_norm_warp<T, V, KIND, false><<<grid, block, 0, st>>>(a, s);
      };
      using std::integral_constant;
      if (a.layer) go(integral_constant<int, 2>{});
      else if (a.res) go(integral_constant<int, 1>{});
      else go(integral_constant<int, 0>{});
    });
    GK_LAUNCH_CHECK(a.layer ? "layer_norm_warp" : "rms_norm_warp");
    done = true;
  });
  return done;
}

bool rows_warp_softmax(const RowArgs& a, bool log, cudaStream_t st) {
  if (a.in_dtype != a.out_dtype || !wanted(a.in_dtype)) return false;
  if (a.in_dtype != DType::f32 && a.in_dtype != DType::bf16 && a.in_dtype != DType::f16) return false;
  bool done = false;
  dispatch_float(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int N = kVecN<T>;
    if (a.cols % N || a.in_row_stride % N || a.out_row_stride % N || !aligned16(a.in) || !aligned16(a.out)) return;
    const Pick k = pick(a.cols / N);
    if (!k.v) return;
    const int64_t blocks = (a.rows + k.rpc - 1) / k.rpc;
    if (blocks > int64_t(INT32_MAX)) return;
    const Shape s{a.rows, int(a.cols / N), k.wsh(), hints(a.rows * a.cols * int64_t(sizeof(T)) * 2), 1.f};
    const dim3 grid{unsigned(blocks), 1u, 1u}, block{unsigned(32 * k.wpr * k.rpc), 1u, 1u};
    const T* in = static_cast<const T*>(a.in);
    T* out = static_cast<T*>(a.out);
    const bool pers = tune("rows.pers", 0) != 0;
    const auto irs = a.in_row_stride, ors = a.out_row_stride;
    with_v(k.v, [&](auto vc) {
      constexpr int V = decltype(vc)::value;
      auto go = [&](auto lg) {
        constexpr bool L = decltype(lg)::value;
        if constexpr (kPers<T, V>) {
          if (pers) {
            constexpr auto K = k_softmax_warp<T, V, L, true>;
            K<<<pers_grid<K>(blocks, int(block.x)), block, 0, st>>>(in, out, irs, ors, s);
            return;
          }
        }
        k_softmax_warp<T, V, L, false><<<grid, block, 0, st>>>(in, out, irs, ors, s);
      };
      if (log) go(std::true_type{});
      else go(std::false_type{});
    });
    GK_LAUNCH_CHECK("softmax_warp");
    done = true;
  });
  return done;
}

}  // namespace gk::cuda
