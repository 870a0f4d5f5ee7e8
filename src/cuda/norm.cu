// CUDA rms_norm (optionally fused with the residual add, Gemma-style) and
// layer_norm. A group of threads per row (one warp for short rows, several rows
// per block); the row stays in registers as raw 16-byte vectors (all loads of a
// thread issued before any arithmetic) between the reduction and the write; the
// sums use a fixed warp-shuffle + shared-memory order (deterministic).
// Rows that are too long, unaligned or not a multiple of the vector width take a
// scalar path that re-reads the row (from L1/L2).
// Dense, aligned rows of 32 or more 16-byte vectors take the warp-row form of
// src/cuda/rows_warp.cu by default (session 4); the forms here serve the other
// rows, and all rows with GPUKIT_TUNE rows.on=0. With norm.pipe=1 (and rows.on=0),
// rows of 129 to 1024 vectors take the staged form of src/cuda/rows_pipe.cu. The
// choice never depends on the number of rows.
#include <algorithm>

#include "cuda/common/rows.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/rows_pipe.h"
#include "cuda/rows_warp.h"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("rms_norm", "rms_norm_residual", "layer_norm");

namespace {

// Sum over the blockDim.x threads of one row; blockDim.y rows share the block
// (rows * warps per row <= 32). Every thread of the row gets the same value, in a
// fixed order. All threads of the block must call it (no early return).
__device__ __forceinline__ float group_sum(float v, float* sh) {
  v = warp_sum(v);
  if (blockDim.x == 32) return v;
  const int nw = blockDim.x >> 5;
  float* mine = sh + threadIdx.y * nw;
  __syncthreads();  // sh may still be read by a previous group_sum
  if ((threadIdx.x & 31) == 0) mine[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < nw; ++i) t += mine[i];
  return t;
}

// Row-in-registers form: thread t of a row holds the 16-byte vectors t, t + tpr,
// ... (VPT of them, raw until all loads are issued). MAXT: the largest block
// this instantiation is launched with, which sets the register budget.
// PERSIST: a grid of about one wave loops over the row groups and loads the
// next group's rows while it reduces and writes the current one.
// PREW: the weight (and bias) vectors are loaded with the row, before the
// reduction, instead of after it.
template <class T, int VPT, int MAXT, bool PERSIST, bool PREW>
__global__ void __launch_bounds__(MAXT) k_norm_vec(NormArgs a) {
  constexpr int N = kVecN<T>;
  __shared__ float sh[32];
  const int tpr = blockDim.x, t = threadIdx.x;
  const int64_t groups = (a.rows + blockDim.y - 1) / blockDim.y;
  const int hvec = int(a.H / N);
  auto load = [&](int64_t g, raw16 (&xs)[VPT], raw16 (&rs)[VPT]) {
    const int64_t row = g * blockDim.y + threadIdx.y;
    const int nvec = row < a.rows ? hvec : 0;
    const raw16* x = reinterpret_cast<const raw16*>(static_cast<const T*>(a.x) + row * a.x_rs);
    const raw16* r = reinterpret_cast<const raw16*>(static_cast<const T*>(a.res) + row * a.res_rs);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int i = t + k * tpr;
      if (i < nvec) {
        xs[k] = ld16(x + i);
        if (a.res) rs[k] = ld16(r + i);
      }
    }
  };
  auto process = [&](int64_t g, raw16 (&xs)[VPT], const raw16 (&rs)[VPT]) {
    const int64_t row = g * blockDim.y + threadIdx.y;
    const int nvec = row < a.rows ? hvec : 0;  // a dead row (last group) only joins the barriers
    const raw16* w = static_cast<const raw16*>(a.w);
    const raw16* b = static_cast<const raw16*>(a.b);
    raw16 wv[VPT], bv[VPT];
    if constexpr (PREW) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int i = t + k * tpr;
        if (i < nvec) {
          wv[k] = ld16_ro(w + i);
          if (b) bv[k] = ld16_ro(b + i);
        }
      }
    }
    if (a.res) {
      raw16* ro = reinterpret_cast<raw16*>(static_cast<T*>(a.res_out) + row * a.res_out_rs);
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int i = t + k * tpr;
        if (i < nvec) {
          float xf[N], rf[N];
          unpack<T>(xs[k], xf);
          unpack<T>(rs[k], rf);
#pragma unroll
          for (int j = 0; j < N; ++j) xf[j] += rf[j];
          xs[k] = pack<T>(xf);  // the new residual, rounded to T: the normalization sees this value
          st16(ro + i, xs[k]);
        }
      }
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (t + k * tpr < nvec) {
        float xf[N];
        unpack<T>(xs[k], xf);
#pragma unroll
        for (int j = 0; j < N; ++j) s += a.layer ? xf[j] : xf[j] * xf[j];
      }
    s = group_sum(s, sh);
    const float invH = 1.f / float(a.H);
    float mean = 0.f, inv;
    if (a.layer) {  // two reductions (mean, then squared deviations from registers)
      mean = s * invH;
      float q = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (t + k * tpr < nvec) {
          float xf[N];
          unpack<T>(xs[k], xf);
#pragma unroll
          for (int j = 0; j < N; ++j) q += (xf[j] - mean) * (xf[j] - mean);
        }
      q = group_sum(q, sh);
      inv = rsqrtf(q * invH + float(a.eps));
    } else {
      inv = rsqrtf(s * invH + float(a.eps));
    }
    raw16* out = reinterpret_cast<raw16*>(static_cast<T*>(a.out) + row * a.out_rs);
    const float wadd = a.gemma ? 1.f : 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int i = t + k * tpr;
      if (i < nvec) {
        float xf[N], wf[N];
        unpack<T>(xs[k], xf);
        unpack<T>(PREW ? wv[k] : ld16_ro(w + i), wf);
        if (b) {
          float bf[N];
          unpack<T>(PREW ? bv[k] : ld16_ro(b + i), bf);
#pragma unroll
          for (int j = 0; j < N; ++j) xf[j] = (xf[j] - mean) * inv * wf[j] + bf[j];
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) xf[j] = (xf[j] - mean) * inv * (wf[j] + wadd);
        }
        st16(out + i, pack<T>(xf));
      }
    }
  };
  raw16 xs[VPT], rs[VPT];
  int64_t g = blockIdx.x;
  load(g, xs, rs);
  if constexpr (!PERSIST) {
    process(g, xs, rs);
  } else {
    for (;;) {
      const int64_t gn = g + gridDim.x;
      raw16 xn[VPT], rn[VPT];
      if (gn < groups) load(gn, xn, rn);  // block-uniform
      process(g, xs, rs);
      if (gn >= groups) break;
      g = gn;
#pragma unroll
      for (int k = 0; k < VPT; ++k) xs[k] = xn[k], rs[k] = rn[k];
    }
  }
}

