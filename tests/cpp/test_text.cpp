// Tokenizer and chat-template tests that need no Python: a small hand-built byte-level
// BPE tokenizer.json, hostile inputs, streaming decode, and 8 threads on one object.
#include <gtest/gtest.h>

#include <ctime>
#include <random>
#include <thread>

#include "gpukit/errors.h"
#include "gpukit/text.h"

using gk::text::Tokenizer;

namespace {

// Byte-level vocabulary: the 256 byte characters plus a few merges.
std::string byte_char(int b) {
  // the GPT-2 byte -> unicode map
  int k = 0;
  for (int c = 0; c < 256; ++c) {
    bool keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
    int cp = keep ? c : 0x100 + k++;
    if (c == b) {
      std::string s;
      if (cp < 0x80) s += char(cp);
      else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
      }
      return s;
    }
  }
  return {};
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

std::string small_tokenizer_json(const std::string& pre) {
  std::string vocab, merges;
  int id = 0;
  for (int b = 0; b < 256; ++b, ++id) {
    if (id) vocab += ",";
    vocab += "\"" + escape(byte_char(b)) + "\":" + std::to_string(id);
  }
  const char* m[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"\xC4\xA0", "w"}, {"o", "r"}, {"\xC4\xA0w", "or"},
                        {"\xC4\xA0wor", "l"}, {"\xC4\xA0worl", "d"}, {"a", "a"}, {"aa", "aa"}};
  for (auto& p : m) {
    vocab += ",\"" + std::string(p[0]) + p[1] + "\":" + std::to_string(id++);
    merges += std::string(merges.empty() ? "" : ",") + "\"" + p[0] + " " + p[1] + "\"";
  }
  std::string added = "[{\"id\":" + std::to_string(id) +
                      ",\"content\":\"<|end|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                      "\"normalized\":false,\"special\":true}]";
  return "{\"version\":\"1.0\",\"added_tokens\":" + added + ",\"normalizer\":null,\"pre_tokenizer\":" + pre +
         ",\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{" +
         vocab + "},\"merges\":[" + merges + "]}}";
}

Tokenizer small() {
  return Tokenizer::from_json(small_tokenizer_json(
      R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})"));
}

}  // namespace

TEST(Text, EncodeDecodeSmall) {
  Tokenizer t = small();
  auto ids = t.encode("hello world<|end|>");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(t.id_to_token(ids[0]), "hello");
  EXPECT_EQ(t.id_to_token(ids[1]), "\xC4\xA0world");
  EXPECT_EQ(t.id_to_token(ids[2]), "<|end|>");
  EXPECT_EQ(t.decode(ids), "hello world<|end|>");
  EXPECT_EQ(t.decode(ids, true), "hello world");
  EXPECT_THROW(t.decode({0, 1 << 20}), gk::IndexError);
  EXPECT_THROW(t.decode({-1}), gk::IndexError);
}

TEST(Text, InvalidUtf8IsReplaced) {
  Tokenizer t = small();
  std::string bad = "a\xFF" "b\xE2\x82";
  EXPECT_EQ(t.encode(bad), t.encode("a\xEF\xBF\xBD" "b\xEF\xBF\xBD"));
}

TEST(Text, LongRunIsFast) {
  Tokenizer t = small();
  std::string s(1 << 20, 'a');
  // CPU time, not wall time: the test machines are shared
  std::clock_t c0 = std::clock();
  auto ids = t.encode(s);
  double sec = double(std::clock() - c0) / CLOCKS_PER_SEC;
  EXPECT_EQ(ids.size(), size_t(1 << 18));  // "aaaa" tokens
  EXPECT_LT(sec, 1.0);
  EXPECT_EQ(t.decode(ids), s);
}

