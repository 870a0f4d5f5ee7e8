// Evaluator of the Jinja subset (see jinja.h): values, operators, filters, tests,
// string/dict methods and the globals chat templates use (range, namespace,
// raise_exception). Every node evaluation counts one step against the limit.
#include <algorithm>
#include <charconv>
#include <cmath>

#include "gpukit/errors.h"
#include "text/jinja_internal.h"

namespace gk::text::jinja {

namespace {
using namespace detail;

struct Loop {
  bool brk = false, cont = false;
};

struct Ctx {
  std::vector<std::map<std::string, Value>> scopes;
  std::string out;
  Limits lim;
  size_t steps = 0;
  int depth = 0;
  Loop* loop = nullptr;

  void step() {
    if (++steps > lim.max_steps) fail("execution step limit exceeded");
  }
  void emit(const std::string& s) {
    if (out.size() + s.size() > lim.max_output) fail("output size limit exceeded");
    out += s;
  }
  void check_size(size_t n) {
    if (n > lim.max_output) fail("value size limit exceeded");
  }
  Value lookup(const std::string& n) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    return Value();
  }

  Value eval(const Node& n);
  Value eval_node(const Node& n);
  Value call(const Node& n);
  Value filter(const Node& n);
  bool test(const Node& n);
  void exec(const Node& n);
  void exec_block(const Node& blk) {
    for (auto& k : blk.kids) {
      exec(*k);
      if (loop && (loop->brk || loop->cont)) return;
    }
  }
};

Args eval_args(Ctx& c, const Node& n, size_t first) {
  Args a;
  size_t npos = n.kids.size() - first - n.kw.size();
  for (size_t i = 0; i < npos; ++i) a.pos.push_back(c.eval(*n.kids[first + i]));
  for (size_t i = 0; i < n.kw.size(); ++i) a.kw.emplace_back(n.kw[i], c.eval(*n.kids[first + npos + i]));
  return a;
}

Value index_value(Ctx& c, const Value& obj, const Value& key) {
  if (obj.kind == Value::DictK) {
    if (const Value* v = obj.get(to_str(key))) return *v;
    return Value();
  }
  if (obj.kind == Value::ListK || obj.kind == Value::Str) {
    if (key.kind != Value::Int && key.kind != Value::Bool) fail("list index must be an integer");
    int64_t n = obj.kind == Value::ListK ? int64_t(obj.list->size()) : int64_t(obj.s.size());
    int64_t i = as_int(key);
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();  // jinja: undefined
    return obj.kind == Value::ListK ? (*obj.list)[size_t(i)] : Value::str(std::string(1, obj.s[size_t(i)]));
  }
  if (obj.kind == Value::Undefined) fail("subscript of an undefined value");
  return Value();
}

Value attr_value(const Value& obj, const std::string& name) {
  if (obj.kind == Value::DictK) {
    if (const Value* v = obj.get(name)) return *v;
  }
  static const char* str_methods[] = {"strip", "lstrip", "rstrip", "upper", "lower", "startswith", "endswith",
                                      "replace", "split"};
  static const char* dict_methods[] = {"items", "keys", "values", "get"};
  auto has = [&](auto& arr) {
    for (const char* m : arr)
      if (name == m) return true;
    return false;
  };
  if ((obj.kind == Value::Str && has(str_methods)) || (obj.kind == Value::DictK && !obj.is_namespace && has(dict_methods))) {
    Value m;
    m.kind = Value::Method;
    m.s = name;
    m.self = std::make_shared<Value>(obj);
    return m;
  }
  if (obj.kind == Value::Undefined) fail("attribute '" + name + "' of an undefined value");
  return Value();
}

Value arith(Ctx& c, const std::string& o, const Value& a, const Value& b) {
  if (o == "~") {
    std::string r = to_str(a) + to_str(b);
    c.check_size(r.size());
    return Value::str(std::move(r));
  }
  if (o == "+") {
    if (a.kind == Value::Str && b.kind == Value::Str) {
      c.check_size(a.s.size() + b.s.size());
      return Value::str(a.s + b.s);
    }
    if (a.kind == Value::ListK && b.kind == Value::ListK) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      c.check_size(l.size());
      return Value::make_list(std::move(l));
    }
  }
  if (o == "*" && ((a.kind == Value::Str && b.kind == Value::Int) || (a.kind == Value::Int && b.kind == Value::Str))) {
    const Value& s = a.kind == Value::Str ? a : b;
    int64_t n = std::max<int64_t>(0, a.kind == Value::Int ? a.i : b.i);
    if (n > 0 && s.s.size() * uint64_t(n) > c.lim.max_output) fail("value size limit exceeded");
    std::string r;
    for (int64_t i = 0; i < n; ++i) r += s.s;
    return Value::str(std::move(r));
  }
  if (!is_num(a) || !is_num(b)) fail("unsupported operand types for '" + o + "'");
  bool fl = a.kind == Value::Float || b.kind == Value::Float;
  if (o == "/") {
    if (num(b) == 0) fail("division by zero");
    return Value::number(num(a) / num(b));
  }
  if (fl) {
    double x = num(a), y = num(b);
    if (o == "+") return Value::number(x + y);
    if (o == "-") return Value::number(x - y);
    if (o == "*") return Value::number(x * y);
    if (o == "**") return Value::number(std::pow(x, y));
    if (y == 0) fail("division by zero");
    if (o == "//") return Value::number(std::floor(x / y));
    if (o == "%") return Value::number(x - y * std::floor(x / y));
  }
  int64_t x = as_int(a), y = as_int(b), r;
  if (o == "+" && !__builtin_add_overflow(x, y, &r)) return Value::integer(r);
  if (o == "-" && !__builtin_sub_overflow(x, y, &r)) return Value::integer(r);
  if (o == "*" && !__builtin_mul_overflow(x, y, &r)) return Value::integer(r);
  if (o == "**") {
    if (y < 0) return Value::number(std::pow(double(x), double(y)));
    r = 1;
    for (int64_t i = 0; i < y; ++i) {
      c.step();
      if (__builtin_mul_overflow(r, x, &r)) fail("integer overflow");
      if (r == 0 || r == 1) break;
    }
    return Value::integer(r);
  }
  if (o == "//" || o == "%") {
    if (y == 0) fail("division by zero");
    if (x == INT64_MIN && y == -1) fail("integer overflow");
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    return Value::integer(o == "//" ? q : m);
  }
  fail("integer overflow");
}

