// Loader for Hugging Face tokenizer.json (byte-level BPE models) and tokenizer_config.json.
#include <algorithm>

#include "gpukit/errors.h"
#include "text/json.h"
#include "text/tokenizer_impl.h"

namespace gk::text::detail {
namespace {
using json::Value;

const char* kGpt2Re = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kLlama3Re =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Re =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string type_of(const Value& v, const char* what) {
  if (!v.is_object()) throw FormatError(cat(what, ": expected an object"));
  const Value* t = v.find("type");
  return t ? t->str(what) : std::string();
}

bool flag(const Value& v, const char* key, bool dflt) {
  const Value* f = v.find(key);
  if (!f || f->is_null()) return dflt;
  return f->boolean(key);
}

// Returns true when the step list ends with a ByteLevel pre-tokenizer.
void pre_step(TokenizerImpl& t, const Value& p, bool last, bool* byte_level) {
  std::string ty = type_of(p, "pre_tokenizer");
  if (ty == "ByteLevel") {
    if (!last) throw FormatError("pre_tokenizer: ByteLevel must be the last step");
    *byte_level = true;
    t.add_prefix_space = flag(p, "add_prefix_space", false);
    if (flag(p, "use_regex", true)) t.pre_steps.push_back(PreStep::Gpt2);
  } else if (ty == "Digits") {
    t.pre_steps.push_back(flag(p, "individual_digits", false) ? PreStep::DigitsIndividual : PreStep::DigitsGrouped);
  } else if (ty == "Split") {
    const Value* pat = p.find("pattern");
    const Value* re = pat ? pat->find("Regex") : nullptr;
    if (!re) throw FormatError("pre_tokenizer: Split needs a Regex pattern");
    const Value* beh = p.find("behavior");
    if (!beh || beh->str("behavior") != "Isolated" || flag(p, "invert", false))
      throw FormatError("pre_tokenizer: only Split(behavior=Isolated, invert=false) is supported");
    const std::string& r = re->str("pattern");
    if (r == kGpt2Re) t.pre_steps.push_back(PreStep::Gpt2);
    else if (r == kLlama3Re) t.pre_steps.push_back(PreStep::Llama3);
    else if (r == kQwen2Re) t.pre_steps.push_back(PreStep::Qwen2);
    else throw FormatError("pre_tokenizer: unsupported Split pattern (known: GPT-2, Llama-3, Qwen2)");
  } else {
    throw FormatError(cat("pre_tokenizer: unsupported type '", ty, "'"));
  }
}

int32_t token_id(const TokenizerImpl& t, const std::string& tok, const char* what) {
  int32_t id = t.vocab.find(tok);
  if (id < 0) throw FormatError(cat(what, ": token '", tok, "' is not in the vocabulary"));
  return id;
}

void post_processor(TokenizerImpl& t, const Value& p) {
  if (p.is_null()) return;
  std::string ty = type_of(p, "post_processor");
  auto ids_of = [&](const Value& pair, const char* what) {
    const auto& a = pair.array(what);
    if (a.size() != 2) throw FormatError(cat(what, ": expected [token, id]"));
    int64_t id = a[1].integer(what);
    if (id < 0 || id >= int64_t(t.id_to_token.size())) throw FormatError(cat(what, ": id out of range"));
    return int32_t(id);
  };
  if (ty == "ByteLevel") return;
  if (ty == "Sequence") {
    const Value* ps = p.find("processors");
    if (!ps) throw FormatError("post_processor: Sequence without processors");
    for (auto& q : ps->array("processors")) post_processor(t, q);
  } else if (ty == "RobertaProcessing" || ty == "BertProcessing") {
    const Value *cls = p.find("cls"), *sep = p.find("sep");
    if (!cls || !sep) throw FormatError("post_processor: cls/sep missing");
    t.prefix_ids = {ids_of(*cls, "cls")};
    t.suffix_ids = {ids_of(*sep, "sep")};
  } else if (ty == "TemplateProcessing") {
    const Value* single = p.find("single");
    const Value* specials = p.find("special_tokens");
    if (!single) throw FormatError("post_processor: TemplateProcessing without 'single'");
    t.prefix_ids.clear();
    t.suffix_ids.clear();
    bool seen_a = false;
    for (auto& piece : single->array("single")) {
      if (const Value* sp = piece.find("SpecialToken")) {
        const Value* idv = sp->find("id");
        if (!idv) throw FormatError("post_processor: SpecialToken without id");
        const std::string& name = idv->str("SpecialToken.id");
        const Value* entry = specials ? specials->find(name) : nullptr;
        std::vector<int32_t> ids;
        if (entry && entry->find("ids")) {
          for (auto& x : entry->find("ids")->array("ids")) {
            int64_t id = x.integer("special_tokens.ids");
            if (id < 0 || id >= int64_t(t.id_to_token.size())) throw FormatError("post_processor: id out of range");
            ids.push_back(int32_t(id));
          }
        } else {
          ids.push_back(token_id(t, name, "post_processor"));
        }
        auto& dst = seen_a ? t.suffix_ids : t.prefix_ids;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else if (piece.find("Sequence")) {
        seen_a = true;
      } else {
        throw FormatError("post_processor: unknown TemplateProcessing piece");
      }
    }
  } else {
    throw FormatError(cat("post_processor: unsupported type '", ty, "'"));
  }
}

std::string token_text(const Value* v) {
  if (!v || v->is_null()) return {};
  if (v->is_string()) return v->s;
  if (const Value* c = v->find("content")) return c->str("content");
  return {};
}

}  // namespace

std::shared_ptr<TokenizerImpl> load_json(std::string_view tokenizer_json, std::string_view config_json) {
  auto t = std::make_shared<TokenizerImpl>();
  Value root = json::parse(tokenizer_json);
  if (!root.is_object()) throw FormatError("tokenizer.json: expected an object");
  const Value* model = root.find("model");
  if (!model || !model->is_object()) throw FormatError("tokenizer.json: missing 'model'");
  std::string mty = type_of(*model, "model");
  if (!mty.empty() && mty != "BPE") throw FormatError(cat("model: unsupported type '", mty, "' (only BPE)"));
  if (const Value* d = model->find("dropout"); d && !d->is_null())
    throw FormatError("model: BPE dropout is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const Value* d = model->find(k); d && !d->is_null() && !d->str(k).empty())
      throw FormatError(cat("model: ", k, " is not supported"));
  t->model = Model::ByteBPE;
  t->ignore_merges = flag(*model, "ignore_merges", false);
  t->byte_fallback = flag(*model, "byte_fallback", false);

  // vocabulary
  const Value* vocab = model->find("vocab");
  if (!vocab || !vocab->is_object()) throw FormatError("model.vocab: expected an object");
  int64_t max_id = -1;
  auto note_id = [&](int64_t id, const char* what) {
    if (id < 0 || id >= (int64_t(1) << 30)) throw FormatError(cat(what, ": id ", id, " out of range"));
    max_id = std::max(max_id, id);
  };
  for (auto& [k, v] : vocab->obj) note_id(v.integer("model.vocab"), "model.vocab");
  const Value* added = root.find("added_tokens");
  if (added && !added->is_null())
    for (auto& a : added->array("added_tokens")) {
      const Value* id = a.find("id");
      if (!id) throw FormatError("added_tokens: entry without id");
      note_id(id->integer("added_tokens.id"), "added_tokens");
    }
  size_t entries = vocab->obj.size() + (added && added->is_array() ? added->arr.size() : 0);
  if (max_id >= int64_t(2 * entries + 1024))
    throw FormatError(cat("model.vocab: id ", max_id, " far beyond the ", entries, " entries (sparse ids)"));
  t->id_to_token.assign(size_t(max_id + 1), std::string());
  t->special.assign(size_t(max_id + 1), 0);
  for (auto& [k, v] : vocab->obj) {
    auto& slot = t->id_to_token[size_t(v.i)];
    if (!slot.empty() && slot != k) throw FormatError(cat("model.vocab: id ", v.i, " assigned twice"));
    slot = k;
  }
  if (added && !added->is_null())
    for (auto& a : added->array("added_tokens")) {
      AddedToken at;
      at.id = int32_t(a.find("id")->i);
      const Value* c = a.find("content");
      if (!c) throw FormatError("added_tokens: entry without content");
      at.content = c->str("added_tokens.content");
      if (at.content.size() > 65536) throw FormatError("added_tokens: content longer than 64 KiB");
      at.special = flag(a, "special", false);
      at.lstrip = flag(a, "lstrip", false);
      at.rstrip = flag(a, "rstrip", false);
      at.normalized = flag(a, "normalized", false);
      t->id_to_token[at.id] = at.content;
      if (at.special) t->special[at.id] = 1;
      t->added.push_back(std::move(at));
    }
  // Temporary lookup for building merges (finalize rebuilds it with added tokens).
  {
    std::vector<std::pair<std::string_view, int32_t>> items;
    for (auto& [k, v] : vocab->obj) items.emplace_back(k, int32_t(v.i));
    t->vocab.build(items);
  }
  if (const Value* u = model->find("unk_token"); u && !u->is_null()) t->unk_id = t->vocab.find(u->str("unk_token"));

  // pre-tokenizer
  const Value* pre = root.find("pre_tokenizer");
  bool byte_level = false;
  if (!pre || pre->is_null()) throw FormatError("pre_tokenizer: missing (a ByteLevel pre-tokenizer is required)");
  if (type_of(*pre, "pre_tokenizer") == "Sequence") {
    const Value* ps = pre->find("pretokenizers");
    if (!ps) throw FormatError("pre_tokenizer: Sequence without pretokenizers");
    const auto& arr = ps->array("pretokenizers");
    for (size_t i = 0; i < arr.size(); ++i) pre_step(*t, arr[i], i + 1 == arr.size(), &byte_level);
  } else {
    pre_step(*t, *pre, true, &byte_level);
  }
  if (!byte_level) throw FormatError("pre_tokenizer: a ByteLevel pre-tokenizer is required");
  t->pre_name = "tokenizer.json";

  if (const Value* n = root.find("normalizer"); n && !n->is_null()) {
    std::string ty = type_of(*n, "normalizer");
    if (ty == "NFC") t->nfc_declared = true;
    else throw FormatError(cat("normalizer: unsupported type '", ty, "'"));
  }
  if (const Value* d = root.find("decoder"); d && !d->is_null()) {
    std::string ty = type_of(*d, "decoder");
    if (ty != "ByteLevel") throw FormatError(cat("decoder: unsupported type '", ty, "'"));
  }

  // initial symbols: the byte-level character of each byte
  for (int b = 0; b < 256; ++b) {
    t->byte_ids[b] = t->vocab.find(byte_symbol(uint8_t(b)));
    if (t->byte_ids[b] < 0 && t->byte_fallback) {
      static const char* hex = "0123456789ABCDEF";
      std::string bt = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
      t->byte_ids[b] = t->vocab.find(bt);
    }
  }

  // merges
  const Value* merges = model->find("merges");
  if (merges && !merges->is_null()) {
    const auto& arr = merges->array("model.merges");
    t->merges.reserve(arr.size());
    for (size_t r = 0; r < arr.size(); ++r) {
      std::string left, right;
      if (arr[r].is_string()) {
        const std::string& m = arr[r].s;
        size_t sp = m.find(' ', 1);
        if (sp == std::string::npos) throw FormatError(cat("model.merges[", r, "]: expected 'left right'"));
        left = m.substr(0, sp);
        right = m.substr(sp + 1);
      } else {
        const auto& pr = arr[r].array("model.merges");
        if (pr.size() != 2) throw FormatError(cat("model.merges[", r, "]: expected a pair"));
        left = pr[0].str("model.merges");
        right = pr[1].str("model.merges");
      }
      int32_t a = t->vocab.find(left), b = t->vocab.find(right), m = t->vocab.find(left + right);
      if (a < 0 || b < 0 || m < 0)
        throw FormatError(cat("model.merges[", r, "]: token not in the vocabulary"));
      t->merges.insert(a, b, int32_t(r), m);  // the first (highest priority) occurrence wins
    }
  }

  const Value* pp = root.find("post_processor");
  if (pp) post_processor(*t, *pp);

  // tokenizer_config.json
  std::string bos_tok, eos_tok;
  if (!config_json.empty()) {
    Value cfg = json::parse(config_json);
    if (cfg.is_object()) {
      bos_tok = token_text(cfg.find("bos_token"));
      eos_tok = token_text(cfg.find("eos_token"));
      if (const Value* ct = cfg.find("chat_template")) {
        if (ct->is_string()) t->chat_template = ct->s;
        else if (ct->is_array())
          for (auto& e : ct->arr)
            if (const Value* name = e.find("name"); name && name->is_string() && name->s == "default")
              if (const Value* tt = e.find("template")) t->chat_template = tt->str("chat_template");
      }
    }
  }
  t->finalize();
  if (!bos_tok.empty()) t->bos = t->vocab.find(bos_tok);
  else if (!t->prefix_ids.empty()) t->bos = t->prefix_ids[0];
  if (!eos_tok.empty()) t->eos = t->vocab.find(eos_tok);
  else
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>"})
      if (int32_t id = t->vocab.find(name); id >= 0 && t->eos < 0) t->eos = id;
  return t;
}

}  // namespace gk::text::detail
