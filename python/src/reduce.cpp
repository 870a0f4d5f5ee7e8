// Reductions, softmax and matmul, and the matching gpukit.Array methods.
#include "bind.h"
#include "gpukit/errors.h"
#include "ops/reduce.h"

namespace gkpy {
using namespace gk;

namespace {

// axis: None (all axes), an int, or a tuple/list of ints (() reduces none).
std::optional<std::vector<int>> to_axes(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  auto one = [](nb::handle v) {
    // ints and integer-like objects (numpy.int64, ...), but not bool or float
    if (nb::isinstance<nb::bool_>(v) || !(nb::isinstance<nb::int_>(v) || nb::hasattr(v, "__index__")))
      throw TypeError(cat("axis: expected an int, a tuple of ints or None, got ",
                          nb::cast<std::string>(nb::str(v.type().attr("__name__")))));
    int64_t a = nb::cast<int64_t>(v.attr("__index__")());
    if (a < INT32_MIN || a > INT32_MAX) throw IndexError(cat("axis: ", a, " is out of bounds"));
    return int(a);
  };
  std::vector<int> ax;
  if (nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h)) {
    for (nb::handle v : h) ax.push_back(one(v));
  } else {
    ax.push_back(one(h));
  }
  return ax;
}

Array as_input(nb::handle x) {
  if (nb::isinstance<Array>(x)) return nb::cast<Array>(x);
  return to_array(x, "x");
}

Array reduce_any(ReduceOp op, nb::handle x, nb::handle axis, bool keepdims, nb::handle dtype, nb::handle stream) {
  Stream st;
  const Stream* sp = to_stream(stream, st);
  Array a = as_input(x);
  auto ax = to_axes(axis);
  std::optional<DType> dt = to_dtype_opt(dtype);
  if (dt && *dt != a.dtype()) a = a.astype(*dt, sp);
  Array r = detail::reduce_over(op, a, ax ? &*ax : nullptr, keepdims, sp);
  if (dt && r.dtype() != *dt) r = r.astype(*dt, sp);
  return r;
}

Array arg_any(ReduceOp op, nb::handle x, nb::handle axis, bool keepdims, nb::handle stream) {
  Stream st;
  const Stream* sp = to_stream(stream, st);
  Array a = as_input(x);
  if (nb::isinstance<nb::tuple>(axis) || nb::isinstance<nb::list>(axis))
    throw TypeError(cat("axis: ", op_name(op), " takes an int or None"));
  auto ax = to_axes(axis);
  return detail::reduce_over(op, a, ax ? &*ax : nullptr, keepdims, sp);
}

Array matmul_any(nb::handle a, nb::handle b, nb::handle stream) {
  Stream st;
  const Stream* sp = to_stream(stream, st);
  bool aa = nb::isinstance<Array>(a), ba = nb::isinstance<Array>(b);
  if (aa && ba) return matmul(nb::cast<Array>(a), nb::cast<Array>(b), sp);
  if (aa) {
    Array x = nb::cast<Array>(a);
    return matmul(x, to_array(b, "b", &x), sp);
  }
  if (ba) {
    Array y = nb::cast<Array>(b);
    return matmul(to_array(a, "a", &y), y, sp);
  }
  return matmul(to_array(a, "a"), to_array(b, "b"), sp);
}

const char* kSumDoc =
    "sum(x, axis=None, keepdims=False, dtype=None, stream=None)\n\n"
    "Sum over `axis` (None: all axes; an int or a tuple of ints, negative allowed,\n"
    "duplicates raise ValueError; () reduces nothing). NumPy semantics: bool and\n"
    "integer arrays give int64 (wrapping on overflow); float arrays keep their dtype,\n"
    "accumulated in float32 for float16/bfloat16/fp8 and in float64 for float64.\n"
    "`dtype` casts the input first (and the result, for integer dtypes). The sum of an\n"
    "empty axis is 0. The summation order is fixed: the same bits on every run.";
const char* kMeanDoc =
    "mean(x, axis=None, keepdims=False, dtype=None, stream=None)\n\n"
    "Mean over `axis` (as in sum). Float arrays keep their dtype (fp32 accumulation for\n"
    "the narrow floats); bool and integer arrays give float32 (their sum is exact in\n"
    "int64). The mean of an empty axis is NaN.";
const char* kMaxDoc =
    "{0}(x, axis=None, keepdims=False, stream=None)\n\n"
    "{1} over `axis` (as in sum); keeps the dtype. NaN propagates: a row holding a\n"
    "NaN gives NaN. An empty axis raises ValueError (no identity).";
const char* kArgDoc =
    "{0}(x, axis=None, keepdims=False, stream=None)\n\n"
    "Index (int64) of the {1} along `axis`, or into the flattened array when axis is\n"
    "None. Ties go to the lowest index; if the row holds a NaN the index of the first\n"
    "NaN is returned. An empty axis raises ValueError.";
const char* kSoftmaxDoc =
    "{0}(x, axis=-1, stream=None)\n\n"
    "{0} along `axis`, numerically stable (the row maximum is subtracted first), computed\n"
    "in float32 for the narrow floats (float64 for float64). The result has the input's\n"
    "float dtype; integer and bool inputs give float32. A row whose entries are all -inf\n"
    "gives NaN (as NumPy and torch do); a NaN in a row makes the whole row NaN.";
const char* kMatmulDoc =
    "matmul(a, b, stream=None)\n\n"
    "Matrix product with NumPy semantics: a 1-d operand gets a dimension added (rows for\n"
    "a, columns for b) that is removed from the result, and batch dimensions broadcast.\n"
    "Inputs: float32, float16, bfloat16 (and float64); mixed dtypes promote (float16 with\n"
    "bfloat16 gives float32); integer inputs raise TypeError. Accumulation is in float32\n"
    "(float64 for float64); the result has the promoted dtype and is contiguous. Operands\n"
    "may have any strides (transposed or sliced views). k = 0 gives zeros. Each output\n"
    "element is summed in a fixed order: the same bits on every run.";

std::string fmt2(const char* f, const char* a, const char* b) {
  std::string s = f;
  for (auto [key, val] : {std::pair<const char*, const char*>{"{0}", a}, {"{1}", b}})
    for (size_t p = s.find(key); p != std::string::npos; p = s.find(key)) s.replace(p, 3, val);
  return s;
}

}  // namespace

