// The cluster primitives of the cluster-merged decode attention kernels (attention_decode_fold_cl.cu's 24 / 25 /
// 33, attention_decode_fold_pcl.cu's 31, attention_decode_fold_c2.cu's 39): the cluster-wide barrier (release /
// acquire: every CTA's shared-memory writes before it are visible to the cluster after it) and a float load from
// another CTA's shared memory (distributed shared memory). sm_90+; elsewhere they compile to nothing.
#pragma once
#include <cstdint>

namespace gk::cuda::dcl {

__device__ __forceinline__ void cl_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}
// The float at shared address s (an offset in this CTA's window) of CTA `rank` of the cluster.
__device__ __forceinline__ float ld_peer(uint32_t s, uint32_t rank) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ra;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(s), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(ra) : "memory");
#endif
  return v;
}

}  // namespace gk::cuda::dcl