TEST(Text, StreamDecoderNeverSplitsCharacters) {
  Tokenizer t = small();
  std::string text = "h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80!";
  auto ids = t.encode(text);
  gk::text::StreamDecoder d(t);
  std::string all;
  for (int32_t id : ids) {
    std::string piece = d.push(id);
    // each piece is valid UTF-8 on its own
    EXPECT_EQ(t.decode(t.encode(piece, false)), piece);
    all += piece;
  }
  all += d.flush();
  EXPECT_EQ(all, text);
  // an unfinished character at the end is replaced by U+FFFD at flush
  gk::text::StreamDecoder d2(t);
  EXPECT_EQ(d2.push(t.encode("\xE4\xB8\xAD", false)[0]), "");
  EXPECT_EQ(d2.flush(), "\xEF\xBF\xBD");
}

TEST(Text, RandomBytesNeverCrash) {
  Tokenizer t = small();
  std::mt19937 rng(7);
  for (int it = 0; it < 2000; ++it) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = char(rng());
    auto ids = t.encode(s);
    std::string back = t.decode(ids);
    gk::text::StreamDecoder d(t);
    std::string st;
    for (int32_t id : ids) st += d.push(id);
    st += d.flush();
    EXPECT_EQ(st, back);
  }
}

TEST(Text, EightThreadsAgree) {
  Tokenizer t = small();
  std::vector<std::string> texts;
  std::mt19937 rng(3);
  for (int i = 0; i < 64; ++i) {
    std::string s;
    for (int k = 0; k < 2000; ++k) s += "hello world aaaa \xE4\xB8\xAD<|end|> 123"[rng() % 36];
    texts.push_back(s);
  }
  std::vector<std::vector<int32_t>> ref;
  for (auto& s : texts) ref.push_back(t.encode(s));
  std::vector<int> bad(8, 0);
  std::vector<std::thread> th;
  for (int k = 0; k < 8; ++k)
    th.emplace_back([&, k] {
      for (int rep = 0; rep < 4; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (t.encode(texts[i]) != ref[i] || t.decode(ref[i]) != t.decode(t.encode(texts[i]))) bad[k]++;
    });
  for (auto& x : th) x.join();
  for (int k = 0; k < 8; ++k) EXPECT_EQ(bad[k], 0);
}

TEST(Text, MalformedJsonRaises) {
  for (const char* s : {"", "{", "{\"model\":{}}", "[1,2", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999}}}",
                        "\"\\ud800\"", "{\"a\":\"\xFF\"}"}) {
    EXPECT_THROW(Tokenizer::from_json(s), gk::FormatError) << s;
  }
  std::string deep(100000, '[');
  EXPECT_THROW(Tokenizer::from_json(deep), gk::FormatError);
}

TEST(Text, ChatTemplateChatML) {
  const char* tmpl =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
      "Default<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
      "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  std::vector<gk::text::ChatMessage> msgs = {{"user", "Hi"}};
  EXPECT_EQ(gk::text::render_chat(tmpl, msgs),
            "<|im_start|>system\nDefault<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  gk::text::ChatOptions o;
  o.add_generation_prompt = false;
  msgs.insert(msgs.begin(), {"system", "S"});
  EXPECT_EQ(gk::text::render_chat(tmpl, msgs, o), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(Text, ChatTemplateLimits) {
  gk::text::ChatOptions o;
  o.max_steps = 10000;
  EXPECT_THROW(gk::text::render_chat("{% for i in range(100000) %}x{% endfor %}", {}, o), gk::ValueError);
  o.max_output_bytes = 100;
  EXPECT_THROW(gk::text::render_chat("{% for i in range(200) %}x{% endfor %}", {}, o), gk::ValueError);
  EXPECT_THROW(gk::text::render_chat("{{ raise_exception('boom') }}", {}), gk::ValueError);
  EXPECT_THROW(gk::text::render_chat("{% for %}", {}), gk::ValueError);
  EXPECT_THROW(gk::text::render_chat(std::string(5000, '(').insert(0, "{{ "), {}), gk::ValueError);
}
