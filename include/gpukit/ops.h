// The op library. Every op validates its arguments (typed errors naming the
// argument), allocates its output, and runs on the CPU reference backend or the
// CUDA backend depending on where its inputs live. `stream` may be null: the
// device's current stream is used.
#pragma once
#include <optional>
#include <vector>

#include "gpukit/array.h"

namespace gk {

// A Python-style scalar operand: it takes the dtype of the array it meets
// (a float scalar with an integer array gives float32).
struct Scalar {
  double f = 0;
  int64_t i = 0;
  bool is_float = true;
  bool is_bool = false;
  static Scalar of(double v) { return {v, int64_t(v), true, false}; }
  static Scalar of_int(int64_t v) { return {double(v), v, false, false}; }
  static Scalar of_bool(bool v) { return {double(v), int64_t(v), false, true}; }
};

// ---- copy and conversion ----
// Copies src into dst (broadcasting src, converting dtype); devices may differ.
void copy_into(const Array& dst, const Array& src, const Stream* s = nullptr);
Array full(const Shape& shape, Scalar value, DType dtype, Device device, const Stream* s = nullptr);
Array arange(double start, double stop, double step, DType dtype, Device device, const Stream* s = nullptr);

// ---- elementwise ----
enum class BinaryOp : uint8_t {
  Add, Sub, Mul, Div, Pow, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge, LogicalAnd, LogicalOr,
};
enum class UnaryOp : uint8_t {
  Neg, Abs, Exp, Log, Sqrt, Rsqrt, Sin, Cos, Tanh, Sigmoid, Relu, GeluErf, GeluTanh, Silu, LogicalNot,
};
const char* op_name(BinaryOp op);
const char* op_name(UnaryOp op);
bool is_comparison(BinaryOp op);

// Result dtype of a binary op on two arrays (promotion; bool for comparisons,
// float for true division of integers).
DType binary_result_dtype(BinaryOp op, DType a, DType b);
Array binary(BinaryOp op, const Array& a, const Array& b, const Stream* s = nullptr);
// `scalar_first`: computes scalar (op) a instead of a (op) scalar.
Array binary(BinaryOp op, const Array& a, Scalar b, bool scalar_first = false, const Stream* s = nullptr);
Array unary(UnaryOp op, const Array& a, const Stream* s = nullptr);
Array clamp(const Array& a, std::optional<Scalar> lo, std::optional<Scalar> hi, const Stream* s = nullptr);
Array where(const Array& cond, const Array& a, const Array& b, const Stream* s = nullptr);

inline Array add(const Array& a, const Array& b, const Stream* s = nullptr) { return binary(BinaryOp::Add, a, b, s); }
inline Array sub(const Array& a, const Array& b, const Stream* s = nullptr) { return binary(BinaryOp::Sub, a, b, s); }
inline Array mul(const Array& a, const Array& b, const Stream* s = nullptr) { return binary(BinaryOp::Mul, a, b, s); }
inline Array div(const Array& a, const Array& b, const Stream* s = nullptr) { return binary(BinaryOp::Div, a, b, s); }

// ---- reductions (axes empty: all axes) ----
enum class ReduceOp : uint8_t { Sum, Mean, Max, Min, Argmax, Argmin };
const char* op_name(ReduceOp op);
Array reduce(ReduceOp op, const Array& a, const std::vector<int>& axes, bool keepdims,
             const Stream* s = nullptr);
// argmax/argmin over one axis (or the flattened array when axis is nullopt); int64 result.
Array arg_reduce(ReduceOp op, const Array& a, std::optional<int> axis, bool keepdims,
                 const Stream* s = nullptr);
Array softmax(const Array& a, int axis = -1, const Stream* s = nullptr);
Array log_softmax(const Array& a, int axis = -1, const Stream* s = nullptr);

// ---- linear algebra ----
// NumPy matmul semantics (1-d operands promoted and squeezed, batch dims
// broadcast); float32/float16/bfloat16 inputs, fp32 accumulation.
Array matmul(const Array& a, const Array& b, const Stream* s = nullptr);

// ---- registry: which ops each backend implements (for the test harness) ----
struct OpEntry {
  std::string name;
  bool cpu = false;
  bool cuda = false;
};
std::vector<OpEntry> registered_ops();

}  // namespace gk
