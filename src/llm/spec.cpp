// Model spec table: which architectures map to which family, and how a
// ModelConfig is read from a Hugging Face config.json or from GGUF metadata.
#include <algorithm>
#include <cmath>

#include "gpukit/errors.h"
#include "gpukit/llm.h"
#include "llm/internal.h"
#include "text/json.h"

namespace gk::llm {

namespace {

// architecture name (HF model_type or GGUF general.architecture) -> family
const std::vector<std::pair<std::string, std::string>>& arch_table() {
  static const std::vector<std::pair<std::string, std::string>> t = {
      {"llama", "llama"}, {"mistral", "llama"}, {"smollm", "llama"},
      {"qwen2", "qwen2"}, {"qwen3", "qwen3"}, {"mixtral", "llama"},
  };
  return t;
}

std::string family_of(const std::string& arch) {
  for (auto& [a, f] : arch_table())
    if (a == arch) return f;
  std::string list;
  for (auto& [a, f] : arch_table()) list += (list.empty() ? "" : ", ") + a;
  throw ValueError(cat("unsupported model architecture '", arch, "' (supported: ", list,
                       "; GPT-2 and mixture-of-experts models are not implemented yet)"));
}

void apply_family(ModelConfig& c) {
  c.family = family_of(c.architecture);
  if (c.family == "qwen2") c.attention_bias = true;
  if (c.family == "qwen3") c.qk_norm = true;
}

void check_config(const ModelConfig& c) {
  auto pos = [&](const char* what, int64_t v, int64_t max = int64_t(1) << 31) {
    if (v <= 0 || v > max) throw ValueError(cat("model config: ", what, " must be in [1, ", max, "], got ", v));
  };
  pos("vocab_size", c.vocab_size, int64_t(1) << 24);
  pos("hidden_size", c.hidden_size, int64_t(1) << 20);
  pos("num_hidden_layers", c.num_layers, 4096);
  pos("num_attention_heads", c.num_heads, 4096);
  pos("num_key_value_heads", c.num_kv_heads, 4096);
  pos("head_dim", c.head_dim);
  pos("intermediate_size", c.intermediate_size, int64_t(1) << 22);
  pos("max_position_embeddings", c.max_positions);
  if (c.num_heads % c.num_kv_heads != 0)
    throw ValueError(cat("model config: num_attention_heads (", c.num_heads, ") is not a multiple of num_key_value_heads (",
                         c.num_kv_heads, ")"));
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256)
    throw ValueError(cat("model config: head_dim ", c.head_dim, " is not supported (64, 128 or 256)"));
  if (c.rotary_dim < 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2)
    throw ValueError(cat("model config: rotary dimension ", c.rotary_dim, " must be even and <= head_dim ", c.head_dim));
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    throw ValueError(cat("model config: rope_theta must be positive, got ", c.rope_theta));
  if (!(c.norm_eps >= 0) || !std::isfinite(c.norm_eps))
    throw ValueError(cat("model config: rms_norm_eps must be >= 0, got ", c.norm_eps));
  nn::rope_inv_freq(c.rope_theta, int(c.rotary_dim ? c.rotary_dim : c.head_dim), c.rope_scaling);  // validates
  if (c.num_experts < 0 || c.num_experts > 1024 ||
      (c.num_experts > 0 && (c.experts_per_tok < 1 || c.experts_per_tok > c.num_experts)))
    throw ValueError(cat("model config: ", c.num_experts, " experts with ", c.experts_per_tok,
                         " per token (need 1 <= per token <= experts <= 1024)"));
}

double num(const text::json::Value& v, const char* what) {
  if (v.kind != text::json::Kind::Number) throw ValueError(cat("config.json: ", what, " must be a number"));
  return v.is_int ? double(v.i) : v.num;
}

}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> r;
  for (auto& [a, f] : arch_table()) r.push_back(a);
  return r;
}

