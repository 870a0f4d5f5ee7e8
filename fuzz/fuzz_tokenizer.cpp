// libFuzzer target for the tokenizers, the tokenizer.json parser and the chat-template
// interpreter. The first input byte picks the mode; the rest is the payload.
//   modes 0-4: encode/decode/stream-decode with a byte-level tokenizer for each
//              pre-tokenizer (gpt-2, llama-bpe, qwen2, smollm) and a SentencePiece one
//   mode 5:    decode of arbitrary ids (pairs of bytes), out-of-range ids must raise
//   mode 6:    Tokenizer::from_json on the payload
//   mode 7:    render_chat with the payload as the template
// Build and run: fuzz/run_tokenizer.sh SECONDS
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpukit/errors.h"
#include "gpukit/text.h"
#include "core/utf8.h"
#include "text/tokenizer_impl.h"

namespace {

using gk::text::GGUFTokenizerData;
using gk::text::Tokenizer;

std::string byte_char(int b) { return gk::text::detail::byte_symbol(uint8_t(b)); }  // (the tokenizer's own map)

Tokenizer byte_level(const char* pre) {
  GGUFTokenizerData d;
  d.model = "gpt2";
  d.pre = pre;
  d.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  d.token_types = {3, 3, 4};
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(byte_char(b));
    d.token_types.push_back(1);
  }
  const char* m[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}, {"o", "r"},
                        {"\xC4\xA0w", "or"}, {"a", "a"}, {"aa", "aa"}, {"aa", "a"}, {"1", "2"}, {"\xC4\xA0", "\xC4\xA0"},
                        {"\xC3\xA4", "\xC2\xB8"}, {"\xC4\x8A", "\xC4\x8A"}, {"'", "s"}};
  for (auto& p : m) {
    d.tokens.push_back(std::string(p[0]) + p[1]);
    d.token_types.push_back(1);
    d.merges.push_back(std::string(p[0]) + " " + p[1]);
  }
  d.bos_id = 0;
  d.eos_id = 0;
  return Tokenizer::from_gguf_data(d);
}

Tokenizer spm() {
  GGUFTokenizerData d;
  d.model = "llama";
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.token_types = {2, 3, 3};
  d.scores = {0, 0, 0};
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    d.token_types.push_back(6);
    d.scores.push_back(0);
  }
  const char* pieces[] = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "\xE2\x96\x81" "ab", "\xE2\x96\x81\xE2\x96\x81", "e",
                          "\xE4\xB8\xAD"};
  float s = -1;
  for (const char* p : pieces) {
    d.tokens.push_back(p);
    d.token_types.push_back(1);
    d.scores.push_back(s--);
  }
  d.bos_id = 1;
  d.eos_id = 2;
  d.unk_id = 0;
  return Tokenizer::from_gguf_data(d);
}

void check(bool ok, const char* what) {
  if (!ok) {
#ifdef GK_FUZZ_NO_ABORT  // replayed inside the unit tests
    throw std::logic_error(std::string("fuzz_tokenizer: invariant failed: ") + what);
#else
    std::fprintf(stderr, "fuzz_tokenizer: invariant failed: %s\n", what);
    std::abort();
#endif
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Tokenizer> toks = {byte_level("gpt-2"), byte_level("llama-bpe"), byte_level("qwen2"),
                                              byte_level("smollm"), spm()};
  if (size == 0) return 0;
  int mode = data[0] % 8;
  std::string payload(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (mode < 5) {
    const Tokenizer& t = toks[mode];
    for (bool parse_special : {true, false}) {
      auto ids = t.encode(payload, true, parse_special);
      for (int32_t id : ids) check(id >= 0 && id < t.vocab_size(), "id in range");
      std::string text = t.decode(ids);
      std::string skipped = t.decode(ids, true);
      gk::text::StreamDecoder d(t);
      std::string streamed;
      for (int32_t id : ids) streamed += d.push(id);
      streamed += d.flush();
      check(streamed == text, "streamed decode equals decode");
    }
    // round trip: the (U+FFFD-repaired) text comes back exactly
    std::string want = gk::utf8::sanitize(payload);
    if (mode == 4)  // SentencePiece: U+2581 in the input is the space marker and decodes to ' '
      for (size_t p; (p = want.find("\xE2\x96\x81")) != std::string::npos;) want.replace(p, 3, " ");
    check(t.decode(t.encode(payload, false, false)) == want, "round trip");
  } else if (mode == 5) {
    const Tokenizer& t = toks[data[1 % size] % 5];
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < payload.size(); i += 2)
      ids.push_back(int32_t(uint8_t(payload[i]) | (uint8_t(payload[i + 1]) << 8)) - 8);
    try {
      t.decode(ids);
      gk::text::StreamDecoder d(t, true);
      d.push(ids);
      d.flush();
    } catch (const gk::IndexError&) {
    }
  } else if (mode == 6) {
    try {
      Tokenizer t = Tokenizer::from_json(payload);
      t.decode(t.encode("Hello world 123 \xE4\xB8\xAD"));
    } catch (const gk::FormatError&) {
    }
  } else {
    std::vector<gk::text::ChatMessage> msgs = {{"system", "sys"}, {"user", "hi"}, {"assistant", "yo"}};
    gk::text::ChatOptions o;
    o.max_steps = 100000;
    o.max_output_bytes = 1 << 20;
    try {
      gk::text::render_chat(payload, msgs, o);
    } catch (const gk::ValueError&) {
    }
  }
  return 0;
}
