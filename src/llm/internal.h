// Shared pieces of the LLM engine (src/llm).
#pragma once
#include <functional>
#include <string>

#include "gpukit/llm.h"

namespace gk::llm {
// The file name of a tensor role ("q", "attn_norm", ...) of `layer` in the config's format.
std::string tensor_name(const ModelConfig& c, const std::string& role, int layer = -1);
// Where a model lives: a GGUF file, or a directory (or a file inside it) with config.json.
struct ModelFiles {
  std::string gguf;         // set for GGUF
  std::string dir;          // HF directory
  std::string weights;      // the .safetensors file or index, or the directory
};
ModelFiles locate_model(const std::string& path);
// Where each tensor of the config goes, with its expected shape (HF [out, in] order).
struct WeightSlot {
  Array* dst;
  std::string role;
  int layer;
  Shape shape;
  bool file_transposed = false;  // the file holds shape reversed ([in, out], HF GPT-2 Conv1D): transposed at load
};
std::vector<WeightSlot> weight_plan(const ModelConfig& c, Weights& w, bool tied);
// Whether the fused attention merges its chunks by push (EngineOptions::fused_attention_push,
// or _push_auto where measured faster: head_dim 64, quantized weights).
inline bool push_merge(const EngineOptions& o, const ModelConfig& c, const Weights& w) {
  return o.fused_attention_push || (o.fused_attention_push_auto && (c.head_dim == 64 || !w.quantized.empty()));
}

// ---- GPT-2 (gpt2.cpp) ----
std::vector<WeightSlot> gpt2_weight_plan(const ModelConfig& c, Weights& w, bool tied);
// attend(q [T, Hq, D], k, v [T, Hkv, D], layer) -> [T, Hq, D] (prefill or decode attention)
using AttendFn = std::function<Array(const Array&, const Array&, const Array&, int)>;
// The layers of a learned-position LayerNorm/GELU model over the KV cache: token and
// position embeddings, per layer LayerNorm -> fused qkv -> kv_append -> attend ->
// output projection (+ residual), LayerNorm -> up -> GELU -> down (+ residual);
// returns the final-normed hidden states [T, H]. pos: int32 positions on the device.
Array gpt2_layers(const ModelConfig& c, const Weights& w, const Array& ids, const Array& pos, KvCache& cache,
                  const nn::KvIndex& idx, const AttendFn& attend);
// Mixture of experts (src/llm/moe.cpp): names of the "moe_*" roles, their weight slots
// (instead of gate/up/down), stacking the loaded experts, and the sparse MLP of a layer.
std::string moe_tensor_name(const ModelConfig& c, const std::string& role, int layer);
void moe_weight_slots(const ModelConfig& c, LayerWeights& L, int layer, std::vector<WeightSlot>& wants);
void moe_finish_weights(const ModelConfig& c, Weights& w);
Array moe_forward(const ModelConfig& c, const LayerWeights& L, const Array& h);
// A new model's EngineOptions from the GPUKIT_* environment variables (options_env.cpp).
void env_options(EngineOptions& o);
}  // namespace gk::llm