thread_local Ctx* g_ctx = nullptr;

Value Ctx::eval(const Node& n) {
  Value v = eval_node(n);
  tick(cost(v));  // work proportional to the size of what was built
  return v;
}

Value Ctx::eval_node(const Node& n) {
  step();
  if (++depth > 400) fail("expression nested too deeply");
  struct D {
    int& d;
    ~D() { --d; }
  } dd{depth};
  switch (n.type) {
    case Node::Lit: return n.lit;
    case Node::Name: return lookup(n.name);
    case Node::ListLit: {
      List l;
      for (auto& k : n.kids) l.push_back(eval(*k));
      return Value::make_list(std::move(l));
    }
    case Node::DictLit: {
      Dict d;
      for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
        std::string k = to_str(eval(*n.kids[i]));
        Value v = eval(*n.kids[i + 1]);
        bool found = false;
        for (auto& [dk, dv] : d)
          if (dk == k) dv = v, found = true;
        if (!found) d.emplace_back(k, v);
      }
      return Value::make_dict(std::move(d));
    }
    case Node::Attr: return attr_value(eval(*n.kids[0]), n.name);
    case Node::Index: {
      Value o = eval(*n.kids[0]);
      return index_value(*this, o, eval(*n.kids[1]));
    }
    case Node::Slice: {
      Value o = eval(*n.kids[0]);
      Value lo = eval(*n.kids[1]), hi = eval(*n.kids[2]), st = eval(*n.kids[3]);
      if (o.kind != Value::ListK && o.kind != Value::Str) fail("slice of a non-sequence");
      int64_t len = o.kind == Value::ListK ? int64_t(o.list->size()) : int64_t(o.s.size());
      int64_t step = st.kind == Value::Int ? st.i : 1;
      if (step == 0) fail("slice step cannot be zero");
      auto norm = [&](const Value& v, int64_t dflt) {
        if (v.kind != Value::Int) return dflt;
        int64_t i = v.i < 0 ? v.i + len : v.i;
        return step > 0 ? std::clamp<int64_t>(i, 0, len) : std::clamp<int64_t>(i, -1, len - 1);
      };
      int64_t a = norm(lo, step > 0 ? 0 : len - 1), b = norm(hi, step > 0 ? len : -1);
      List l;
      std::string s;
      for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
        this->step();
        if (o.kind == Value::ListK) l.push_back((*o.list)[size_t(i)]);
        else s += o.s[size_t(i)];
      }
      return o.kind == Value::ListK ? Value::make_list(std::move(l)) : Value::str(std::move(s));
    }
    case Node::Call: return call(n);
    case Node::Filter: return filter(n);
    case Node::Test: return Value::boolean(test(n) != n.negate);
    case Node::Unary: {
      Value v = eval(*n.kids[0]);
      if (n.name == "not") return Value::boolean(!truthy(v));
      if (!is_num(v)) fail("unary '" + n.name + "' needs a number");
      if (n.name == "+") return v;
      if (v.kind == Value::Float) return Value::number(-v.f);
      if (as_int(v) == INT64_MIN) fail("integer overflow");
      return Value::integer(-as_int(v));
    }
    case Node::Binary: {
      const std::string& o = n.name;
      if (o == "and") {
        Value a = eval(*n.kids[0]);
        return truthy(a) ? eval(*n.kids[1]) : a;
      }
      if (o == "or") {
        Value a = eval(*n.kids[0]);
        return truthy(a) ? a : eval(*n.kids[1]);
      }
      Value a = eval(*n.kids[0]), b = eval(*n.kids[1]);
      tick(cost(a) + cost(b));
      if (o == "==") return Value::boolean(equal(a, b));
      if (o == "!=") return Value::boolean(!equal(a, b));
      if (o == "<") return Value::boolean(compare(a, b) < 0);
      if (o == ">") return Value::boolean(compare(a, b) > 0);
      if (o == "<=") return Value::boolean(compare(a, b) <= 0);
      if (o == ">=") return Value::boolean(compare(a, b) >= 0);
      if (o == "in" || o == "notin") {
        bool r = false;
        if (b.kind == Value::Str) {
          if (a.kind != Value::Str) fail("'in <string>' needs a string on the left");
          r = b.s.find(a.s) != std::string::npos;
        } else if (b.kind == Value::ListK) {
          for (auto& e : *b.list)
            if (equal(a, e)) r = true;
        } else if (b.kind == Value::DictK) {
          r = b.get(to_str(a)) != nullptr;
        } else if (b.kind != Value::Undefined && b.kind != Value::None) {
          fail("'in' needs a string, list or mapping");
        } else {
          fail("'in' of an undefined value");
        }
        return Value::boolean(o == "in" ? r : !r);
      }
      return arith(*this, o, a, b);
    }
    case Node::Cond: return truthy(eval(*n.kids[0])) ? eval(*n.kids[1]) : eval(*n.kids[2]);
    default: fail("statement used as an expression");
  }
}

