// Shared pieces of the LLM engine (src/llm).
#pragma once
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
};
std::vector<WeightSlot> weight_plan(const ModelConfig& c, Weights& w, bool tied);
// Mixture of experts (src/llm/moe.cpp): names of the "moe_*" roles, their weight slots
// (instead of gate/up/down), stacking the loaded experts, and the sparse MLP of a layer.
std::string moe_tensor_name(const ModelConfig& c, const std::string& role, int layer);
void moe_weight_slots(const ModelConfig& c, LayerWeights& L, int layer, std::vector<WeightSlot>& wants);
void moe_finish_weights(const ModelConfig& c, Weights& w);
Array moe_forward(const ModelConfig& c, const LayerWeights& L, const Array& h);
}  // namespace gk::llm
