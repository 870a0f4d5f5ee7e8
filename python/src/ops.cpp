// Elementwise ops and the operator overloads of gpukit.Array.
#include "bind.h"
#include "gpukit/errors.h"

namespace gkpy {
using namespace gk;

namespace {

nb::object binary_any(BinaryOp op, nb::handle a, nb::handle b, nb::handle stream, bool reflected = false) {
  Stream st;
  const Stream* sp = to_stream(stream, st);
  bool aa = nb::isinstance<Array>(a), ba = nb::isinstance<Array>(b);
  if (aa && is_scalar(b)) return nb::cast(binary(op, nb::cast<Array>(a), to_scalar(b, "b"), false, sp));
  if (ba && is_scalar(a)) return nb::cast(binary(op, nb::cast<Array>(b), to_scalar(a, "a"), true, sp));
  if (aa && ba) return nb::cast(binary(op, nb::cast<Array>(a), nb::cast<Array>(b), sp));
  if (aa) {
    Array x = nb::cast<Array>(a);
    return nb::cast(binary(op, x, to_array(b, "b", &x), sp));
  }
  if (ba) {
    Array y = nb::cast<Array>(b);
    return nb::cast(binary(op, to_array(a, "a", &y), y, sp));
  }
  return nb::cast(binary(op, to_array(a, "a"), to_array(b, "b"), sp));
}

void def_binary(nb::module_& m, nb::handle cls, const char* name, BinaryOp op, const char* dunder,
                const char* rdunder) {
  m.def(name, [op](nb::handle a, nb::handle b, nb::handle stream) { return binary_any(op, a, b, stream); },
        nb::arg("a"), nb::arg("b"), nb::arg("stream") = nb::none());
  if (dunder)
    nb::setattr(cls, dunder, nb::cpp_function([op](nb::handle self, nb::handle other) {
      return binary_any(op, self, other, nb::none());
    }, nb::is_method()));
  if (rdunder)
    nb::setattr(cls, rdunder, nb::cpp_function([op](nb::handle self, nb::handle other) {
      return binary_any(op, other, self, nb::none());
    }, nb::is_method()));
}

void def_unary(nb::module_& m, const char* name, UnaryOp op) {
  m.def(name, [op](const Array& x, nb::handle stream) {
    Stream st;
    return unary(op, x, to_stream(stream, st));
  }, nb::arg("x"), nb::arg("stream") = nb::none());
}

}  // namespace

GK_BINDING(20, ops) {
  nb::handle cls = nb::type<Array>();
  def_binary(m, cls, "add", BinaryOp::Add, "__add__", "__radd__");
  def_binary(m, cls, "sub", BinaryOp::Sub, "__sub__", "__rsub__");
  def_binary(m, cls, "mul", BinaryOp::Mul, "__mul__", "__rmul__");
  def_binary(m, cls, "div", BinaryOp::Div, "__truediv__", "__rtruediv__");
  def_binary(m, cls, "pow", BinaryOp::Pow, "__pow__", "__rpow__");
  def_binary(m, cls, "maximum", BinaryOp::Maximum, nullptr, nullptr);
  def_binary(m, cls, "minimum", BinaryOp::Minimum, nullptr, nullptr);
  def_binary(m, cls, "eq", BinaryOp::Eq, "__eq__", nullptr);
  def_binary(m, cls, "ne", BinaryOp::Ne, "__ne__", nullptr);
  def_binary(m, cls, "lt", BinaryOp::Lt, "__lt__", nullptr);
  def_binary(m, cls, "le", BinaryOp::Le, "__le__", nullptr);
  def_binary(m, cls, "gt", BinaryOp::Gt, "__gt__", nullptr);
  def_binary(m, cls, "ge", BinaryOp::Ge, "__ge__", nullptr);
  def_binary(m, cls, "logical_and", BinaryOp::LogicalAnd, "__and__", "__rand__");
  def_binary(m, cls, "logical_or", BinaryOp::LogicalOr, "__or__", "__ror__");
  nb::setattr(cls, "__hash__", nb::none());

  def_unary(m, "neg", UnaryOp::Neg);
  def_unary(m, "abs", UnaryOp::Abs);
  def_unary(m, "exp", UnaryOp::Exp);
  def_unary(m, "log", UnaryOp::Log);
  def_unary(m, "sqrt", UnaryOp::Sqrt);
  def_unary(m, "rsqrt", UnaryOp::Rsqrt);
  def_unary(m, "sin", UnaryOp::Sin);
  def_unary(m, "cos", UnaryOp::Cos);
  def_unary(m, "tanh", UnaryOp::Tanh);
  def_unary(m, "sigmoid", UnaryOp::Sigmoid);
  def_unary(m, "relu", UnaryOp::Relu);
  def_unary(m, "silu", UnaryOp::Silu);
  def_unary(m, "gelu_tanh", UnaryOp::GeluTanh);
  def_unary(m, "logical_not", UnaryOp::LogicalNot);
  m.def("gelu", [](const Array& x, const std::string& approximate, nb::handle stream) {
    Stream st;
    if (approximate != "none" && approximate != "tanh")
      throw ValueError("approximate: must be 'none' (erf form) or 'tanh'");
    return unary(approximate == "tanh" ? UnaryOp::GeluTanh : UnaryOp::GeluErf, x, to_stream(stream, st));
  }, nb::arg("x"), nb::arg("approximate") = "none", nb::arg("stream") = nb::none());
  nb::setattr(cls, "__neg__", nb::cpp_function([](const Array& x) { return unary(UnaryOp::Neg, x); }, nb::is_method()));
  nb::setattr(cls, "__abs__", nb::cpp_function([](const Array& x) { return unary(UnaryOp::Abs, x); }, nb::is_method()));
  nb::setattr(cls, "__invert__", nb::cpp_function([](const Array& x) {
    if (x.dtype() != DType::b8) throw TypeError("x: ~ is supported for boolean arrays only");
    return unary(UnaryOp::LogicalNot, x);
  }, nb::is_method()));

  m.def("clamp", [](const Array& x, nb::handle lo, nb::handle hi, nb::handle stream) {
    Stream st;
    std::optional<Scalar> l, h;
    if (!lo.is_none()) l = to_scalar(lo, "min");
    if (!hi.is_none()) h = to_scalar(hi, "max");
    return clamp(x, l, h, to_stream(stream, st));
  }, nb::arg("x"), nb::arg("min") = nb::none(), nb::arg("max") = nb::none(), nb::arg("stream") = nb::none());
  m.def("where", [](nb::handle c, nb::handle a, nb::handle b, nb::handle stream) {
    Stream st;
    Array cond = to_array(c, "cond");
    auto conv = [&](nb::handle v, const char* arg, const Array* other) {
      if (is_scalar(v)) {
        Scalar s = to_scalar(v, arg);
        DType t = other ? other->dtype() : (s.is_bool ? DType::b8 : s.is_float ? DType::f32 : DType::i64);
        if (other && s.is_float && !is_floating(t)) t = DType::f32;
        return full({}, s, t, cond.device(), to_stream(stream, st));
      }
      return to_array(v, arg, &cond);
    };
    std::optional<Array> aa, bb;
    if (!is_scalar(a)) aa = conv(a, "a", nullptr);
    if (!is_scalar(b)) bb = conv(b, "b", aa ? &*aa : nullptr);
    if (!aa) aa = conv(a, "a", bb ? &*bb : nullptr);
    if (!bb) bb = conv(b, "b", &*aa);
    return where(cond, *aa, *bb, to_stream(stream, st));
  }, nb::arg("cond"), nb::arg("a"), nb::arg("b"), nb::arg("stream") = nb::none());
  m.def("registered_ops", [] {
    nb::list l;
    for (auto& e : registered_ops()) l.append(nb::make_tuple(e.name, e.cpu, e.cuda));
    return l;
  });
}

}  // namespace gkpy