Value Ctx::call(const Node& n) {
  const Node& f = *n.kids[0];
  Args a = eval_args(*this, n, 1);
  if (f.type == Node::Name && lookup(f.name).kind == Value::Undefined) {
    const std::string& fn = f.name;
    if (fn == "raise_exception") {
      std::string msg = a.pos.empty() ? std::string("raise_exception() called") : to_str(a.pos[0]);
      throw ValueError("chat template raised: " + msg);
    }
    if (fn == "range") {
      if (a.pos.empty() || a.pos.size() > 3) fail("range() takes 1 to 3 arguments");
      for (auto& v : a.pos)
        if (v.kind != Value::Int) fail("range() arguments must be integers");
      int64_t lo = a.pos.size() > 1 ? a.pos[0].i : 0, hi = a.pos.size() > 1 ? a.pos[1].i : a.pos[0].i;
      int64_t st = a.pos.size() > 2 ? a.pos[2].i : 1;
      if (st == 0) fail("range() step cannot be zero");
      List l;
      for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        step();
        if (l.size() >= 1000000) fail("range() too long");
        l.push_back(Value::integer(i));
      }
      return Value::make_list(std::move(l));
    }
    if (fn == "namespace" || fn == "dict") {
      Dict d;
      for (auto& [k, v] : a.kw) d.emplace_back(k, v);
      Value v = Value::make_dict(std::move(d));
      v.is_namespace = fn == "namespace";
      return v;
    }
    fail("'" + fn + "' is undefined");
  }
  Value callee = eval(f);
  if (callee.kind != Value::Method) fail("value is not callable");
  tick(cost(*callee.self));
  return method_call(lim.max_output, *callee.self, callee.s, a);
}

