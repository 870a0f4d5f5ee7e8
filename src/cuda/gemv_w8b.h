// The bulk-copy form of the staged 8-bit GEMV (src/cuda/gemv_w8b.cu; GPUKIT_GEMV_W8's XS 4).
#pragma once
#include <cuda_runtime.h>

#include "cuda/common/gemv.cuh"

namespace gk::cuda::gemv_detail {

// k_w8b on launch_w8's plan (nw warps per CTA, split slices of K): fp8 (else int8) codes decoded
// to bf16, bf16 x; stages of kb (4 or 8) blocks in a ring of d (2..4; kb 8: 2); spread as launch_kd.
void launch_w8b(bool fp8, const KArgs& p, int nw, int split, int kb, int d, bool spread, cudaStream_t st);

}  // namespace gk::cuda::gemv_detail
