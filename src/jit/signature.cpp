// Kernel parameter lists: finding a __global__ declaration in CUDA C++ source and
// mapping its parameter types to how launch arguments are packed and checked.
#include <cctype>
#include <map>

#include "jit/internal.h"

namespace gk::jit {
namespace {

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Blanks comments, string/char literals and preprocessor lines (keeps offsets).
std::string strip_source(std::string_view src) {
  std::string s(src);
  size_t n = s.size();
  bool line_start = true;
  for (size_t i = 0; i < n;) {
    char c = s[i];
    if (c == '/' && i + 1 < n && s[i + 1] == '/') {
      while (i < n && s[i] != '\n') s[i++] = ' ';
    } else if (c == '/' && i + 1 < n && s[i + 1] == '*') {
      s[i++] = ' ';
      s[i++] = ' ';
      while (i < n && !(s[i] == '*' && i + 1 < n && s[i + 1] == '/')) {
        if (s[i] != '\n') s[i] = ' ';
        ++i;
      }
      for (int k = 0; k < 2 && i < n; ++k) s[i++] = ' ';
    } else if (c == '"' || c == '\'') {
      char q = c;
      s[i++] = ' ';
      while (i < n && s[i] != q && s[i] != '\n') {
        if (s[i] == '\\' && i + 1 < n) s[i++] = ' ';
        s[i++] = ' ';
      }
      if (i < n && s[i] == q) s[i++] = ' ';
    } else if (c == '#' && line_start) {
      while (i < n && s[i] != '\n') {
        if (s[i] == '\\' && i + 1 < n && s[i + 1] == '\n') {
          s[i++] = ' ';
          ++i;  // keep the newline; continue the directive
          continue;
        }
        s[i++] = ' ';
      }
    } else {
      if (c == '\n') line_start = true;
      else if (!std::isspace(static_cast<unsigned char>(c))) line_start = false;
      ++i;
    }
  }
  return s;
}

// Splits at top-level commas (outside (), <>, [], {}).
std::vector<std::string> split_top(std::string_view s) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '(' || c == '<' || c == '[' || c == '{') ++depth;
    else if (c == ')' || c == '>' || c == ']' || c == '}') --depth;
    else if (c == ',' && depth == 0) {
      out.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  out.push_back(trim(s.substr(start)));
  return out;
}

// Tokens: identifiers (with :: joined), and single punctuation characters.
std::vector<std::string> tokens(std::string_view s) {
  std::vector<std::string> t;
  for (size_t i = 0; i < s.size();) {
    if (std::isspace(static_cast<unsigned char>(s[i]))) {
      ++i;
    } else if (ident_char(s[i])) {
      size_t j = i;
      while (j < s.size() && (ident_char(s[j]) || (s[j] == ':' && j + 1 < s.size() && s[j + 1] == ':'))) j += s[j] == ':' ? 2 : 1;
      t.emplace_back(s.substr(i, j - i));
      i = j;
    } else if (s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':') {
      size_t j = i + 2;
      while (j < s.size() && ident_char(s[j])) ++j;
      t.emplace_back(s.substr(i + 2, j - i - 2));  // leading :: (global scope)
      i = j;
    } else {
      t.emplace_back(1, s[i++]);
    }
  }
  return t;
}

bool is_qualifier(const std::string& w) {
  static const char* q[] = {"const", "volatile", "__restrict__", "__restrict", "restrict", "__grid_constant__",
                            "struct", "class", "typename", "__align__"};
  for (const char* x : q)
    if (w == x) return true;
  return false;
}
bool is_builtin_word(const std::string& w) {
  return w == "unsigned" || w == "signed" || w == "short" || w == "long" || w == "int" || w == "char" ||
         w == "float" || w == "double" || w == "bool" || w == "void";
}

struct Base {
  ParamKind kind;
  int size;
  std::optional<DType> dtype;
};

const std::map<std::string, Base>& named_types() {
  static const std::map<std::string, Base> m = {
      {"float", {ParamKind::Float, 4, DType::f32}}, {"double", {ParamKind::Float, 8, DType::f64}},
      {"half", {ParamKind::Float, 2, DType::f16}}, {"__half", {ParamKind::Float, 2, DType::f16}},
      {"__nv_half", {ParamKind::Float, 2, DType::f16}}, {"__nv_bfloat16", {ParamKind::Float, 2, DType::bf16}},
      {"nv_bfloat16", {ParamKind::Float, 2, DType::bf16}}, {"bool", {ParamKind::Bool, 1, DType::b8}},
      {"int8_t", {ParamKind::Int, 1, DType::i8}}, {"uint8_t", {ParamKind::UInt, 1, DType::u8}},
      {"int16_t", {ParamKind::Int, 2, DType::i16}}, {"uint16_t", {ParamKind::UInt, 2, std::nullopt}},
      {"int32_t", {ParamKind::Int, 4, DType::i32}}, {"uint32_t", {ParamKind::UInt, 4, std::nullopt}},
      {"int64_t", {ParamKind::Int, 8, DType::i64}}, {"uint64_t", {ParamKind::UInt, 8, std::nullopt}},
      {"size_t", {ParamKind::UInt, 8, std::nullopt}}, {"uintptr_t", {ParamKind::UInt, 8, std::nullopt}},
      {"intptr_t", {ParamKind::Int, 8, DType::i64}}, {"ptrdiff_t", {ParamKind::Int, 8, DType::i64}},
      {"ssize_t", {ParamKind::Int, 8, DType::i64}},
  };
  return m;
}
// Element types that only appear behind pointers.
const std::map<std::string, std::pair<DType, int>>& pointee_types() {
  static const std::map<std::string, std::pair<DType, int>> m = {
      {"__nv_fp8_e4m3", {DType::f8e4m3, 1}}, {"__nv_fp8_e5m2", {DType::f8e5m2, 1}},
      {"float2", {DType::f32, 8}}, {"float4", {DType::f32, 16}}, {"double2", {DType::f64, 16}},
      {"half2", {DType::f16, 4}}, {"__half2", {DType::f16, 4}}, {"__nv_bfloat162", {DType::bf16, 4}},
      {"nv_bfloat162", {DType::bf16, 4}}, {"int2", {DType::i32, 8}}, {"int4", {DType::i32, 16}},
      {"char4", {DType::i8, 4}}, {"longlong2", {DType::i64, 16}},
  };
  return m;
}

[[noreturn]] void unsupported(std::string_view spelling, const std::string& arg, const char* why) {
  throw ValueError(cat(arg, ": cannot pass a kernel parameter of type '", spelling, "' (", why,
                       "; supported: pointers, bool, integer types, float, double, __half, __nv_bfloat16); "
                       "declare it with types=[...]"));
}

}  // namespace

