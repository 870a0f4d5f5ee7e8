// Element types and the type-promotion rules (see docs/dtypes.md).
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <string_view>

#include "gpukit/numeric.h"

namespace gk {

enum class DType : uint8_t {
  b8, u8, i8, i16, i32, i64, f8e4m3, f8e5m2, f16, bf16, f32, f64,
};
inline constexpr int kNumDTypes = 12;

inline constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::b8: case DType::u8: case DType::i8: case DType::f8e4m3: case DType::f8e5m2: return 1;
    case DType::i16: case DType::f16: case DType::bf16: return 2;
    case DType::i32: case DType::f32: return 4;
    case DType::i64: case DType::f64: return 8;
  }
  return 0;
}
inline constexpr bool is_floating(DType t) {
  return t == DType::f8e4m3 || t == DType::f8e5m2 || t == DType::f16 || t == DType::bf16 ||
         t == DType::f32 || t == DType::f64;
}
inline constexpr bool is_integral(DType t) { return !is_floating(t) && t != DType::b8; }
inline constexpr bool is_fp8(DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; }

// The public name ("float32", "bfloat16", ...), as NumPy/torch spell it.
std::string_view dtype_name(DType t);
// Parses a name or alias ("float32", "f32", "bf16", "half", "int8", "bool", ...);
// throws TypeError naming `arg` when unknown.
DType dtype_from_name(std::string_view name, const char* arg = "dtype");

// Promotion of two array dtypes (documented in docs/dtypes.md):
//  - bool < integers < floating types;
//  - integers: the smallest signed/unsigned type holding both (u8+i8 -> i16, i64+u8 -> i64);
//  - an integer with a float gives the float;
//  - floats by width; f16+bf16 -> f32; fp8 + fp8 of the other kind -> f16;
DType promote(DType a, DType b);
// Result dtype of true division and of float functions (exp, sqrt, ...):
// floats stay, integers and bool become float32.
DType float_result(DType t);

// Calls f(T{}) with the C++ storage type of `t`.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::b8: return f(bool{});
    case DType::u8: return f(uint8_t{});
    case DType::i8: return f(int8_t{});
    case DType::i16: return f(int16_t{});
    case DType::i32: return f(int32_t{});
    case DType::i64: return f(int64_t{});
    case DType::f8e4m3: return f(f8e4m3{});
    case DType::f8e5m2: return f(f8e5m2{});
    case DType::f16: return f(f16{});
    case DType::bf16: return f(bf16{});
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
  }
  return f(float{});
}

template <class T> struct dtype_of;
template <> struct dtype_of<bool> { static constexpr DType value = DType::b8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<int16_t> { static constexpr DType value = DType::i16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<f8e4m3> { static constexpr DType value = DType::f8e4m3; };
template <> struct dtype_of<f8e5m2> { static constexpr DType value = DType::f8e5m2; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };

// The type arithmetic on T is done in: float for the narrow float types, T otherwise.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<f16> { using type = float; };
template <> struct compute_type<bf16> { using type = float; };
template <> struct compute_type<f8e4m3> { using type = float; };
template <> struct compute_type<f8e5m2> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

// double -> float rounded to odd: when the value is not exact, the result is the float
// toward zero with its last bit set. Rounding that float again to nearest-even into a format
// with at most 22 significand bits (f16, bf16, fp8) gives the correctly rounded result of
// the double, where plain double -> float -> narrow could round twice.
GK_HD float f64_to_f32_round_odd(double d) {
  float f = static_cast<float>(d);
  double back = static_cast<double>(f);
  if (!(d == d) || back == d) return f;
  uint32_t u = f32_bits(f);
  if ((back < 0 ? -back : back) > (d < 0 ? -d : d)) u -= 1;  // rounded away from zero (inf -> max)
  return bits_f32(u | 1u);
}

// Converts between any two storage types, through the compute type. float64 and integers
// reach the narrow float types through a round-to-odd float, so they are rounded once
// (integers above 2^53 in magnitude are first rounded to double).
template <class To, class From>
GK_HD To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != compute_t<From>(0);
  } else if constexpr (std::is_same_v<To, f16> || std::is_same_v<To, bf16> ||
                       std::is_same_v<To, f8e4m3> || std::is_same_v<To, f8e5m2>) {
    using C = compute_t<From>;
    if constexpr (std::is_same_v<C, float>) return To(static_cast<float>(static_cast<C>(v)));
    else return To(f64_to_f32_round_odd(static_cast<double>(static_cast<C>(v))));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<compute_t<From>>) {
    // float -> int: truncation toward zero; NaN gives 0; out-of-range values clamp.
    using C = compute_t<From>;
    C c = static_cast<C>(v);
    if (!(c == c)) return To(0);
    if (c <= C(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (c >= C(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(c);
  } else {
    return static_cast<To>(static_cast<compute_t<From>>(v));
  }
}

}  // namespace gk
