// Row-wise fused kernels (rms_norm / layer_norm, softmax / log_softmax) with the
// rows staged in shared memory by bulk async copies (sm_90 TMA), several rows per
// SM in flight whatever the register use; see src/cuda/rows_pipe.cu.
#pragma once
#include <cuda_runtime.h>

#include "ops/backend.h"
#include "ops/nn_args.h"

namespace gk::cuda {

// Whether the staged form takes a row of `bytes` bytes (16-byte multiple) on the
// current device: sm_90 or newer, with the kernels built for it. Depends on the
// row length only (never on the number of rows), so a row's bits do not depend
// on its batch.
bool pipe_norm_ok(const NormArgs& a);
bool pipe_softmax_ok(const RowArgs& a, bool log);

// Run them; the caller checked *_ok (dense, 16-byte aligned rows).
void pipe_norm(const NormArgs& a, cudaStream_t st);
void pipe_softmax(const RowArgs& a, bool log, cudaStream_t st);

}  // namespace gk::cuda
