// The LLM engine: model specs, weights, the transformer forward pass over a paged
// KV cache, and generation.
//
// Supported families (spec.cpp): "llama" (Llama 2/3/3.1/3.2 with rope scaling,
// Mistral, SmolLM2), "qwen2" (q/k/v bias), "qwen3" (q/k RMS norms), "gpt2"
// (learned absolute positions, LayerNorm with bias, GELU MLP with biases, fused
// qkv; gpt2.cpp), and Mixtral-style mixture of experts as llama with a sparse MLP
// (moe.cpp). Unknown architectures raise a ValueError listing the supported ones.
//
// Models load from a Hugging Face directory (config.json + *.safetensors, optional
// tokenizer.json) or a GGUF file (float formats directly, quantized tensors
// dequantized at load time). GGUF llama weights carry Q/K rows permuted by the
// llama.cpp converter to adjacent-pair rotary layout: they use interleaved rope;
// Hugging Face weights use the NeoX half-split rope.
//
// Several new tokens after a cached prefix (chunked prefill, later chat turns) run
// as a prefill whose attention gathers the sequence's keys/values from its pages.
// Decode steps run through a DecodeRunner (src/llm/decode.cpp): fixed device
// buffers for the per-step inputs and, on CUDA, one captured CUDA graph of the whole
// step (embedding .. lm head .. sampling) replayed per token.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpukit/array.h"
#include "gpukit/io.h"
#include "gpukit/nn.h"
#include "gpukit/quant.h"

namespace gk {
// Gathers rows of `table` [V, H] for the int32/int64 `ids` (any shape): result
// ids.shape + [H], table's dtype and device. Ids on the CPU are checked (IndexError
// for an id outside [0, V)); device-resident ids are not inspected and an
// out-of-range id gives a zero row.
Array embedding(const Array& ids, const Array& table, const Stream* s = nullptr);
}  // namespace gk

namespace gk::text {
class Tokenizer;
}

namespace gk::llm {

struct ModelConfig {
  std::string architecture;  // as written in the file ("llama", "mistral", "qwen2", ...)
  std::string family;        // the spec table entry: "llama", "qwen2", "qwen3", "gpt2"
  std::string format;        // "safetensors" or "gguf"
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t intermediate_size = 0, max_positions = 0;
  double rope_theta = 10000.0;
  int64_t rotary_dim = 0;          // 0: head_dim
  bool rope_interleaved = false;   // GGUF llama: adjacent pairs
  nn::RopeScaling rope_scaling;
  double norm_eps = 1e-6;
  bool tie_embeddings = false, qk_norm = false, attention_bias = false;
  int64_t sliding_window = 0;  // > 0: each token attends to the last sliding_window keys (itself included)
  int64_t num_experts = 0, experts_per_tok = 0;  // mixture of experts (Mixtral); 0: a dense MLP
  int64_t bos_id = -1;
  std::vector<int64_t> eos_ids;
  // From the family's spec (gpt2: true, "gelu_tanh", true): LayerNorm with bias
  // instead of RMSNorm, MLP activation ("silu" = SwiGLU; "gelu_tanh" / "gelu" =
  // plain up/down MLP with biases), learned absolute positions instead of rope.
  bool layer_norm = false;
  std::string activation = "silu";
  bool learned_positions = false;
};

std::vector<std::string> supported_architectures();
// From the text of a Hugging Face config.json.
ModelConfig config_from_hf_json(const std::string& text);
ModelConfig config_from_gguf(const io::GGUF& file);
std::string config_summary(const ModelConfig& c);

// The weights of one layer and of the model (HF naming of the roles).
struct LayerWeights {
  Array attn_norm, q, k, v, o, q_bias, k_bias, v_bias, q_norm, k_norm, ffn_norm, gate, up, down;
  // Made by prepare_weights: q/k/v (and their biases) and gate/up concatenated along
  // the output rows, one matrix per layer; q, k, v, gate and up are then views into them.
  Array qkv, qkv_bias, gate_up;  // [Q + 2 KV, H], [Q + 2 KV], [2 I, H]
  // quantize= option: the linear weights in a gk::quantize_weight format (format empty
  // when not quantized; the float weights above are then released).
  QuantizedWeight qkv_q, o_q, gate_up_q, down_q;
  // gpt2: qkv above is loaded fused [3 * Hq * D, H]; the biases of the norms and projections
  Array o_bias, attn_norm_bias, ffn_norm_bias, up_bias, down_bias;
  // mixture of experts (src/llm/moe.cpp): router [E, H], experts' w1;w3 [E, 2I, H], w2 [E, H, I]
  Array moe_gate, moe_w13, moe_w2;
  std::vector<Array> moe_parts;  // the expert tensors as read, until they are stacked
};
struct Weights {
  Array embed, final_norm, lm_head;  // lm_head == embed when tied
  Array pos_embed, final_norm_bias;  // gpt2: learned positions [max_positions, H], LayerNorm bias
  std::vector<LayerWeights> layers;
  size_t nbytes = 0;
  std::string quantized;  // "", "fp8", "int8", "int4"
  // quantize=: the lm head too (int8 for int4 models, else the same format); the
  // embedding table stays in the model dtype for the row gathers.
  QuantizedWeight lm_head_q;
};
// progress(done, total) after each tensor (may be empty).
using Progress = std::function<void(int64_t, int64_t)>;
Weights load_weights(const ModelConfig& c, const std::string& path, Device device, DType dtype,
                     const Progress& progress = {});

// Random weights for a config (benchmarks): unit-variance embeddings, weights scaled by
// 1/sqrt(fan_in), norms near 1; made on the host one tensor at a time.
// share_layers: every layer gets a device copy of layer 0's draw (fast set-up of big
// models for benchmarks; the layers still own separate memory).
Weights random_weights(const ModelConfig& c, Device device, DType dtype, uint64_t seed = 0,
                       bool share_layers = false);

// Load-time preparation: concatenates q/k/v (+ biases) and gate/up of each layer, and
// with quantize ("fp8", "int8", "int4": gk::quantize_weight, int4 in groups of 128, or
// 64 / 32 where K is not a multiple of 128)
// replaces the linear weights of the layers by their quantized form, and adds a
// quantized lm head (int8 for int4 models; the embedding table stays as it is). share_layers: quantize layer 0 and copy it (random
// benchmark weights only).
void prepare_weights(const ModelConfig& c, Weights& w, const std::string& quantize = "", bool share_layers = false);

// A paged KV cache: per layer one pool [num_blocks, block_size, Hkv, D] allocated up
// front; sequences take pages from a free list as they grow (never copied).
class KvCache {
 public:
  KvCache(const ModelConfig& c, int64_t num_blocks, int64_t block_size, Device device, DType dtype);
  int64_t add_sequence();              // a new empty sequence; returns its id
  void release(int64_t seq);           // frees its pages
  int64_t length(int64_t seq) const;
  // Reserves pages so that `seq` can hold `length` tokens (ValueError when the pool is full).
  void reserve(int64_t seq, int64_t length);
  void advance(int64_t seq, int64_t n);  // records n appended tokens
  // Forgets all but the first `length` tokens (their pages stay with the sequence).
  void truncate(int64_t seq, int64_t length);
  // Tokens the free pages plus `seq`'s own pages can hold.
  int64_t capacity(int64_t seq) const;
  // int32 [B, max_blocks] block table of `seqs` (CPU).
  Array block_table(const std::vector<int64_t>& seqs) const;
  const std::vector<int32_t>& pages(int64_t seq) const { return pages_.at(seq); }
  int64_t num_blocks() const { return k.empty() ? 0 : k[0].shape(0); }
  int64_t block_size() const { return bs_; }
  int64_t free_blocks() const { return int64_t(free_.size()); }
  std::vector<Array> k, v;  // per layer

