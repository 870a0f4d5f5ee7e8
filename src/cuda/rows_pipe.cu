// Session 4: the per-element code is the lean one of rows_warp.cu (pack_out: one
// NaN test per vector; softmax as max, then sum of exp(x - max), in warp
// reductions), and 15 consumer warps (pipe.w=15, up to 128 registers). Checkpoint
// A of session 4 (H200, 4096x4096, % of a same-bytes copy): 15 warps did not help
// (bf16 layer_norm 78%, softmax 52%; f32 softmax 75%, below the 88% of session 3:
// f32 rows of 32 vectors per lane compute their expf twice), while the warp-row
// form of rows_warp.cu reached 87-99%: that is the default now, and this form is
// taken only with GPUKIT_TUNE rows.on=0 and norm.pipe=1 / softmax.pipe=1 (the
// latter the default for f32 rows under rows.on=0).
// Row-wise fused kernels with the rows staged in shared memory: rms_norm (with
// the residual add), layer_norm, softmax and log_softmax on rows of 129 to 1024
// 16-byte vectors (bf16/f16 H <= 8192, f32 H <= 4096; softmax of 16-bit rows
// H <= 4096).
//
// Why: a row held in registers (src/cuda/norm.cu, reduce.cu) keeps only as many
// rows in flight per SM as the register file allows, and a block's loads stop
// while it reduces and writes; short kernels (64 MiB, ~17 us on an H200) then
// stay well under the copy bandwidth. Here a persistent grid (one CTA per SM)
// keeps up to 200 KB of rows per SM in flight, independent of the arithmetic:
//  - one producer thread issues one bulk async copy (cp.async.bulk, TMA) per row
//    and input into a ring of `stages` shared-memory slots, each completing on
//    the slot's "full" mbarrier;
//  - nw consumer warps take the CTA's rows in turn (row i of the CTA: warp
//    i % nw, slot i % stages; nw = min(7, stages), or 11 with pipe.w=11); a
//    warp copies its row's 16-byte vectors from the slot into registers (lane l:
//    vectors l, l + 32, ...), frees the slot (its "empty" mbarrier, the producer
//    refills it at once), reduces with warp shuffles only (a fixed butterfly:
//    deterministic, no block barrier) and writes the outputs with 16-byte stores.
//  - stages is a multiple of nw, so that the previous use of a warp's slot was
//    the same warp's row: a warp never waits for a phase of a "full" barrier
//    whose previous phase is still pending (a parity wait cannot tell them apart;
//    that was the H200 launch failure of checkpoint A, 2026-11-30).
// CTA b takes the rows b, b + grid, b + 2 grid, ...; every row is computed the
// same way whatever the grid, so the bits do not depend on the batch.
// Measured on the H200 (checkpoint B of 2026-11-30, bench/fused.py, 4096x4096,
// TB/s against a same-bytes copy of 3.84 (f32) / 3.51 (bf16) TB/s):
//   softmax f32:     staged 3.30 (7 warps), 3.37 (11 warps)   register form 3.19
//   layer_norm f32:  staged 3.35 / 3.34                       register form 3.59
//   layer_norm bf16: staged 2.19 / 2.67 (2.81 with pipe.ef)   register form 2.75
//   softmax bf16:    staged 1.57 / 2.06 (2.19 at pipe.kb=128) register form 2.37
// The consumer warps, not the memory, set the pace of 16-bit rows (7 -> 11 warps:
// +22% / +31%), and more warps do not fit the registers. So the staged form is
// the default for f32 softmax / log_softmax only (with 11 consumer warps); the
// others take it with GPUKIT_TUNE norm.pipe=1 / softmax.pipe=1.
// GPUKIT_TUNE: pipe.kb (shared memory per SM for the slots, KB, default 200),
// pipe.cta (CTAs per SM, default 1), pipe.grid (force the grid, for the tests),
// pipe.ef (1: the row loads carry an L2 evict-first hint);
// pipe.w (7, 11 or 15 consumer warps); norm.pipe / softmax.pipe (1: the staged form
// where it applies; default 0, 1 for f32 softmax).
#include "cuda/rows_pipe.h"

