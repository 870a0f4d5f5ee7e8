// Internal helpers shared by the Jinja evaluator files.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "text/jinja.h"

namespace gk::text::jinja::detail {

[[noreturn]] void fail(const std::string& m);
bool truthy(const Value& v);
std::string to_str(const Value& v);   // Python str()
std::string repr(const Value& v);     // Python repr()
std::string repr_at(const Value& v, int depth);
// Charges n steps to the template being rendered on this thread (raises past the limit).
void tick(size_t n);
size_t cost(const Value& v);  // work proportional to a value's size
void to_json(const Value& v, std::string& out, int depth);  // json.dumps(ensure_ascii=False)
bool is_num(const Value& v);
double num(const Value& v);
int64_t as_int(const Value& v);
bool equal(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);
std::string strip(const std::string& s, bool left, bool right, const std::string* chars = nullptr);

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(const char* name) const {
    for (auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
  const Value* arg(size_t i, const char* name) const { return i < pos.size() ? &pos[i] : kwarg(name); }
};


Value items_of(const Value& d);
// A string or dict method; results larger than max_size raise.
Value method_call(size_t max_size, const Value& self, const std::string& m, const Args& a);

}  // namespace gk::text::jinja::detail
