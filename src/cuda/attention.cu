// CUDA attention_decode (flash-decoding on CUDA cores).
//
// Kernel 1, one CTA per (split, kv head x group of up to kGB query heads,
// sequence): a split is a fixed chunk of kDecodeChunk key positions. Phase 1
// computes the chunk's logits for the CTA's query heads (LPT lanes share one
// key row, each holding EPL elements; the query slice sits in registers),
// phase 2 the softmax numerator over V with the same layout; partial outputs,
// maxima and sums go to a float32 workspace. Kernel 2 merges a sequence's splits
// in split order. The chunking is a constant and every reduction has a fixed
// order, so results are bitwise reproducible and independent of the batch.
#include <cfloat>

#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("attention_decode", "attention_prefill");

namespace {
constexpr int kThr = 128;  // 4 warps
constexpr int kGB = 4;     // query heads per CTA
constexpr int kEPL = 16;   // elements of a row per lane
constexpr int kC = nn::kDecodeChunk;

template <class T>  // T: any storage type (an fp8 row of kEPL elements is one 16-byte load)
__device__ __forceinline__ void load_row(const T* p, float (&r)[kEPL]) {
  constexpr int N = 16 / sizeof(T);
#pragma unroll
  for (int u = 0; u < kEPL / N; ++u) {
    Vec<T, N> v = reinterpret_cast<const Vec<T, N>*>(p)[u];
#pragma unroll
    for (int j = 0; j < N; ++j) r[u * N + j] = float(v.v[j]);
  }
}

__device__ __forceinline__ int64_t seq_len(const DecodeArgs& a, int b) {
  int64_t L = a.seq_lens[b];
  return L < 0 ? 0 : (L > a.capacity ? a.capacity : L);
}

// T: q / out storage type; C: cache storage type (T, or f8e4m3 with per-head scales).
template <class T, class C, int D>
__global__ void __launch_bounds__(kThr) k_decode_partial(const __grid_constant__ DecodeArgs a) {
  constexpr int LPT = D / kEPL, TPW = 32 / LPT, NTG = TPW * (kThr / 32);
  __shared__ float sp[kGB][kC];
  __shared__ float red[NTG][kGB][D];
  __shared__ float sm_m[kGB], sm_l[kGB];

  const int b = blockIdx.z, split = blockIdx.x;
  const int G = a.hq / a.hkv, ngb = (G + kGB - 1) / kGB;
  const int kvh = blockIdx.y / ngb, gb = blockIdx.y % ngb;
  const int h0 = kvh * G + gb * kGB, nh = min(kGB, G - gb * kGB);
  const int64_t L = seq_len(a, b);
  const int64_t start = a.window > 0 ? (L - a.window > 0 ? L - a.window : 0) : 0;
  const int64_t j0 = int64_t(split) * kC, j1 = min(j0 + kC, L), lo = max(j0, start);
  if (lo >= j1) return;  // outside the attended range: the merge skips this split

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, ld = lane % LPT;
  const int tg = warp * TPW + lane / LPT;
  const C* kc = static_cast<const C*>(a.kc);
  const C* vc = static_cast<const C*>(a.vc);
  const float ksc = a.k_scale ? a.k_scale[kvh] : 1.f, vsc = a.v_scale ? a.v_scale[kvh] : 1.f;

  float qr[kGB][kEPL];
#pragma unroll
  for (int g = 0; g < kGB; ++g) {
    const T* q = static_cast<const T*>(a.q) + b * a.q_bs + int64_t(h0 + (g < nh ? g : 0)) * a.q_hs + ld * kEPL;
#pragma unroll
    for (int e = 0; e < kEPL; ++e) qr[g][e] = g < nh ? float(q[e]) * a.scale * ksc : 0.f;
  }

  // Phase 1: logits. Every lane of a warp runs the same trip count (shuffles).
#pragma unroll 2  // two key rows in flight per lane
  for (int64_t base = j0 + warp * TPW; base < j1; base += NTG) {
    const int64_t j = base + lane / LPT;
    const bool in = j >= lo && j < j1;
    const int64_t row = in ? decode_row(a, b, j) : -1;
    float kf[kEPL];
    if (row >= 0) load_row<C>(kc + (row * a.hkv + kvh) * D + ld * kEPL, kf);
    else
#pragma unroll
      for (int e = 0; e < kEPL; ++e) kf[e] = 0.f;
    float dot[kGB];
#pragma unroll
    for (int g = 0; g < kGB; ++g) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < kEPL; ++e) s = fmaf(qr[g][e], kf[e], s);
#pragma unroll
      for (int o = LPT / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      dot[g] = s;
    }
    if (ld == 0 && j < j1) {
#pragma unroll
      for (int g = 0; g < kGB; ++g) {
        float s = dot[g];
        if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
        if (g < nh) sp[g][j - j0] = row >= 0 ? s : -INFINITY;
      }
    }
  }
  __syncthreads();
  // Softmax statistics of the chunk: warp w takes query head w.
  const int n = int(j1 - j0);
  if (warp < nh) {
    float m = -INFINITY;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, sp[warp][i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int i = lane; i < n; i += 32) {
      float p = m == -INFINITY ? 0.f : expf(sp[warp][i] - m);
      sp[warp][i] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      sm_m[warp] = m;
      sm_l[warp] = l;
    }
  }
  __syncthreads();
  // Phase 2: sum_j p_j v_j for this thread's slice of D and its token group.
  float acc[kGB][kEPL];
#pragma unroll
  for (int g = 0; g < kGB; ++g)
#pragma unroll
    for (int e = 0; e < kEPL; ++e) acc[g][e] = 0.f;
#pragma unroll 2
  for (int64_t j = j0 + tg; j < j1; j += NTG) {
    if (j < lo) continue;
    const int64_t row = decode_row(a, b, j);
    if (row < 0) continue;
    float vf[kEPL];
    load_row<C>(vc + (row * a.hkv + kvh) * D + ld * kEPL, vf);
#pragma unroll
    for (int g = 0; g < kGB; ++g) {
      const float p = g < nh ? sp[g][j - j0] : 0.f;
#pragma unroll
      for (int e = 0; e < kEPL; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
    }
  }
#pragma unroll
  for (int g = 0; g < kGB; ++g)
#pragma unroll
    for (int e = 0; e < kEPL; ++e) red[tg][g][ld * kEPL + e] = acc[g][e];
  __syncthreads();
  for (int idx = tid; idx < nh * D; idx += kThr) {
    const int g = idx / D, dd = idx - g * D;
    float s = 0.f;
#pragma unroll
    for (int t = 0; t < NTG; ++t) s += red[t][g][dd];
    a.ws_o[((int64_t(b) * a.hq + h0 + g) * a.nsplit + split) * D + dd] = s * vsc;
  }
  if (tid < nh) {
    float* ml = a.ws_ml + ((int64_t(b) * a.hq + h0 + tid) * a.nsplit + split) * 2;
    ml[0] = sm_m[tid];
    ml[1] = sm_l[tid];
  }
}

// One CTA per (query head, sequence), one thread per output element.
template <class T>
__global__ void k_decode_merge(const __grid_constant__ DecodeArgs a) {
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const int64_t L = seq_len(a, b);
  const int64_t start = a.window > 0 ? (L - a.window > 0 ? L - a.window : 0) : 0;
  const int s_lo = int(start / kC), s_hi = int((L + kC - 1) / kC);
  const int64_t row = int64_t(b) * a.hq + h;
  const float* ml = a.ws_ml + row * a.nsplit * 2;
  float M = -INFINITY;
  for (int s = s_lo; s < s_hi; ++s) M = fmaxf(M, ml[2 * s]);
  float num = 0.f, den = 0.f;
  if (M > -INFINITY) {
    for (int s = s_lo; s < s_hi; ++s) {
      const float m = ml[2 * s];
      if (m == -INFINITY) continue;
      const float w = expf(m - M);
      den = fmaf(w, ml[2 * s + 1], den);
      num = fmaf(w, a.ws_o[(row * a.nsplit + s) * a.D + d], num);
    }
  }
  static_cast<T*>(a.out)[row * a.D + d] = convert<T>(den > 0.f ? num / den : 0.f);
}

template <class T, class C, int D>
void launch(const DecodeArgs& a, cudaStream_t st) {
  const int G = a.hq / a.hkv, ngb = (G + kGB - 1) / kGB;
  if (a.B > 65535) throw ValueError("q: more than 65535 sequences in one decode call");
  if (int64_t(a.hkv) * ngb > 65535) throw ValueError("q: too many heads");
  dim3 grid{unsigned(a.nsplit), unsigned(a.hkv * ngb), unsigned(a.B)};
  k_decode_partial<T, C, D><<<grid, kThr, 0, st>>>(a);
  GK_LAUNCH_CHECK("attention_decode_partial");
  dim3 mgrid{unsigned(a.hq), unsigned(a.B), 1u};
  k_decode_merge<T><<<mgrid, unsigned(D), 0, st>>>(a);
  GK_LAUNCH_CHECK("attention_decode_merge");
}
// Prefill: one CTA per (query token, kv head x group of up to kGB query heads).
// The key range is walked in chunks of kC keys with the decode kernel's layout;
// running max / sum live in shared memory, the output accumulators in registers
// (rescaled per chunk). A correct CUDA-core kernel, not a tensor-core one.
template <class T, int D>
__global__ void __launch_bounds__(kThr) k_prefill(const __grid_constant__ PrefillArgs a) {
  constexpr int LPT = D / kEPL, TPW = 32 / LPT, NTG = TPW * (kThr / 32);
  __shared__ float sp[kGB][kC];
  __shared__ float red[NTG][kGB][D];
  __shared__ float sM[kGB], sL[kGB], sA[kGB];

  const int64_t t = blockIdx.x;
  const int G = a.hq / a.hkv, ngb = (G + kGB - 1) / kGB;
  const int kvh = blockIdx.y / ngb, gb = blockIdx.y % ngb;
  const int h0 = kvh * G + gb * kGB, nh = min(kGB, G - gb * kGB);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, ld = lane % LPT;
  const int tg = warp * TPW + lane / LPT;
  T* out = static_cast<T*>(a.out) + (t * a.hq + h0) * D;
  int64_t k0, lo, hi;
  if (!prefill_range(a, t, k0, lo, hi)) {
    for (int i = tid; i < nh * D; i += kThr) out[i] = convert<T>(0.f);
    return;
  }
  const T* kp = static_cast<const T*>(a.k) + k0 * a.k_ts + int64_t(kvh) * a.k_hs + ld * kEPL;
  const T* vp = static_cast<const T*>(a.v) + k0 * a.v_ts + int64_t(kvh) * a.v_hs + ld * kEPL;
  float qr[kGB][kEPL];
#pragma unroll
  for (int g = 0; g < kGB; ++g) {
    const T* q = static_cast<const T*>(a.q) + t * a.q_ts + int64_t(h0 + (g < nh ? g : 0)) * a.q_hs + ld * kEPL;
#pragma unroll
    for (int e = 0; e < kEPL; ++e) qr[g][e] = g < nh ? float(q[e]) * a.scale : 0.f;
  }
  if (tid < kGB) {
    sM[tid] = -INFINITY;
    sL[tid] = 0.f;
  }
  float acc[kGB][kEPL];
#pragma unroll
  for (int g = 0; g < kGB; ++g)
#pragma unroll
    for (int e = 0; e < kEPL; ++e) acc[g][e] = 0.f;
  for (int64_t c0 = lo; c0 < hi; c0 += kC) {
    const int64_t c1 = min(c0 + kC, hi);
#pragma unroll 2
    for (int64_t base = c0 + warp * TPW; base < c1; base += NTG) {
      const int64_t j = base + lane / LPT;
      float kf[kEPL];
      if (j < c1) load_row<T>(kp + j * a.k_ts, kf);
      else
#pragma unroll
        for (int e = 0; e < kEPL; ++e) kf[e] = 0.f;
#pragma unroll
      for (int g = 0; g < kGB; ++g) {
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < kEPL; ++e) s = fmaf(qr[g][e], kf[e], s);
#pragma unroll
        for (int o = LPT / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
        if (ld == 0 && j < c1 && g < nh) sp[g][j - c0] = s;
      }
    }
    __syncthreads();
    const int n = int(c1 - c0);
    if (warp < nh) {
      float m = -INFINITY;
      for (int i = lane; i < n; i += 32) m = fmaxf(m, sp[warp][i]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      const float Mo = sM[warp], Mn = fmaxf(Mo, m);
      float l = 0.f;
      for (int i = lane; i < n; i += 32) {
        float p = Mn == -INFINITY ? 0.f : expf(sp[warp][i] - Mn);
        sp[warp][i] = p;
        l += p;
      }
      l = warp_sum(l);
      __syncwarp();
      if (lane == 0) {
        const float alpha = Mo == -INFINITY ? 0.f : expf(Mo - Mn);
        sA[warp] = alpha;
        sL[warp] = sL[warp] * alpha + l;
        sM[warp] = Mn;
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kGB; ++g) {
      const float al = g < nh ? sA[g] : 0.f;
#pragma unroll
      for (int e = 0; e < kEPL; ++e) acc[g][e] *= al;
    }
#pragma unroll 2
    for (int64_t j = c0 + tg; j < c1; j += NTG) {
      float vf[kEPL];
      load_row<T>(vp + j * a.v_ts, vf);
#pragma unroll
      for (int g = 0; g < kGB; ++g) {
        const float p = g < nh ? sp[g][j - c0] : 0.f;
#pragma unroll
        for (int e = 0; e < kEPL; ++e) acc[g][e] = fmaf(p, vf[e], acc[g][e]);
      }
    }
    __syncthreads();  // sp is rewritten by the next chunk
  }
#pragma unroll
  for (int g = 0; g < kGB; ++g)
#pragma unroll
    for (int e = 0; e < kEPL; ++e) red[tg][g][ld * kEPL + e] = acc[g][e];
  __syncthreads();
  for (int idx = tid; idx < nh * D; idx += kThr) {
    const int g = idx / D, dd = idx - g * D;
    float s = 0.f;
#pragma unroll
    for (int u = 0; u < NTG; ++u) s += red[u][g][dd];
    out[idx] = convert<T>(sL[g] > 0.f ? s / sL[g] : 0.f);
  }
}

template <class T, int D>
void launch_prefill(const PrefillArgs& a, cudaStream_t st) {
  const int G = a.hq / a.hkv, ngb = (G + kGB - 1) / kGB;
  if (a.Tq > int64_t(INT32_MAX)) throw ValueError("q: too many tokens for one launch");
  if (int64_t(a.hkv) * ngb > 65535) throw ValueError("q: too many heads");
  dim3 grid{unsigned(a.Tq), unsigned(a.hkv * ngb), 1u};
  k_prefill<T, D><<<grid, kThr, 0, st>>>(a);
  GK_LAUNCH_CHECK("attention_prefill");
}
}  // namespace

bool attention_prefill_sm90(const PrefillArgs& a, void* stream);  // attention_prefill_sm90.cu (wgmma)

void attention_prefill(const PrefillArgs& a, void* stream) {
  if (attention_prefill_sm90(a, stream)) return;
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int N = 16 / sizeof(T);
    bool ok = aligned16(a.k) && aligned16(a.v);
    for (int64_t s : {a.k_ts, a.k_hs, a.v_ts, a.v_hs}) ok = ok && s % N == 0;
    if (!ok) throw ValueError("k, v: token and head strides must keep rows 16-byte aligned (pass contiguous arrays)");
    switch (a.D) {
      case 64: return launch_prefill<T, 64>(a, st);
      case 128: return launch_prefill<T, 128>(a, st);
      case 256: return launch_prefill<T, 256>(a, st);
      default: throw ValueError("q: head_dim must be 64, 128 or 256");
    }
  });
}

void attention_decode(const DecodeArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  if (!aligned16(a.kc) || !aligned16(a.vc)) throw ValueError("k_cache, v_cache: must be 16-byte aligned");
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    auto go = [&](auto c) {
      using C = decltype(c);
      switch (a.D) {
        case 64: return launch<T, C, 64>(a, st);
        case 128: return launch<T, C, 128>(a, st);
        case 256: return launch<T, C, 256>(a, st);
        default: throw ValueError("q: head_dim must be 64, 128 or 256");
      }
    };
    if (a.cache_dtype == DType::f8e4m3) go(f8e4m3{});
    else go(T{});
  });
}

}  // namespace gk::cuda
