// CUDA kv_append: one block per new token; the destination comes from the rule
// shared with the CPU reference (kv_dest: a token whose destination falls
// outside the pool is skipped, so unvalidated device metadata never writes out
// of bounds); k and v rows are copied with 16-byte vectors, or converted to
// fp8-e4m3 with a per-head scale. With fused RoPE (rope_rd > 0) a second kernel
// rotates k on the way (one thread per rotary pair, the cos/sin formula of
// rope.cu: sincosf of the fp32 angle, times mscale), optionally writing the
// rotated keys to k_out as well.
#include <algorithm>

#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("kv_append");

namespace {
template <class T, class C>
__device__ __forceinline__ C to_cache(T x, const float* scale, int h) {
  if constexpr (std::is_same_v<C, f8e4m3>) return f8e4m3(float(x) / scale[h]);
  else return x;
}

template <class T, class C, int W>
__global__ void __launch_bounds__(256) k_kv_append(const __grid_constant__ KvAppendArgs a) {
  const int64_t t = blockIdx.x;
  int64_t blk, off, pos;
  if (!kv_dest(a, t, blk, off, pos)) return;
  const int per_head = a.D / W, total = a.hkv * per_head;
  const int64_t base = (blk * a.bs + off) * a.hkv * a.D;
  for (int u = threadIdx.x; u < total; u += blockDim.x) {
    const int h = u / per_head, i = (u - h * per_head) * W;
    Vec<T, W> kv = *reinterpret_cast<const Vec<T, W>*>(static_cast<const T*>(a.k) + t * a.k_ts + h * a.k_hs + i);
    Vec<T, W> vv = *reinterpret_cast<const Vec<T, W>*>(static_cast<const T*>(a.v) + t * a.v_ts + h * a.v_hs + i);
    const int64_t dst = base + int64_t(h) * a.D + i;
    if constexpr (std::is_same_v<C, f8e4m3>) {
      Vec<C, W> ko, vo;
#pragma unroll
      for (int j = 0; j < W; ++j) {
        ko.v[j] = to_cache<T, C>(kv.v[j], a.k_scale, h);
        vo.v[j] = to_cache<T, C>(vv.v[j], a.v_scale, h);
      }
      *reinterpret_cast<Vec<C, W>*>(static_cast<C*>(a.kc) + dst) = ko;
      *reinterpret_cast<Vec<C, W>*>(static_cast<C*>(a.vc) + dst) = vo;
    } else {
      *reinterpret_cast<Vec<T, W>*>(static_cast<T*>(a.kc) + dst) = kv;
      *reinterpret_cast<Vec<T, W>*>(static_cast<T*>(a.vc) + dst) = vv;
    }
  }
}

// kv_append with RoPE on k. Work items of a token: hkv * rd/2 rotary pairs, then
// hkv * (D - rd) unrotated k elements, then hkv * D v elements.
template <class T, class C, bool IL>
__global__ void __launch_bounds__(256) k_kv_append_rope(const __grid_constant__ KvAppendArgs a) {
  const int64_t t = blockIdx.x;
  int64_t blk, off, pos;
  const bool dest = kv_dest(a, t, blk, off, pos);
  if (!dest && !a.k_out) return;
  const int n = a.rope_rd / 2, tail = a.D - a.rope_rd;
  const float p = float(kv_rope_pos(a, t, pos));
  const int64_t base = dest ? (blk * a.bs + off) * a.hkv * a.D : 0;
  C* kc = static_cast<C*>(a.kc) + base;
  C* vc = static_cast<C*>(a.vc) + base;
  T* ko = static_cast<T*>(a.k_out);
  const int npair = a.hkv * n, ntail = a.hkv * tail, total = npair + ntail + (dest ? a.hkv * a.D : 0);
  for (int u = threadIdx.x; u < total; u += blockDim.x) {
    if (u < npair) {
      const int h = u / n, i = u - h * n;
      const int i1 = IL ? 2 * i : i, i2 = IL ? 2 * i + 1 : i + n;
      const T* k = static_cast<const T*>(a.k) + t * a.k_ts + h * a.k_hs;
      float cs, sn;
      sincosf(p * a.inv_freq[i], &sn, &cs);
      cs *= a.rope_mscale;
      sn *= a.rope_mscale;
      const float x1 = float(k[i1]), x2 = float(k[i2]);
      const T r1 = convert<T>(x1 * cs - x2 * sn), r2 = convert<T>(x2 * cs + x1 * sn);
      if (ko) {
        ko[t * a.ko_ts + h * a.ko_hs + i1] = r1;
        ko[t * a.ko_ts + h * a.ko_hs + i2] = r2;
      }
      if (dest) {
        kc[h * a.D + i1] = to_cache<T, C>(r1, a.k_scale, h);
        kc[h * a.D + i2] = to_cache<T, C>(r2, a.k_scale, h);
      }
    } else if (u < npair + ntail) {
      const int w = u - npair, h = w / tail, i = a.rope_rd + (w - h * tail);
      const T x = static_cast<const T*>(a.k)[t * a.k_ts + h * a.k_hs + i];
      if (ko) ko[t * a.ko_ts + h * a.ko_hs + i] = x;
      if (dest) kc[h * a.D + i] = to_cache<T, C>(x, a.k_scale, h);
    } else {
      const int w = u - npair - ntail, h = w / a.D, i = w - h * a.D;
      vc[h * a.D + i] = to_cache<T, C>(static_cast<const T*>(a.v)[t * a.v_ts + h * a.v_hs + i], a.v_scale, h);
    }
  }
}

template <class T, class C>
void launch(const KvAppendArgs& a, cudaStream_t st) {
  constexpr int N = 16 / sizeof(T);
  if (a.T > int64_t(INT32_MAX)) throw ValueError("k_new: too many tokens for one launch");
  if (a.rope_rd > 0) {
    const int64_t work = int64_t(a.hkv) * (a.D + a.D / 2);
    const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (work + 31) / 32 * 32)));
    if (a.rope_il) k_kv_append_rope<T, C, true><<<unsigned(a.T), unsigned(threads), 0, st>>>(a);
    else k_kv_append_rope<T, C, false><<<unsigned(a.T), unsigned(threads), 0, st>>>(a);
    GK_LAUNCH_CHECK("kv_append_rope");
    return;
  }
  bool vec = a.D % N == 0 && aligned16(a.k) && aligned16(a.v) && aligned16(a.kc) && aligned16(a.vc);
  for (int64_t s : {a.k_ts, a.k_hs, a.v_ts, a.v_hs}) vec = vec && s % N == 0;
  const int W = vec ? N : 1;
  const int64_t work = int64_t(a.hkv) * (a.D / W);
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (work + 31) / 32 * 32)));
  if (vec) k_kv_append<T, C, N><<<unsigned(a.T), unsigned(threads), 0, st>>>(a);
  else k_kv_append<T, C, 1><<<unsigned(a.T), unsigned(threads), 0, st>>>(a);
  GK_LAUNCH_CHECK("kv_append");
}
}  // namespace

void kv_append(const KvAppendArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    if (a.cache_dtype == DType::f8e4m3) launch<T, f8e4m3>(a, st);
    else launch<T, T>(a, st);
  });
}

}  // namespace gk::cuda