 private:
  int64_t bs_;
  std::vector<int32_t> free_;
  std::map<int64_t, std::vector<int32_t>> pages_;
  std::map<int64_t, int64_t> len_;
  int64_t next_id_ = 0;
};

// The inputs of one decode step (one new token per sequence), all int32 arrays on
// the model's device, so that the step can be captured in a CUDA graph and replayed
// after the buffers are rewritten.
struct DecodeBatch {
  Array ids;          // [B] the new tokens
  Array positions;    // [B] their positions = the cached lengths before the step
  Array lengths;      // [B] the lengths after the step (positions + 1)
  Array block_table;  // [B, max_blocks] pages of each sequence (entries past its pages: any id)
};

struct SideBranch;  // src/llm/model.cpp

// Engine switches of a model.
struct EngineOptions {
  bool cuda_graph = true;  // capture the decode step in a CUDA graph on CUDA
  bool use_gemv = true;    // decode projections (<= 8 rows) through gk::gemv instead of matmul
  int64_t gemv_min_elems = 0;  // ... for weights of at least this many elements (smaller: cuBLASLt)
  // How the layers are composed (the environment sets the default of a new model:
  // GPUKIT_ENGINE_FUSION=0/1/2, or GPUKIT_ENGINE_UNFUSED=1 for 0):
  // 2 (default): decode steps on CUDA run the engine's own kernels (src/llm/fused.h):
  //   the q/k/v, o, down projections and gate/up + SwiGLU as one GEMV each (bf16/f16
  //   weights, <= 8 rows; quantized weights keep gemv_quantized), q/k RoPE + KV append
  //   in one launch, residual add + RMSNorm in one launch, chained with programmatic
  //   dependent launch (GPUKIT_PDL=0 turns that off); prefill and the CPU as level 1;
  // 1: the gk::nn fused ops (rms_norm_residual, rope then kv_append, gated_fused SwiGLU)
  //   with the concatenated q/k/v and gate/up weights through gk::gemv / cuBLASLt;
  // 0: the unfused composition (the "before" of the fused kernels): separate q, k, v and
  //   gate, up projections (bias added separately), add then rms_norm, rope then
  //   kv_append, silu then mul. All levels compute the same model (same rounding steps
  //   up to the order of the sums inside the projections).
  int fusion = 2;
  // Level 2: the q/k/v GEMV also rotates q and k and stores k, v into the cache (one
  // launch instead of GEMV + rope_append; the same bits). Not with q/k norm. Off by
  // default (H200, checkpoint B: 8B 216.9 vs 219.1 tok/s, 1B 948 vs 977 once rope_append
  // was one thread per item). The environment sets the default: GPUKIT_ROPE_IN_QKV=0/1.
  bool rope_in_qkv = false;
  // Level 2 decode: the residual add + RMSNorm after the o and down projections is done by
  // the projection's last block instead of its own launch (the same bits). Off by default
  // (checkpoint B: 8B 211.4 vs 216.9 tok/s, 1B 914 vs 948: the last block's serial norm
  // costs more than the PDL-overlapped launch). Default from GPUKIT_NORM_IN_TAIL=0/1.
  bool norm_in_tail = false;
  // Level 2 decode: while RoPE and attention run (the weights' memory bandwidth idle), a
  // side branch of the step prefetches into L2 up to this many MiB of the weights that
  // come next: the output projection, then the first rows of gate/up. 0: off. Default
  // from GPUKIT_PREFETCH_MB; GPUKIT_PREFETCH_LAST=1 (prefetch_last) marks the lines
  // evict-last.
  int64_t prefetch_mb = 0;
  bool prefetch_last = false;
  // Level 2 decode, bf16/fp16 weights: the lm head through the engine's GEMV (float32
  // logits, PDL-chained) instead of gk::gemv. Default from GPUKIT_HEAD_PROJ.
  bool head_proj = false;
  // Level 2 decode: the embedding gather and the first RMSNorm in one PDL-chained launch.
  // Default from GPUKIT_EMBED_NORM (on).
  bool embed_norm = true;
  // Prefill (more than 8 rows) with quantized weights on CUDA: the weight expanded to
  // bf16/fp16 and cuBLASLt, instead of the GEMV per 8 rows. Default from
  // GPUKIT_DEQUANT_PREFILL (on).
  bool dequant_prefill = true;
  // Level 2 decode, bf16/fp16 cache, no q/k norm or sliding window: RoPE, the KV append
  // and attention in one PDL-chained launch (src/cuda/llm_attention.cu) when the step's
  // block table spans at most fused_attention_max_keys keys; else rope_append +
  // attention_decode. Default from GPUKIT_FUSED_ATTN.
  bool fused_attention = false;
  // ... and without it, where measured faster (H200, session 5, checkpoint A: 8B bf16
  // 230.7 tok/s against 227.1; 1B 1103 against 1130, quantized slower): bf16/fp16 weights,
  // head_dim 128, a block table of at most 384 keys. Default from GPUKIT_FUSED_ATTN_AUTO.
  bool fused_attention_auto = true;
  // ... auto also takes head_dim 64 (bf16/fp16 weights, <= 384 keys): with the push merge
  // (fused_attention_push_auto) in fused_attention_chunk keys per CTA, without it one CTA
  // per kv head (the chunk-0 rule) unless fused_attention is set explicitly. H200, session 7,
  // checkpoint A (1B, b1): fa+fapush 1164.0 tok/s, fa+fac0 1155.1, faa64 (chunk 0) 1149.1,
  // fa (pull merge) 1129.9, rope_append + attention_decode 1127.9. Default from
  // GPUKIT_FUSED_ATTN_AUTO_HD64.
  bool fused_attention_auto_hd64 = true;
  // ... auto also takes fp8 weights (head_dim 128, <= 384 keys); meant together with
  // quantized_attention_pdl. Session 7, checkpoint A (8B, b1): fp8 fa+qapdl+fapush 367.4
  // tok/s against 361.5 for rope_append + attention_decode; int4 395.6 against 408.5. int4
  // too since session 8 (its verify run, with fused_attention_wide 4: 8B int4 509.6 tok/s
  // against 500.3); int8 since session 16 (docs/notes/s16.md). Default from GPUKIT_FUSED_ATTN_AUTO_QUANT.
  bool fused_attention_auto_quant = true;
  int64_t fused_attention_max_keys = 4096;
  // keys per CTA: 64, 128, 256 or 384 (one thread per key), or 0: the smallest of 128 / 256 /
  // 384 that holds the step's block table (one CTA per kv head and sequence), else 128; -1 (the
  // default since session 12): 64 with fp8 (and since session 16 int8) weights, else 128. 64 with fp8: with the 8-bit GEMVs'
  // 5-warp q/k/v CTAs (session 12) the attention's 40 KB CTAs find room beside them sooner than
  // the 77 KB ones of 128 keys (H200, 8B fp8 b1 decode tok/s, 64 / 128 with fused_attention_wide
  // 4: session 12 checkpoint C 412.0 / 400.0 and 411.9 / 399.9, final run 405.9 / 399.3 and
  // 406.8 / 399.6; int4 slower: 526.1 / 537.4). int4 with 64 measured again in session 15 with its new GEMV (k_w4i and
  // the SwiGLU epilogue; run s15-D, 8B decode tok/s, 64 / 128): b1 615.0 / 601.8, b2 970.4 / 957.0, b4 1769.0 / 1734.2,
  // but b8 2787.7 / 2980.4 (1B b1 1835.4 / 1838.1), so int4 keeps 128: a chunk chosen by batch size would make a
  // sequence's bits depend on its batch. (GPUKIT_FUSED_ATTN_CHUNK)
  int fused_attention_chunk = -1;
  // Where its CTAs let the output projection launch (PDL; GPUKIT_FUSED_ATTN_TRIGGER):
  // 0 before waiting for the q/k/v projection, 1 after reading its output, 2 after P V,
  // 3 at exit. The same bits for every value.
  int fused_attention_trigger = 0;
  // Chunks of 64 / 128 keys, 2 to 8 of them: the chunks of a (sequence, kv head) form a
  // thread block cluster and merge through distributed shared memory instead of the
  // workspace + counter merge (the same bits; checkpoint A, 8B: 230.7 tok/s against 228.3).
  // GPUKIT_FUSED_ATTN_CLUSTER.
  bool fused_attention_cluster = true;
  // The fused attention's score pass on the tensor cores (mma.m16n8k16, a warp's 32 keys x
  // the group's heads) and its P V pass with 16-byte V reads (each thread 8 dimensions of
  // every KG-th key, the key groups added in order), the output staged in shared memory.
  // Session 5's phase stamps (8B, one CTA per kv head): scores + softmax 4.2 us and P V
  // 3.0 us after the keys landed; the old P V issues ~640 shared loads per thread (one per
  // key and head). Other bits than without (both within rounding of float64 attention;
  // each the same bits run to run, graph and eager, cluster and workspace merge).
  // H200, session 6, checkpoint A (8B bf16, b1): 237.9 tok/s against 230.8 (phase stamps:
  // scores + softmax 2.2 us against 5.1, the CTA 12.8 us against 16.7); 1B not affected
  // (head_dim 64 takes rope_append + attention_decode). Default from GPUKIT_FUSED_ATTN_MMA.
  bool fused_attention_mma = true;
  // The fused attention's CTAs ask for at least this many KiB of dynamic shared memory
  // (0: only what they use; capped at a CTA's maximum), so that the o GEMV's blocks
  // launched early (trigger 0) do not share their SMs: checkpoint A's stamps show the 16
  // CTAs' P V ending 6.4 to 10.0 us after their entry for the same work. The same bits.
  // Unmeasured at the time of writing. Default from GPUKIT_FUSED_ATTN_PAD_KB.
  int fused_attention_pad_kb = 0;
  // The fused attention's cluster merge by push (with fused_attention_cluster and
  // fused_attention_mma): chunks 1..S-1 store their partials into chunk 0's shared memory
  // with st.async, counted on an mbarrier there (no release barrier = no MEMBAR.ALL.GPU, no
  // second barrier, no remote loads); chunk 0 merges in the same order: the same bits.
  // Session 6's stamps: the merge is the CTA's largest phase (~4.4 us after P V).
  // Everywhere the cluster merge runs; default off (session 7, checkpoint A, 8B bf16: 237.7
  // and 237.6 tok/s against 238.5 and 238.6 without). Default from GPUKIT_FUSED_ATTN_PUSH.
  bool fused_attention_push = false;
  // ... and where measured faster without fused_attention_push: head_dim 64 and quantized
  // weights (checkpoint A: 1B fa 1129.9 -> fa+fapush 1164.0; fp8 fa+qapdl 364.6 -> 367.4;
  // int4 395.4 -> 395.6). Default from GPUKIT_FUSED_ATTN_PUSH_AUTO.
  bool fused_attention_push_auto = true;
  // The fused attention (MMA passes, chunks of 64 / 128 keys) computes its rotations' cos /
  // sin (times the rope mscale) and the new token's cache slot before its PDL wait instead
  // of after it: they depend on the positions, the block table and the frequencies only,
  // all written before the step. After the wait only the q/k/v loads, the rotations and
  // the append remain before the keys' scores. The same bits. Session 7's stamps (8B bf16):
  // 1.7 us from the wait's return to q/k/v read + RoPE + append, on the layer's critical
  // path. Off: session 8's checkpoint A, 8B bf16 b1 235.3 tok/s against 238.0 without (fp8
  // 372.3 / 369.8, 1B 1154.3 / 1159.6). Default from GPUKIT_FUSED_ATTN_EARLY.
  bool fused_attention_early_rope = false;
  // The fused attention (MMA passes, chunks of 64 / 128 keys) with 2 or 4 times the warps per
  // CTA (8 or 16 for 128-key chunks; 0: off): its 16-key score tiles spread over the warps,
  // P V's threads repeated with the heads of each block of 4 split between the copies, the
  // q/k/v loads, rotations and merges over more threads. Every sum keeps its order: the same
  // bits. Session 8's checkpoint A stamps (8B bf16, layer 5, 16 CTAs of 4 warps): ~2.5 us
  // scores + softmax and ~2.6 us P V for ~1000 instructions per warp, one warp per SM
  // sub-partition (no latency hidden). fused_attention_early_rope is ignored with it.
  // 4 since session 8's final run (b1 decode tok/s, 0 / 2 / 4: 8B bf16 241.6 / 246.1 / 248.7,
  // 8B fp8 374.1 / 382.8 / 387.0, 1B 1164.1 / 1202.2 / 1200.4). -1 (the default since session 16):
  // 2 with int4 weights, else 4 where the launch's CTAs (sequences x kv heads x chunks of the table)
  // fit two per SM (32K registers each), else 2; the same bits either way (run s16-A, 8B int4 b1 /
  // b8 with 4 / 2: 600.7 / 611.0, 3035.5 / 3068.5; fp8 b8 2826.8 / 2936.5: docs/notes/s16.md).
  // Default from GPUKIT_FUSED_ATTN_WIDE (-1, 0, 2 or 4).
  int fused_attention_wide = -1;
  // Level 2 decode, bf16/fp16 weights, one sequence: the engine GEMV launched right after
  // the fused attention (the output projection; rows of <= 4096 elements) runs in blocks of
  // 8 rows, 4 loaded into registers and 4 into shared memory (cp.async), both before its PDL
  // wait: its 512 blocks (8B) are resident at once and all 33.5 MB are requested while the
  // attention runs. Session 7's trace (8B bf16): the o GEMV ends 9.9 us after the attention,
  // its first wave (~17 MB, 4 blocks of 4 rows per SM) loaded during the attention, the
  // second wave read after it. The same bits. On since session 8's checkpoint A (8B bf16 b1:
  // 238.0 -> 240.1 tok/s, with fused_attention_early_rope 235.3 -> 237.5; 1B 1159.6 ->
  // 1161.5). Default from GPUKIT_O_PROJ_STAGE.
  bool o_proj_stage = true;
  // Level 2 decode: the kernel before the output projection that runs while its weights'
  // bandwidth idles (rope_append, or the fused attention) brings that weight into L2 before
  // its PDL wait (bulk prefetch): 0 off, 1 the second half of its rows (the first half is
  // what the o GEMV's first blocks load themselves when launched early), 2 all of it.
  // Steps of up to 8 sequences. Slower (checkpoint A, 8B: 212.6 tok/s with 2 against 227.1:
  // the prefetched lines do not survive the q/k/v GEMV's stream). 3 / 4: as 1 / 2, but the
  // fused attention issues the prefetch after its cached K/V have landed in shared memory
  // (the q/k/v GEMV has ended, the rest of its work is on chip; session 5's slowdown was the
  // prefetch queued ahead of those loads); rope_append as 1 / 2. Unmeasured (session 7).
  // Default from GPUKIT_ATTN_L2.
  int attn_l2 = 0;
  // Level 2 decode, bf16/fp16 weights, <= 8 sequences: the q/k/v GEMV's last 32 blocks
  // bring the layer's KV cache pages of the step's sequences into L2 (bulk prefetch) before
  // their weights, so that the attention after it reads them from L2. Unmeasured at the
  // time of writing. Default from GPUKIT_KV_L2.
  bool kv_l2 = false;
  // Level 2 decode: the preferred shared memory carveout of the engine's kernels (percent
  // of the SM's unified L1 / shared memory; -1: the driver's choice). Checkpoint A's trace
  // (8B) shows the fused attention with 144 KB of shared memory per CTA starting 1.3 us
  // before the q/k/v GEMV ends, the 76-KB one and rope_append ~3 us before: a CTA that
  // needs more shared memory than the SM's current split (set for the GEMV, 1 KB per
  // block) may have to wait for the SM to drain (the 144-KB variant is also short of
  // registers beside 4 GEMV blocks). 100: every engine kernel prefers the
  // largest split, so the attention's CTAs can become resident beside the GEMV's last
  // blocks and load their keys and values before the wait. The same bits. Unmeasured at
  // the time of writing. Default from GPUKIT_CARVEOUT.
  int carveout = -1;
  // Level 2 decode, bf16/fp16 weights, one sequence: the engine GEMV's weight loads carry
  // an L2 evict-first policy (createpolicy), so that the ~440 MB of weights streamed per
  // layer (8B) stop evicting what the small kernels reuse from L2: their code, the
  // activations and the KV cache. Session 5's phase stamps show the fused attention
  // spending ~2 us per ~1000 instructions of straight-line code where the work itself is
  // short (cold instruction fetches from HBM were the suspect). The same bits (only a cache
  // hint). No effect measured (session 6, checkpoint A: 8B 231.1 tok/s against 230.8, with
  // the mma attention 237.6 against 237.9; 1B 1104.1 against 1105.6; the stamps unchanged):
  // the instruction-fetch suspicion is not supported. Default from GPUKIT_WEIGHTS_EF.
  bool weights_evict_first = false;
  // ... and for quantized weights (whose GEMVs are not the engine's kernels): each decode
  // GEMV launches into the stream with an L2 access policy window over its codes (the first
  // cudaDevAttrMaxAccessPolicyWindowSize bytes) marked streaming (evict-first). The same
  // bits. H200, session 6, checkpoint A (8B, b1): int4 395.5 tok/s against 377.0, fp8 349.8
  // against 338.0. Default from GPUKIT_QUANT_STREAMING.
  bool quant_streaming = true;
  // Level 2 decode, bf16/fp16 weights: no RMSNorm launches. The o and down GEMVs add the
  // residual in their epilogue; the q/k/v and gate/up GEMVs (and the lm head with
  // head_proj) read the raw residual and apply the norm inside: the product with
  // r * norm_w scaled by rsqrt(mean(r^2) + eps) at the end (the normalized row is not
  // rounded to the weight type: not the same bits as the separate norm). Default from
  // GPUKIT_NORM_IN_PROJ.
  bool norm_in_proj = false;
  // Level 2 decode with quantized weights: the engine's own launches between the
  // gemv_quantized ones (norms, SwiGLU, RoPE + append, attention) use PDL. Off by default:
  // a kernel launched early parks its blocks beside the quantized GEMV (H200, session 5,
  // checkpoint A: 8B fp8 352.6 tok/s without against 336.1 with, int4 403.3 against 406.3;
  // session 4 B: fp8 302.3 / 292.6, int4 306.1 / 283.0). Default from GPUKIT_QUANT_PDL.
  bool quantized_pdl = false;
  // ... and fp8 weights take quantized_pdl whatever its value (session 7's final run, 8B fp8
  // b1, with the fused attention of fused_attention_auto_quant: 374.8 tok/s with quantized_pdl
  // against 364.5 without; checkpoint A, without the fused attention: 366.4 / 361.5; int4 at
  // checkpoint A: 400.9 / 408.5, so not int4). The same bits. Default from GPUKIT_QUANT_PDL_FP8.
  bool quantized_pdl_fp8 = true;
  // ... and with quantized_pdl: the SwiGLU and rope_append grids capped at 4 blocks and the
  // fused attention launched without PDL, so that the kernels launched early and parked
  // until the quantized GEMV before them ends take few of its SMs' slots (checkpoint A:
  // slower, fp8 311.5 and int4 368.6 tok/s: each thread's grid-stride items run one after
  // the other). Default from GPUKIT_QUANT_PDL_COMPACT.
  bool quantized_pdl_compact = false;
  // Quantized weights without quantized_pdl (int4 / int8): PDL for the add_rms_norm launches
  // only (bit 1; one block per row: nothing of the GEMV's slots taken while it waits) and /
  // or the SwiGLU launches (bit 2); the rest as without PDL. Session 7's int4 trace
  // (checkpoint A, plan 8): each add_rms_norm 3.4 us and SwiGLU 1.3 us, each after a gap, ~8
  // us of a ~75 us layer. The same bits. 2 since session 8's checkpoint A (8B int4 b1: 485.2
  // tok/s with 0, 489.0 with 1, 499.8 with 2, 497.7 with 3). 3 since session 9's checkpoint
  // (the int4 fused attention in the chain since session 8's verify): 8B int4 b1 508.3 / 508.1
  // tok/s with 2, 525.2 / 525.4 with 3; 1B int4 1566.0 -> 1589.1; 8B int8 366.1 -> 365.1
  // (docs/device-runs/2026-11-30-h200-s9-ckptB-{1,2}.log). Default from GPUKIT_QUANT_SMALL_PDL (0..3).
  int quantized_small_pdl = 3;
  // Quantized weights with quantized_pdl off: the fused attention (fused_attention) still
  // launched with PDL, alone, so that its CTAs start as the q/k/v GEMV's last blocks start
  // (the quantized GEMVs trigger at their blocks' start) and load the cached K/V before
  // their wait; the norms / SwiGLU stay without (quantized_pdl's cost). The same bits.
  // Session 7, checkpoint A (8B, b1): with the fused attention int4 383.2 -> 395.4 tok/s,
  // fp8 355.5 -> 364.6. Default from GPUKIT_QUANT_ATTN_PDL.
  bool quantized_attention_pdl = true;
  // Level 2 decode with fp8 / int8 weights (bf16 x): the staged GEMV (src/cuda/gemv_w8.cu)
  // takes a ring deep enough to hold each warp's whole k range where all its CTAs can be
  // resident at once with it, so that every weight byte is requested before the GEMV's PDL
  // wait (the usual ring of 2: half or a third of them). A mask: bit 1 the GEMVs with more
  // rows than columns (8B: q/k/v, 6144 x 4096, 3 stages per warp), bit 2 the others (8B:
  // the output projection, 4096 x 4096, 2 stages; gate/up, down and the lm head never fit).
  // Session 8's checkpoint A trace (8B fp8 b1): the q/k/v GEMV ends 11 us after the norm
  // before it for 6.1 us of weight bytes, the o GEMV 5.1 us after the attention for 4.1.
  // The same bits (the same warps and split-K). Unmeasured at the time of writing.
  int quantized_full_ring = 0;
  // Level 2 decode with fp8 / int8 weights (bf16, M <= 8): the residual add + RMSNorm before
  // the q/k/v, gate/up and lm head GEMVs also writes the staged GEMV's scaled fp16 copy of its
  // output (each row times 2^c so that its largest |value| lands in [2^14, 2^15); session 5's
  // x kernel, src/cuda/gemv_w8.cu), and those GEMVs read it: fp8 codes become fp16 in one
  // instruction per pair (cvt.rn.f16x2.e4m3x2) instead of the four of the exact-bf16 decode.
  // Session 8's final run, standalone M = 1, % of copy at (K, N) = (4096, 14336) / (14336,
  // 4096) / (4096, 128256): fp8 with bf16 x 86 / 86 / 99, with fp16 x 89 / 88 / 101. The same
  // bits (the products are the bf16 ones times 2^c, exact; rows whose values span more than
  // ~2^30 could differ in their smallest terms). Unmeasured in the engine at the time of writing.
  bool quantized_x_prep = false;
  // Level 2 decode with int4 weights (groups of 128, bf16): the SwiGLU in the gate/up GEMV's epilogue where that GEMV
  // runs on the integer tensor cores (gk::gemv_quantized_swiglu: the default int4 kernel, K % 512 == 0, no split-K),
  // one launch fewer per layer; elsewhere the GEMV then the SwiGLU launch. The same bits (g and u rounded to the
  // weight type, then k_swiglu's arithmetic). Default from GPUKIT_QUANT_SWIGLU.
  bool quantized_swiglu = true;
};

class Model {
 public:
  // quantize: "", "fp8", "int8" or "int4" (see prepare_weights).
  static std::shared_ptr<Model> load(const std::string& path, Device device = {}, DType dtype = DType::f32,
                                     const Progress& progress = {}, const std::string& quantize = "");
  // A model with random weights and no tokenizer (benchmarks, tests).
  static std::shared_ptr<Model> random(const ModelConfig& c, Device device = {}, DType dtype = DType::f32,
                                       uint64_t seed = 0, const std::string& quantize = "",
                                       bool share_layers = false);
  EngineOptions& options() { return opt_; }
  const EngineOptions& options() const { return opt_; }
  // Layers run through the fused decode attention since the model was made (tests).
  int64_t fused_attention_layers() const { return fa_layers_; }
  // ... of them with the push merge (fused_attention_push, _push_auto; tests).
  int64_t fused_attention_push_layers() const { return fa_push_layers_; }
  // ... of them with more warps per CTA (EngineOptions::fused_attention_wide taken)
  int64_t fused_attention_wide_layers() const { return fa_wide_layers_; }
  // ... of them with 4 times the warps (fused_attention_wide 4, or -1 where it chose 4)
  int64_t fused_attention_wide4_layers() const { return fa_wide4_layers_; }
  // Debug: from now on the fused attention of layer `layer` (-1: none) writes per CTA 8
  // %globaltimer stamps (fused::AttnStampScope) into attention_stamps() at every decode
  // step (graph replays included): int64 [512, 8] on the model's device (one buffer for
  // the model's life), zeroed at each call with layer >= 0.
  void set_attention_stamps(int layer);
  Array attention_stamps() const { return stamps_; }
  // One decode step over device-resident inputs (no host synchronization, nothing
  // read back; capturable): float32 logits [B, V]. The caller has reserved the pages
  // and advances the cache lengths afterwards.
  // argmax_keys (int64 [B] device zeros, see head_argmax()): the lm head also folds each
  // row's greedy token into it (fused::advance_argmax reads and resets it).
  Array decode_batch(KvCache& cache, const DecodeBatch& in, const Array& argmax_keys = {});
  // Whether decode_batch can fold the greedy token into the lm head for B rows (level 2,
  // CUDA, a dense bf16/fp16 head through the engine's GEMV: head_proj).
  bool head_argmax(int64_t B) const;
  // Profiling: when set, run_layers calls it after each op ("embed", "qkv", "rope",
  // ...) with the layer index (-1 outside the layers); used by gk.llm's profile().
  std::function<void(const char*, int)> op_hook;
  const ModelConfig& config() const { return cfg_; }
  const Weights& weights() const { return w_; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  // null when the model has no tokenizer (a safetensors directory without tokenizer.json)
  const text::Tokenizer* tokenizer() const { return tok_.get(); }
  std::string chat_template() const;

  // Appends the tokens of each sequence to its cache and returns float32 logits:
  // [sum of tokens, V] with all_logits, else [B, V] (each sequence's last token).
  // One token per sequence with a cached prefix: a batched decode step; otherwise a
  // (chunked) prefill. Empty token lists, ids outside the vocabulary and sequences
  // that would outgrow the context are errors.
  Array step(KvCache& cache, const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& tokens,
             bool all_logits);
  // Logits [T, V] of one fresh sequence (a scratch cache).
  Array forward(const std::vector<int32_t>& ids);
  KvCache make_cache(const std::vector<int64_t>& lengths, int64_t block_size = 16) const;

 private:
  Array prefill(KvCache& cache, const std::vector<int64_t>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                bool all_logits);
  Array decode(KvCache& cache, const std::vector<int64_t>& seqs, const std::vector<int32_t>& tokens);
  Array run_layers(const Array& ids, const Array& positions, KvCache& cache, const nn::KvIndex& idx,
                   const std::function<Array(const Array&, const Array&, const Array&, int)>& attend);
  // y = x @ W^T (+ bias) through the fastest path for the rows of x and the weight form.
  Array project(const Array& x, const Array& w, const QuantizedWeight& qw, const Array& bias = {},
                std::optional<DType> out = std::nullopt) const;
  Array project_swiglu(const Array& x, const QuantizedWeight& qw) const;  // undefined where not fused
  Array lm_head(const Array& h, const Array* argmax_keys = nullptr) const;
  Array mlp(const LayerWeights& L, const Array& h, int layer) const;
  Array add_norm(const Array& x, Array& resid, const Array& w, int layer) const;
  bool engine_ops() const;                    // fusion level 2 decode step on CUDA
  bool engine_proj(const Array& x) const;     // ... and x @ W^T through the engine's GEMV
  void mark(const char* what, int layer) const {
    if (op_hook) op_hook(what, layer);
  }
  // The L2 prefetch's side branch (prefetch_mb): a stream and two events, made on first use.
  void prefetch_during_attention(const LayerWeights& L);
  void make_side_branch();
  void join_side_branch();
  std::shared_ptr<SideBranch> side_;
  bool decoding_ = false;  // run_layers is running a decode step (decode_batch)
  mutable bool raw_final_ = false;
  // quantized_x_prep: the last add_norm output and its scaled fp16 copy (project() reads them)
  mutable Array xprep_h_, xprep_xh_, xprep_inv_;
  Array stamps_;
  int stamps_layer_ = -1;
  int64_t fa_layers_ = 0, fa_push_layers_ = 0, fa_wide_layers_ = 0, fa_wide4_layers_ = 0;  // run_layers returned the raw residual: lm_head applies the final norm
  ModelConfig cfg_;
  EngineOptions opt_;
  Weights w_;
  Device device_;
  DType dtype_ = DType::f32;
  std::shared_ptr<text::Tokenizer> tok_;
  std::string chat_template_;
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // <= 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;
  uint64_t seed = 0;
  std::vector<int32_t> stop_ids;  // in addition to the model's EOS ids
  bool ignore_eos = false;
  std::optional<bool> cuda_graph;  // default: the model's options().cuda_graph
  // CUDA: launch the next decode step before reading this one's tokens (hides the
  // host's per-token work). last_logits() of graph steps then needs lookahead = false.
  bool lookahead = true;
};
class DecodeRunner;
void validate(const GenerateOptions& o);

// Token-by-token generation for a batch of prompts. step() runs one forward pass
// (the prefill first) and returns the token chosen for each sequence, or -1 for a
// finished one.
class Generation {
 public:
  Generation(std::shared_ptr<Model> model, const std::vector<std::vector<int32_t>>& prompts,
             const GenerateOptions& o);
  // Continues sequences `seqs` of an existing cache: `prompts` are the tokens to
  // append to each (at least one), e.g. the next turn of a chat.
  Generation(std::shared_ptr<Model> model, std::shared_ptr<KvCache> cache, const std::vector<int64_t>& seqs,
             const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& o);
  ~Generation();
  Generation(Generation&&) noexcept;
  std::vector<int32_t> step();
  // float32 logits [n, V] of the last step's running rows (a host copy; tests).
  Array last_logits() const;
  // How many times the decode step was captured (0 when eager).
  int64_t captures() const { return captures_; }
  // Nodes of the current decode graph: {all, kernels, memcpy, memset} (zeros when eager
  // or before the first decode step).
  std::vector<int64_t> graph_nodes() const;
  bool done() const;
  void finish(size_t row);  // stops a sequence (e.g. a stop string matched)
  const std::vector<std::vector<int32_t>>& generated() const { return out_; }
  // "eos", "stop", "length" or "" (still running) per sequence
  const std::vector<std::string>& finish_reasons() const { return reason_; }

