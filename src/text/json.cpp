#include "text/json.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "gpukit/errors.h"
#include "core/utf8.h"

namespace gk::text::json {

const Value* Value::find(std::string_view key) const {
  if (kind != Kind::Object) return nullptr;
  const Value* r = nullptr;
  for (auto& [k, v] : obj)
    if (k == key) r = &v;
  return r;
}
const std::string& Value::str(const char* what) const {
  if (kind != Kind::String) throw FormatError(cat(what, ": expected a JSON string"));
  return s;
}
int64_t Value::integer(const char* what) const {
  if (kind != Kind::Number || !is_int) throw FormatError(cat(what, ": expected a JSON integer"));
  return i;
}
bool Value::boolean(const char* what) const {
  if (kind != Kind::Bool) throw FormatError(cat(what, ": expected a JSON boolean"));
  return b;
}
const std::vector<Value>& Value::array(const char* what) const {
  if (kind != Kind::Array) throw FormatError(cat(what, ": expected a JSON array"));
  return arr;
}

namespace {

struct Parser {
  std::string_view t;
  size_t p = 0;
  int max_depth;

  [[noreturn]] void fail(const char* msg) const { throw FormatError(cat("JSON: ", msg, " at byte ", p)); }
  void ws() {
    while (p < t.size() && (t[p] == ' ' || t[p] == '\t' || t[p] == '\n' || t[p] == '\r')) ++p;
  }
  char peek() const { return p < t.size() ? t[p] : '\0'; }
  bool lit(const char* w) {
    size_t n = std::strlen(w);
    if (t.size() - p >= n && t.compare(p, n, w) == 0) {
      p += n;
      return true;
    }
    return false;
  }
  unsigned hex4() {
    if (t.size() - p < 4) fail("truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = t[p++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }
  std::string string() {
    ++p;  // opening quote
    std::string out;
    for (;;) {
      if (p >= t.size()) fail("unterminated string");
      unsigned char c = (unsigned char)t[p];
      if (c == '"') {
        ++p;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c == '\\') {
        ++p;
        if (p >= t.size()) fail("truncated escape");
        char e = t[p++];
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
            unsigned cp = hex4();
            if (cp >= 0xD800 && cp < 0xDC00) {
              if (!lit("\\u")) fail("unpaired high surrogate");
              unsigned lo = hex4();
              if (lo < 0xDC00 || lo >= 0xE000) fail("bad low surrogate");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
              fail("unpaired low surrogate");
            }
            utf8::append(out, cp);
            break;
          }
          default: fail("unknown escape");
        }
        continue;
      }
      // A run of plain bytes: validate UTF-8 one code point at a time.
      if (c < 0x80) {
        out += char(c);
        ++p;
        continue;
      }
      size_t n = utf8::valid_len(reinterpret_cast<const uint8_t*>(t.data()) + p, t.size() - p);
      if (n == 0) fail("invalid UTF-8 in string");
      out.append(t.data() + p, n);
      p += n;
    }
  }
  Value number() {
    size_t s = p;
    bool integral = true;
    if (peek() == '-') ++p;
    if (peek() == '0') {
      ++p;
    } else if (peek() >= '1' && peek() <= '9') {
      while (p < t.size() && t[p] >= '0' && t[p] <= '9') ++p;
    } else {
      fail("bad number");
    }
    if (peek() == '.') {
      integral = false;
      ++p;
      if (!(peek() >= '0' && peek() <= '9')) fail("bad fraction");
      while (p < t.size() && t[p] >= '0' && t[p] <= '9') ++p;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++p;
      if (peek() == '+' || peek() == '-') ++p;
      if (!(peek() >= '0' && peek() <= '9')) fail("bad exponent");
      while (p < t.size() && t[p] >= '0' && t[p] <= '9') ++p;
    }
    std::string lit(t.substr(s, p - s));
    Value v;
    v.kind = Kind::Number;
    v.num = std::strtod(lit.c_str(), nullptr);
    if (integral && lit.size() <= 19) {  // fits int64 for 18 digits + sign, checked below
      errno = 0;
      long long x = std::strtoll(lit.c_str(), nullptr, 10);
      if (errno == 0) {
        v.is_int = true;
        v.i = x;
      }
    }
    return v;
  }
  Value value(int depth) {
    if (depth > max_depth) fail("nesting too deep");
    ws();
    Value v;
    char c = peek();
    if (c == '{') {
      ++p;
      v.kind = Kind::Object;
      ws();
      if (peek() == '}') {
        ++p;
        return v;
      }
      for (;;) {
        ws();
        if (peek() != '"') fail("expected a member name");
        std::string k = string();
        ws();
        if (peek() != ':') fail("expected ':'");
        ++p;
        v.obj.push_back(Member{std::move(k), value(depth + 1)});
        ws();
        if (peek() == ',') {
          ++p;
          continue;
        }
        if (peek() == '}') {
          ++p;
          return v;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      ++p;
      v.kind = Kind::Array;
      ws();
      if (peek() == ']') {
        ++p;
        return v;
      }
      for (;;) {
        v.arr.push_back(value(depth + 1));
        ws();
        if (peek() == ',') {
          ++p;
          continue;
        }
        if (peek() == ']') {
          ++p;
          return v;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Kind::String;
      v.s = string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (lit("true")) {
      v.kind = Kind::Bool;
      v.b = true;
      return v;
    }
    if (lit("false")) {
      v.kind = Kind::Bool;
      return v;
    }
    if (lit("null")) return v;
    fail(p >= t.size() ? "unexpected end of input" : "unexpected character");
  }
};

}  // namespace

Value parse(std::string_view text, int max_depth) {
  Parser ps{text, 0, max_depth};
  Value v = ps.value(0);
  ps.ws();
  if (ps.p != text.size()) ps.fail("trailing characters after the document");
  return v;
}

}  // namespace gk::text::json
