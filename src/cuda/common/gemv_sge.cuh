// The SwiGLU epilogue of the gate/up GEMV (EngineOptions::quantized_swiglu_epi; session 10, "sge"):
// the quantized decode GEMV of w = [gate; up] (N = 2 I rows) writes act[m, j] = SwiGLU(gate[j], up[j])
// ([M, I]) instead of gu[m, 0 .. 2 I), so the engine's SwiGLU launch (k_swiglu of
// src/cuda/llm_small.cu) goes away.
// - Row mapping (k_w8 XM 4, common/gemv_w8.cuh; k_w4 MODE 100 + M, common/gemv_w4.cuh): a CTA of
//   16 RT rows takes, in its m16 tile rt, gate rows j = b 8 RT + 8 rt + r (local rows r < 8) and the
//   up rows I + j (local rows r + 8), so the mma lane (g, t) that ends with rows g and g + 8 holds
//   gate[j] and up[j] of the same j. The copies, k order, accumulators, warp reduction and scales are
//   the kernel's, only the rows read are others: the sums are the unfused GEMV's bits.
// - Epilogue (sge_store): each sum rounded as store_out rounds it (the GEMV's output type), then
//   k_swiglu's own expression, convert<T>(gated_fn<SwiGLU, float>(float(g), float(u))), on those
//   values, rounded by the same conversion: the bits of GEMV -> SwiGLU (NaN, inf, saturation included).
// The host (gemv_w8.cu / gemv_w4_staged.cu) requires I % (8 RT) == 0 and no split-K.
#pragma once
#include "gemv.cuh"
#include "ops/nn_args.h"

namespace gk::cuda::gemv_detail {

// The weight row of local row r (0 .. 16 RT - 1) of CTA b when the rows are [gate; up] of I each.
template <int RT>
__device__ __forceinline__ int64_t sge_row(int64_t b, int r, int64_t n) {
  const int64_t j = b * 8 * RT + 8 * (r >> 4) + (r & 7);
  return (r & 8) ? n / 2 + j : j;
}

template <class T>
__device__ __forceinline__ void sge_put(void* y, int64_t i, float g, float u) {
  const T gt = convert<T>(g), ut = convert<T>(u);  // store_out's rounding (float: as it is)
  static_cast<T*>(y)[i] = convert<T>(gated_fn<nn::GatedAct::SwiGLU, float>(float(gt), float(ut)));
}

// act[i] = SwiGLU of the GEMV sums g (gate row) and u (up row), in the output type t.
__device__ __forceinline__ void sge_store(void* y, DType t, int64_t i, float g, float u) {
  if (t == DType::f32) sge_put<float>(y, i, g, u);
  else if (t == DType::bf16) sge_put<bf16>(y, i, g, u);
  else sge_put<f16>(y, i, g, u);
}

}  // namespace gk::cuda::gemv_detail
