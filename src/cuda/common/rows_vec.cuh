// Pieces of the lean row kernels (src/cuda/rows_warp.cu, src/cuda/rows_pipe.cu):
// fp32 -> T rounding with one NaN test per 16-byte vector, and loads / stores
// with cache hints.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/common/vec.cuh"

namespace gk::cuda {

// fp32 -> T with pack<T>'s bits: the paired conversion, and pack<T> itself only
// for a vector that holds a NaN (one test per pair, one branch per vector; the
// per-pair branch of pack_bf16x2 cost ~2 instructions per element).
template <class T>
__device__ __forceinline__ raw16 pack_out(const float (&f)[kVecN<T>]) {
  if constexpr (std::is_same_v<T, bf16>) {
    raw16 v;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
      uint32_t w;
      memcpy(&w, &h, 4);
      set_word(v, i, w);
      nan |= (f[2 * i] != f[2 * i]) | (f[2 * i + 1] != f[2 * i + 1]);
    }
    if (nan) v = pack<T>(f);
    return v;
  } else {
    return pack<T>(f);
  }
}

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
// 16 bytes, not allocated in L1.
__device__ __forceinline__ raw16 ld_na(const raw16* p) {
  raw16 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// The same with an L2 policy (evict_first_policy()).
__device__ __forceinline__ raw16 ld_ef(const raw16* p, uint64_t pol) {
  raw16 v;
  asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}
// 16 bytes; cs: the streaming store (.cs, evict first).
__device__ __forceinline__ void st_out(raw16* p, raw16 v, bool cs) {
  if (cs)
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  else
    *p = v;
}

}  // namespace gk::cuda
