// Fused inference ops: normalization, gated activations, rotary/ALiBi/sinusoidal
// positions, KV cache append, decode and prefill attention. Storage dtypes
// float32, float16 and bfloat16; the math is fp32 on CUDA and fp64 in the CPU
// reference. Every op validates its arguments before
// any launch (ValueError/TypeError naming the argument), takes an optional
// stream (null: the device's current stream), never synchronizes the host and
// allocates only its outputs (and, for attention on CUDA, a workspace), so it can
// be captured in a graph. Exceptions: index arrays passed on the CPU to a CUDA op
// (kv_append, attention_*) are uploaded through pinned staging, validate=true
// syncs, and alibi_slopes copies from the host: keep those out of captures.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpukit/array.h"

namespace gk::nn {

// ---- normalization over the last dimension of x [..., H] ----
// y = x / sqrt(mean(x^2) + eps) * w           (gemma: * (1 + w))
// w: [H], same dtype as x. x's last dimension must be dense (stride 1); the
// leading dimensions may be strided.
Array rms_norm(const Array& x, const Array& w, double eps, bool gemma = false, const Stream* s = nullptr);
// Fused residual form: r = x + residual (rounded to x's dtype), y = rms_norm(r).
// One kernel; returns (y, r). residual has x's shape and dtype.
std::pair<Array, Array> rms_norm_residual(const Array& x, const Array& residual, const Array& w, double eps,
                                          bool gemma = false, const Stream* s = nullptr);
// y = (x - mean) / sqrt(var + eps) * w + b  (biased variance); b may be undefined (no bias).
Array layer_norm(const Array& x, const Array& w, const Array& b, double eps, const Stream* s = nullptr);

// ---- gated activations ----
enum class GatedAct : uint8_t { SwiGLU, GeGLU, GeGLUTanh, ReLU2 };
const char* gated_act_name(GatedAct a);
// act(gate) * up for gate and up of one shape [..., I] (up ignored and may be
// undefined for ReLU2, which is relu(x)^2 on `gate`).
Array gated(GatedAct act, const Array& gate, const Array& up, const Stream* s = nullptr);
// Fused form on one concatenated [..., 2I] tensor: gate = x[..., :I], up = x[..., I:].
Array gated_fused(GatedAct act, const Array& x, const Stream* s = nullptr);

// ---- rotary position embedding ----
// Frequency scaling of the rotary inverse-frequency table (as in the Hugging Face
// rope_scaling configs):
//  Linear: inv_freq / factor.
//  NTK:    theta * alpha^(rd / (rd - 2)) (alpha defaults to factor).
//  YaRN:   blend of inv_freq and inv_freq / factor with a linear ramp between the
//          correction dims of beta_fast and beta_slow over original_max_position;
//          cos and sin scaled by mscale (default 0.1 * ln(factor) + 1).
//  Llama3: wavelengths above original_max_position / low_freq_factor divided by
//          factor, below original_max_position / high_freq_factor kept, smooth between.
enum class RopeScalingKind : uint8_t { None, Linear, NTK, YaRN, Llama3 };
struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::None;
  double factor = 1.0;
  double alpha = 0.0;  // NTK; 0: use factor
  double original_max_position = 0.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  std::optional<double> mscale;  // YaRN attention factor
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
};
// The inverse frequencies (rotary_dim / 2 of them) in float64, and the cos/sin
// multiplier (1 except for YaRN). Validates the scaling parameters.
std::vector<double> rope_inv_freq(double theta, int rotary_dim, const RopeScaling& scaling, double* mscale = nullptr);
// Rotates q [T, Hq, D] and k [T, Hkv, D] (k may be undefined) by per-token
// positions [T] (int32/int64), over the first rotary_dim (default D) dims of each
// head: NeoX half-split pairs (i, i + rd/2) or interleaved pairs (2i, 2i + 1).
// cos/sin are computed in fp32 from the float64 table rounded to fp32.
// inplace: q and k are overwritten and returned; otherwise new contiguous arrays
// (dims past rotary_dim copied). Negative positions are a ValueError when
// positions are on the CPU; device-resident positions are not inspected (that
// would need a host sync) and a negative one simply rotates backwards.
std::pair<Array, Array> rope(const Array& q, const Array& k, const Array& positions, double theta = 10000.0,
                             std::optional<int> rotary_dim = std::nullopt, bool interleaved = false,
                             const RopeScaling& scaling = {}, bool inplace = false, const Stream* s = nullptr);