ParamType parse_type(std::string_view spelling, const std::string& arg) {
  ParamType p;
  p.spelling = trim(spelling);
  std::vector<std::string> words;
  int stars = 0;
  auto t = tokens(spelling);
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string& w = t[i];
    if (w == "*") {
      ++stars;
    } else if (w == "&" || w == "[") {
      unsupported(spelling, arg, w == "&" ? "references cannot be kernel parameters" : "arrays are not supported");
    } else if (w == "__align__" && i + 1 < t.size() && t[i + 1] == "(") {
      while (i < t.size() && t[i] != ")") ++i;
    } else if (is_qualifier(w)) {
      continue;
    } else if (ident_char(w[0])) {
      if (stars > 0) unsupported(spelling, arg, "unexpected name after '*'");
      std::string last = w.substr(w.rfind(':') == std::string::npos ? 0 : w.rfind(':') + 1);
      words.push_back(last);
    } else {
      unsupported(spelling, arg, "unexpected token");
    }
  }
  if (words.empty()) unsupported(spelling, arg, "no type");
  // Builtin multi-word types.
  bool builtin = true;
  for (const auto& w : words) builtin = builtin && is_builtin_word(w);
  Base base{ParamKind::Int, 4, DType::i32};
  bool opaque = false;
  if (builtin) {
    int longs = 0;
    bool uns = false, sgn = false, shrt = false, chr = false, other = false;
    std::string single;
    for (const auto& w : words) {
      if (w == "long") ++longs;
      else if (w == "unsigned") uns = true;
      else if (w == "signed") sgn = true;
      else if (w == "short") shrt = true;
      else if (w == "char") chr = true;
      else if (w == "int") continue;
      else {
        other = true;
        single = w;
      }
    }
    if (other) {
      if (words.size() != 1 && !(single == "double" && longs == 0)) unsupported(spelling, arg, "unknown type");
      if (single == "void") {
        if (stars == 0) unsupported(spelling, arg, "void");
        opaque = true;
      } else {
        base = named_types().at(single);
      }
    } else if (chr) {
      if (stars > 0 && !uns && !sgn) opaque = true;  // char*: raw bytes
      base = uns ? Base{ParamKind::UInt, 1, DType::u8} : Base{ParamKind::Int, 1, DType::i8};
    } else if (shrt) {
      base = uns ? Base{ParamKind::UInt, 2, std::nullopt} : Base{ParamKind::Int, 2, DType::i16};
    } else if (longs > 0) {
      base = uns ? Base{ParamKind::UInt, 8, std::nullopt} : Base{ParamKind::Int, 8, DType::i64};
    } else {
      base = uns ? Base{ParamKind::UInt, 4, std::nullopt} : Base{ParamKind::Int, 4, DType::i32};
    }
  } else {
    if (words.size() != 1) unsupported(spelling, arg, "unknown type");
    auto it = named_types().find(words[0]);
    if (it != named_types().end()) {
      base = it->second;
    } else if (stars > 0) {
      auto jt = pointee_types().find(words[0]);
      if (jt == pointee_types().end()) {
        opaque = true;  // a pointer to a user type: passed unchecked
      } else {
        p.kind = ParamKind::Pointer;
        p.size = 8;
        p.elem = jt->second.first;
        p.elem_size = jt->second.second;
        return p;
      }
    } else {
      unsupported(spelling, arg, "unknown type");
    }
  }
  if (stars > 0) {
    p.kind = ParamKind::Pointer;
    p.size = 8;
    if (opaque || stars > 1) {
      p.any_elem = true;
      return p;
    }
    p.elem = base.dtype;
    p.elem_size = base.size;
    p.unsigned_elem = base.kind == ParamKind::UInt;
    return p;
  }
  p.kind = base.kind;
  p.size = base.size;
  p.elem = base.dtype;
  return p;
}