#include <algorithm>

#include "core/cuda_util.h"
#include "cuda/common/rows.cuh"
#include "cuda/common/rows_vec.cuh"
#include "cuda/common/softmax_rows.cuh"
#include "cuda/common/tma.cuh"
#include "cuda/common/vec.cuh"

namespace gk::cuda {

namespace {

// W consumer warps reduce and write rows, one producer warp loads them: 7 + 1
// warps (2 per SM sub-partition, so up to 255 registers), or 11 + 1 (pipe.w=11;
// up to 168 registers).
constexpr int kMaxStages = 32;
constexpr int kBarBytes = 1024;  // full[kMaxStages], empty[kMaxStages]; the slots follow
constexpr int kMaxSmem = 227 * 1024;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned),
// completing as transaction bytes on the mbarrier at `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// The same with an L2 eviction-priority hint (a policy from createpolicy).
__device__ __forceinline__ void bulk_load_hint(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                               uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// Op: int nin (inputs staged per row, 1 or 2); const void* src(k, row);
// int npar (row-long parameter vectors: the norms' weight and bias, copied to
// shared memory once per CTA, so that they do not compete with the slots for L1);
// const void* par(k); process<CPL>(row, slot, params, lane, release): release() is
// called by the whole warp once the slot is no longer read.
template <class Op, int CPL, int W>
__global__ void __launch_bounds__((W + 1) * 32, 1) k_pipe(const Op op, int rows, int stages, uint32_t row_bytes,
                                                            int evict_first) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = smem_addr(smem);  // full[s] at bars + 8 s, empty[s] at bars + 8 (kMaxStages + s)
  raw16* params = reinterpret_cast<raw16*>(smem + kBarBytes);
  unsigned char* slots = smem + kBarBytes + size_t(op.npar) * row_bytes;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = int(gridDim.x), b = int(blockIdx.x);
  const int nl = rows > b ? int((int64_t(rows) - b + G - 1) / G) : 0;  // rows of this CTA
  const uint32_t slot_bytes = uint32_t(op.nin) * row_bytes;
  const bool producer = warp == W && lane == 0;
  // One row's loads into slot i % stages (the slot is free).
  auto issue = [&](int i) {
    const int s = i % stages;
    const uint32_t full = bars + 8 * s;
    sm90::mbar_expect_tx(full, slot_bytes);
    const int64_t row = b + int64_t(i) * G;
    for (int k = 0; k < op.nin; ++k) {
      const uint32_t dst = smem_addr(slots) + uint32_t(s) * slot_bytes + k * row_bytes;
      if (evict_first) bulk_load_hint(dst, op.src(k, row), row_bytes, full, policy_evict_first());
      else bulk_load(dst, op.src(k, row), row_bytes, full);
    }
  };
  // The producer initializes the barriers and starts the first `stages` rows
  // before anything else, while the other threads stage the parameters.
  if (producer) {
    for (int s = 0; s < stages; ++s) {
      sm90::mbar_init(bars + 8 * s, 1);
      sm90::mbar_init(bars + 8 * (kMaxStages + s), 1);
    }
    sm90::mbar_fence_init();
    for (int i = 0; i < nl && i < stages; ++i) issue(i);
  }
  const int pv = int(row_bytes / 16);
  if (warp < W)  // the consumer warps
    for (int k = 0; k < op.npar; ++k)
      for (int v = threadIdx.x; v < pv; v += W * 32)
        params[k * pv + v] = ld16_ro(static_cast<const raw16*>(op.par(k)) + v);
  __syncthreads();
  if (warp == W) {  // producer: each further row once its slot's previous row is released
    if (producer)
      for (int i = stages; i < nl; ++i) {
        sm90::mbar_wait(bars + 8 * (kMaxStages + i % stages), uint32_t((i / stages) - 1) & 1u);
        issue(i);
      }
    return;
  }
  const int nw = stages < W ? stages : W;  // the host makes stages a multiple of nw
  if (warp >= nw) return;
  for (int i = warp; i < nl; i += nw) {
    const int s = i % stages;
    sm90::mbar_wait(bars + 8 * s, uint32_t(i / stages) & 1u);
    const raw16* slot = reinterpret_cast<const raw16*>(slots + size_t(s) * slot_bytes);
    op.template process<CPL>(b + int64_t(i) * G, slot, params, lane, [&] {
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(bars + 8 * (kMaxStages + s));
    });
  }
#else
  __trap();  // never launched: the host checks the kernel's binary version first
#endif
}

// ---- rms_norm / layer_norm ----
template <class T>
struct NormPipe {
  NormArgs a;
  int nin, npar;  // 1 + residual; 1 + bias
  __device__ const void* src(int k, int64_t row) const {
    return k == 0 ? static_cast<const T*>(a.x) + row * a.x_rs : static_cast<const T*>(a.res) + row * a.res_rs;
  }
  __device__ const void* par(int k) const { return k == 0 ? a.w : a.b; }
  template <int CPL, class Rel>
  __device__ __forceinline__ void process(int64_t row, const raw16* sl, const raw16* prm, int lane,
                                          Rel release) const {
    constexpr int N = kVecN<T>;
    const int nvec = int(a.H / N);
    raw16 xs[CPL];
    if (a.res) {  // the new residual, rounded to T: the normalization sees this value
      raw16* ro = reinterpret_cast<raw16*>(static_cast<T*>(a.res_out) + row * a.res_out_rs);
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const int c = lane + 32 * j;
        if (c < nvec) {
          float xf[N], rf[N];
          unpack<T>(sl[c], xf);
          unpack<T>(sl[nvec + c], rf);
#pragma unroll
          for (int n = 0; n < N; ++n) xf[n] += rf[n];
          xs[j] = pack_out<T>(xf);
          st16(ro + c, xs[j]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < CPL; ++j)
        if (lane + 32 * j < nvec) xs[j] = sl[lane + 32 * j];
    }
    release();
    // statistics (branches outside the element loops)
    const float invH = 1.f / float(a.H);
    float mean = 0.f, inv;
    if (a.layer) {  // the mean, then the squared deviations from it, from registers
      float s = 0.f, q = 0.f;
#pragma unroll
      for (int j = 0; j < CPL; ++j)
        if (lane + 32 * j < nvec) {
          float xf[N];
          unpack<T>(xs[j], xf);
#pragma unroll
          for (int n = 0; n < N; ++n) s += xf[n];
        }
      mean = warp_sum(s) * invH;
#pragma unroll
      for (int j = 0; j < CPL; ++j)
        if (lane + 32 * j < nvec) {
          float xf[N];
          unpack<T>(xs[j], xf);
#pragma unroll
          for (int n = 0; n < N; ++n) q += (xf[n] - mean) * (xf[n] - mean);
        }
      inv = rsqrtf(warp_sum(q) * invH + float(a.eps));
    } else {
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < CPL; ++j)
        if (lane + 32 * j < nvec) {
          float xf[N];
          unpack<T>(xs[j], xf);
#pragma unroll
          for (int n = 0; n < N; ++n) s += xf[n] * xf[n];
        }
      inv = rsqrtf(warp_sum(s) * invH + float(a.eps));
    }
    const raw16* w = prm;  // weight, then bias, in shared memory
    raw16* out = reinterpret_cast<raw16*>(static_cast<T*>(a.out) + row * a.out_rs);
    if (a.b) {  // layer_norm with a bias: two FMAs per element
      const raw16* bb = prm + nvec;
      const float nmi = -mean * inv;
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const int c = lane + 32 * j;
        if (c < nvec) {
          float xf[N], wf[N], bf[N];
          unpack<T>(xs[j], xf);
          unpack<T>(w[c], wf);
          unpack<T>(bb[c], bf);
#pragma unroll
          for (int n = 0; n < N; ++n) xf[n] = fmaf(fmaf(xf[n], inv, nmi), wf[n], bf[n]);
          st16(out + c, pack_out<T>(xf));
        }
      }
      return;
    }
    const float wadd = a.gemma ? 1.f : 0.f;  // mean = 0 for rms_norm
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int c = lane + 32 * j;
      if (c < nvec) {
        float xf[N], wf[N];
        unpack<T>(xs[j], xf);
        unpack<T>(w[c], wf);
#pragma unroll
        for (int n = 0; n < N; ++n) xf[n] = (xf[n] - mean) * inv * (wf[n] + wadd);
        st16(out + c, pack_out<T>(xf));
      }
    }
  }
};

