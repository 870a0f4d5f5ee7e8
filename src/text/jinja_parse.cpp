// Lexer and parser of the Jinja subset (see jinja.h). Whitespace control follows
// Jinja with trim_blocks and lstrip_blocks on: '{%-'/'-%}' strip all whitespace on
// that side, a block tag's own line indentation is removed and one newline after
// '%}' is dropped; '{%+' keeps the indentation.
#include <cstring>

#include "gpukit/errors.h"
#include "text/jinja.h"

namespace gk::text::jinja {
namespace {

enum class T : uint8_t { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, End };

struct Tok {
  T t;
  std::string s;
  int64_t i = 0;
  double f = 0;
  size_t pos = 0;
};

[[noreturn]] void fail(const std::string& msg, size_t pos) {
  throw ValueError(cat("chat template: ", msg, " (at byte ", pos, ")"));
}

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::vector<Tok> lex(std::string_view src) {
  std::vector<Tok> out;
  size_t p = 0, n = src.size();
  bool strip_next = false;  // '-%}' / '-}}': drop leading whitespace of the next text
  bool trim_nl = false;     // trim_blocks: drop one newline after a block tag
  while (p < n) {
    // text up to the next tag
    size_t q = p;
    while (q < n && !(src[q] == '{' && q + 1 < n && (src[q + 1] == '{' || src[q + 1] == '%' || src[q + 1] == '#'))) ++q;
    std::string text(src.substr(p, q - p));
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_ws(text[k])) ++k;
      text.erase(0, k);
    } else if (trim_nl && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    strip_next = trim_nl = false;
    if (q >= n) {
      if (!text.empty()) out.push_back({T::Text, text, 0, 0, p});
      break;
    }
    char kind = src[q + 1];
    size_t body = q + 2;
    bool minus = body < n && src[body] == '-', plus = body < n && src[body] == '+';
    if (minus || plus) ++body;
    if (minus) {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if (kind != '{' && !plus) {
      // lstrip_blocks: remove the tag line's indentation (judged on the source)
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      size_t ws_src = q - (text.size() - k);
      if (ws_src == 0 || src[ws_src - 1] == '\n') text.erase(k);
    }
    if (!text.empty()) out.push_back({T::Text, text, 0, 0, p});
    if (kind == '#') {
      size_t e = src.find("#}", body);
      if (e == std::string_view::npos) fail("unterminated comment", q);
      bool m = e > body && src[e - 1] == '-';
      p = e + 2;
      strip_next = m;
      trim_nl = !m;
      continue;
    }
    out.push_back({kind == '{' ? T::VarBegin : T::BlockBegin, "", 0, 0, q});
    const char close = kind == '{' ? '}' : '%';
    p = body;
    for (;;) {
      while (p < n && is_ws(src[p])) ++p;
      if (p >= n) fail("unterminated tag", q);
      char c = src[p];
      if ((c == '-' && src.substr(p + 1, 2) == std::string{close, '}'}) ||
          (c == close && p + 1 < n && src[p + 1] == '}')) {
        bool m = c == '-';
        p += m ? 3 : 2;
        out.push_back({kind == '{' ? T::VarEnd : T::BlockEnd, "", 0, 0, p});
        strip_next = m;
        trim_nl = !m && kind == '%';
        break;
      }
      size_t st = p;
      if (is_name0(c)) {
        while (p < n && (is_name0(src[p]) || is_digit(src[p]))) ++p;
        out.push_back({T::Name, std::string(src.substr(st, p - st)), 0, 0, st});
      } else if (is_digit(c)) {
        while (p < n && is_digit(src[p])) ++p;
        bool fl = false;
        if (p + 1 < n && src[p] == '.' && is_digit(src[p + 1])) {
          fl = true;
          ++p;
          while (p < n && is_digit(src[p])) ++p;
        }
        std::string num(src.substr(st, p - st));
        Tok t{fl ? T::Float : T::Int, num, 0, 0, st};
        if (fl) t.f = std::strtod(num.c_str(), nullptr);
        else {
          if (num.size() > 18) fail("integer literal too large", st);
          t.i = std::strtoll(num.c_str(), nullptr, 10);
        }
        out.push_back(t);
      } else if (c == '\'' || c == '"') {
        std::string s;
        ++p;
        for (;;) {
          if (p >= n) fail("unterminated string", st);
          char d = src[p++];
          if (d == c) break;
          if (d == '\\' && p < n) {
            char e = src[p++];
            switch (e) {
              case 'n': s += '\n'; break;
              case 't': s += '\t'; break;
              case 'r': s += '\r'; break;
              case '\\': s += '\\'; break;
              case '\'': s += '\''; break;
              case '"': s += '"'; break;
              default: s += '\\'; s += e;
            }
          } else {
            s += d;
          }
        }
        out.push_back({T::Str, s, 0, 0, st});
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".", ",",
                                    ":", "|", "~", "+", "-", "*", "/", "%", "<", ">", "="};
        bool found = false;
        for (const char* o : ops) {
          size_t l = std::strlen(o);
          if (src.substr(p, l) == o) {
            out.push_back({T::Op, o, 0, 0, p});
            p += l;
            found = true;
            break;
          }
        }
        if (!found) fail(cat("unexpected character '", c, "'"), p);
      }
    }
  }
  out.push_back({T::End, "", 0, 0, n});
  return out;
}

struct Parser {
  std::vector<Tok> t;
  size_t k = 0;
  int depth = 0;

