// Value helpers of the Jinja subset: truthiness, str()/repr(), tojson, equality and
// ordering, and the string/dict methods templates call.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "gpukit/errors.h"
#include "text/jinja_internal.h"

namespace gk::text::jinja {

const Value* Value::get(std::string_view key) const {
  if (kind != DictK) return nullptr;
  for (auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

Value Value::make_list(List l) {
  Value v;
  v.kind = ListK;
  for (auto& e : l) {
    v.depth = std::max(v.depth, e.depth + 1);
    v.has_ns |= e.is_namespace || e.has_ns;
  }
  if (v.depth > kMaxDepth) detail::fail("values nested too deeply");
  v.list = std::make_shared<List>(std::move(l));
  return v;
}

Value Value::make_dict(Dict d) {
  Value v;
  v.kind = DictK;
  for (auto& e : d) {
    v.depth = std::max(v.depth, e.second.depth + 1);
    v.has_ns |= e.second.is_namespace || e.second.has_ns;
  }
  if (v.depth > kMaxDepth) detail::fail("values nested too deeply");
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}

namespace detail {

size_t cost(const Value& v) {
  switch (v.kind) {
    case Value::Str: return 1 + v.s.size() / 16;
    case Value::ListK: return 1 + v.list->size();
    case Value::DictK: return 1 + v.dict->size();
    default: return 1;
  }
}

[[noreturn]] void fail(const std::string& m) { throw ValueError("chat template: " + m); }

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Undefined:
    case Value::None: return false;
    case Value::Bool: return v.b;
    case Value::Int: return v.i != 0;
    case Value::Float: return v.f != 0;
    case Value::Str: return !v.s.empty();
    case Value::ListK: return !v.list->empty();
    case Value::DictK: return !v.dict->empty();
    default: return true;
  }
}


std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Undefined: return "";
    case Value::None: return "None";
    case Value::Bool: return v.b ? "True" : "False";
    case Value::Int: return std::to_string(v.i);
    case Value::Float: {
      if (std::isnan(v.f)) return "nan";
      if (std::isinf(v.f)) return v.f > 0 ? "inf" : "-inf";
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, v.f);
      std::string s(buf, r.ptr);
      if (s.find_first_of(".en") == std::string::npos) s += ".0";
      return s;
    }
    case Value::Str: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v) { return repr_at(v, 0); }

std::string repr_at(const Value& v, int depth) {
  if (depth > 100) fail("value nested too deeply to print");
  tick(cost(v));
  if (v.kind == Value::Str) {
    char q = v.s.find('\'') != std::string::npos && v.s.find('"') == std::string::npos ? '"' : '\'';
    std::string o(1, q);
    for (char c : v.s) {
      if (c == q || c == '\\') o += '\\', o += c;
      else if (c == '\n') o += "\\n";
      else if (c == '\t') o += "\\t";
      else if (c == '\r') o += "\\r";
      else o += c;
    }
    return o + q;
  }
  if (v.kind == Value::ListK) {
    std::string o = "[";
    for (size_t i = 0; i < v.list->size(); ++i) o += (i ? ", " : "") + repr_at((*v.list)[i], depth + 1);
    return o + "]";
  }
  if (v.kind == Value::DictK) {
    std::string o = "{";
    bool first = true;
    for (auto& [k, x] : *v.dict) {
      o += (first ? "" : ", ") + repr_at(Value::str(k), depth + 1) + ": " + repr_at(x, depth + 1);
      first = false;
    }
    return o + "}";
  }
  return to_str(v);
}

void json_str(const std::string& s, std::string& o) {
  o += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += char(c);
        }
    }
  }
  o += '"';
}

// json.dumps(ensure_ascii=False) with the default separators, as HF's tojson filter.
void to_json(const Value& v, std::string& o, int depth) {
  if (depth > 100) fail("tojson: nesting too deep");
  tick(cost(v));
  switch (v.kind) {
    case Value::Undefined:
    case Value::None: o += "null"; break;
    case Value::Bool: o += v.b ? "true" : "false"; break;
    case Value::Int: o += std::to_string(v.i); break;
    case Value::Float: o += std::isfinite(v.f) ? to_str(v) : (std::isnan(v.f) ? "NaN" : v.f > 0 ? "Infinity" : "-Infinity"); break;
    case Value::Str: json_str(v.s, o); break;
    case Value::ListK:
      o += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) o += ", ";
        to_json((*v.list)[i], o, depth + 1);
      }
      o += ']';
      break;
    case Value::DictK: {
      o += '{';
      bool first = true;
      for (auto& [k, x] : *v.dict) {
        if (!first) o += ", ";
        first = false;
        json_str(k, o);
        o += ": ";
        to_json(x, o, depth + 1);
      }
      o += '}';
      break;
    }
    default: fail("tojson: value is not serializable");
  }
}