// ---- softmax / log_softmax: the row max (warp max), then the sum of exp(x - max)
// (warp sum), then the outputs, each pass from the slot; a NaN, a +inf or an all
// -inf row gives NaN through the arithmetic itself (inf - inf, exp(NaN)), as on
// the CPU. Non-log rows of at most 64 elements per lane keep the exponentials in
// registers; longer ones compute them again for the output. ----
template <class T, bool LOG>
struct SoftmaxPipe {
  const T* in;
  T* out;
  int64_t irs, ors;
  int nvec;
  int nin = 1, npar = 0;
  __device__ const void* src(int, int64_t row) const { return in + row * irs; }
  __device__ const void* par(int) const { return nullptr; }
  template <int CPL, class Rel>
  __device__ __forceinline__ void process(int64_t row, const raw16* sl, const raw16*, int lane, Rel release) const {
    constexpr int N = kVecN<T>;
    constexpr bool KEEP = !LOG && CPL * N <= 64;
    raw16* y = reinterpret_cast<raw16*>(out + row * ors);
    float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < CPL; ++j)
      if (lane + 32 * j < nvec) {
        float f[N];
        unpack<T>(sl[lane + 32 * j], f);
#pragma unroll
        for (int n = 0; n < N; n += 2) m0 = fmaxf(m0, f[n]), m1 = fmaxf(m1, f[n + 1]);
      }
    float M = fmaxf(m0, m1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float e[KEEP ? CPL : 1][N];
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int j = 0; j < CPL; ++j)
      if (lane + 32 * j < nvec) {
        float f[N];
        unpack<T>(sl[lane + 32 * j], f);
#pragma unroll
        for (int n = 0; n < N; n += 2) {
          const float e0 = exp_t<T>(f[n] - M), e1 = exp_t<T>(f[n + 1] - M);
          s0 += e0;
          s1 += e1;
          if constexpr (KEEP) e[j][n] = e0, e[j][n + 1] = e1;
        }
      }
    if constexpr (KEEP) release();
    const float S = warp_sum(s0 + s1);
    if constexpr (LOG) {
      const float ls = ::logf(S);
#pragma unroll
      for (int j = 0; j < CPL; ++j)
        if (lane + 32 * j < nvec) {
          float f[N];
          unpack<T>(sl[lane + 32 * j], f);
#pragma unroll
          for (int n = 0; n < N; ++n) f[n] = (f[n] - M) - ls;
          st16(y + lane + 32 * j, pack_out<T>(f));
        }
      release();
    } else {
      const float r = 1.f / S;
#pragma unroll
      for (int j = 0; j < CPL; ++j)
        if (lane + 32 * j < nvec) {
          float f[N];
          if constexpr (KEEP) {
#pragma unroll
            for (int n = 0; n < N; ++n) f[n] = e[j][n] * r;
          } else {
            unpack<T>(sl[lane + 32 * j], f);
#pragma unroll
            for (int n = 0; n < N; ++n) f[n] = exp_t<T>(f[n] - M) * r;
          }
          st16(y + lane + 32 * j, pack_out<T>(f));
        }
      if constexpr (!KEEP) release();
    }
  }
};

