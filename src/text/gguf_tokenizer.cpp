// Tokenizer::from_gguf: reads the tokenizer.ggml.* keys through the GGUF reader
// (gk::io::GGUF). Kept apart so the text library builds before the reader exists.
#include "gpukit/errors.h"
#include "gpukit/io.h"
#include "gpukit/text.h"

namespace gk::text {

Tokenizer Tokenizer::from_gguf(const io::GGUF& f) {
  GGUFTokenizerData d;
  auto str = [&](const char* k, std::string* out) {
    if (const io::GGUFValue* v = f.find(k)) *out = v->as_string();
  };
  auto integer = [&](const char* k, int64_t* out) {
    if (const io::GGUFValue* v = f.find(k)) *out = v->as_int();
  };
  auto boolean = [&](const char* k, std::optional<bool>* out) {
    if (const io::GGUFValue* v = f.find(k)) *out = v->as_int() != 0;
  };
  str("tokenizer.ggml.model", &d.model);
  str("tokenizer.ggml.pre", &d.pre);
  str("tokenizer.chat_template", &d.chat_template);
  if (const io::GGUFValue* v = f.find("tokenizer.ggml.tokens")) d.tokens = v->as_strings();
  else throw FormatError("tokenizer.ggml.tokens: missing");
  if (const io::GGUFValue* v = f.find("tokenizer.ggml.scores")) d.scores = v->as_floats();
  if (const io::GGUFValue* v = f.find("tokenizer.ggml.token_type")) d.token_types = v->as_ints();
  if (const io::GGUFValue* v = f.find("tokenizer.ggml.merges")) d.merges = v->as_strings();
  integer("tokenizer.ggml.bos_token_id", &d.bos_id);
  integer("tokenizer.ggml.eos_token_id", &d.eos_id);
  integer("tokenizer.ggml.unknown_token_id", &d.unk_id);
  integer("tokenizer.ggml.padding_token_id", &d.pad_id);
  boolean("tokenizer.ggml.add_bos_token", &d.add_bos);
  boolean("tokenizer.ggml.add_eos_token", &d.add_eos);
  boolean("tokenizer.ggml.add_space_prefix", &d.add_space_prefix);
  return from_gguf_data(d);
}

}  // namespace gk::text
