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

// One entry per family: the architectures it covers, where config.json keeps its
// sizes, its tensor names, and the switches of the forward pass. Adding a family
// is an entry here plus the functions that really differ (gpt2.cpp for GPT-2).
struct TensorName {
  const char* role;
  const char* hf;    // "#": the layer index
  const char* gguf;
};

const std::vector<TensorName> kLlamaNames = {
    {"embed", "model.embed_tokens.weight", "token_embd.weight"},
    {"final_norm", "model.norm.weight", "output_norm.weight"},
    {"lm_head", "lm_head.weight", "output.weight"},
    {"attn_norm", "model.layers.#.input_layernorm.weight", "blk.#.attn_norm.weight"},
    {"q", "model.layers.#.self_attn.q_proj.weight", "blk.#.attn_q.weight"},
    {"k", "model.layers.#.self_attn.k_proj.weight", "blk.#.attn_k.weight"},
    {"v", "model.layers.#.self_attn.v_proj.weight", "blk.#.attn_v.weight"},
    {"o", "model.layers.#.self_attn.o_proj.weight", "blk.#.attn_output.weight"},
    {"q_bias", "model.layers.#.self_attn.q_proj.bias", "blk.#.attn_q.bias"},
    {"k_bias", "model.layers.#.self_attn.k_proj.bias", "blk.#.attn_k.bias"},
    {"v_bias", "model.layers.#.self_attn.v_proj.bias", "blk.#.attn_v.bias"},
    {"q_norm", "model.layers.#.self_attn.q_norm.weight", "blk.#.attn_q_norm.weight"},
    {"k_norm", "model.layers.#.self_attn.k_norm.weight", "blk.#.attn_k_norm.weight"},
    {"ffn_norm", "model.layers.#.post_attention_layernorm.weight", "blk.#.ffn_norm.weight"},
    {"gate", "model.layers.#.mlp.gate_proj.weight", "blk.#.ffn_gate.weight"},
    {"up", "model.layers.#.mlp.up_proj.weight", "blk.#.ffn_up.weight"},
    {"down", "model.layers.#.mlp.down_proj.weight", "blk.#.ffn_down.weight"},
};

// GPT-2: Hugging Face checkpoints written by save_pretrained prefix "transformer.";
// the original hub files do not (weights.cpp tries both).
const std::vector<TensorName> kGpt2Names = {
    {"embed", "transformer.wte.weight", "token_embd.weight"},
    {"pos_embed", "transformer.wpe.weight", "position_embd.weight"},
    {"final_norm", "transformer.ln_f.weight", "output_norm.weight"},
    {"final_norm_bias", "transformer.ln_f.bias", "output_norm.bias"},
    {"lm_head", "lm_head.weight", "output.weight"},
    {"attn_norm", "transformer.h.#.ln_1.weight", "blk.#.attn_norm.weight"},
    {"attn_norm_bias", "transformer.h.#.ln_1.bias", "blk.#.attn_norm.bias"},
    {"qkv", "transformer.h.#.attn.c_attn.weight", "blk.#.attn_qkv.weight"},
    {"qkv_bias", "transformer.h.#.attn.c_attn.bias", "blk.#.attn_qkv.bias"},
    {"o", "transformer.h.#.attn.c_proj.weight", "blk.#.attn_output.weight"},
    {"o_bias", "transformer.h.#.attn.c_proj.bias", "blk.#.attn_output.bias"},
    {"ffn_norm", "transformer.h.#.ln_2.weight", "blk.#.ffn_norm.weight"},
    {"ffn_norm_bias", "transformer.h.#.ln_2.bias", "blk.#.ffn_norm.bias"},
    {"up", "transformer.h.#.mlp.c_fc.weight", "blk.#.ffn_up.weight"},
    {"up_bias", "transformer.h.#.mlp.c_fc.bias", "blk.#.ffn_up.bias"},
    {"down", "transformer.h.#.mlp.c_proj.weight", "blk.#.ffn_down.weight"},
    {"down_bias", "transformer.h.#.mlp.c_proj.bias", "blk.#.ffn_down.bias"},
};

struct FamilySpec {
  std::string family;
  std::vector<std::string> archs;  // HF model_type / GGUF general.architecture
  // config.json keys (first found wins)
  std::vector<const char*> hidden, layers, heads, positions, intermediate, eps;
  int64_t intermediate_mult = 0;  // > 0: intermediate size defaults to this * hidden
  const char* gguf_eps;           // GGUF key after "<arch>."
  bool attention_bias = false, qk_norm = false, layer_norm = false, learned_positions = false;
  bool default_tie = false;  // tie_word_embeddings when config.json does not say
  bool has_kv_heads = true;  // num_key_value_heads / head_dim keys exist (else MHA, H / heads)
  const std::vector<TensorName>* names;
};

