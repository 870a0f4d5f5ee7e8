// CUDA kv_append: one block per new token; the destination comes from the rule
// shared with the CPU reference (kv_dest: a token whose destination falls
// outside the pool is skipped, so unvalidated device metadata never writes out
// of bounds); k and v rows are copied with 16-byte vectors, or converted to
// fp8-e4m3 with a per-head scale.
#include <algorithm>

#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("kv_append");

namespace {
template <class T, class C, int W>
__global__ void __launch_bounds__(256) k_kv_append(KvAppendArgs a) {
  const int64_t t = blockIdx.x;
  int64_t blk, off;
  if (!kv_dest(a, t, blk, off)) return;
  const int per_head = a.D / W, total = a.hkv * per_head;
  const int64_t base = (blk * a.bs + off) * a.hkv * a.D;
  for (int u = threadIdx.x; u < total; u += blockDim.x) {
    const int h = u / per_head, i = (u - h * per_head) * W;
    Vec<T, W> kv = *reinterpret_cast<const Vec<T, W>*>(static_cast<const T*>(a.k) + t * a.k_ts + h * a.k_hs + i);
    Vec<T, W> vv = *reinterpret_cast<const Vec<T, W>*>(static_cast<const T*>(a.v) + t * a.v_ts + h * a.v_hs + i);
    const int64_t dst = base + int64_t(h) * a.D + i;
    if constexpr (std::is_same_v<C, f8e4m3>) {
      const float ks = a.k_scale[h], vs = a.v_scale[h];
      Vec<C, W> ko, vo;
#pragma unroll
      for (int j = 0; j < W; ++j) {
        ko.v[j] = f8e4m3(float(kv.v[j]) / ks);
        vo.v[j] = f8e4m3(float(vv.v[j]) / vs);
      }
      *reinterpret_cast<Vec<C, W>*>(static_cast<C*>(a.kc) + dst) = ko;
      *reinterpret_cast<Vec<C, W>*>(static_cast<C*>(a.vc) + dst) = vo;
    } else {
      *reinterpret_cast<Vec<T, W>*>(static_cast<T*>(a.kc) + dst) = kv;
      *reinterpret_cast<Vec<T, W>*>(static_cast<T*>(a.vc) + dst) = vv;
    }
  }
}

template <class T, class C>
void launch(const KvAppendArgs& a, cudaStream_t st) {
  constexpr int N = 16 / sizeof(T);
  bool vec = a.D % N == 0 && aligned16(a.k) && aligned16(a.v) && aligned16(a.kc) && aligned16(a.vc);
  for (int64_t s : {a.k_ts, a.k_hs, a.v_ts, a.v_hs}) vec = vec && s % N == 0;
  const int W = vec ? N : 1;
  const int64_t work = int64_t(a.hkv) * (a.D / W);
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (work + 31) / 32 * 32)));
  if (a.T > int64_t(INT32_MAX)) throw ValueError("k_new: too many tokens for one launch");
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
