// Warpgroup MMA wrappers that the GEMM kernels need beyond src/cuda/common/wgmma.cuh
// (same conventions, same namespace): m64n256k16 with both operands in shared memory,
// K-major, 128-byte swizzle (smem_desc), fp32 accumulators, bf16 or fp16 inputs.
// sm_90a only. Stamped by wgmma.cuh's GK_WG_MMA_SS.
#pragma once
#include <cstdint>

#include "cuda/common/wgmma.cuh"

namespace gk::cuda::sm90 {

GK_WG_MMA_SS(256, true, "bf16", GK_WG_D128, GK_WG_R128, 128, 129, 130)
GK_WG_MMA_SS(256, false, "f16", GK_WG_D128, GK_WG_R128, 128, 129, 130)

}  // namespace gk::cuda::sm90