// Whether kernel K runs here (built for sm_90 or newer); sets its shared-memory
// limit once per device.
template <auto K>
bool kernel_ready() {
  static int cache[64] = {};  // 0: unknown, 1: yes, 2: no (benign race: same value)
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  int& c = cache[dev & 63];
  if (!c) {
    cudaFuncAttributes fa{};
    bool ok = cudaFuncGetAttributes(&fa, K) == cudaSuccess && fa.binaryVersion >= 90;
    ok = ok && cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    c = ok ? 1 : 2;
  }
  return c == 1;
}

// Vectors per lane for a row of nvec 16-byte vectors: 8, 16, 32, or 0 (not taken).
int pick_cpl(int64_t nvec, int max_cpl) {
  if (nvec <= 32 * 4) return 0;  // short rows: the register forms do well
  const int c = nvec <= 32 * 8 ? 8 : nvec <= 32 * 16 ? 16 : nvec <= 32 * 32 ? 32 : 0;
  return c <= max_cpl ? c : 0;
}

// Default launch shape of an op and dtype (GPUKIT_TUNE pipe.* overrides it).
struct PipeShape {
  int kb = 200, w = 7, ef = 0, cta = 1;
};

template <class Op, int CPL>
void launch_pipe(const Op& op, int64_t rows, uint32_t row_bytes, cudaStream_t st, const char* what, PipeShape d) {
  const uint32_t slot = uint32_t(op.nin) * row_bytes;
  const size_t fixed = size_t(kBarBytes) + size_t(op.npar) * row_bytes;
  const int ctas = std::max(1, std::min(8, tune("pipe.cta", d.cta)));
  const int64_t budget = std::min<int64_t>(int64_t(std::max(1, tune("pipe.kb", d.kb))) * 1024 / ctas, kMaxSmem);
  const int wt = tune("pipe.w", d.w);
  const bool w15 = wt == 15 && kernel_ready<k_pipe<Op, CPL, 15>>();
  const bool w11 = !w15 && wt == 11 && kernel_ready<k_pipe<Op, CPL, 11>>();
  const int W = w15 ? 15 : w11 ? 11 : 7;
  int stages = int(std::max<int64_t>(1, std::min<int64_t>(kMaxStages, (budget - int64_t(fixed)) / slot)));
  if (stages > W) stages = stages / W * W;  // a multiple of the consumer warps (see k_pipe)
  const size_t smem = fixed + size_t(stages) * slot;
  int64_t g = int64_t(sm_count()) * ctas;
  if (const int forced = tune("pipe.grid", 0); forced > 0) g = forced;  // tests: many rows per CTA
  const unsigned grid = unsigned(std::min<int64_t>(rows, g));
  const int ef = tune("pipe.ef", d.ef);
  if (w15)
    k_pipe<Op, CPL, 15><<<grid, 16 * 32, smem, st>>>(op, int(rows), stages, row_bytes, ef);
  else if (w11)
    k_pipe<Op, CPL, 11><<<grid, 12 * 32, smem, st>>>(op, int(rows), stages, row_bytes, ef);
  else
    k_pipe<Op, CPL, 7><<<grid, 8 * 32, smem, st>>>(op, int(rows), stages, row_bytes, ef);
  GK_LAUNCH_CHECK(what);
}