ModelConfig config_from_hf_json(const std::string& text) {
  namespace J = text::json;
  J::Value root = J::parse(text);
  if (!root.is_object()) throw ValueError("config.json: expected a JSON object");
  ModelConfig c;
  c.format = "safetensors";
  const J::Value* mt = root.find("model_type");
  if (!mt || !mt->is_string()) throw ValueError("config.json: missing \"model_type\"");
  c.architecture = mt->s;
  apply_family(c);
  auto get_int = [&](const char* key, bool required, int64_t def) -> int64_t {
    const J::Value* v = root.find(key);
    if (!v || v->is_null()) {
      if (required) throw ValueError(cat("config.json: missing \"", key, "\""));
      return def;
    }
    if (v->kind != J::Kind::Number || !v->is_int) throw ValueError(cat("config.json: \"", key, "\" must be an integer"));
    return v->i;
  };
  auto get_num = [&](const char* key, double def) -> double {
    const J::Value* v = root.find(key);
    return v && !v->is_null() ? num(*v, key) : def;
  };
  auto get_bool = [&](const char* key, bool def) -> bool {
    const J::Value* v = root.find(key);
    if (!v || v->is_null()) return def;
    if (v->kind != J::Kind::Bool) throw ValueError(cat("config.json: \"", key, "\" must be true or false"));
    return v->b;
  };
  c.vocab_size = get_int("vocab_size", true, 0);
  c.hidden_size = get_int("hidden_size", true, 0);
  c.num_layers = get_int("num_hidden_layers", true, 0);
  c.num_heads = get_int("num_attention_heads", true, 0);
  c.num_kv_heads = get_int("num_key_value_heads", false, c.num_heads);
  c.head_dim = get_int("head_dim", false, c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.intermediate_size = get_int("intermediate_size", true, 0);
  c.num_experts = get_int("num_local_experts", false, 0);  // Mixtral
  c.experts_per_tok = get_int("num_experts_per_tok", false, c.num_experts > 0 ? 2 : 0);
  c.max_positions = get_int("max_position_embeddings", false, 4096);
  c.rope_theta = get_num("rope_theta", 10000.0);
  c.norm_eps = get_num("rms_norm_eps", 1e-6);
  c.tie_embeddings = get_bool("tie_word_embeddings", false);
  if (c.family == "llama") c.attention_bias = get_bool("attention_bias", false);
  // Mistral's sliding_window applies as written; Qwen2/3 only with use_sliding_window
  if (c.architecture == "mistral" || c.architecture == "mixtral" || get_bool("use_sliding_window", false)) {
    c.sliding_window = get_int("sliding_window", false, 0);
    if (c.sliding_window < 0) throw ValueError("config.json: \"sliding_window\" must be >= 0");
    if (c.sliding_window >= c.max_positions) c.sliding_window = 0;
  }
  c.bos_id = get_int("bos_token_id", false, -1);
  if (const J::Value* e = root.find("eos_token_id")) {
    if (e->is_array()) {
      for (auto& x : e->array("eos_token_id")) c.eos_ids.push_back(x.integer("eos_token_id"));
    } else if (!e->is_null()) {
      c.eos_ids.push_back(e->integer("eos_token_id"));
    }
  }
  if (const J::Value* rs = root.find("rope_scaling"); rs && !rs->is_null()) {
    if (!rs->is_object()) throw ValueError("config.json: \"rope_scaling\" must be an object");
    const J::Value* t = rs->find("rope_type");
    if (!t) t = rs->find("type");
    std::string type = t && t->is_string() ? t->s : "";
    auto f = [&](const char* key, double def) {
      const J::Value* v = rs->find(key);
      return v && !v->is_null() ? num(*v, key) : def;
    };
    nn::RopeScaling& s = c.rope_scaling;
    s.factor = f("factor", 1.0);
    s.original_max_position = f("original_max_position_embeddings", 0.0);
    if (type == "llama3") {
      s.kind = nn::RopeScalingKind::Llama3;
      s.low_freq_factor = f("low_freq_factor", 1.0);
      s.high_freq_factor = f("high_freq_factor", 4.0);
    } else if (type == "linear") {
      s.kind = nn::RopeScalingKind::Linear;
    } else if (type == "yarn") {
      s.kind = nn::RopeScalingKind::YaRN;
      s.beta_fast = f("beta_fast", 32.0);
      s.beta_slow = f("beta_slow", 1.0);
      if (const J::Value* m = rs->find("attention_factor"); m && !m->is_null()) s.mscale = num(*m, "attention_factor");
      if (s.original_max_position == 0) s.original_max_position = double(c.max_positions);
    } else if (type == "default" || type.empty()) {
      s.kind = nn::RopeScalingKind::None;
    } else {
      throw ValueError(cat("config.json: rope_scaling type '", type,
                           "' is not supported (llama3, linear, yarn, default)"));
    }
  }
  check_config(c);
  return c;
}

ModelConfig config_from_gguf(const io::GGUF& g) {
  ModelConfig c;
  c.format = "gguf";
  const io::GGUFValue* a = g.find("general.architecture");
  if (!a || a->type != io::GGUFType::String) throw ValueError("GGUF: missing general.architecture");
  c.architecture = a->as_string();
  apply_family(c);
  const std::string p = c.architecture + ".";
  auto val = [&](const std::string& key) { return g.find(p + key); };
  auto get_int = [&](const std::string& key, bool required, int64_t def) -> int64_t {
    const io::GGUFValue* v = val(key);
    if (!v) {
      if (required) throw ValueError(cat("GGUF: missing metadata key ", p + key));
      return def;
    }
    return v->as_int();
  };
  auto get_num = [&](const std::string& key, double def) -> double {
    const io::GGUFValue* v = val(key);
    return v ? v->as_float() : def;
  };
  c.num_layers = get_int("block_count", true, 0);
  c.hidden_size = get_int("embedding_length", true, 0);
  c.num_heads = get_int("attention.head_count", true, 0);
  c.num_kv_heads = get_int("attention.head_count_kv", false, c.num_heads);
  c.head_dim = get_int("attention.key_length", false, c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.intermediate_size = get_int("feed_forward_length", true, 0);
  c.num_experts = get_int("expert_count", false, 0);  // Mixtral in GGUF: llama with experts
  c.experts_per_tok = get_int("expert_used_count", false, 0);
  c.max_positions = get_int("context_length", false, 4096);
  c.rope_theta = get_num("rope.freq_base", 10000.0);
  c.rotary_dim = get_int("rope.dimension_count", false, 0);
  if (c.rotary_dim == c.head_dim) c.rotary_dim = 0;
  c.norm_eps = get_num("attention.layer_norm_rms_epsilon", 1e-6);
  int64_t vocab = get_int("vocab_size", false, 0);
  if (vocab == 0) {
    const io::GGUFValue* toks = g.find("tokenizer.ggml.tokens");
    if (toks && toks->is_array()) vocab = int64_t(toks->size());
  }
  if (vocab == 0 && g.contains("token_embd.weight")) vocab = g.info("token_embd.weight").shape()[0];
  c.vocab_size = vocab;
  c.tie_embeddings = !g.contains("output.weight");
  // llama.cpp's converter permutes Q/K rows of llama-family weights so that its
  // (adjacent pair) rope applies; qwen2/qwen3 are stored unpermuted (NeoX rope).
  c.rope_interleaved = c.family == "llama";
  if (const io::GGUFValue* t = val("rope.scaling.type")) {
    std::string type = t->as_string();
    nn::RopeScaling& s = c.rope_scaling;
    s.factor = get_num("rope.scaling.factor", 1.0);
    s.original_max_position = get_num("rope.scaling.original_context_length", 0.0);
    if (type == "linear") {
      s.kind = nn::RopeScalingKind::Linear;
    } else if (type == "yarn") {
      s.kind = nn::RopeScalingKind::YaRN;
      if (s.original_max_position == 0) s.original_max_position = double(c.max_positions);
    } else if (type != "none") {
      throw ValueError(cat("GGUF: rope scaling type '", type, "' is not supported (linear, yarn, none)"));
    }
  }
  c.sliding_window = std::max<int64_t>(0, get_int("attention.sliding_window", false, 0));
  if (c.sliding_window >= c.max_positions) c.sliding_window = 0;
  if (g.contains("rope_freqs.weight"))
    throw ValueError("GGUF: rope_freqs.weight (llama3 rope scaling stored as a tensor) is not supported yet");
  if (const io::GGUFValue* b = g.find("tokenizer.ggml.bos_token_id")) c.bos_id = b->as_int();
  if (const io::GGUFValue* e = g.find("tokenizer.ggml.eos_token_id")) c.eos_ids.push_back(e->as_int());
  if (const io::GGUFValue* e = g.find("tokenizer.ggml.eot_token_id")) {
    int64_t id = e->as_int();
    if (std::find(c.eos_ids.begin(), c.eos_ids.end(), id) == c.eos_ids.end()) c.eos_ids.push_back(id);
  }
  check_config(c);
  return c;
}

std::string config_summary(const ModelConfig& c) {
  return cat(c.architecture, " (family ", c.family, ", ", c.format, "): ", c.num_layers, " layers, hidden ", c.hidden_size,
             ", heads ", c.num_heads, "/", c.num_kv_heads, " x ", c.head_dim, ", intermediate ", c.intermediate_size,
             ", vocab ", c.vocab_size, ", context ", c.max_positions, ", rope theta ", c.rope_theta,
             c.rope_interleaved ? " (interleaved)" : " (neox)", c.tie_embeddings ? ", tied embeddings" : "",
             c.qk_norm ? ", q/k norm" : "", c.attention_bias ? ", qkv bias" : "",
             c.sliding_window ? cat(", sliding window ", c.sliding_window) : std::string());
}

// ---- tensor names ----
std::string tensor_name(const ModelConfig& c, const std::string& role, int layer) {
  static const std::map<std::string, std::pair<std::string, std::string>> names = {
      // role -> (HF, GGUF); "#" is the layer index
      {"embed", {"model.embed_tokens.weight", "token_embd.weight"}},
      {"final_norm", {"model.norm.weight", "output_norm.weight"}},
      {"lm_head", {"lm_head.weight", "output.weight"}},
      {"attn_norm", {"model.layers.#.input_layernorm.weight", "blk.#.attn_norm.weight"}},
      {"q", {"model.layers.#.self_attn.q_proj.weight", "blk.#.attn_q.weight"}},
      {"k", {"model.layers.#.self_attn.k_proj.weight", "blk.#.attn_k.weight"}},
      {"v", {"model.layers.#.self_attn.v_proj.weight", "blk.#.attn_v.weight"}},
      {"o", {"model.layers.#.self_attn.o_proj.weight", "blk.#.attn_output.weight"}},
      {"q_bias", {"model.layers.#.self_attn.q_proj.bias", "blk.#.attn_q.bias"}},
      {"k_bias", {"model.layers.#.self_attn.k_proj.bias", "blk.#.attn_k.bias"}},
      {"v_bias", {"model.layers.#.self_attn.v_proj.bias", "blk.#.attn_v.bias"}},
      {"q_norm", {"model.layers.#.self_attn.q_norm.weight", "blk.#.attn_q_norm.weight"}},
      {"k_norm", {"model.layers.#.self_attn.k_norm.weight", "blk.#.attn_k_norm.weight"}},
      {"ffn_norm", {"model.layers.#.post_attention_layernorm.weight", "blk.#.ffn_norm.weight"}},
      {"gate", {"model.layers.#.mlp.gate_proj.weight", "blk.#.ffn_gate.weight"}},
      {"up", {"model.layers.#.mlp.up_proj.weight", "blk.#.ffn_up.weight"}},
      {"down", {"model.layers.#.mlp.down_proj.weight", "blk.#.ffn_down.weight"}},
  };
  if (role.compare(0, 4, "moe_") == 0) return moe_tensor_name(c, role, layer);
  auto it = names.find(role);
  if (it == names.end()) throw ValueError(cat("internal: unknown tensor role ", role));
  std::string n = c.format == "gguf" ? it->second.second : it->second.first;
  if (auto p = n.find('#'); p != std::string::npos) n.replace(p, 1, std::to_string(layer));
  return n;
}

}  // namespace gk::llm
