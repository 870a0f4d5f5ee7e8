// Mixture of experts: top-k gating, permutation of tokens into expert order, the
// grouped GEMM that runs every expert in one launch, and the weighted un-permute.
// Deterministic on every backend: ties go to the lower expert, tokens keep their
// order inside an expert, and every sum runs in a fixed order.
#pragma once
#include <cstdint>
#include <optional>

#include "gpukit/array.h"
#include "gpukit/stream.h"

namespace gk {

struct MoeRouting {
  Array expert_ids;  // int32 [T, k]: chosen experts, by decreasing logit (ties: lower expert first)
  Array weights;     // float32 [T, k]: their softmax probabilities (renormalized over the k when asked)
};
// logits [T, E] (float32/float16/bfloat16): experts are chosen by logit (exact, the
// same on every backend); p = softmax(logits) in fp32 (max subtracted, the sum in
// increasing expert order); weights = p of the chosen experts, divided by their sum
// (in order j = 0..k-1) when renormalize (Mixtral: softmax over the top-k logits).
MoeRouting moe_topk_gating(const Array& logits, int64_t k, bool renormalize = true, const Stream* s = nullptr);

struct MoePermutation {
  Array x_sorted;  // [T*k, H]: rows of x grouped by expert (expert 0 first), token order kept inside an expert
  Array offsets;   // int32 [E+1]: rows offsets[e]..offsets[e+1] of x_sorted belong to expert e
  Array slot_pos;  // int32 [T, k]: row of x_sorted holding (token t, choice j)
  Array sorted_token;  // int32 [T*k]: the token of each row of x_sorted
};
// x [T, H], expert_ids int32 [T, k] with values in [0, num_experts).
MoePermutation moe_permute(const Array& x, const Array& expert_ids, int64_t num_experts, const Stream* s = nullptr);

// y[t] = sum_j weights[t, j] * y_sorted[slot_pos[t, j]] for j = 0..k-1 in that order,
// fp32, rounded once to out_dtype (default: y_sorted's dtype). y_sorted [R, H].
Array moe_unpermute(const Array& y_sorted, const Array& slot_pos, const Array& weights,
                    std::optional<DType> out_dtype = std::nullopt, const Stream* s = nullptr);

// Grouped GEMM over rows sorted by expert, one launch for all experts:
// y[r] = x[r] @ w[e]^T for offsets[e] <= r < offsets[e+1]; x [R, K], w [E, N, K]
// (torch Linear layout per expert), both bfloat16 or both float16 (float32 also works,
// on gpukit's kernel); offsets int32 [E+1] on x's device with offsets[0] = 0,
// offsets[E] = R (rows outside [0, offsets[E]) are left as zeros). fp32 accumulation in
// increasing k, rounded once to out_dtype (default x's dtype). The CUDA-core kernel
// (float32, or no tensor cores) gives the CPU's bits; the tensor-core kernels (bf16/f16:
// wgmma on Hopper, mma.sync elsewhere) are within fp32 accuracy of them, and the same
// bits on every run whatever the other experts' rows. validate: the offsets are checked
// on the host first (a copy: a sync). validate = false skips that (for offsets from
// moe_permute): nothing synchronizes the host and the call can be captured in a CUDA
// graph; the kernels clamp the offsets, so bad ones give wrong rows, never out-of-bounds
// accesses.
Array moe_grouped_gemm(const Array& x, const Array& w, const Array& offsets,
                       std::optional<DType> out_dtype = std::nullopt, const Stream* s = nullptr,
                       bool validate = true);

// The Mixtral expert MLP for x [T, H]: router logits = x @ gate_w^T (gate_w [E, H]),
// top-k gating (renormalized), then per chosen expert w2 @ (silu(w1 x) * (w3 x)) with
// w13 [E, 2I, H] = concat(w1, w3) per expert (gate rows first) and w2 [E, H, I], and
// the weighted sum. Intermediates: fp32 gate-up accumulators, SwiGLU rounded to x's
// dtype, down products rounded to x's dtype, the sum in fp32 rounded once.
Array moe_mlp(const Array& x, const Array& gate_w, const Array& w13, const Array& w2, int64_t top_k,
              const Stream* s = nullptr);

}  // namespace gk