 private:
  std::shared_ptr<Model> m_;
  GenerateOptions o_;
  std::vector<std::vector<int32_t>> prompts_, out_;
  std::vector<std::string> reason_;
  std::vector<int64_t> seqs_;
  std::shared_ptr<KvCache> cache_;
  void check_prompts() const;
  std::vector<int32_t> last_;
  bool started_ = false;
  std::unique_ptr<DecodeRunner> runner_;
  Array last_logits_;
  int64_t captures_ = 0;
  std::vector<int32_t> sample_prefill(const Array& logits, const std::vector<size_t>& rows);
};

// GPU time of each op of one eager decode step for `batch` sequences of `context`
// cached tokens (random ids; CUDA events between the ops of Model's op hook, the GPU
// queue filled first with matrix products so that launch gaps do not count): the
// median over `reps` steps. On the CPU the times are wall-clock. The first entries,
// named "(event)", are empty intervals: the cost of the event records themselves,
// which each op's time includes.
struct OpTime {
  std::string name;
  int layer;  // -1: outside the layers
  double ms;
};
std::vector<OpTime> profile_decode(Model& m, int64_t batch, int64_t context, int64_t reps = 3);

std::vector<std::vector<int32_t>> generate(std::shared_ptr<Model> model,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& o);

}  // namespace gk::llm
