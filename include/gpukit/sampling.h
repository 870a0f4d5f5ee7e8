// Token selection for LLM decoding: argmax, top-k, logit processors, filters and
// seeded sampling, fused into one batched, graph-capturable decode step.
//
// Logits are [B, V] (or [V], treated as one row), float32, bfloat16 or float16;
// rows may be strided (the last dimension must have stride 1, otherwise a
// contiguous copy is made). Results are float32 logits or int32 token ids.
//
// Definitions (the CPU reference and the CUDA kernels implement exactly these):
//  * Processing order: logit bias (x += bias), repetition penalty (CTRL: x > 0 ? x / r
//    : x * r) then frequency and presence (x -= frequency * count + presence) for
//    every token id in the row's history, banned ids and (while generated <
//    min_tokens) EOS ids set to -inf, then temperature (s = x / T).
//    History ids outside [0, V) are ignored; entries past the row's length are
//    never read. Lengths are clamped to [0, Hmax].
//  * Greedy: temperature <= 0 (or NaN) picks argmax (ties -> lowest index).
//  * Weights: m = max s, w_i = floor(exp(s_i - m) * 2^40) as an integer (the max
//    token weighs 2^40; tokens under 2^-40 of the max weigh 0 and are never drawn).
//    All masses below are exact integer sums of w.
//  * top-k (k in [1, V)): keep s_i >= the k-th largest s (ties at the boundary are
//    all kept). top-p (p in (0, 1)): over the top-k set, keep s_i >= tau where tau
//    is the largest value with mass(s >= tau) >= floor(p * mass(top-k set)) (ties
//    kept). min-p: keep exp(s_i - m) >= min_p (relative to the most likely token).
//    typical-p: over the set kept so far, with mean = sum(w (s - m)) / sum(w), keep
//    the tokens whose |(s_i - m) - mean| is smallest until their mass reaches
//    floor(typical_p * mass(set)) (ties kept). Order: top-k, top-p, min-p, typical.
//  * Draw: 64 random bits R = Philox4x32-10(key = seed, counter = (position, row tag, 0));
//    target t = floor(W * R / 2^64) with W the kept mass; the token is the first kept
//    id, scanning in vocabulary order, whose inclusive prefix of w exceeds t. If W is
//    0 (only possible with typical-p) the argmax is returned.
//  * Log-probabilities are log_softmax of the processed logits s (temperature 1 for
//    greedy rows), before the filters. Top-n: the n largest, ties -> lowest index.
//    On CUDA the normalizer is the exact integer sum of the weights (Z = sum w / 2^40,
//    within V * 2^-40 of sum exp(s - m)), so logprob bits do not depend on how a row is
//    partitioned; the CPU sums exp in double (the two agree to ~1e-7).
//  * Bad values: on the CPU, a row with NaN logits raises ValueError. On CUDA (no
//    host synchronization) NaN is treated as -inf. On both, +inf (also when bias,
//    penalty or temperature overflow) is treated as the largest finite float, and a row with no finite logit gives token -1 and
//    logprob NaN. Per-row parameter arrays are validated on the CPU (ValueError);
//    on CUDA out-of-range values disable that filter (top_k <= 0 or >= V, top_p or
//    typical_p outside (0, 1), min_p outside (0, 1], repetition penalty <= 0).
//    top_k <= 0 means "off" in per-row arrays; scalar arguments are checked strictly.
//  * exp: the weights, min-p and the sums use one exp (det_exp in src/ops/sampling_args.h)
//    built from singly rounded float operations, so the CPU and CUDA weights, masses,
//    thresholds and draws are bit-identical (penalties avoid FMA contraction likewise).
//  * CUDA limits: topk k <= 1024; at most 65535 rows per call for the sampling ops.
//    Design (decode_step / sample without typical-p or top-n, sm_90+, any batch size): one
//    launch, one thread-block cluster of 7-16 CTAs per row; each CTA keeps its slice of the
//    row in shared memory, radix selects on 8-bit digits (top-p's on a key linear in m - s)
//    sum their integer histograms over the cluster through distributed shared memory
//    (src/cuda/sampling_fused.cu; docs/sampling.md).
//    Otherwise (filters, processors, typical-p, top-n logprobs): each row is split into chunks of 2048 entries, one CTA per chunk, in a few
//    passes: processing (bias, penalties, bans, temperature) + max, a three-level radix
//    select per active filter (integer histograms merged with integer atomics), and a
//    final pass (kept masses, sum of exp, top-n candidates per chunk) whose last CTA per
//    row merges in chunk order and draws. No float atomics; the chunking depends only on
//    V, so a row's token and logprob bits do not depend on the batch, the run, or eager vs
//    graph replay.
#pragma once
#include <optional>
#include <utility>