const std::vector<FamilySpec>& spec_table() {
  static const std::vector<FamilySpec> t = [] {
    FamilySpec llama;
    llama.family = "llama";
    llama.archs = {"llama", "mistral", "smollm", "mixtral"};
    llama.hidden = {"hidden_size"};
    llama.layers = {"num_hidden_layers"};
    llama.heads = {"num_attention_heads"};
    llama.positions = {"max_position_embeddings"};
    llama.intermediate = {"intermediate_size"};
    llama.eps = {"rms_norm_eps"};
    llama.gguf_eps = "attention.layer_norm_rms_epsilon";
    llama.names = &kLlamaNames;
    FamilySpec qwen2 = llama;
    qwen2.family = "qwen2";
    qwen2.archs = {"qwen2"};
    qwen2.attention_bias = true;
    FamilySpec qwen3 = llama;
    qwen3.family = "qwen3";
    qwen3.archs = {"qwen3"};
    qwen3.qk_norm = true;
    FamilySpec gpt2;
    gpt2.family = "gpt2";
    gpt2.archs = {"gpt2"};
    gpt2.hidden = {"n_embd", "hidden_size"};
    gpt2.layers = {"n_layer", "num_hidden_layers"};
    gpt2.heads = {"n_head", "num_attention_heads"};
    gpt2.positions = {"n_positions", "max_position_embeddings"};
    gpt2.intermediate = {"n_inner"};
    gpt2.intermediate_mult = 4;
    gpt2.eps = {"layer_norm_epsilon"};
    gpt2.gguf_eps = "attention.layer_norm_epsilon";
    gpt2.layer_norm = gpt2.learned_positions = gpt2.default_tie = true;
    gpt2.has_kv_heads = false;
    gpt2.names = &kGpt2Names;
    return std::vector<FamilySpec>{llama, qwen2, qwen3, gpt2};
  }();
  return t;
}

const FamilySpec& spec_of_arch(const std::string& arch) {
  for (auto& f : spec_table())
    for (auto& a : f.archs)
      if (a == arch) return f;
  std::string list;
  for (auto& a : supported_architectures()) list += (list.empty() ? "" : ", ") + a;
  throw ValueError(cat("unsupported model architecture '", arch, "' (supported: ", list, ")"));
}

const FamilySpec& spec_of_family(const std::string& family) {
  for (auto& f : spec_table())
    if (f.family == family) return f;
  throw ValueError(cat("internal: unknown model family '", family, "'"));
}

