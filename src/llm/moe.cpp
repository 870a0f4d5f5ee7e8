// Mixture-of-experts layers of the engine (Mixtral-style sparse MLP): the tensor names
// of the router and the experts in both file formats, the weight slots that load them,
// stacking the experts into the two arrays the grouped GEMM reads, and the forward
// step (gk::moe_mlp: router, top-k gating, permute, grouped gate-up GEMM, SwiGLU,
// grouped down GEMM, weighted un-permute).
//
// Files: Hugging Face Mixtral: model.layers.L.block_sparse_moe.gate.weight [E, H] and
// model.layers.L.block_sparse_moe.experts.N.{w1,w3} [I, H], .w2 [H, I]. GGUF (llama
// architecture with llama.expert_count / expert_used_count): blk.L.ffn_gate_inp.weight
// [E, H] and the stacked 3-D blk.L.ffn_{gate,up,down}_exps.weight ([E, I, H], [E, I, H],
// [E, H, I] in row-major order). In memory: moe_gate [E, H], moe_w13 [E, 2I, H] (w1 rows
// then w3 rows per expert), moe_w2 [E, H, I].
#include <string>

#include "gpukit/errors.h"
#include "gpukit/moe.h"
#include "gpukit/ops.h"
#include "llm/internal.h"

namespace gk::llm {

namespace {
bool gguf(const ModelConfig& c) { return c.format == "gguf"; }

std::string with_layer(std::string n, int layer) {
  if (auto p = n.find('#'); p != std::string::npos) n.replace(p, 1, std::to_string(layer));
  return n;
}
}  // namespace

// roles: "moe_gate"; HF / random: "moe_w1.N", "moe_w3.N", "moe_w2.N"; GGUF: "moe_gate_exps",
// "moe_up_exps", "moe_down_exps"
std::string moe_tensor_name(const ModelConfig& c, const std::string& role, int layer) {
  if (role == "moe_gate")
    return with_layer(gguf(c) ? "blk.#.ffn_gate_inp.weight" : "model.layers.#.block_sparse_moe.gate.weight", layer);
  if (role == "moe_gate_exps" || role == "moe_up_exps" || role == "moe_down_exps")
    return with_layer("blk.#.ffn_" + role.substr(4) + ".weight", layer);
  auto dot = role.find('.');
  if (role.size() > 7 && role.compare(0, 5, "moe_w") == 0 && dot == 6)
    return with_layer("model.layers.#.block_sparse_moe.experts." + role.substr(7) + "." + role.substr(4, 2) + ".weight",
                      layer);
  throw ValueError(cat("internal: unknown expert tensor role ", role));
}

void moe_weight_slots(const ModelConfig& c, LayerWeights& L, int layer, std::vector<WeightSlot>& wants) {
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.intermediate_size;
  wants.push_back({&L.moe_gate, "moe_gate", layer, {E, H}});
  if (gguf(c)) {
    L.moe_parts.resize(3);
    wants.push_back({&L.moe_parts[0], "moe_gate_exps", layer, {E, I, H}});
    wants.push_back({&L.moe_parts[1], "moe_up_exps", layer, {E, I, H}});
    wants.push_back({&L.moe_parts[2], "moe_down_exps", layer, {E, H, I}});
    return;
  }
  L.moe_parts.resize(size_t(3 * E));  // w1 of every expert, then w3, then w2 (pointers stay valid: no regrowth)
  for (int64_t e = 0; e < E; ++e) {
    wants.push_back({&L.moe_parts[size_t(e)], cat("moe_w1.", e), layer, {I, H}});
    wants.push_back({&L.moe_parts[size_t(E + e)], cat("moe_w3.", e), layer, {I, H}});
    wants.push_back({&L.moe_parts[size_t(2 * E + e)], cat("moe_w2.", e), layer, {H, I}});
  }
}

// Stacks the loaded parts into moe_w13 / moe_w2, one layer at a time (the parts of a
// layer are released as soon as it is stacked: device memory peaks at one layer more).
void moe_finish_weights(const ModelConfig& c, Weights& w) {
  if (c.num_experts <= 0) return;
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.intermediate_size;
  for (LayerWeights& L : w.layers) {
    if (L.moe_parts.empty()) continue;
    const Array& any = L.moe_parts[0];
    Array w13 = Array::empty({E, 2 * I, H}, any.dtype(), any.device());
    Array w2 = Array::empty({E, H, I}, any.dtype(), any.device());
    if (L.moe_parts.size() == 3) {  // GGUF: already stacked per kind
      copy_into(w13.narrow(1, 0, I), L.moe_parts[0]);
      copy_into(w13.narrow(1, I, I), L.moe_parts[1]);
      copy_into(w2, L.moe_parts[2]);
    } else {
      for (int64_t e = 0; e < E; ++e) {
        Array dst = w13.select(0, e);
        copy_into(dst.narrow(0, 0, I), L.moe_parts[size_t(e)]);
        copy_into(dst.narrow(0, I, I), L.moe_parts[size_t(E + e)]);
        copy_into(w2.select(0, e), L.moe_parts[size_t(2 * E + e)]);
      }
    }
    size_t parts = 0;
    for (const Array& a : L.moe_parts) parts += a.nbytes();
    w.nbytes = w.nbytes - parts + w13.nbytes() + w2.nbytes();
    L.moe_parts.clear();
    L.moe_parts.shrink_to_fit();
    L.moe_w13 = std::move(w13);
    L.moe_w2 = std::move(w2);
  }
}

Array moe_forward(const ModelConfig& c, const LayerWeights& L, const Array& h) {
  return moe_mlp(h, L.moe_gate, L.moe_w13, L.moe_w2, c.experts_per_tok);
}

}  // namespace gk::llm
