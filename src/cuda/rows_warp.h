// Row-wise fused kernels (rms_norm with or without the residual add, layer_norm,
// softmax / log_softmax) with the row held in registers by one to eight warps and
// lean per-element code; see src/cuda/rows_warp.cu.
#pragma once
#include <cuda_runtime.h>

#include "ops/backend.h"
#include "ops/nn_args.h"

namespace gk::cuda {

// Launch the warp-row form when it takes the rows (dense, 16-byte aligned rows of
// 32 to 16 * 32 * 8 vectors, and the form selected for this dtype and row length);
// false: nothing was launched. The choice depends on the dtype and the row length
// only, never on the number of rows, so a row's bits do not depend on its batch.
bool rows_warp_norm(const NormArgs& a, cudaStream_t st);
bool rows_warp_softmax(const RowArgs& a, bool log, cudaStream_t st);

}  // namespace gk::cuda