const FamilySpec& apply_family(ModelConfig& c) {
  const FamilySpec& f = spec_of_arch(c.architecture);
  c.family = f.family;
  c.attention_bias = f.attention_bias;
  c.qk_norm = f.qk_norm;
  c.layer_norm = f.layer_norm;
  c.learned_positions = f.learned_positions;
  c.activation = f.layer_norm ? "gelu_tanh" : "silu";
  return f;
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
  for (auto& f : spec_table())
    for (auto& a : f.archs) r.push_back(a);
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
  const FamilySpec& spec = apply_family(c);
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
  // the first of a family's names for a key that config.json has
  auto key_of = [&](const std::vector<const char*>& keys) -> const char* {
    for (const char* k : keys)
      if (const J::Value* v = root.find(k); v && !v->is_null()) return k;
    return keys.front();
  };
  c.vocab_size = get_int("vocab_size", true, 0);
  c.hidden_size = get_int(key_of(spec.hidden), true, 0);
  c.num_layers = get_int(key_of(spec.layers), true, 0);
  c.num_heads = get_int(key_of(spec.heads), true, 0);
  const int64_t even_split = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  if (spec.has_kv_heads) {
    c.num_kv_heads = get_int("num_key_value_heads", false, c.num_heads);
    c.head_dim = get_int("head_dim", false, even_split);
  } else {
    c.num_kv_heads = c.num_heads;
    if (c.num_heads > 0 && c.hidden_size % c.num_heads != 0)
      throw ValueError(cat("config.json: the hidden size ", c.hidden_size, " is not a multiple of the ", c.num_heads,
                           " attention heads"));
    c.head_dim = even_split;
  }
  c.intermediate_size = get_int(key_of(spec.intermediate), spec.intermediate_mult == 0,
                                spec.intermediate_mult * c.hidden_size);
  c.max_positions = get_int(key_of(spec.positions), false, spec.learned_positions ? 1024 : 4096);
  c.num_experts = get_int("num_local_experts", false, 0);  // Mixtral
  c.experts_per_tok = get_int("num_experts_per_tok", false, c.num_experts > 0 ? 2 : 0);
  c.rope_theta = get_num("rope_theta", 10000.0);
  c.norm_eps = get_num(key_of(spec.eps), spec.layer_norm ? 1e-5 : 1e-6);
  c.tie_embeddings = get_bool("tie_word_embeddings", spec.default_tie);
  if (c.family == "gpt2") {
    // HF GPT2Config options this engine implements: GELU (tanh or erf), 1/sqrt(D) scores
    const J::Value* act = root.find("activation_function");
    std::string a = act && act->is_string() ? act->s : "gelu_new";
    if (a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "gelu_fast") c.activation = "gelu_tanh";
    else if (a == "gelu") c.activation = "gelu";
    else throw ValueError(cat("config.json: activation_function '", a,
                              "' is not supported for gpt2 (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu)"));
    if (!get_bool("scale_attn_weights", true) || get_bool("scale_attn_by_inverse_layer_idx", false))
      throw ValueError("config.json: gpt2 attention scaling other than 1/sqrt(head_dim) is not supported "
                       "(scale_attn_weights false or scale_attn_by_inverse_layer_idx true)");
  }
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
  // transformers >= 5 writes "rope_parameters" {rope_type, rope_theta, factor, ...} in place of
  // rope_theta + rope_scaling
  const J::Value* rs = root.find("rope_scaling");
  if (const J::Value* rp = root.find("rope_parameters"); rp && !rp->is_null()) {
    if (!rp->is_object()) throw ValueError("config.json: \"rope_parameters\" must be an object");
    if (const J::Value* th = rp->find("rope_theta"); th && !th->is_null()) c.rope_theta = num(*th, "rope_theta");
    if (!rs || rs->is_null()) rs = rp;
  }
  if (rs && !rs->is_null()) {
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
  const FamilySpec& spec = apply_family(c);
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
  c.norm_eps = get_num(spec.gguf_eps, spec.layer_norm ? 1e-5 : 1e-6);
  if (!spec.has_kv_heads && c.num_kv_heads != c.num_heads)
    throw ValueError(cat("GGUF: ", c.architecture, " has ", c.num_heads, " query heads but ", c.num_kv_heads,
                         " key/value heads (only multi-head attention is supported for it)"));
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
  if (spec.learned_positions && !g.contains("position_embd.weight"))
    throw ValueError(cat("GGUF: ", c.architecture, " model without position_embd.weight"));
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
  std::string pos = c.learned_positions ? std::string(", learned positions")
                                        : cat(", rope theta ", c.rope_theta, c.rope_interleaved ? " (interleaved)" : " (neox)");
  return cat(c.architecture, " (family ", c.family, ", ", c.format, "): ", c.num_layers, " layers, hidden ", c.hidden_size,
             ", heads ", c.num_heads, "/", c.num_kv_heads, " x ", c.head_dim, ", intermediate ", c.intermediate_size,
             ", vocab ", c.vocab_size, ", context ", c.max_positions, pos, c.layer_norm ? ", layer norm" : "",
             c.activation != "silu" ? cat(", ", c.activation, " mlp") : std::string(),
             c.tie_embeddings ? ", tied embeddings" : "",
             c.qk_norm ? ", q/k norm" : "", c.attention_bias ? ", qkv bias" : "",
             c.sliding_window ? cat(", sliding window ", c.sliding_window) : std::string());
}

// ---- tensor names ----
std::string tensor_name(const ModelConfig& c, const std::string& role, int layer) {
  if (role.compare(0, 4, "moe_") == 0) return moe_tensor_name(c, role, layer);
  const FamilySpec& f = spec_of_family(c.family);
  for (const TensorName& t : *f.names) {
    if (role != t.role) continue;
    std::string n = c.format == "gguf" ? t.gguf : t.hf;
    if (auto p = n.find('#'); p != std::string::npos) n.replace(p, 1, std::to_string(layer));
    return n;
  }
  throw ValueError(cat("internal: no tensor role ", role, " in family ", c.family));
}

}  // namespace gk::llm
