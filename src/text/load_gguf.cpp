// Loader for the tokenizer.ggml.* metadata of GGUF files (llama.cpp conventions).
#include <cmath>

#include "gpukit/errors.h"
#include "text/tokenizer_impl.h"

namespace gk::text::detail {
namespace {

struct PreInfo {
  const char* name;
  std::vector<PreStep> steps;
  bool ignore_merges;
  bool add_bos;
};

const PreInfo* find_pre(const std::string& name) {
  static const std::vector<PreInfo> table = {
      {"gpt-2", {PreStep::Gpt2}, false, false},
      {"gpt2", {PreStep::Gpt2}, false, false},
      {"llama-bpe", {PreStep::Llama3}, true, true},
      {"llama3", {PreStep::Llama3}, true, true},
      {"llama-v3", {PreStep::Llama3}, true, true},
      {"qwen2", {PreStep::Qwen2}, false, false},
      {"smollm", {PreStep::DigitsIndividual, PreStep::Gpt2}, false, false},
      {"starcoder", {PreStep::DigitsIndividual, PreStep::Gpt2}, false, false},
  };
  for (auto& p : table)
    if (name == p.name) return &p;
  return nullptr;
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

int32_t checked_id(int64_t id, size_t n, const char* key) {
  if (id < 0) return -1;
  if (id >= int64_t(n)) throw FormatError(cat(key, ": token id ", id, " out of range [0, ", n, ")"));
  return int32_t(id);
}

}  // namespace

std::shared_ptr<TokenizerImpl> load_gguf_data(const GGUFTokenizerData& d) {
  auto t = std::make_shared<TokenizerImpl>();
  const size_t n = d.tokens.size();
  if (n == 0) throw FormatError("tokenizer.ggml.tokens: missing or empty");
  if (n >= (size_t(1) << 30)) throw FormatError("tokenizer.ggml.tokens: too many tokens");
  if (!d.token_types.empty() && d.token_types.size() != n)
    throw FormatError(cat("tokenizer.ggml.token_type: ", d.token_types.size(), " entries for ", n, " tokens"));
  t->id_to_token = d.tokens;
  t->special.assign(n, 0);
  auto type_of = [&](size_t i) { return d.token_types.empty() ? int64_t(1) : d.token_types[i]; };
  for (int b = 0; b < 256; ++b) t->byte_ids[b] = -1;
  bool add_bos_default;
  if (d.model == "gpt2") {
    t->model = Model::ByteBPE;
    const PreInfo* pi = find_pre(d.pre.empty() ? std::string("gpt-2") : d.pre);
    if (!pi)
      throw FormatError(cat("tokenizer.ggml.pre: unsupported pre-tokenizer '", d.pre,
                            "' (supported: gpt-2, llama-bpe, qwen2, smollm, starcoder)"));
    t->pre_steps = pi->steps;
    t->pre_name = pi->name;
    t->ignore_merges = pi->ignore_merges;
    add_bos_default = pi->add_bos;
  } else if (d.model == "llama") {
    t->model = Model::SpmBPE;
    t->pre_name = "sentencepiece";
    if (d.scores.size() != n)
      throw FormatError(cat("tokenizer.ggml.scores: ", d.scores.size(), " entries for ", n, " tokens"));
    t->scores.resize(n);
    for (size_t i = 0; i < n; ++i) {
      double s = d.scores[i];
      t->scores[i] = std::isfinite(s) ? float(s) : (s > 0 ? 3.0e38f : -3.0e38f);  // NaN -> lowest
    }
    t->add_space_prefix = d.add_space_prefix.value_or(true);
    t->strip_decoded_space = t->add_space_prefix;
    add_bos_default = true;
  } else {
    throw FormatError(cat("tokenizer.ggml.model: unsupported model '", d.model, "' (supported: gpt2, llama)"));
  }

  // Special (matched in text) tokens: CONTROL, USER_DEFINED, UNKNOWN. Byte tokens <0xNN>.
  for (size_t i = 0; i < n; ++i) {
    int64_t ty = type_of(i);
    const std::string& tok = d.tokens[i];
    if (ty == int64_t(TokenType::Control) || ty == int64_t(TokenType::UserDefined) ||
        ty == int64_t(TokenType::Unknown)) {
      if (tok.empty() || tok.size() > 65536) continue;
      AddedToken at;
      at.content = tok;
      at.id = int32_t(i);
      at.special = ty != int64_t(TokenType::UserDefined);
      t->special[i] = at.special;
      t->added.push_back(std::move(at));
    } else if (ty == int64_t(TokenType::Byte) && tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>') {
      int hi = hexval(tok[3]), lo = hexval(tok[4]);
      if (hi >= 0 && lo >= 0 && t->model == Model::SpmBPE && t->byte_ids[hi * 16 + lo] < 0)
        t->byte_ids[hi * 16 + lo] = int32_t(i);
    }
  }
  {
    std::vector<std::pair<std::string_view, int32_t>> items;
    items.reserve(n);
    for (size_t i = 0; i < n; ++i) items.emplace_back(d.tokens[i], int32_t(i));
    t->vocab.build(items);
  }
  if (t->model == Model::ByteBPE) {
    for (int b = 0; b < 256; ++b) t->byte_ids[b] = t->vocab.find(byte_symbol(uint8_t(b)));
    t->merges.reserve(d.merges.size());
    for (size_t r = 0; r < d.merges.size(); ++r) {
      const std::string& m = d.merges[r];
      size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) throw FormatError(cat("tokenizer.ggml.merges[", r, "]: expected 'left right'"));
      std::string_view mv(m);
      int32_t a = t->vocab.find(mv.substr(0, sp)), b = t->vocab.find(mv.substr(sp + 1));
      std::string joined = m.substr(0, sp) + m.substr(sp + 1);
      int32_t c = t->vocab.find(joined);
      if (a < 0 || b < 0 || c < 0) continue;  // llama.cpp ignores merges of unknown tokens
      t->merges.insert(a, b, int32_t(r), c);
    }
  }
  t->bos = checked_id(d.bos_id, n, "tokenizer.ggml.bos_token_id");
  t->eos = checked_id(d.eos_id, n, "tokenizer.ggml.eos_token_id");
  t->unk_id = checked_id(d.unk_id, n, "tokenizer.ggml.unknown_token_id");
  checked_id(d.pad_id, n, "tokenizer.ggml.padding_token_id");
  if (d.add_bos.value_or(add_bos_default) && t->bos >= 0) t->prefix_ids = {t->bos};
  if (d.add_eos.value_or(false) && t->eos >= 0) t->suffix_ids = {t->eos};
  t->chat_template = d.chat_template;
  t->finalize();
  return t;
}

}  // namespace gk::text::detail