// ---- ALiBi and sinusoidal positions ----
// Slopes of the ALiBi paper for n_heads heads (float32 [n_heads]), computed on the
// host and copied to `device` (a setup-time call: not for graph capture on CUDA).
Array alibi_slopes(int n_heads, Device device = {}, const Stream* s = nullptr);
// bias[h, i, j] = slopes[h] * (j - (i + k_len - q_len)): 0 on the diagonal of the
// last q_len queries against k_len keys, -slope * distance for earlier keys.
// slopes: float32 [H]; result [H, q_len, k_len] of `dtype` (f32/f16/bf16).
Array alibi_bias(const Array& slopes, int64_t q_len, int64_t k_len, DType dtype = DType::f32,
                 const Stream* s = nullptr);
// Additive sinusoidal encodings: out[t, 2i] = sin(p_t * w_i), out[t, 2i+1] = cos(p_t * w_i),
// w_i = 1 / 10000^(2i / dim) (the same fp32 table method as rope). dim even, <= 1024.
Array sinusoidal_positions(const Array& positions, int dim, DType dtype = DType::f32, const Stream* s = nullptr);

// ---- KV cache append ----
// Writes new keys/values k_new, v_new [T, Hkv, D] into a cache pair k_cache,
// v_cache [num_blocks, block_size, Hkv, D] (dense) in place. Where token t goes:
//  - slot_mapping [T] (int32/int64): slot = block * block_size + offset; a
//    negative slot skips the token (padding).
//  - block_table [B, max_blocks] (int32) with seq_lens [B] (int32, the lengths
//    BEFORE the append): a paged cache (block_size 16..256); token j of sequence
//    b goes to position seq_lens[b] + j, i.e. block block_table[b, pos / bs].
//  - seq_lens alone: a contiguous cache [B, T_max, Hkv, D] (block = b).
//  The tokens of sequence b are cu_seqlens[b] .. cu_seqlens[b+1] (int32 [B+1]);
//  without cu_seqlens each sequence appends one token (T == B, decode).
// Cache dtype: that of k_new, or float8_e4m3fn with per-head float32 scales
// k_scale/v_scale [Hkv] (stored = fp8(x / scale)).
// Bounds (slots inside the pool, block ids inside the pool, seq_lens[b] + new
// tokens <= capacity) are checked on the host before any launch when the index
// arrays are on the CPU (they are then copied to the cache's device, stream
// ordered), or, with validate=true, by copying device index arrays to the host
// (a sync: not for graph capture). Unvalidated device index arrays are still
// safe: the kernel skips any token whose destination is outside the pool.
struct KvIndex {
  Array slot_mapping, block_table, seq_lens, cu_seqlens;  // undefined = absent
};
void kv_append(const Array& k_new, const Array& v_new, const Array& k_cache, const Array& v_cache,
               const KvIndex& index, const Array& k_scale = {}, const Array& v_scale = {}, bool validate = false,
               const Stream* s = nullptr);
// kv_append fused with RoPE on k (one kernel): k is rotated exactly as nn::rope
// rotates it (same options and cos/sin method, the result rounded to k's dtype)
// and then stored. positions [T] (int32/int64): the rotation position of each
// new token; undefined: its cache position (seq_lens[b] + j; required with a
// slot mapping). Negative positions are a ValueError when they are on the CPU.
// write_k: k_new is overwritten with the rotated keys too (for the attention
// call of a prefill step), even for tokens whose slot is skipped.
struct KvRope {
  Array positions;
  double theta = 10000.0;
  std::optional<int> rotary_dim;
  bool interleaved = false;
  RopeScaling scaling;
  bool write_k = false;
};
void kv_append(const Array& k_new, const Array& v_new, const Array& k_cache, const Array& v_cache,
               const KvIndex& index, const KvRope& rope, const Array& k_scale = {}, const Array& v_scale = {},
               bool validate = false, const Stream* s = nullptr);

