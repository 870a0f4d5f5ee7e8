// A small strict JSON parser for tokenizer.json and tokenizer_config.json. Input is
// untrusted: every read is bounds-checked, nesting depth is capped, strings must be
// valid UTF-8 (\u escapes with surrogate pairs are decoded), and errors raise
// gk::FormatError with the byte offset.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gk::text::json {

enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };

struct Member;

struct Value {
  Kind kind = Kind::Null;
  bool b = false;
  double num = 0;
  bool is_int = false;   // the literal had no fraction or exponent and fits int64
  int64_t i = 0;
  std::string s;
  std::vector<Value> arr;
  std::vector<Member> obj;  // in file order

  bool is_null() const { return kind == Kind::Null; }
  bool is_string() const { return kind == Kind::String; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_array() const { return kind == Kind::Array; }
  // Member lookup (last duplicate wins, like most parsers); null when absent.
  const Value* find(std::string_view key) const;
  // Typed accessors that raise FormatError naming `what` on a type mismatch.
  const std::string& str(const char* what) const;
  int64_t integer(const char* what) const;
  bool boolean(const char* what) const;
  const std::vector<Value>& array(const char* what) const;
};

struct Member {
  std::string key;
  Value value;
};

// Parses a complete document (trailing non-space is an error). max_depth bounds nesting.
Value parse(std::string_view text, int max_depth = 128);

}  // namespace gk::text::json
