#include "text/json.h"

#include <cerrno>
#include <cstdlib>

#include "gpukit/errors.h"
#include "io/json.h"

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

// Builds the tree with the shared lexer (io/json.h), which checks the syntax, the escapes and UTF-8.
Value read_value(io::detail::JsonReader& r, int depth, int max_depth) {
  if (depth > max_depth) r.fail(cat("nesting deeper than ", max_depth, " levels"));
  Value v;
  char c = r.peek();
  if (c == '{') {
    v.kind = Kind::Object;
    r.begin_object("object");
    std::string k;
    bool first = true;
    while (r.next_key(k, first, "object")) v.obj.push_back(Member{std::move(k), read_value(r, depth + 1, max_depth)});
  } else if (c == '[') {
    v.kind = Kind::Array;
    r.begin_array("array");
    bool first = true;
    while (r.next_elem(first, "array")) v.arr.push_back(read_value(r, depth + 1, max_depth));
  } else if (c == '"') {
    v.kind = Kind::String;
    v.s = r.string("value");
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    bool integral = false;
    std::string lit(r.number(&integral));
    v.kind = Kind::Number;
    v.num = std::strtod(lit.c_str(), nullptr);
    if (integral) {
      errno = 0;
      long long x = std::strtoll(lit.c_str(), nullptr, 10);
      if (errno == 0) {  // out of int64 range: a number without an integer value
        v.is_int = true;
        v.i = x;
      }
    }
  } else if (c == 't' || c == 'f') {
    v.kind = Kind::Bool;
    v.b = c == 't';
    r.literal(v.b ? "true" : "false");
  } else if (c == 'n') {
    r.literal("null");
  } else {
    r.fail(r.at_end() ? "unexpected end of input" : "unexpected character");
  }
  return v;
}

}  // namespace

Value parse(std::string_view text, int max_depth) {
  io::detail::JsonReader r(text, "JSON", "document");
  Value v = read_value(r, 0, max_depth);
  r.finish();
  return v;
}

}  // namespace gk::text::json
