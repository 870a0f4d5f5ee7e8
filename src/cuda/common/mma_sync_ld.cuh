// Shared-memory staging of the mma.sync tensor-core GEMMs (src/cuda/int8_gemm.cu, the
// bf16 / f16 grouped GEMM of src/cuda/moe.cu): 16-byte cp.async copies and ldmatrix.
// sm_80+.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace gk::cuda::tc {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared (cp.async.cg); !valid: 0 source bytes, the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n));
}

// Four 8 x 8 matrices of 16-bit elements, one row address per lane.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

}  // namespace gk::cuda::tc
