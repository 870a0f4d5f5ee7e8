// Matrix products beyond plain matmul: output dtype and precision choice, the
// Linear layer with fused epilogues, and the gate-up projection with SwiGLU.
// On CUDA they run through cuBLASLt when it is present (loaded at run time) and
// through gpukit's own kernel otherwise; results are the same bits on every run.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpukit/array.h"
#include "gpukit/stream.h"

namespace gk {

// "highest": float32 products in true FP32. "tf32": float32 products may use
// TF32 tensor cores (10-bit mantissa inputs). Process-wide; default "highest".
enum class MatmulPrecision { highest, tf32 };
void set_matmul_precision(MatmulPrecision p);
MatmulPrecision matmul_precision();

struct MatmulOptions {
  std::optional<DType> out_dtype;   // default: the promoted input dtype
  std::optional<bool> allow_tf32;   // default: matmul_precision() == tf32
};
// matmul with NumPy semantics (see ops.h) and options. out_dtype: float32 for any
// input; float16/bfloat16 only for float16/bfloat16/float32 inputs; float64 only for
// float64 inputs. Accumulation is fp32 (fp64 for float64), rounded once to out_dtype.
Array matmul(const Array& a, const Array& b, const MatmulOptions& opt, const Stream* s = nullptr);

enum class Activation { none, gelu, gelu_tanh, silu };
Activation parse_activation(const std::string& name);  // "", "none", "gelu", "gelu_tanh", "silu"

// y = act(x @ w^T + bias) + residual, with x [..., K], w [N, K] (torch Linear
// layout), bias [N], residual of y's shape [..., N]. Computed in fp32 (fp64 for
// float64) and rounded once to out_dtype (default: the promoted dtype of x and w);
// bias and residual are first converted to out_dtype.
Array linear(const Array& x, const Array& w, const Array* bias = nullptr, Activation act = Activation::none,
             const Array* residual = nullptr, std::optional<DType> out_dtype = std::nullopt,
             const Stream* s = nullptr);

// h = silu(x @ Wg^T) * (x @ Wu^T) with w_gate_up [2*I, K] = concat(Wg, Wu) along
// rows (gate rows first); x [..., K] -> h [..., I]. fp32 products, rounded once.
Array gate_up_swiglu(const Array& x, const Array& w_gate_up, std::optional<DType> out_dtype = std::nullopt,
                     const Stream* s = nullptr);

// Decode GEMV: y = x @ w^T for x [M, K] or [K] with M = 1..8 and w [N, K] in
// bfloat16/float16 (rows contiguous). x is converted to w's dtype; fp32
// accumulation, rounded once to out_dtype (default w's dtype; float32 allowed).
// More than 8 rows of x run as linear(). Reads w at the bandwidth limit on CUDA.
Array gemv(const Array& x, const Array& w, std::optional<DType> out_dtype = std::nullopt,
           const Stream* s = nullptr);

// W8A8: int8 x [..., K] times int8 w [N, K]^T with exact int32 accumulation
// (K <= 131071). Without scales the int32 products are returned. With x_scale (one
// per row of x, or one for all: per token / per tensor) and w_scale (per output
// channel or per tensor): y = acc * x_scale[i] * w_scale[j] (+ bias[j]) in fp32,
// rounded once to out_dtype (default float32). cuBLASLt's int8 GEMM on CUDA when
// the layout is its "TN" form, else gpukit's kernel.
Array int8_linear(const Array& x, const Array& w, const Array* x_scale = nullptr, const Array* w_scale = nullptr,
                  const Array* bias = nullptr, std::optional<DType> out_dtype = std::nullopt,
                  const Stream* s = nullptr);

// FP8 x [..., K] times w [N, K]^T (each float8_e4m3fn or float8_e5m2) with per-tensor scales (one float each):
// y = (x @ w^T) * x_scale * w_scale (+ bias), fp32 accumulation, rounded once to
// out_dtype (default bfloat16). cuBLASLt's FP8 GEMM when it takes the problem (e4m3 x
// e4m3, no bias, dimensions multiples of 16, aligned), else an exact float32 GEMM of the
// converted operands and a scaling pass.
Array fp8_linear(const Array& x, const Array& w, const Array& x_scale, const Array& w_scale,
                 const Array* bias = nullptr, std::optional<DType> out_dtype = std::nullopt,
                 const Stream* s = nullptr);

// FP8 (e4m3) with block scales, the DeepSeek-V3 layout: x [..., K] with one float
// scale per 1x128 block of each row, x_scale [..., ceil(K/128)]; w [N, K] with one
// scale per 128x128 block, w_scale [ceil(N/128), ceil(K/128)]. Per block b of K:
// P_b = fp32 sum of x*w over the block; y = sum_b (x_scale[i,b] * w_scale[j/128,b]) *
// P_b (+ bias) in fp32, rounded once to out_dtype (default bfloat16). On CUDA
// cuBLASLt's block-scaled FP8 kernels (VEC128_32F x BLK128x128_32F, sm_90) when the
// problem meets their requirements, else gpukit's kernel (bitwise equal to the CPU).
// cuBLASLt sums each block P_b on the FP8 tensor cores, whose adder keeps about 14
// significant bits (measured on the H200: errors up to 2^-14 of the block's sum of
// |products|); only the scaled blocks are added in fp32. gpukit's kernel is exact fp32.
Array fp8_block_linear(const Array& x, const Array& w, const Array& x_scale, const Array& w_scale,
                       const Array* bias = nullptr, std::optional<DType> out_dtype = std::nullopt,
                       const Stream* s = nullptr);

// Block quantization to e4m3 for fp8_block_linear: block_rows = 1 gives 1x128 blocks
// (activations a [..., K] -> scales [..., ceil(K/128)]), block_rows = 128 gives 128x128
// blocks (weights a [N, K] -> scales [ceil(N/128), ceil(K/128)]). s = amax/448 per block
// (1 for an all-zero block), q = e4m3(a / s) rounded to nearest even. Returns (q, s).
std::pair<Array, Array> quantize_fp8_blocks(const Array& a, int64_t block_rows, const Stream* s = nullptr);

namespace blas {
struct Info {
  bool available = false;
  std::string path, reason;
  int version = 0;
  uint64_t lt_calls = 0, fallback_calls = 0, plans = 0, no_algo = 0;
};
Info cublaslt_info();  // loads cuBLASLt on first call
void cublaslt_add_search_paths(const std::vector<std::string>& paths);
}  // namespace blas

}  // namespace gk