// ---- decode attention ----
// One new query per sequence: q [B, Hq, D] against the cache k_cache, v_cache
// [num_blocks, block_size, Hkv, D] (paged, with block_table [B, max_blocks]
// int32, block_size 16..256) or [B, T_max, Hkv, D] (contiguous: block_table
// undefined). seq_lens [B] int32: the number of cached tokens of each sequence
// (the new one included). MHA/GQA/MQA: Hq % Hkv == 0; head_dim 64, 128 or 256.
// scale defaults to 1/sqrt(D); window w > 0 keeps the last w keys; softcap c > 0
// maps each scaled logit s to c * tanh(s / c). A sequence of length 0 gives 0.
// CUDA (flash-decoding): the attended keys [start, L) of a sequence are cut into
// chunks whose length depends only on that sequence's length, the window and
// fixed constants, never on the batch or the GPU; partial results combine in a
// fixed order, so the output bits of a sequence are reproducible and independent
// of the other sequences. bf16/fp16 caches run on the tensor cores
// (src/cuda/attention_decode_fold.cu: chunks of 32 * 2^k keys, at most 1024, the
// smallest giving at most 128 chunks, folded sequentially in groups of 8);
// float32 and fp8 caches on a CUDA-core kernel with chunks of kDecodeChunkMin *
// 2^k tokens (at most kDecodeChunkMax), the smallest giving at most
// kDecodeTargetSplits chunks, and at most 4 chunks while they are shorter than
// 4 * kDecodeChunkMin. (The environment variable
// GPUKIT_DECODE_SPLIT="min,max,target[,variant]", read at each call, overrides the
// three constants, and variant 1 forces the CUDA-core kernel: tuning knobs.)
// Bounds: as kv_append (host-visible seq_lens/block_table are checked before the
// launch, validate=true copies device ones to the host; otherwise the kernel
// clamps lengths to the capacity and masks keys of block ids outside the pool).
// A float8_e4m3fn cache (as written by kv_append) takes its per-head float32
// scales k_scale, v_scale [Hkv]: key = stored * k_scale.
constexpr int kDecodeChunkMin = 64, kDecodeChunkMax = 2048, kDecodeTargetSplits = 64;
Array attention_decode(const Array& q, const Array& k_cache, const Array& v_cache, const Array& seq_lens,
                       const Array& block_table = {}, std::optional<double> scale = std::nullopt,
                       std::optional<int64_t> window = std::nullopt, std::optional<double> softcap = std::nullopt,
                       const Array& k_scale = {}, const Array& v_scale = {}, bool validate = false,
                       const Stream* s = nullptr);

// ---- prefill attention ----
// q [Tq, Hq, D], k, v [Tk, Hkv, D] (packed tokens of B sequences given by
// cu_seqlens_q / cu_seqlens_k, int32 [B+1]; both undefined: one sequence).
// causal: query i of a sequence (Lq queries, Lk keys) sits at position
// p = i + Lk - Lq and sees keys j <= p (bottom-right aligned, so queries can
// attend to a cached prefix plus themselves); window w > 0 (causal only) keeps
// keys j > p - w. Rows without keys give 0. Same head/dtype rules as decode.
// On sm_90 (H100/H200) bf16/fp16 run on tensor cores (wgmma, TMA, warp-
// specialized; src/cuda/attention_prefill_sm90*.cu); other devices and float32
// use a CUDA-core kernel. Both are deterministic (fixed tile orders, no atomics).
Array attention_prefill(const Array& q, const Array& k, const Array& v, const Array& cu_seqlens_q = {},
                        const Array& cu_seqlens_k = {}, bool causal = true,
                        std::optional<double> scale = std::nullopt, std::optional<int64_t> window = std::nullopt,
                        std::optional<double> softcap = std::nullopt, const Stream* s = nullptr);

}  // namespace gk::nn
