// CUDA attention_prefill on CUDA cores (the decode kernels are in
// attention_decode.cu).
#include <cfloat>

#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("attention_prefill");

namespace {
constexpr int kThr = 128;  // 4 warps
constexpr int kGB = 4;     // query heads per CTA
constexpr int kEPL = 16;   // elements of a row per lane
constexpr int kC = 256;   // keys per chunk

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

}  // namespace gk::cuda
