// The LLM engine: model specs, weights, the transformer forward pass over a paged
// KV cache, and generation.
//
// Supported families (spec.cpp): "llama" (Llama 2/3/3.1/3.2 with rope scaling,
// Mistral, SmolLM2), "qwen2" (q/k/v bias), "qwen3" (q/k RMS norms). GPT-2 and
// Mixtral-style MoE are not implemented yet (unknown architectures raise a
// ValueError listing the supported ones).
//
// Models load from a Hugging Face directory (config.json + *.safetensors, optional
// tokenizer.json) or a GGUF file (float formats directly, quantized tensors
// dequantized at load time). GGUF llama weights carry Q/K rows permuted by the
// llama.cpp converter to adjacent-pair rotary layout: they use interleaved rope;
// Hugging Face weights use the NeoX half-split rope.
//
// Several new tokens after a cached prefix (chunked prefill, later chat turns) run
// as a prefill whose attention gathers the sequence's keys/values from its pages.
// Not done yet: CUDA graph capture of the decode step (each step runs eagerly).
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
  std::string family;        // the spec table entry: "llama", "qwen2", "qwen3"
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
};

std::vector<std::string> supported_architectures();
// From the text of a Hugging Face config.json.
ModelConfig config_from_hf_json(const std::string& text);
ModelConfig config_from_gguf(const io::GGUF& file);
std::string config_summary(const ModelConfig& c);

// The weights of one layer and of the model (HF naming of the roles).
struct LayerWeights {
  Array attn_norm, q, k, v, o, q_bias, k_bias, v_bias, q_norm, k_norm, ffn_norm, gate, up, down;
  // mixture of experts (src/llm/moe.cpp): router [E, H], experts' w1;w3 [E, 2I, H], w2 [E, H, I]
  Array moe_gate, moe_w13, moe_w2;
  std::vector<Array> moe_parts;  // the expert tensors as read, until they are stacked
};
struct Weights {
  Array embed, final_norm, lm_head;  // lm_head == embed when tied
  std::vector<LayerWeights> layers;
  size_t nbytes = 0;
};
// progress(done, total) after each tensor (may be empty).
using Progress = std::function<void(int64_t, int64_t)>;
Weights load_weights(const ModelConfig& c, const std::string& path, Device device, DType dtype,
                     const Progress& progress = {});

// Random weights for a config (benchmarks): unit-variance embeddings, weights scaled by
// 1/sqrt(fan_in), norms near 1; made on the host one tensor at a time.
Weights random_weights(const ModelConfig& c, Device device, DType dtype, uint64_t seed = 0);

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

class Model {
 public:
  static std::shared_ptr<Model> load(const std::string& path, Device device = {}, DType dtype = DType::f32,
                                     const Progress& progress = {});
  // A model with random weights and no tokenizer (benchmarks, tests).
  static std::shared_ptr<Model> random(const ModelConfig& c, Device device = {}, DType dtype = DType::f32,
                                       uint64_t seed = 0);
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
  ModelConfig cfg_;
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
};
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
  std::vector<int32_t> step();
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
};

std::vector<std::vector<int32_t>> generate(std::shared_ptr<Model> model,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& o);

}  // namespace gk::llm
