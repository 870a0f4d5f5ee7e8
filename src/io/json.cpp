// Strict JSON pull parser: see json.h.
#include "io/json.h"

#include "gpukit/errors.h"
#include "io/reader.h"

namespace gk::io::detail {

JsonReader::JsonReader(std::string_view text, std::string what, std::string doc)
    : s_(text), what_(std::move(what)), doc_(std::move(doc)) {
  if (!valid_utf8(text)) fail("not valid UTF-8");
}

void JsonReader::fail(const std::string& msg) const {
  throw FormatError(cat(what_, ": invalid ", doc_, ": ", msg, " (at ", doc_, " byte ", pos_, ")"));
}

void JsonReader::ws() {
  while (pos_ < s_.size()) {
    char c = s_[pos_];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') ++pos_;
    else break;
  }
}

char JsonReader::peek() {
  ws();
  return pos_ < s_.size() ? s_[pos_] : '\0';
}

bool JsonReader::consume(char c) {
  if (peek() == c && pos_ < s_.size()) {
    ++pos_;
    return true;
  }
  return false;
}

void JsonReader::expect(char c, const char* where) {
  if (!consume(c)) {
    if (pos_ >= s_.size()) fail(cat("unexpected end of header in ", where, " (expected '", c, "')"));
    fail(cat("expected '", c, "' in ", where, ", found ", quote(s_.substr(pos_, 1))));
  }
}

uint32_t JsonReader::hex4() {
  if (s_.size() - pos_ < 4) fail("truncated \\u escape");
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) {
    char c = s_[pos_++];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
    else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
    else fail("bad hex digit in \\u escape");
  }
  return v;
}

std::string JsonReader::string(const char* where) {
  if (peek() != '"') {
    if (pos_ >= s_.size()) fail(cat("unexpected end of header, expected a string for ", where));
    fail(cat("expected a string for ", where));
  }
  ++pos_;
  std::string out;
  for (;;) {
    if (pos_ >= s_.size()) fail(cat("unterminated string in ", where));
    unsigned char c = static_cast<unsigned char>(s_[pos_++]);
    if (c == '"') break;
    if (c < 0x20) fail(cat("unescaped control character in a string in ", where));
    if (c != '\\') {
      out += char(c);
      continue;
    }
    if (pos_ >= s_.size()) fail("truncated escape");
    char e = s_[pos_++];
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        uint32_t cp = hex4();
        if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired low surrogate in \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (s_.size() - pos_ < 2 || s_[pos_] != '\\' || s_[pos_ + 1] != 'u')
            fail("unpaired high surrogate in \\u escape");
          pos_ += 2;
          uint32_t lo = hex4();
          if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired high surrogate in \\u escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        utf8::append(out, cp);
        break;
      }
      default: fail(cat("invalid escape '\\", quote(std::string_view(&e, 1)), "' in ", where));
    }
  }
  return out;
}

uint64_t JsonReader::uint(const char* where) {
  char c = peek();
  if (c == '-') fail(cat("negative number for ", where));
  if (c < '0' || c > '9') fail(cat("expected a non-negative integer for ", where));
  uint64_t v = 0;
  size_t start = pos_;
  while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
    if (mul_ovf(v, 10, &v) || add_ovf(v, uint64_t(s_[pos_] - '0'), &v))
      fail(cat("integer too large for 64 bits in ", where));
    ++pos_;
  }
  if (pos_ - start > 1 && s_[start] == '0') fail(cat("leading zero in a number in ", where));
  if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
    fail(cat("expected an integer for ", where, ", found a fraction or exponent"));
  return v;
}

std::string_view JsonReader::number(bool* integral) {
  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  ws();
  size_t start = pos_;
  *integral = true;
  auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
  if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
  if (!digit()) fail("malformed number");
  if (s_[pos_] == '0') {
    ++pos_;
  } else {
    while (digit()) ++pos_;
  }
  if (pos_ < s_.size() && s_[pos_] == '.') {
    *integral = false;
    ++pos_;
    if (!digit()) fail("malformed number");
    while (digit()) ++pos_;
  }
  if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
    *integral = false;
    ++pos_;
    if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
    if (!digit()) fail("malformed number");
    while (digit()) ++pos_;
  }
  return s_.substr(start, pos_ - start);
}

void JsonReader::literal(const char* word) {
  ws();
  std::string_view w(word);
  if (s_.substr(pos_, w.size()) != w) fail("invalid literal");
  pos_ += w.size();
}

void JsonReader::skip_value(int depth) {
  if (depth > kMaxDepth) fail(cat("nesting deeper than ", kMaxDepth, " levels"));
  char c = peek();
  switch (c) {
    case '{': {
      begin_object("object");
      std::string k;
      bool first = true;
      while (next_key(k, first, "object")) skip_value(depth + 1);
      return;
    }
    case '[': {
      begin_array("array");
      bool first = true;
      while (next_elem(first, "array")) skip_value(depth + 1);
      return;
    }
    case '"': string("value"); return;
    case 't': literal("true"); return;
    case 'f': literal("false"); return;
    case 'n': literal("null"); return;
    case '\0':
      if (pos_ >= s_.size()) fail("unexpected end of header");
      [[fallthrough]];
    default:
      if (c == '-' || (c >= '0' && c <= '9')) {
        bool integral;
        number(&integral);
        return;
      }
      fail("unexpected character");
  }
}

void JsonReader::begin_object(const char* where) {
  if (peek() != '{') fail(cat("expected an object for ", where));
  ++pos_;
}

bool JsonReader::next_key(std::string& key, bool& first, const char* where) {
  if (consume('}')) return false;
  if (!first) expect(',', where);
  first = false;
  if (peek() == '}') fail(cat("trailing ',' in ", where));
  key = string(where);
  expect(':', where);
  return true;
}

void JsonReader::begin_array(const char* where) {
  if (peek() != '[') fail(cat("expected an array for ", where));
  ++pos_;
}

bool JsonReader::next_elem(bool& first, const char* where) {
  if (consume(']')) return false;
  if (!first) expect(',', where);
  first = false;
  if (peek() == ']') fail(cat("trailing ',' in ", where));
  if (pos_ >= s_.size()) fail(cat("unexpected end of header in ", where));
  return true;
}

void JsonReader::finish() {
  ws();
  if (pos_ != s_.size()) fail("unexpected content after the top-level value");
}

}  // namespace gk::io::detail