#include "gpukit/array.h"

namespace gk::sampling {

// Per-row parameters: arrays of B values on the logits' device (any numeric dtype,
// converted), or undefined for the default of every row.
struct Params {
  Array temperature;         // default 1; <= 0: greedy
  Array top_k;               // default 0 (off)
  Array top_p;               // default 1 (off)
  Array min_p;               // default 0 (off)
  Array typical_p;           // default 1 (off)
  Array repetition_penalty;  // default 1 (off)
  Array presence_penalty;    // default 0
  Array frequency_penalty;   // default 0
  Array min_tokens;          // default 0: EOS masked while generated < min_tokens
};

// Logit processors' inputs (all optional).
struct Processors {
  Array history;          // int32 [B, Hmax] token ids
  Array history_lengths;  // int32 [B]
  Array logit_bias;       // float32 [V] or [B, V]
  Array banned;           // int32 [N] (every row) or [B, N]
  Array eos_ids;          // int32 [E]
  Array generated;        // int32 [B] tokens generated so far (for min_tokens)
};

struct DecodeResult {
  Array tokens;        // int32 [B]
  Array logprobs;      // float32 [B] (when asked)
  Array top_ids;       // int32 [B, n]
  Array top_logprobs;  // float32 [B, n]
};

Array argmax(const Array& logits, const Stream* s = nullptr);  // int32 [B]
// Values (float32) and int32 indices [B, k], sorted descending, ties -> lowest index.
std::pair<Array, Array> topk(const Array& logits, int64_t k, const Stream* s = nullptr);
Array apply_temperature(const Array& logits, double temperature, const Stream* s = nullptr);
Array apply_penalties(const Array& logits, const Array& history, const Array& lengths, double repetition,
                      double presence, double frequency, const Stream* s = nullptr);
Array apply_logit_bias(const Array& logits, const Array& bias, const Stream* s = nullptr);
Array ban_tokens(const Array& logits, const Array& ids, const Stream* s = nullptr);
Array apply_min_tokens(const Array& logits, const Array& eos_ids, const Array& generated, int64_t min_tokens,
                       const Stream* s = nullptr);

// Filters: float32 logits with the removed entries set to -inf.
Array top_k_filter(const Array& logits, int64_t k, const Stream* s = nullptr);
Array top_p_filter(const Array& logits, double p, const Stream* s = nullptr);
Array min_p_filter(const Array& logits, double min_p, const Stream* s = nullptr);
Array typical_p_filter(const Array& logits, double p, const Stream* s = nullptr);

struct SampleOptions {
  double temperature = 1.0;
  std::optional<int64_t> top_k;
  double top_p = 1.0, min_p = 0.0, typical_p = 1.0;
};
// One token per row; row r uses the row tag r (so rows differ under one seed).
Array sample(const Array& logits, const SampleOptions& o, uint64_t seed, int64_t position = 0,
             const Stream* s = nullptr);

// The fused step. seeds: int64/uint64 [B] (the row's identity), positions: int64 [B].
// No host synchronization on CUDA; capturable in a graph.
DecodeResult decode_step(const Array& logits, const Params& params, const Array& seeds, const Array& positions,
                         const Processors& proc = {}, bool return_logprobs = false, int top_logprobs = 0,
                         const Stream* s = nullptr);

}  // namespace gk::sampling