// Calls f(integral_constant<CPL>) for CPL in {8, 16, 32} (at most MAXC).
template <int MAXC, class F>
void with_cpl(int cpl, F f) {
  using std::integral_constant;
  if (cpl == 8) f(integral_constant<int, 8>{});
  else if (cpl == 16 || MAXC < 32) f(integral_constant<int, 16>{});
  else if constexpr (MAXC >= 32) f(integral_constant<int, 32>{});
}
template <class T, bool LOG>
inline constexpr int kSoftmaxMaxCpl = 32;

// fixed: the parameter vectors' bytes
bool rows_ok(int64_t rows, uint32_t slot, size_t fixed = 0) {
  return rows > 0 && rows <= INT32_MAX && size_t(kBarBytes) + fixed + slot <= size_t(kMaxSmem);
}

template <class T>
bool norm_ready(const NormArgs& a) {
  constexpr int N = kVecN<T>;
  const int cpl = pick_cpl(a.H / N, 32);
  if (!cpl) return false;
  bool ok = false;
  with_cpl<32>(cpl, [&](auto c) { ok = kernel_ready<k_pipe<NormPipe<T>, decltype(c)::value, 7>>(); });
  return ok;
}

template <class T, bool LOG>
bool softmax_ready(int64_t cols) {
  constexpr int N = kVecN<T>;
  // non-log softmax keeps CPL * N exponentials per lane in registers: at most 128
  constexpr int MAXC = kSoftmaxMaxCpl<T, LOG>;
  const int cpl = pick_cpl(cols / N, MAXC);
  if (!cpl) return false;
  bool ok = false;
  with_cpl<MAXC>(cpl, [&](auto c) { ok = kernel_ready<k_pipe<SoftmaxPipe<T, LOG>, decltype(c)::value, 7>>(); });
  return ok;
}

}  // namespace