GK_BINDING(25, reduce) {
  nb::handle cls = nb::type<Array>();
  static std::vector<std::string> docs;  // docstrings must outlive the module definition
  docs.reserve(16);
  auto doc = [](std::string s) { docs.push_back(std::move(s)); return docs.back().c_str(); };

  for (auto [name, op, d] : {std::tuple{"sum", ReduceOp::Sum, kSumDoc}, std::tuple{"mean", ReduceOp::Mean, kMeanDoc}}) {
    ReduceOp o = op;
    m.def(name, [o](nb::handle x, nb::handle axis, bool keepdims, nb::handle dtype, nb::handle stream) {
      return reduce_any(o, x, axis, keepdims, dtype, stream);
    }, nb::arg("x"), nb::arg("axis") = nb::none(), nb::arg("keepdims") = false, nb::arg("dtype") = nb::none(),
          nb::arg("stream") = nb::none(), d);
    nb::setattr(cls, name, nb::cpp_function([o](nb::handle self, nb::handle axis, bool keepdims, nb::handle dtype,
                                                nb::handle stream) {
      return reduce_any(o, self, axis, keepdims, dtype, stream);
    }, nb::is_method(), nb::arg("axis") = nb::none(), nb::arg("keepdims") = false, nb::arg("dtype") = nb::none(),
       nb::arg("stream") = nb::none(), nb::name(name), d));
  }
  for (auto [name, op, what] : {std::tuple{"max", ReduceOp::Max, "Maximum"}, std::tuple{"min", ReduceOp::Min, "Minimum"}}) {
    ReduceOp o = op;
    const char* d = doc(fmt2(kMaxDoc, name, what));
    m.def(name, [o](nb::handle x, nb::handle axis, bool keepdims, nb::handle stream) {
      return reduce_any(o, x, axis, keepdims, nb::none(), stream);
    }, nb::arg("x"), nb::arg("axis") = nb::none(), nb::arg("keepdims") = false, nb::arg("stream") = nb::none(), d);
    nb::setattr(cls, name, nb::cpp_function([o](nb::handle self, nb::handle axis, bool keepdims, nb::handle stream) {
      return reduce_any(o, self, axis, keepdims, nb::none(), stream);
    }, nb::is_method(), nb::arg("axis") = nb::none(), nb::arg("keepdims") = false, nb::arg("stream") = nb::none(),
       nb::name(name), d));
  }
  for (auto [name, op, what] : {std::tuple{"argmax", ReduceOp::Argmax, "maximum"},
                                std::tuple{"argmin", ReduceOp::Argmin, "minimum"}}) {
    ReduceOp o = op;
    const char* d = doc(fmt2(kArgDoc, name, what));
    m.def(name, [o](nb::handle x, nb::handle axis, bool keepdims, nb::handle stream) {
      return arg_any(o, x, axis, keepdims, stream);
    }, nb::arg("x"), nb::arg("axis") = nb::none(), nb::arg("keepdims") = false, nb::arg("stream") = nb::none(), d);
    nb::setattr(cls, name, nb::cpp_function([o](nb::handle self, nb::handle axis, bool keepdims, nb::handle stream) {
      return arg_any(o, self, axis, keepdims, stream);
    }, nb::is_method(), nb::arg("axis") = nb::none(), nb::arg("keepdims") = false, nb::arg("stream") = nb::none(),
       nb::name(name), d));
  }
  for (bool log : {false, true}) {
    const char* name = log ? "log_softmax" : "softmax";
    m.def(name, [log](nb::handle x, int axis, nb::handle stream) {
      Stream st;
      const Stream* sp = to_stream(stream, st);
      Array a = as_input(x);
      return log ? log_softmax(a, axis, sp) : softmax(a, axis, sp);
    }, nb::arg("x"), nb::arg("axis") = -1, nb::arg("stream") = nb::none(), doc(fmt2(kSoftmaxDoc, name, "")));
  }
  m.def("matmul", [](nb::handle a, nb::handle b, nb::handle stream) { return matmul_any(a, b, stream); },
        nb::arg("a"), nb::arg("b"), nb::arg("stream") = nb::none(), kMatmulDoc);
  nb::setattr(cls, "__matmul__", nb::cpp_function([](nb::handle self, nb::handle other) {
    return matmul_any(self, other, nb::none());
  }, nb::is_method(), nb::name("__matmul__")));
  nb::setattr(cls, "__rmatmul__", nb::cpp_function([](nb::handle self, nb::handle other) {
    return matmul_any(other, self, nb::none());
  }, nb::is_method(), nb::name("__rmatmul__")));
}

}  // namespace gkpy
