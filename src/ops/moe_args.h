// Internal: argument blocks of the mixture-of-experts kernels (see include/gpukit/moe.h).
#pragma once
#include <cstdint>

#include "gpukit/dtype.h"

namespace gk {

struct MoeGatingArgs {
  const void* logits = nullptr;  // [t, e], row stride e
  DType dtype = DType::f32;
  int64_t t = 0, e = 0, k = 0;
  bool renormalize = true;
  int32_t* ids = nullptr;  // [t, k]
  float* weights = nullptr;  // [t, k]
};

// Stable counting sort of the t*k slots by expert; then the row copy.
struct MoePermuteArgs {
  const int32_t* ids = nullptr;  // [t*k] (validated: 0 <= id < e)
  int64_t t = 0, k = 0, e = 0, h = 0;
  const void* x = nullptr;  // [t, h], row stride x_rs, elements contiguous
  int64_t x_rs = 0;
  DType dtype = DType::f32;
  void* x_sorted = nullptr;  // [t*k, h] contiguous
  int32_t* offsets = nullptr;  // [e+1]
  int32_t* slot_pos = nullptr;  // [t*k]
  int32_t* sorted_token = nullptr;  // [t*k]
};

struct MoeUnpermuteArgs {
  const void* y_sorted = nullptr;  // [r, h] contiguous
  DType in_dtype = DType::f32, out_dtype = DType::f32;
  const int32_t* slot_pos = nullptr;  // [t, k]
  const float* weights = nullptr;  // [t, k]
  int64_t t = 0, k = 0, h = 0, r = 0;
  void* out = nullptr;  // [t, h]
};

struct MoeGemmArgs {
  const void* x = nullptr;  // [r, kdim] contiguous
  const void* w = nullptr;  // [e, n, kdim] contiguous
  const int32_t* offsets = nullptr;  // [e+1]
  void* y = nullptr;  // [r, n] contiguous
  int64_t r = 0, e = 0, n = 0, kdim = 0;
  DType dtype = DType::bf16, out_dtype = DType::bf16;
  // moe_mlp's gate-up product: w [e, n, kdim] holds n / 2 gate rows then n / 2 up rows, and
  // y [r, n / 2] = silu(x w_gate^T) * (x w_up^T), from the fp32 accumulators
  bool swiglu = false;
};

namespace cpu {
void moe_topk_gating(const MoeGatingArgs& a);
void moe_permute(const MoePermuteArgs& a);
void moe_unpermute(const MoeUnpermuteArgs& a);
void moe_grouped_gemm(const MoeGemmArgs& a);
}  // namespace cpu
namespace cuda {
void moe_topk_gating(const MoeGatingArgs& a, void* stream);
void moe_permute(const MoePermuteArgs& a, void* stream);
void moe_unpermute(const MoeUnpermuteArgs& a, void* stream);
void moe_grouped_gemm(const MoeGemmArgs& a, void* stream);
// a.swiglu: the fused gate-up + SwiGLU product where a kernel supports it (Hopper, bf16 / f16);
// false: nothing was launched, the caller runs the product and the epilogue separately
bool moe_grouped_gemm_swiglu(const MoeGemmArgs& a, void* stream);
}  // namespace cuda

}  // namespace gk