bool pipe_norm_ok(const NormArgs& a) {
  if (!tune("norm.pipe", 0)) return false;  // off by default: slower than the register forms (see the top)
  const size_t es = itemsize(a.dtype);
  const int64_t rb = a.H * int64_t(es);
  if (rb % 16 || !rows_ok(a.rows, uint32_t((a.res ? 2 : 1) * rb), size_t(a.b ? 2 : 1) * size_t(rb))) return false;
  bool ok = false;
  dispatch_float(a.dtype, [&](auto t) { ok = norm_ready<decltype(t)>(a); });
  return ok;
}

void pipe_norm(const NormArgs& a, cudaStream_t st) {
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    const NormPipe<T> op{a, a.res ? 2 : 1, a.b ? 2 : 1};
    with_cpl<32>(pick_cpl(a.H / kVecN<T>, 32), [&](auto c) {
      launch_pipe<NormPipe<T>, decltype(c)::value>(op, a.rows, uint32_t(a.H * int64_t(sizeof(T))), st,
                                                    a.layer ? "layer_norm_pipe" : "rms_norm_pipe", PipeShape{});
    });
  });
}

bool pipe_softmax_ok(const RowArgs& a, bool log) {
  // on by default for f32 only (see the top)
  if (!tune("softmax.pipe", a.in_dtype == DType::f32 ? 1 : 0)) return false;
  if (a.in_dtype != a.out_dtype || (a.in_dtype != DType::f32 && a.in_dtype != DType::f16 && a.in_dtype != DType::bf16))
    return false;
  bool ok = false;
  dispatch_float(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    if (a.cols * int64_t(sizeof(T)) % 16 || !rows_ok(a.rows, uint32_t(a.cols * int64_t(sizeof(T))))) return;
    ok = log ? softmax_ready<T, true>(a.cols) : softmax_ready<T, false>(a.cols);
  });
  return ok;
}

void pipe_softmax(const RowArgs& a, bool log, cudaStream_t st) {
  dispatch_float(a.in_dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int N = kVecN<T>;
    const uint32_t rb = uint32_t(a.cols * int64_t(sizeof(T)));
    auto go = [&](auto lg) {
      constexpr bool L = decltype(lg)::value;
      const SoftmaxPipe<T, L> op{static_cast<const T*>(a.in), static_cast<T*>(a.out), a.in_row_stride,
                                 a.out_row_stride, int(a.cols / N)};
      constexpr int MAXC = kSoftmaxMaxCpl<T, L>;
      with_cpl<MAXC>(pick_cpl(a.cols / N, MAXC),
               [&](auto c) {
                       launch_pipe<SoftmaxPipe<T, L>, decltype(c)::value>(op, a.rows, rb, st, "softmax_pipe", PipeShape{200, 11});
                     });
    };
    if (log) go(std::true_type{});
    else go(std::false_type{});
  });
}

}  // namespace gk::cuda
