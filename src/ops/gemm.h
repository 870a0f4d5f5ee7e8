// Internal: how the front ends of matmul, linear and gate_up_swiglu run one GEMM.
#pragma once
#include "gpukit/array.h"
#include "gpukit/stream.h"
#include "ops/backend.h"

namespace gk::detail {

// True when the batch dimensions of `ma` collapse to one stride per operand
// (what cuBLASLt's strided batch needs); *a_bs/*b_bs receive those strides.
bool collapse_batch(const MatmulArgs& ma, int64_t* a_bs, int64_t* b_bs);

// Runs ma (c contiguous [batch..., m, n]) on the CPU or, for a CUDA device, through
// cuBLASLt when it takes the problem, else gpukit's CUDA kernel.
void run_gemm(const MatmulArgs& ma, Device d, const Stream& s);

// The GEMM c [m, n] (contiguous) = x2 [m, k] @ w^T for w [n, k] (any strides): the product
// of every linear-style front end (linear, gate_up_swiglu, int8_linear, fp8_linear).
MatmulArgs rows_times_wt(const Array& x2, const Array& w, const Array& c, int64_t n, DType dtype, DType out_dtype);

// out[i, j] = acc[i, j] * xs[i] * ws[j] (+ bias[j]) into y [m, n] of dtype `out` (the scale
// epilogue of int8_linear and fp8_linear; xs, ws contiguous float32; bias may be undefined).
void scale_epilogue(const Array& acc, const Array& xs, const Array& ws, const Array& bias, Array& y, int64_t m,
                    int64_t n, DType out, Device d, const Stream& s);

// x [..., K] -> [m, k] (a view when the strides allow, else a contiguous copy).
Array rows_view(const Array& x, int64_t m, int64_t k, const Stream& s);

}  // namespace gk::detail

namespace gk::cuda {
// gpukit's tensor-core int8 GEMM (src/cuda/int8_gemm.cu): batch 1, A rows and B = W^T
// columns K-contiguous, K and the row strides multiples of 16, 16-byte aligned operands.
// Returns false, having launched nothing, when the problem does not fit those rules.
bool int8_gemm_mma(const MatmulArgs& a, void* stream);
}  // namespace gk::cuda