// Any H and alignment: scalar accesses, the row re-read for each pass.
template <class T>
__global__ void __launch_bounds__(1024) k_norm_scalar(NormArgs a) {
  __shared__ float sh[32];
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= a.rows) return;
  const int tpr = blockDim.x, t = threadIdx.x;
  const T* x = static_cast<const T*>(a.x) + row * a.x_rs;
  if (a.res) {  // write the new residual, then normalize it (each thread re-reads its own writes)
    const T* r = static_cast<const T*>(a.res) + row * a.res_rs;
    T* ro = static_cast<T*>(a.res_out) + row * a.res_out_rs;
    for (int64_t i = t; i < a.H; i += tpr) ro[i] = convert<T>(float(x[i]) + float(r[i]));
    x = ro;
  }
  float s = 0.f;
  for (int64_t i = t; i < a.H; i += tpr) s += a.layer ? float(x[i]) : float(x[i]) * float(x[i]);
  s = row_sum(s, sh);
  const float invH = 1.f / float(a.H);
  float mean = 0.f, inv;
  if (a.layer) {
    mean = s * invH;
    float q = 0.f;
    for (int64_t i = t; i < a.H; i += tpr) {
      float d = float(x[i]) - mean;
      q += d * d;
    }
    q = row_sum(q, sh);
    inv = rsqrtf(q * invH + float(a.eps));
  } else {
    inv = rsqrtf(s * invH + float(a.eps));
  }
  const T* w = static_cast<const T*>(a.w);
  const T* b = static_cast<const T*>(a.b);
  T* out = static_cast<T*>(a.out) + row * a.out_rs;
  const float wadd = a.gemma ? 1.f : 0.f;
  for (int64_t i = t; i < a.H; i += tpr) {
    float y = (float(x[i]) - mean) * inv * (float(w[i]) + wadd);
    if (b) y += float(b[i]);
    out[i] = convert<T>(y);
  }
}

int round32(int64_t n) { return int(std::min<int64_t>(1024, std::max<int64_t>(32, (n + 31) / 32 * 32))); }