Value Ctx::filter(const Node& n) {
  Value v = eval(*n.kids[0]);
  tick(cost(v));
  Args a = eval_args(*this, n, 1);
  const std::string& f = n.name;
  if (f == "trim") return Value::str(strip(to_str(v), true, true));
  if (f == "length" || f == "count") {
    if (v.kind == Value::Str) {
      int64_t cps = 0;
      for (unsigned char ch : v.s) cps += (ch & 0xC0) != 0x80;
      return Value::integer(cps);
    }
    if (v.kind == Value::ListK) return Value::integer(int64_t(v.list->size()));
    if (v.kind == Value::DictK) return Value::integer(int64_t(v.dict->size()));
    fail("length of a value without length");
  }
  if (f == "upper" || f == "lower") return method_call(lim.max_output, Value::str(to_str(v)), f, {});
  if (f == "capitalize") {
    std::string s = to_str(v);
    for (size_t i = 0; i < s.size(); ++i) s[i] = char(i ? std::tolower((unsigned char)s[i]) : std::toupper((unsigned char)s[i]));
    return Value::str(s);
  }
  if (f == "default" || f == "d") {
    const Value* d = a.arg(0, "default_value");
    const Value* b = a.arg(1, "boolean");
    bool use = v.kind == Value::Undefined || (b && truthy(*b) && !truthy(v));
    return use ? (d ? *d : Value::str("")) : v;
  }
  if (f == "tojson") {
    std::string o;
    to_json(v, o, 0);
    check_size(o.size());
    return Value::str(o);
  }
  if (f == "string") return Value::str(to_str(v));
  if (f == "int") return v.kind == Value::Str ? Value::integer(std::strtoll(v.s.c_str(), nullptr, 10)) : Value::integer(is_num(v) ? as_int(v) : 0);
  if (f == "safe" || f == "e" || f == "escape") return v;  // no autoescaping in chat templates
  if (f == "first" || f == "last") {
    if (v.kind == Value::ListK) return v.list->empty() ? Value() : (f == "first" ? v.list->front() : v.list->back());
    if (v.kind == Value::Str) return v.s.empty() ? Value() : Value::str(std::string(1, f == "first" ? v.s.front() : v.s.back()));
    fail(f + " of a non-sequence");
  }
  if (f == "list") {
    if (v.kind == Value::ListK) return v;
    if (v.kind == Value::DictK) return method_call(lim.max_output, v, "keys", {});
    if (v.kind == Value::Str) {
      List l;
      for (char ch : v.s) l.push_back(Value::str(std::string(1, ch)));
      return Value::make_list(std::move(l));
    }
    fail("list of a non-sequence");
  }
  if (f == "reverse") {
    if (v.kind == Value::ListK) {
      List l(v.list->rbegin(), v.list->rend());
      return Value::make_list(std::move(l));
    }
    std::string s = to_str(v);
    return Value::str(std::string(s.rbegin(), s.rend()));
  }
  if (f == "items") {
    if (v.kind != Value::DictK) fail("items of a non-mapping");
    return items_of(v);
  }
  if (f == "join") {
    const Value* sep = a.arg(0, "d");
    std::string s, d = sep ? to_str(*sep) : "";
    if (v.kind != Value::ListK) fail("join of a non-list");
    for (size_t i = 0; i < v.list->size(); ++i) {
      if (i) s += d;
      s += to_str((*v.list)[i]);
      check_size(s.size());
    }
    return Value::str(s);
  }
  if (f == "replace") return method_call(lim.max_output, Value::str(to_str(v)), "replace", a);
  fail("unknown filter '" + f + "'");
}

bool Ctx::test(const Node& n) {
  Value v = eval(*n.kids[0]);
  const std::string& t = n.name;
  if (t == "defined") return v.kind != Value::Undefined;
  if (t == "undefined") return v.kind == Value::Undefined;
  if (t == "none") return v.kind == Value::None;
  if (t == "string") return v.kind == Value::Str;
  if (t == "number") return v.kind == Value::Int || v.kind == Value::Float;
  if (t == "integer") return v.kind == Value::Int;
  if (t == "float") return v.kind == Value::Float;
  if (t == "boolean") return v.kind == Value::Bool;
  if (t == "true") return v.kind == Value::Bool && v.b;
  if (t == "false") return v.kind == Value::Bool && !v.b;
  if (t == "mapping") return v.kind == Value::DictK;
  if (t == "sequence" || t == "iterable") return v.kind == Value::ListK || v.kind == Value::Str || v.kind == Value::DictK;
  if (t == "even" || t == "odd") {
    if (v.kind != Value::Int) fail("even/odd of a non-integer");
    return (v.i % 2 == 0) == (t == "even");
  }
  if (t == "equalto" || t == "eq" || t == "sameas") {
    if (n.kids.size() < 2) fail(t + " needs an argument");
    return equal(v, eval(*n.kids[1]));
  }
  fail("unknown test '" + t + "'");
}