bool is_num(const Value& v) { return v.kind == Value::Int || v.kind == Value::Float || v.kind == Value::Bool; }
double num(const Value& v) { return v.kind == Value::Float ? v.f : v.kind == Value::Int ? double(v.i) : double(v.b); }
int64_t as_int(const Value& v) { return v.kind == Value::Int ? v.i : v.kind == Value::Bool ? int64_t(v.b) : int64_t(v.f); }

bool equal(const Value& a, const Value& b) {
  tick(1);
  if (is_num(a) && is_num(b)) {
    if (a.kind != Value::Float && b.kind != Value::Float) return as_int(a) == as_int(b);
    return num(a) == num(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Undefined:
    case Value::None: return true;
    case Value::Str: return a.s == b.s;
    case Value::ListK:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Value::DictK: return a.dict == b.dict;
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (is_num(a) && is_num(b)) return num(a) < num(b) ? -1 : num(a) > num(b) ? 1 : 0;
  if (a.kind == Value::Str && b.kind == Value::Str) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  fail("'<' and '>' need two numbers or two strings");
}

std::string strip(const std::string& s, bool left, bool right, const std::string* chars) {
  auto is = [&](char c) {
    return chars ? chars->find(c) != std::string::npos : (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v');
  };
  size_t a = 0, b = s.size();
  if (left)
    while (a < b && is(s[a])) ++a;
  if (right)
    while (b > a && is(s[b - 1])) --b;
  return s.substr(a, b - a);
}

Value items_of(const Value& d) {
  List l;
  for (auto& [k, v] : *d.dict) l.push_back(Value::make_list({Value::str(k), v}));
  return Value::make_list(std::move(l));
}

Value method_call(size_t max_size, const Value& self, const std::string& m, const Args& a) {
  if (self.kind == Value::Str) {
    const std::string& s = self.s;
    const Value* x = a.arg(0, "chars");
    const std::string* chars = x && x->kind == Value::Str ? &x->s : nullptr;
    if (m == "strip") return Value::str(strip(s, true, true, chars));
    if (m == "lstrip") return Value::str(strip(s, true, false, chars));
    if (m == "rstrip") return Value::str(strip(s, false, true, chars));
    if (m == "upper" || m == "lower") {
      std::string r = s;
      for (auto& ch : r) ch = char(m == "upper" ? std::toupper((unsigned char)ch) : std::tolower((unsigned char)ch));
      return Value::str(r);
    }
    if (m == "startswith" || m == "endswith") {
      if (!x) fail(m + "() needs an argument");
      std::vector<std::string> opts;
      if (x->kind == Value::Str) opts.push_back(x->s);
      else if (x->kind == Value::ListK)
        for (auto& e : *x->list) opts.push_back(to_str(e));
      for (auto& o : opts) {
        if (o.size() > s.size()) continue;
        if (m == "startswith" ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0)
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "replace") {
      const Value *from = a.arg(0, "old"), *to = a.arg(1, "new");
      if (!from || !to || from->kind != Value::Str || to->kind != Value::Str) fail("replace() needs two strings");
      if (from->s.empty()) return self;
      std::string r;
      size_t p = 0, q;
      while ((q = s.find(from->s, p)) != std::string::npos) {
        r.append(s, p, q - p);
        r += to->s;
        if (r.size() > max_size) fail("value size limit exceeded");
        p = q + from->s.size();
      }
      r.append(s, p, std::string::npos);
      return Value::str(r);
    }
    if (m == "split") {
      const Value* sep = a.arg(0, "sep");
      List l;
      if (!sep || sep->kind == Value::None) {
        size_t p = 0;
        while (p < s.size()) {
          while (p < s.size() && std::isspace((unsigned char)s[p])) ++p;
          size_t q = p;
          while (q < s.size() && !std::isspace((unsigned char)s[q])) ++q;
          if (q > p) l.push_back(Value::str(s.substr(p, q - p)));
          p = q;
        }
      } else {
        if (sep->kind != Value::Str || sep->s.empty()) fail("split() separator must be a non-empty string");
        size_t p = 0, q;
        while ((q = s.find(sep->s, p)) != std::string::npos) {
          l.push_back(Value::str(s.substr(p, q - p)));
          p = q + sep->s.size();
        }
        l.push_back(Value::str(s.substr(p)));
      }
      return Value::make_list(std::move(l));
    }
  }
  if (self.kind == Value::DictK) {
    if (m == "items") return items_of(self);
    if (m == "keys" || m == "values") {
      List l;
      for (auto& [k, v] : *self.dict) l.push_back(m == "keys" ? Value::str(k) : v);
      return Value::make_list(std::move(l));
    }
    if (m == "get") {
      const Value* k = a.arg(0, "key");
      if (!k) fail("get() needs a key");
      if (const Value* v = self.get(to_str(*k))) return *v;
      const Value* d = a.arg(1, "default");
      return d ? *d : Value::none();
    }
  }
  fail("unknown method '" + m + "'");
}

}  // namespace detail
}  // namespace gk::text::jinja