// Launch shape of the vector form: threads per row (a multiple of 32) and
// vectors per thread (1, 2, 4, 8 or 16). Default: about 4 vectors per thread
// (2 for 16-bit rms_norm), overridable with GPUKIT_TUNE=norm.tpr=..,norm.rows=..,
// norm.prew=..,norm.persist=.. for benchmarking (bench/fused.py sweeps them; on
// the H200 the persistent form was slower everywhere).
template <class T>
void launch(const NormArgs& a, cudaStream_t st) {
  constexpr int N = kVecN<T>;
  bool vec = a.H % N == 0 && a.x_rs % N == 0 && a.out_rs % N == 0 && aligned16(a.x) && aligned16(a.w) &&
             aligned16(a.out) && (!a.b || aligned16(a.b)) &&
             (!a.res || (a.res_rs % N == 0 && a.res_out_rs % N == 0 && aligned16(a.res) && aligned16(a.res_out)));
  if (vec && rows_warp_norm(a, st)) return;  // the lean warp-row form (src/cuda/rows_warp.cu)
  if (vec && pipe_norm_ok(a)) {  // rows staged in shared memory (src/cuda/rows_pipe.cu)
    pipe_norm(a, st);
    return;
  }
  const int64_t nvec = a.H / N;
  int tpr = 0, vpt = 0;
  if (vec && nvec <= 16 * 1024) {
    tpr = nvec <= 32 * 4 ? 32 : round32((nvec + 3) / 4);
    // 16-bit rms_norm: 2 vectors per thread in blocks of up to 256 threads, weights
    // loaded with the row (H200, bf16 4096x4096 with residual: 3.65 TB/s against 3.52)
    if (sizeof(T) == 2 && !a.layer && nvec > 32 * 4 && (nvec + 1) / 2 <= 256) tpr = round32((nvec + 1) / 2);
    tpr = tune("norm.tpr", tpr);
    tpr = std::max(32, std::min(1024, tpr / 32 * 32));
    const int64_t need = (nvec + tpr - 1) / tpr;
    vpt = need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : need <= 8 ? 8 : need <= 16 ? 16 : 0;
    if (vpt >= 8 && tpr > 256) vpt = 0;  // the register-heavy forms run at most 256 threads per block
  }
  if (!vpt) tpr = a.H <= 1024 ? 32 : 256;
  const int maxt = vpt >= 8 ? 256 : 1024;
  int rpb = std::max(1, 128 / tpr);  // rows per block: blocks of at least 4 warps
  if (vpt) rpb = std::max(1, std::min({tune("norm.rows", rpb), maxt / tpr, 32 / (tpr / 32)}));
  else rpb = tpr == 32 ? 4 : 1;  // the scalar form: rows of a block share nothing but warps
  dim3 block{unsigned(tpr), unsigned(rpb), 1u};
  int64_t blocks = (a.rows + rpb - 1) / rpb;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("x: too many rows for one launch");
  dim3 grid{unsigned(blocks), 1u, 1u};
  // persistent: blocks of at most 256 threads (two row buffers need the registers)
  const bool persist = vpt && tpr * rpb <= 256 && tune("norm.persist", 0);
  const bool prew = vpt && vpt <= 4 && tpr * rpb <= 256 && tune("norm.prew", sizeof(T) == 2 && !a.layer);
  // persistent grid: one wave (GPUKIT_TUNE norm.waves / norm.grid for the sweep and the tests)
  auto wave = [&](int64_t resident) {
    int64_t g = resident * std::max(1, tune("norm.waves", 1));
    if (int forced = tune("norm.grid", 0); forced > 0) g = forced;
    return dim3{unsigned(std::min<int64_t>(blocks, g)), 1u, 1u};
  };
  const int threads = tpr * rpb;
  auto go = [&](auto vc, auto mc) {
    constexpr int V = decltype(vc)::value, MT = decltype(mc)::value;
    if constexpr (V <= 4) {
      if (prew && persist) {
        constexpr auto k = k_norm_vec<T, V, 256, true, true>;
        return k<<<wave(resident_blocks<k>(threads)), block, 0, st>>>(a);
      }
      if (prew) return k_norm_vec<T, V, 256, false, true><<<grid, block, 0, st>>>(a);
    }
    if (persist) {
      constexpr auto k = k_norm_vec<T, V, 256, true, false>;
      k<<<wave(resident_blocks<k>(threads)), block, 0, st>>>(a);
    } else {
      k_norm_vec<T, V, MT, false, false><<<grid, block, 0, st>>>(a);
    }
  };
  using std::integral_constant;
  switch (vpt) {
    case 1: go(integral_constant<int, 1>{}, integral_constant<int, 1024>{}); break;
    case 2: go(integral_constant<int, 2>{}, integral_constant<int, 1024>{}); break;
    case 4: go(integral_constant<int, 4>{}, integral_constant<int, 1024>{}); break;
    case 8: go(integral_constant<int, 8>{}, integral_constant<int, 256>{}); break;
    case 16: go(integral_constant<int, 16>{}, integral_constant<int, 256>{}); break;
    default: k_norm_scalar<T><<<grid, block, 0, st>>>(a); break;
  }
  GK_LAUNCH_CHECK(a.layer ? "layer_norm" : "rms_norm");
}

}  // namespace

void norm(const NormArgs& a, void* stream) {
  if (a.rows <= 0 || a.H <= 0) return;
  dispatch_float(a.dtype, [&](auto t) { launch<decltype(t)>(a, static_cast<cudaStream_t>(stream)); });
}

}  // namespace gk::cuda