void Ctx::exec(const Node& n) {
  step();
  switch (n.type) {
    case Node::Text: emit(n.name); return;
    case Node::Output: emit(to_str(eval(*n.kids[0]))); return;
    case Node::Block: exec_block(n); return;
    case Node::If: {
      size_t i = 0;
      for (; i + 1 < n.kids.size(); i += 2)
        if (truthy(eval(*n.kids[i]))) return exec(*n.kids[i + 1]);
      if (i < n.kids.size()) exec(*n.kids[i]);
      return;
    }
    case Node::Set: {
      Value v;
      if (n.kids[0]->type == Node::Block) {  // block set captures output
        std::string saved = std::move(out);
        out.clear();
        exec(*n.kids[0]);
        v = Value::str(std::move(out));
        out = std::move(saved);
      } else {
        v = eval(*n.kids[0]);
      }
      if (!n.attr.empty()) {
        Value ns = lookup(n.name);
        if (ns.kind != Value::DictK || !ns.is_namespace) fail("'" + n.name + "' is not a namespace");
        if (v.is_namespace || v.has_ns) fail("a namespace cannot hold a namespace");
        for (auto& [k, x] : *ns.dict)
          if (k == n.attr) {
            x = v;
            return;
          }
        ns.dict->emplace_back(n.attr, v);
      } else {
        scopes.back()[n.name] = v;
      }
      return;
    }
    case Node::Break:
    case Node::Continue:
      if (!loop) fail("break/continue outside a loop");
      (n.type == Node::Break ? loop->brk : loop->cont) = true;
      return;
    case Node::For: {
      Value it = eval(*n.kids[0]);
      List items;
      if (it.kind == Value::ListK) items = *it.list;
      else if (it.kind == Value::DictK) items = *method_call(lim.max_output, it, "keys", {}).list;
      else if (it.kind == Value::Str)
        for (char ch : it.s) items.push_back(Value::str(std::string(1, ch)));
      else if (it.kind != Value::Undefined && it.kind != Value::None) fail("for loop over a non-iterable value");
      else fail("for loop over an undefined value");
      tick(items.size());
      const Node* filt = n.kids[3].get();
      auto bind = [&](std::map<std::string, Value>& sc, const Value& item) {
        if (n.vars.size() == 1) {
          sc[n.vars[0]] = item;
        } else {
          if (item.kind != Value::ListK || item.list->size() != n.vars.size()) fail("cannot unpack loop item");
          for (size_t k = 0; k < n.vars.size(); ++k) sc[n.vars[k]] = (*item.list)[k];
        }
      };
      if (filt) {  // the loop filter applies before loop.index/length are computed
        List kept;
        for (auto& item : items) {
          scopes.emplace_back();
          bind(scopes.back(), item);
          bool keep = truthy(eval(*filt));
          scopes.pop_back();
          if (keep) kept.push_back(item);
        }
        items = std::move(kept);
      }
      if (items.empty()) {
        if (n.kids[2]) exec(*n.kids[2]);
        return;
      }
      Loop lp;
      Loop* outer = loop;
      const int64_t len = int64_t(items.size());
      for (int64_t i = 0; i < len; ++i) {
        scopes.emplace_back();
        auto& sc = scopes.back();
        bind(sc, items[size_t(i)]);
        Dict info = {{"index", Value::integer(i + 1)},
                     {"index0", Value::integer(i)},
                     {"revindex", Value::integer(len - i)},
                     {"revindex0", Value::integer(len - i - 1)},
                     {"first", Value::boolean(i == 0)},
                     {"last", Value::boolean(i == len - 1)},
                     {"length", Value::integer(len)},
                     {"previtem", i > 0 ? items[size_t(i - 1)] : Value()},
                     {"nextitem", i + 1 < len ? items[size_t(i + 1)] : Value()}};
        sc["loop"] = Value::make_dict(std::move(info));
        loop = &lp;
        lp.cont = false;
        exec(*n.kids[1]);
        loop = outer;
        scopes.pop_back();
        if (lp.brk) break;
      }
      return;
    }
    default: emit(to_str(eval(n)));
  }
}

}  // namespace

void detail::tick(size_t n) {
  if (!g_ctx) return;
  g_ctx->steps += n;
  if (g_ctx->steps > g_ctx->lim.max_steps) fail("execution step limit exceeded");
}

std::string render(const Node& root, const std::map<std::string, Value>& globals, const Limits& limits) {
  Ctx c;
  c.lim = limits;
  struct Bind {
    Ctx* prev;
    Bind(Ctx* c) : prev(g_ctx) { g_ctx = c; }
    ~Bind() { g_ctx = prev; }
  } bind(&c);
  c.scopes.push_back(globals);
  c.scopes.emplace_back();
  c.exec(root);
  return std::move(c.out);
}

}  // namespace gk::text::jinja
