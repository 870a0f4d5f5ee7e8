// A strict, allocation-light JSON pull parser (RFC 8259) for untrusted headers
// (safetensors, model.safetensors.index.json). It builds no tree: callers walk
// the structure they expect and skip (validating) anything else, so memory use
// does not grow with hostile nesting or long arrays. Nesting depth is bounded.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace gk::io::detail {

class JsonReader {
 public:
  static constexpr int kMaxDepth = 64;
  // Throws FormatError if `text` is not valid UTF-8.
  JsonReader(std::string_view text, std::string what);

  [[noreturn]] void fail(const std::string& msg) const;
  void ws();
  char peek();              // next non-space character ('\0' at the end)
  bool consume(char c);     // skips spaces; true and advances if the next char is c
  void expect(char c, const char* where);
  std::string string(const char* where);           // a JSON string, unescaped (valid UTF-8)
  uint64_t uint(const char* where);                // a non-negative integer that fits 64 bits
  void skip_value(int depth = 0);                  // validates and skips any value
  // Object iteration: begin_object(); bool first = true;
  //   while (next_key(k, first, where)) { ...read the value... }
  void begin_object(const char* where);
  bool next_key(std::string& key, bool& first, const char* where);
  // Array iteration: begin_array(); bool first = true; while (next_elem(first, where)) { ... }
  void begin_array(const char* where);
  bool next_elem(bool& first, const char* where);
  void finish();  // only whitespace may follow

 private:
  void skip_number();
  void literal(const char* word);
  uint32_t hex4();
  std::string_view s_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace gk::io::detail
