// The one strict JSON lexer/pull parser (RFC 8259) of gpukit, for untrusted input.
// It builds no tree: the file readers (safetensors headers, sharded indexes) walk the
// structure they expect and skip (validating) anything else, so memory use does not grow
// with hostile nesting or long arrays; text/json.cpp builds a small tree on top of it for
// tokenizer.json and config.json. Nesting depth is bounded by the caller.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace gk::io::detail {

class JsonReader {
 public:
  static constexpr int kMaxDepth = 64;
  // Throws FormatError if `text` is not valid UTF-8. Errors read
  // "<what>: invalid <doc>: <message> (at <doc> byte N)".
  JsonReader(std::string_view text, std::string what, std::string doc = "JSON header");

  [[noreturn]] void fail(const std::string& msg) const;
  void ws();
  char peek();              // next non-space character ('\0' at the end)
  bool consume(char c);     // skips spaces; true and advances if the next char is c
  void expect(char c, const char* where);
  std::string string(const char* where);           // a JSON string, unescaped (valid UTF-8)
  uint64_t uint(const char* where);                // a non-negative integer that fits 64 bits
  void skip_value(int depth = 0);                  // validates and skips any value
  // A number literal (validated), and whether it has neither fraction nor exponent.
  std::string_view number(bool* integral);
  void literal(const char* word);                  // "true", "false" or "null"
  bool at_end() const { return pos_ >= s_.size(); }
  // Object iteration: begin_object(); bool first = true;
  //   while (next_key(k, first, where)) { ...read the value... }
  void begin_object(const char* where);
  bool next_key(std::string& key, bool& first, const char* where);
  // Array iteration: begin_array(); bool first = true; while (next_elem(first, where)) { ... }
  void begin_array(const char* where);
  bool next_elem(bool& first, const char* where);
  void finish();  // only whitespace may follow

 private:
  uint32_t hex4();
  std::string_view s_;
  size_t pos_ = 0;
  std::string what_;
  std::string doc_;
};

}  // namespace gk::io::detail
