// Device helpers shared by the engine's kernels (llm_decode.cu, llm_small.cu,
// llm_step.cu, llm_attention.cu): programmatic dependent launch (PDL) and the launch with its attribute.
//   griddepcontrol.launch_dependents: the next kernel of the stream may start launching;
//   griddepcontrol.wait: the previous kernel has finished and its writes are visible.
// Without the launch attribute (or before sm_90) both are no-ops.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/cuda_util.h"

namespace gk::llm::fused {
int launch_carveout();  // src/llm/fused.h (CarveoutScope)
}

namespace gk::cuda::llmk {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Fire-and-forget: part `part` of `parts` of the bytes [p, p + n) of a buffer that is not
// written during the step, brought into L2 (sm_90 bulk prefetch, 64 KiB pieces issued by
// the lanes of warp 0; p 16-byte aligned, n a multiple of 16). Nothing waits for it.
__device__ __forceinline__ void l2_prefetch_part(const void* p, int64_t n, int64_t part, int64_t parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p == nullptr || n <= 0 || threadIdx.x >= 32) return;
  constexpr int64_t kPiece = 65536;
  const int64_t pieces = (n + kPiece - 1) / kPiece, per = (pieces + parts - 1) / parts;
  const int64_t i1 = (part + 1) * per < pieces ? (part + 1) * per : pieces;
  for (int64_t i = part * per + threadIdx.x; i < i1; i += 32) {
    const int64_t off = i * kPiece;
    const uint32_t sz = uint32_t(n - off < kPiece ? n - off : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(p) + off), "r"(sz)
                 : "memory");
  }
#else
  (void)p, (void)n, (void)part, (void)parts;
#endif
}

// Weights: read once, never written during the step (safe before the PDL wait).
__device__ __forceinline__ uint4 ld_weight(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// The same with an L2 eviction policy (l2_evict_first_policy(): weights streamed once per
// step, so that they do not evict what the small kernels reuse from L2).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}
__device__ __forceinline__ uint4 ld_weight_hint(const void* p, uint64_t pol) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}
// Activations written by the previous kernel: a plain (coherent) load, after the wait.
__device__ __forceinline__ uint4 ld_act(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// A rotary pair, each product rounded on its own (no fused multiply-add).
__device__ __forceinline__ void rotate(float x1, float x2, float cs, float sn, float& r1, float& r2) {
  r1 = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, sn));
  r2 = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, sn));
}

// The cache slot (block * bs + offset) of token t at position p, or false when its page
// is outside the table or the pool (the token is then not stored).
template <class A>
__device__ __forceinline__ bool llm_slot(const A& a, int64_t t, int32_t p, int64_t& slot) {
  if (p < 0) return false;
  const int64_t li = p / a.bs;
  if (li >= a.max_blocks) return false;
  const int64_t blk = a.block_table[t * a.bt_stride + li];
  if (blk < 0 || blk >= a.nb) return false;
  slot = blk * a.bs + (p - li * a.bs);
  return true;
}

// EngineOptions::carveout (fused::CarveoutScope): the kernel's preferred shared memory
// carveout, set before its launch once any scope has asked for one.
template <class K>
void set_carveout(K* kernel) {
  const int cv = gk::llm::fused::launch_carveout();
  if (cv == -2) return;
  GK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cv < 0 ? int(cudaSharedmemCarveoutDefault) : cv));
}

// A launch with the programmatic-serialization attribute when pdl.
template <class... P, class... A>
void launch_ex(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t st, bool pdl, const char* name,
               A&&... args) {
  set_carveout(kernel);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  GK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
  GK_LAUNCH_CHECK(name);
}

}  // namespace gk::cuda::llmk
