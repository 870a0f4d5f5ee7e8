// Tokenizers and chat templates.
//
// Tokenizer: byte-level BPE (GPT-2, Llama-3, Qwen2/3, SmolLM) from a Hugging Face
// tokenizer.json or from GGUF metadata (tokenizer.ggml.model = "gpt2"), and
// SentencePiece-style BPE (Llama-2, Mistral: tokenizer.ggml.model = "llama") from GGUF.
// A Tokenizer is immutable after construction: one object may be used from any number
// of threads at once. Copies share the same tables.
//
// Input text is untrusted. Invalid UTF-8 is handled the documented way: every
// ill-formed subsequence is replaced by U+FFFD (maximal-subpart rule, the same as
// Python's bytes.decode("utf-8", "replace")) before encoding. Decoding joins the
// tokens' bytes and replaces ill-formed subsequences the same way; StreamDecoder
// never emits part of a UTF-8 character.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gk::io {
class GGUF;
}

namespace gk::text {

// GGUF token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

// The tokenizer.ggml.* metadata of a GGUF file.
struct GGUFTokenizerData {
  std::string model;                 // "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE)
  std::string pre;                   // pre-tokenizer name: "gpt-2", "llama-bpe", "qwen2", "smollm", ...
  std::vector<std::string> tokens;
  std::vector<double> scores;        // "llama" models: merge priority (higher merges first)
  std::vector<int64_t> token_types;  // TokenType values; empty = all Normal
  std::vector<std::string> merges;   // "gpt2" models: "left right", highest priority first
  int64_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string chat_template;
};

namespace detail {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // A Hugging Face tokenizer.json document. `config_json` (optional) is the
  // tokenizer_config.json beside it: bos/eos tokens, add_bos/eos_token, chat_template.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {});
  // Reads path (a tokenizer.json) and, when present, tokenizer_config.json in the same folder.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_gguf_data(const GGUFTokenizerData& data);
  // Reads the tokenizer.ggml.* keys of a GGUF file (src/text/gguf_tokenizer.cpp).
  static Tokenizer from_gguf(const io::GGUF& file);

  // Token ids of `text`. add_special_tokens adds BOS/EOS as the tokenizer's post-processor
  // (or GGUF add_bos/add_eos) says; parse_special matches special/added tokens in the text.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true,
                              bool parse_special = true) const;
  // Text of `ids` (IndexError for an id outside [0, vocab_size)).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // The raw bytes one token stands for (before UTF-8 repair); empty for skipped specials.
  std::string token_bytes(int32_t id) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the tokenizer has none
  int32_t eos_id() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const;  // IndexError when out of range
  bool is_special(int32_t id) const;
  const std::string& chat_template() const;
  std::string kind() const;  // "bpe-bytelevel" or "bpe-spm"
  std::string pre_tokenizer() const;

  const detail::TokenizerImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const detail::TokenizerImpl> impl_;
};

// Incremental decoding for streaming: push ids one at a time; each call returns the
// text completed so far and holds back an unfinished UTF-8 character.
class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  std::string push(const std::vector<int32_t>& ids);
  // The held-back bytes, with an unfinished character replaced by U+FFFD; resets.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tok_;
  bool skip_;
  bool first_ = true;
  std::string pending_;
  std::string take(bool final);
};

// ---- chat templates ----
struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  size_t max_output_bytes = 64 << 20;  // execution limits of the template interpreter
  size_t max_steps = 10'000'000;
};

// Renders `messages` with a Jinja chat template (the tokenizer.chat_template of GGUF
// metadata or tokenizer_config.json) in a sandboxed interpreter of the Jinja subset
// chat templates use: no attribute access to host objects, no imports, bounded steps,
// output and recursion. Unsupported constructs raise gk::ValueError; the template's
// raise_exception(...) raises gk::ValueError with its message.
std::string render_chat(std::string_view chat_template, const std::vector<ChatMessage>& messages,
                        const ChatOptions& options = {});

}  // namespace gk::text