  const Tok& cur() const { return t[k]; }
  bool op(const char* o) const { return t[k].t == T::Op && t[k].s == o; }
  bool name(const char* w) const { return t[k].t == T::Name && t[k].s == w; }
  void expect_op(const char* o) {
    if (!op(o)) fail(cat("expected '", o, "'"), cur().pos);
    ++k;
  }
  void expect_name(const char* w) {
    if (!name(w)) fail(cat("expected '", w, "'"), cur().pos);
    ++k;
  }
  std::string ident() {
    if (cur().t != T::Name) fail("expected a name", cur().pos);
    return t[k++].s;
  }
  struct Guard {
    Parser& p;
    Guard(Parser& p) : p(p) {
      if (++p.depth > 200) fail("template nested too deeply", p.cur().pos);
    }
    ~Guard() { --p.depth; }
  };
  static NodeP node(Node::Type ty, std::string nm = {}) {
    auto n = std::make_unique<Node>();
    n->type = ty;
    n->name = std::move(nm);
    return n;
  }
  static NodeP bin(const std::string& o, NodeP a, NodeP b) {
    auto n = node(Node::Binary, o);
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }

  NodeP expr() {
    Guard g(*this);
    NodeP a = or_();
    if (name("if")) {
      ++k;
      NodeP c = or_();
      NodeP e;
      if (name("else")) {
        ++k;
        e = expr();
      } else {
        e = node(Node::Lit);  // undefined
      }
      auto n = node(Node::Cond);
      n->kids.push_back(std::move(c));
      n->kids.push_back(std::move(a));
      n->kids.push_back(std::move(e));
      return n;
    }
    return a;
  }
  NodeP or_() {
    NodeP a = and_();
    while (name("or")) {
      ++k;
      a = bin("or", std::move(a), and_());
    }
    return a;
  }
  NodeP and_() {
    NodeP a = not_();
    while (name("and")) {
      ++k;
      a = bin("and", std::move(a), not_());
    }
    return a;
  }
  NodeP not_() {
    Guard g(*this);
    if (name("not")) {
      ++k;
      auto n = node(Node::Unary, "not");
      n->kids.push_back(not_());
      return n;
    }
    return compare();
  }
  NodeP compare() {
    NodeP a = math1();
    for (;;) {
      std::string o;
      if (op("==") || op("!=") || op("<") || op(">") || op("<=") || op(">=")) o = t[k++].s;
      else if (name("in")) o = (++k, "in");
      else if (name("not") && t[k + 1].t == T::Name && t[k + 1].s == "in") o = (k += 2, "notin");
      else return a;
      a = bin(o, std::move(a), math1());
    }
  }
  NodeP math1() {
    NodeP a = concat();
    while (op("+") || op("-")) {
      std::string o = t[k++].s;
      a = bin(o, std::move(a), concat());
    }
    return a;
  }
  NodeP concat() {
    NodeP a = math2();
    while (op("~")) {
      ++k;
      a = bin("~", std::move(a), math2());
    }
    return a;
  }
  NodeP math2() {
    NodeP a = pow();
    while (op("*") || op("/") || op("//") || op("%")) {
      std::string o = t[k++].s;
      a = bin(o, std::move(a), pow());
    }
    return a;
  }
  NodeP pow() {
    NodeP a = unary();
    while (op("**")) {
      ++k;
      a = bin("**", std::move(a), unary());
    }
    return a;
  }
  NodeP unary() {
    Guard g(*this);
    if (op("-") || op("+")) {
      std::string o = t[k++].s;
      auto n = node(Node::Unary, o);
      n->kids.push_back(unary());
      return filters(std::move(n));
    }
    return filters(postfix(primary()));
  }
  void args(Node& n) {  // after '(' ; fills kids (positional then keyword) and kw
    while (!op(")")) {
      if (cur().t == T::Name && t[k + 1].t == T::Op && t[k + 1].s == "=") {
        n.kw.push_back(t[k].s);
        k += 2;
        n.kids.push_back(expr());
      } else {
        if (!n.kw.empty()) fail("positional argument after keyword argument", cur().pos);
        n.kids.push_back(expr());
      }
      if (!op(",")) break;
      ++k;
    }
    expect_op(")");
  }
  NodeP postfix(NodeP a) {
    for (;;) {
      if (op(".")) {
        ++k;
        auto n = node(Node::Attr, ident());
        n->kids.push_back(std::move(a));
        a = std::move(n);
      } else if (op("[")) {
        ++k;
        NodeP lo, hi, st;
        bool slice = false;
        if (!op(":")) lo = expr();
        if (op(":")) {
          slice = true;
          ++k;
          if (!op("]") && !op(":")) hi = expr();
          if (op(":")) {
            ++k;
            if (!op("]")) st = expr();
          }
        }
        expect_op("]");
        auto n = node(slice ? Node::Slice : Node::Index);
        n->kids.push_back(std::move(a));
        if (slice) {
          n->kids.push_back(lo ? std::move(lo) : node(Node::Lit));
          n->kids.push_back(hi ? std::move(hi) : node(Node::Lit));
          n->kids.push_back(st ? std::move(st) : node(Node::Lit));
        } else {
          if (!lo) fail("empty subscript", cur().pos);
          n->kids.push_back(std::move(lo));
        }
        a = std::move(n);
      } else if (op("(")) {
        ++k;
        auto n = node(Node::Call);
        n->kids.push_back(std::move(a));
        args(*n);
        a = std::move(n);
      } else {
        return a;
      }
    }
  }
  NodeP filters(NodeP a) {
    for (;;) {
      if (op("|")) {
        ++k;
        auto n = node(Node::Filter, ident());
        n->kids.push_back(std::move(a));
        if (op("(")) {
          ++k;
          args(*n);
        }
        a = std::move(n);
      } else if (name("is")) {
        ++k;
        auto n = node(Node::Test);
        if (name("not")) {
          ++k;
          n->negate = true;
        }
        n->name = ident();
        n->kids.push_back(std::move(a));
        if (op("(")) {
          ++k;
          args(*n);
        } else if (cur().t == T::Str || cur().t == T::Int || cur().t == T::Float || name("none") ||
                   name("None") || name("true") || name("false")) {
          n->kids.push_back(primary());
        }
        a = std::move(n);
      } else {
        return a;
      }
    }
  }
  NodeP primary() {
    Guard g(*this);
    const Tok& c = cur();
    auto n = node(Node::Lit);
    switch (c.t) {
      case T::Str: {
        std::string s = c.s;
        ++k;
        while (cur().t == T::Str) s += t[k++].s;  // adjacent literals concatenate
        n->lit = Value::str(s);
        return n;
      }
      case T::Int: n->lit = Value::integer(c.i); ++k; return n;
      case T::Float: n->lit = Value::number(c.f); ++k; return n;
      case T::Name: {
        std::string w = c.s;
        ++k;
        if (w == "true" || w == "True") n->lit = Value::boolean(true);
        else if (w == "false" || w == "False") n->lit = Value::boolean(false);
        else if (w == "none" || w == "None") n->lit = Value::none();
        else return node(Node::Name, w);
        return n;
      }
      case T::Op:
        if (c.s == "(") {
          ++k;
          NodeP e = expr();
          if (op(",")) {  // a tuple: evaluate as a list
            auto l = node(Node::ListLit);
            l->kids.push_back(std::move(e));
            while (op(",")) {
              ++k;
              if (op(")")) break;
              l->kids.push_back(expr());
            }
            e = std::move(l);
          }
          expect_op(")");
          return e;
        }
        if (c.s == "[") {
          ++k;
          auto l = node(Node::ListLit);
          while (!op("]")) {
            l->kids.push_back(expr());
            if (!op(",")) break;
            ++k;
          }
          expect_op("]");
          return l;
        }
        if (c.s == "{") {
          ++k;
          auto d = node(Node::DictLit);
          while (!op("}")) {
            d->kids.push_back(expr());
            expect_op(":");
            d->kids.push_back(expr());
            if (!op(",")) break;
            ++k;
          }
          expect_op("}");
          return d;
        }
        break;
      default: break;
    }
    fail("unexpected token in expression", c.pos);
  }

