// cuBLASLt, loaded at run time with dlopen (never linked): one GEMM call in
// row-major terms, used by the CUDA paths of matmul, linear and gate_up_swiglu.
//
// Search order for libcublasLt.so.13: $GPUKIT_CUBLASLT_PATH (a file or a folder),
// the dynamic loader's path, $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64,
// then folders the Python layer adds (the PyPI nvidia-cublas wheel:
// site-packages/nvidia/cu13/lib, nvidia/cublas/lib). GPUKIT_DISABLE_CUBLASLT=1 turns
// it off (gpukit's own kernels serve instead).
//
// Reproducibility (the same bits on every run):
// - one handle per device and one 32 MiB workspace per (device, stream): two streams
//   never share a workspace, so concurrent GEMMs cannot race on split-K scratch;
// - the algorithm is chosen once per problem key (device, shape, batch, dtypes,
//   transposes, leading dimensions, batch strides, pointer alignments, epilogue,
//   precision) by cublasLtMatmulAlgoGetHeuristic with a fixed workspace limit and
//   cached, so a key always runs the same kernel configuration;
// - the preference's reduction-scheme mask allows only split-K schemes whose partial
//   sums go to the workspace and are added by a separate pass in a fixed order
//   (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE / OUTPUT_TYPE, and NONE); the in-place
//   scheme that accumulates into the output is excluded. GPUKIT_CUBLASLT_NO_SPLITK=1
//   allows only NONE. cuBLASLt has no atomics-based reductions outside these schemes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpukit/dtype.h"

namespace gk::blas {

enum class Epilogue : int { none = 0, bias = 1 };

// How the fp8 scale pointers are read. scalar: one float for the whole operand.
// vec128: one float per 1x128 block along K of each row (our A = activations, scales
// [ceil(K/128), M] with M contiguous, cuBLASLt's layout). blk128x128: one float per
// 128x128 block of the [N, K] weight (our B^T), scales [ceil(N/128), ceil(K/128)]
// row-major... see docs/gemm.md and src/ops/fp8_block.cpp for the exact layouts.
enum class ScaleMode : int { scalar = 0, vec128 = 1, blk128x128 = 2 };

// D[bi] (m x n, row-major, row stride ldd, element stride 1) =
//   A[bi] (m x k, strides a_rs/a_cs) @ B[bi] (k x n, strides b_rs/b_cs) (+ C[bi]) (+ bias[n])
// C (optional, `residual`) has D's layout and dtype; bias has D's dtype.
struct LtGemm {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  const void* bias = nullptr;
  const float* a_scale = nullptr;  // fp8: device pointers to one float each (per-tensor scales of A and B)
  const float* b_scale = nullptr;
  ScaleMode a_scale_mode = ScaleMode::scalar, b_scale_mode = ScaleMode::scalar;
  void* d = nullptr;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t a_rs = 0, a_cs = 0, b_rs = 0, b_cs = 0, ldd = 0;
  int64_t a_bs = 0, b_bs = 0, d_bs = 0;  // batch strides (elements); 0 broadcasts A or B
  DType ab_dtype = DType::f32, d_dtype = DType::f32;
  bool tf32 = false;
  Epilogue epi = Epilogue::none;
};

// True when the library is loaded (tries once; thread-safe).
bool available();
std::string unavailable_reason();
std::string library_path();
int version();  // cublasLtGetVersion(), 0 when not loaded
// Extra candidate folders or files, searched after the built-in ones. Only has an
// effect before the first load attempt.
void add_search_paths(const std::vector<std::string>& paths);

// Whether (ab_dtype -> d_dtype) is a combination this wrapper hands to cuBLASLt.
bool supports(DType ab, DType d);

// Runs the GEMM on `stream` of CUDA device `device`. Returns false, having launched
// nothing, when cuBLASLt is absent or disabled, the dtypes are not supported, the
// strides do not map onto a cuBLASLt layout, or no algorithm fits; the caller then
// uses its own kernel. Throws CudaError when a launch fails.
bool matmul(const LtGemm& g, int device, void* stream);

struct Stats {
  uint64_t lt_calls = 0;        // GEMMs run by cuBLASLt
  uint64_t fallback_calls = 0;  // GEMMs the caller ran with gpukit's kernel (counted by the caller)
  uint64_t plans = 0;           // cached algorithm choices
  uint64_t no_algo = 0;         // problem keys for which cuBLASLt offered no algorithm
};
Stats stats();
void count_fallback();

}  // namespace gk::blas