std::optional<Signature> find_signature(std::string_view source, std::string_view name_expr) {
  std::string expr = trim(name_expr);
  if (!expr.empty() && expr[0] == '&') expr = trim(std::string_view(expr).substr(1));
  std::vector<std::string> targs;
  size_t lt = expr.find('<');
  std::string base = trim(std::string_view(expr).substr(0, lt));
  if (lt != std::string::npos) {
    size_t gt = expr.rfind('>');
    if (gt == std::string::npos || gt < lt) return std::nullopt;
    targs = split_top(std::string_view(expr).substr(lt + 1, gt - lt - 1));
  }
  if (base.rfind("::") != std::string::npos) base = base.substr(base.rfind("::") + 2);
  if (base.empty()) return std::nullopt;
  std::string s = strip_source(source);
  for (size_t pos = s.find(base); pos != std::string::npos; pos = s.find(base, pos + 1)) {
    if (pos > 0 && ident_char(s[pos - 1])) continue;
    size_t k = pos + base.size();
    if (k < s.size() && ident_char(s[k])) continue;
    while (k < s.size() && std::isspace(static_cast<unsigned char>(s[k]))) ++k;
    if (k >= s.size() || s[k] != '(') continue;
    // The declaration runs back to the previous ';', '{' or '}'.
    size_t start = s.find_last_of(";{}", pos);
    start = start == std::string::npos ? 0 : start + 1;
    std::string decl = s.substr(start, pos - start);
    auto dt = tokens(decl);
    bool global = false;
    for (const auto& w : dt) global = global || w == "__global__";
    if (!global) continue;
    // Template parameters: names and defaults.
    std::map<std::string, std::string> subst;
    size_t tpos = decl.find("template");
    if (tpos != std::string::npos) {
      size_t a = decl.find('<', tpos);
      int depth = 0;
      size_t b = a;
      for (; b < decl.size(); ++b) {
        if (decl[b] == '<') ++depth;
        else if (decl[b] == '>' && --depth == 0) break;
      }
      if (a == std::string::npos || b >= decl.size()) return std::nullopt;
      auto tparams = split_top(std::string_view(decl).substr(a + 1, b - a - 1));
      for (size_t i = 0; i < tparams.size(); ++i) {
        std::string tp = tparams[i], def;
        size_t eq = tp.find('=');
        if (eq != std::string::npos) {
          def = trim(std::string_view(tp).substr(eq + 1));
          tp = trim(std::string_view(tp).substr(0, eq));
        }
        auto tt = tokens(tp);
        if (tt.empty()) continue;
        std::string val = i < targs.size() ? targs[i] : def;
        if (!val.empty()) subst[tt.back()] = val;
      }
    }
    // The parameter list, to the matching ')'.
    int depth = 0;
    size_t e = k;
    for (; e < s.size(); ++e) {
      if (s[e] == '(') ++depth;
      else if (s[e] == ')' && --depth == 0) break;
    }
    if (e >= s.size()) return std::nullopt;
    std::string plist = trim(std::string_view(s).substr(k + 1, e - k - 1));
    Signature sig;
    if (plist.empty() || plist == "void") return sig;
    auto params = split_top(plist);
    for (size_t i = 0; i < params.size(); ++i) {
      std::string prm = params[i];
      // Drop a default value.
      int d = 0;
      for (size_t j = 0; j < prm.size(); ++j) {
        char c = prm[j];
        if (c == '(' || c == '<' || c == '[') ++d;
        else if (c == ')' || c == '>' || c == ']') --d;
        else if (c == '=' && d == 0) {
          prm = trim(std::string_view(prm).substr(0, j));
          break;
        }
      }
      auto pt = tokens(prm);
      std::string pname;
      if (pt.size() >= 2 && ident_char(pt.back()[0]) && !is_builtin_word(pt.back()) && !is_qualifier(pt.back()) &&
          !subst.count(pt.back())) {
        pname = pt.back();
        pt.pop_back();
      }
      std::string type;
      for (const auto& w : pt) {
        auto it = subst.find(w);
        type += (type.empty() ? "" : " ") + (it == subst.end() ? w : it->second);
      }
      std::string label = cat("parameter ", i, pname.empty() ? "" : " ('" + pname + "')");
      sig.params.push_back(parse_type(type, label));
      sig.names.push_back(pname);
    }
    return sig;
  }
  return std::nullopt;
}

}  // namespace gk::jit