  // ---- statements ----
  // Parses until a block tag whose keyword is in `stops` (left unconsumed) or the end.
  NodeP body(const std::vector<const char*>& stops) {
    Guard g(*this);
    auto blk = node(Node::Block);
    for (;;) {
      const Tok& c = cur();
      if (c.t == T::End) {
        if (!stops.empty()) fail(cat("missing '{% ", stops.back(), " %}'"), c.pos);
        return blk;
      }
      if (c.t == T::Text) {
        blk->kids.push_back(node(Node::Text, c.s));
        ++k;
      } else if (c.t == T::VarBegin) {
        ++k;
        auto o = node(Node::Output);
        o->kids.push_back(expr());
        if (cur().t != T::VarEnd) fail("expected '}}'", cur().pos);
        ++k;
        blk->kids.push_back(std::move(o));
      } else if (c.t == T::BlockBegin) {
        const Tok& kw = t[k + 1];
        if (kw.t != T::Name) fail("expected a statement keyword", kw.pos);
        for (const char* s : stops)
          if (kw.s == s) return blk;
        k += 2;
        blk->kids.push_back(statement(kw.s, kw.pos));
      } else {
        fail("unexpected token", c.pos);
      }
    }
  }
  void end_tag() {
    if (cur().t != T::BlockEnd) fail("expected '%}'", cur().pos);
    ++k;
  }
  void close(const char* w) {  // consumes {% w %}
    ++k;  // BlockBegin
    expect_name(w);
    end_tag();
  }
  NodeP statement(const std::string& kw, size_t pos) {
    if (kw == "if") {
      auto n = node(Node::If);
      n->kids.push_back(expr());
      end_tag();
      n->kids.push_back(body({"elif", "else", "endif"}));
      for (;;) {
        const std::string& w = t[k + 1].s;
        k += 2;
        if (w == "elif") {
          n->kids.push_back(expr());
          end_tag();
          n->kids.push_back(body({"elif", "else", "endif"}));
        } else if (w == "else") {
          end_tag();
          n->kids.push_back(body({"endif"}));
          close("endif");
          return n;
        } else {
          end_tag();
          return n;
        }
      }
    }
    if (kw == "for") {
      auto n = node(Node::For);
      n->vars.push_back(ident());
      while (op(",")) {
        ++k;
        n->vars.push_back(ident());
      }
      expect_name("in");
      n->kids.push_back(or_());  // no conditional expression: 'if' starts a loop filter
      NodeP filter;
      if (name("if")) {
        ++k;
        filter = or_();
      }
      if (name("recursive")) fail("recursive loops are not supported", cur().pos);
      end_tag();
      n->kids.push_back(body({"else", "endfor"}));
      NodeP els;
      if (t[k + 1].s == "else") {
        k += 2;
        end_tag();
        els = body({"endfor"});
      }
      close("endfor");
      n->kids.push_back(std::move(els));
      n->kids.push_back(std::move(filter));
      return n;
    }
    if (kw == "set") {
      auto n = node(Node::Set, ident());
      if (op(".")) {
        ++k;
        n->attr = ident();
      }
      if (op("=")) {
        ++k;
        n->kids.push_back(expr());
        end_tag();
      } else {  // block set: {% set x %}...{% endset %}
        end_tag();
        n->kids.push_back(body({"endset"}));
        close("endset");
      }
      return n;
    }
    if (kw == "break" || kw == "continue") {
      end_tag();
      return node(kw == "break" ? Node::Break : Node::Continue);
    }
    if (kw == "generation") {  // HF marker for assistant masks: renders its body
      end_tag();
      NodeP b = body({"endgeneration"});
      close("endgeneration");
      return b;
    }
    fail(cat("unsupported statement '", kw, "'"), pos);
  }
};

}  // namespace

NodeP parse(std::string_view source) {
  Parser p{lex(source)};
  NodeP root = p.body({});
  return root;
}

}  // namespace gk::text::jinja
