// GPT-2: the functions that differ from the llama-style families. Weights: token
// and learned position embeddings, per layer LayerNorm (weight + bias) before
// attention and before the MLP, one fused qkv projection [3H, H] with bias, output
// projection with bias, MLP up [I, H] -> GELU (tanh approximation, HF "gelu_new")
// -> down [H, I], both with biases; final LayerNorm; lm head tied to the token
// embeddings unless the file has one. Hugging Face stores the projections as
// Conv1D [in, out]: they are transposed once at load (weights.cpp) so every
// projection here is x @ W.T like the other families; GGUF stores them [out, in].
#include "gpukit/errors.h"
#include "gpukit/ops.h"
#include "llm/internal.h"

namespace gk::llm {

std::vector<WeightSlot> gpt2_weight_plan(const ModelConfig& c, Weights& w, bool tied) {
  const int64_t H = c.hidden_size, Q = c.num_heads * c.head_dim, I = c.intermediate_size;
  const int64_t V = c.vocab_size, P = c.max_positions;
  if (c.num_kv_heads != c.num_heads || Q != H)
    throw ValueError(cat("gpt2: needs multi-head attention with heads x head_dim == hidden size, got ", c.num_heads, "/",
                         c.num_kv_heads, " heads x ", c.head_dim, " for hidden ", H));
  const bool conv1d = c.format == "safetensors";
  w.layers.resize(size_t(c.num_layers));
  std::vector<WeightSlot> wants;
  wants.push_back({&w.embed, "embed", -1, {V, H}});
  wants.push_back({&w.pos_embed, "pos_embed", -1, {P, H}});
  wants.push_back({&w.final_norm, "final_norm", -1, {H}});
  wants.push_back({&w.final_norm_bias, "final_norm_bias", -1, {H}});
  if (!tied) wants.push_back({&w.lm_head, "lm_head", -1, {V, H}});
  for (int l = 0; l < int(c.num_layers); ++l) {
    LayerWeights& L = w.layers[size_t(l)];
    wants.push_back({&L.attn_norm, "attn_norm", l, {H}});
    wants.push_back({&L.attn_norm_bias, "attn_norm_bias", l, {H}});
    wants.push_back({&L.qkv, "qkv", l, {3 * Q, H}, conv1d});
    wants.push_back({&L.qkv_bias, "qkv_bias", l, {3 * Q}});
    wants.push_back({&L.o, "o", l, {H, Q}, conv1d});
    wants.push_back({&L.o_bias, "o_bias", l, {H}});
    wants.push_back({&L.ffn_norm, "ffn_norm", l, {H}});
    wants.push_back({&L.ffn_norm_bias, "ffn_norm_bias", l, {H}});
    wants.push_back({&L.up, "up", l, {I, H}, conv1d});
    wants.push_back({&L.up_bias, "up_bias", l, {I}});
    wants.push_back({&L.down, "down", l, {H, I}, conv1d});
    wants.push_back({&L.down_bias, "down_bias", l, {H}});
  }
  return wants;
}

namespace {
Array affine(const Array& x, const Array& w, const Array& b) { return add(matmul(x, w.T()), b); }
}  // namespace

Array gpt2_layers(const ModelConfig& c, const Weights& w, const Array& ids, const Array& pos, KvCache& cache,
                  const nn::KvIndex& idx, const AttendFn& attend) {
  const int64_t T = ids.numel(), D = c.head_dim, Hq = c.num_heads, Q = Hq * D;
  const double eps = c.norm_eps;
  const UnaryOp act = c.activation == "gelu" ? UnaryOp::GeluErf : UnaryOp::GeluTanh;
  Array x = add(embedding(ids, w.embed), embedding(pos, w.pos_embed));  // residual stream [T, H]
  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    Array h = nn::layer_norm(x, L.attn_norm, L.attn_norm_bias, eps);
    Array qkv = affine(h, L.qkv, L.qkv_bias);  // [T, 3Q]: q | k | v, views below (row stride 3Q)
    Array q = qkv.narrow(1, 0, Q).reshape({T, Hq, D});
    Array k = qkv.narrow(1, Q, Q).reshape({T, Hq, D});
    Array v = qkv.narrow(1, 2 * Q, Q).reshape({T, Hq, D});
    nn::kv_append(k, v, cache.k[size_t(l)], cache.v[size_t(l)], idx);
    Array att = attend(q, k, v, l).reshape({T, Q});
    x = add(x, affine(att, L.o, L.o_bias));
    h = nn::layer_norm(x, L.ffn_norm, L.ffn_norm_bias, eps);
    x = add(x, affine(unary(act, affine(h, L.up, L.up_bias)), L.down, L.down_bias));
  }
  return nn::layer_norm(x, w.final_norm, w.final_norm_bias, eps);
}

}  // namespace gk::llm
