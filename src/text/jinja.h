// A sandboxed interpreter for the Jinja subset that chat templates use. Values are
// the interpreter's own (none, bool, int, float, string, list, dict, namespace); there
// is no access to host objects, no imports, no macros, no file or code execution.
// Every evaluation step, the output size, range() lengths and recursion depth are
// bounded; violations raise gk::ValueError.
// Environment semantics follow Hugging Face's apply_chat_template: trim_blocks and
// lstrip_blocks on, loop controls (break/continue) enabled.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gk::text::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order

struct Value {
  enum Kind : uint8_t { Undefined, None, Bool, Int, Float, Str, ListK, DictK, Method } kind = Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                // Str; Method name
  std::shared_ptr<List> list;   // ListK
  std::shared_ptr<Dict> dict;   // DictK (also namespaces and loop objects)
  std::shared_ptr<Value> self;  // Method receiver
  bool is_namespace = false;
  bool has_ns = false;          // a list/dict holding a namespace (namespaces may not hold
                                // namespaces: no cycles, and `depth` stays an upper bound)
  uint32_t depth = 0;           // nesting depth of lists/dicts (capped: deep values would
                                // recurse when compared, printed or destroyed)
  static constexpr uint32_t kMaxDepth = 256;

  static Value none() { Value v; v.kind = None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Float; v.f = x; return v; }
  static Value str(std::string x) { Value v; v.kind = Str; v.s = std::move(x); return v; }
  static Value make_list(List l = {});
  static Value make_dict(Dict d = {});
  const Value* get(std::string_view key) const;  // dict member or null
};

struct Node;
using NodeP = std::unique_ptr<Node>;

// Expression and statement nodes share one struct to keep the parser small.
struct Node {
  enum Type : uint8_t {
    // expressions
    Lit, Name, ListLit, DictLit, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, Cond,
    // statements
    Text, Output, If, For, Set, Break, Continue, Block
  } type;
  std::string name;             // Name/Attr/Filter/Test/op/Set target; Text content
  std::string attr;             // Set: namespace attribute
  Value lit;                    // Lit
  std::vector<NodeP> kids;      // operands, arguments, body statements
  std::vector<std::string> kw;  // Call/Filter: keyword argument names (parallel to the trailing kids)
  std::vector<std::string> vars;  // For: loop variables
  bool negate = false;          // Test: "is not"
  // If: kids are (cond, Block) pairs then an optional else Block
  // For: kids = iterable, body Block, else Block (may be null), filter (may be null)
};

NodeP parse(std::string_view source);

struct Limits {
  size_t max_steps = 10'000'000;
  size_t max_output = 64 << 20;
};

// Renders a parsed template with the given global variables.
std::string render(const Node& root, const std::map<std::string, Value>& globals, const Limits& limits);

}  // namespace gk::text::jinja
