#include "gpukit/dtype.h"

#include "gpukit/errors.h"

namespace gk {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::b8: return "bool";
    case DType::u8: return "uint8";
    case DType::i8: return "int8";
    case DType::i16: return "int16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::f8e4m3: return "float8_e4m3fn";
    case DType::f8e5m2: return "float8_e5m2";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f32: return "float32";
    case DType::f64: return "float64";
  }
  return "?";
}

DType dtype_from_name(std::string_view n, const char* arg) {
  struct Alias { const char* name; DType t; };
  static const Alias aliases[] = {
      {"bool", DType::b8}, {"bool_", DType::b8}, {"uint8", DType::u8}, {"u8", DType::u8},
      {"int8", DType::i8}, {"i8", DType::i8}, {"int16", DType::i16}, {"i16", DType::i16},
      {"int32", DType::i32}, {"i32", DType::i32}, {"int64", DType::i64}, {"i64", DType::i64},
      {"float8_e4m3fn", DType::f8e4m3}, {"float8_e4m3", DType::f8e4m3}, {"fp8_e4m3", DType::f8e4m3},
      {"e4m3", DType::f8e4m3}, {"float8_e5m2", DType::f8e5m2}, {"fp8_e5m2", DType::f8e5m2}, {"e5m2", DType::f8e5m2},
      {"float16", DType::f16}, {"f16", DType::f16}, {"half", DType::f16}, {"fp16", DType::f16},
      {"bfloat16", DType::bf16}, {"bf16", DType::bf16}, {"float32", DType::f32}, {"f32", DType::f32},
      {"float", DType::f32}, {"fp32", DType::f32}, {"float64", DType::f64}, {"f64", DType::f64},
      {"double", DType::f64},
  };
  for (const auto& a : aliases)
    if (n == a.name) return a.t;
  throw TypeError(cat(arg, ": unknown dtype '", n, "'"));
}

namespace {
int float_rank(DType t) {
  switch (t) {
    case DType::f8e4m3: case DType::f8e5m2: return 1;
    case DType::f16: case DType::bf16: return 2;
    case DType::f32: return 3;
    case DType::f64: return 4;
    default: return 0;
  }
}
DType promote_int(DType a, DType b) {
  auto bits = [](DType t) { return int(itemsize(t)) * 8; };
  bool ua = a == DType::u8, ub = b == DType::u8;
  if (ua == ub) return bits(a) >= bits(b) ? a : b;
  DType s = ua ? b : a;  // the signed one
  if (bits(s) > 8) return s;
  return DType::i16;  // u8 with i8
}
}  // namespace

DType promote(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::b8) return b;
  if (b == DType::b8) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (!fa && !fb) return promote_int(a, b);
  int ra = float_rank(a), rb = float_rank(b);
  if (ra != rb) return ra > rb ? a : b;
  if (ra == 2) return DType::f32;  // f16 with bf16
  return DType::f16;               // e4m3 with e5m2
}

DType float_result(DType t) { return is_floating(t) ? t : DType::f32; }

}  // namespace gk
