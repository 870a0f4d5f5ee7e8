// GGUFValue accessors: typed views of metadata values and of compact arrays.
#include <cstring>

#include "gpukit/errors.h"
#include "gpukit/io.h"
#include "io/reader.h"

namespace gk::io {
namespace {

bool is_unsigned(GGUFType t) {
  return t == GGUFType::U8 || t == GGUFType::U16 || t == GGUFType::U32 || t == GGUFType::U64 || t == GGUFType::Bool;
}
bool is_signed(GGUFType t) {
  return t == GGUFType::I8 || t == GGUFType::I16 || t == GGUFType::I32 || t == GGUFType::I64;
}
bool is_float(GGUFType t) { return t == GGUFType::F32 || t == GGUFType::F64; }

size_t elem_size(GGUFType t) {
  switch (t) {
    case GGUFType::U8: case GGUFType::I8: case GGUFType::Bool: return 1;
    case GGUFType::U16: case GGUFType::I16: return 2;
    case GGUFType::U32: case GGUFType::I32: case GGUFType::F32: return 4;
    default: return 8;
  }
}

[[noreturn]] void wrong(const char* want, GGUFType have, GGUFType elem = GGUFType::U8) {
  if (have == GGUFType::Array)
    throw FormatError(cat("GGUF metadata: expected ", want, ", found an array of ", gguf_type_name(elem)));
  throw FormatError(cat("GGUF metadata: expected ", want, ", found a ", gguf_type_name(have)));
}

// Element k of a numeric array as a scalar value.
GGUFValue number_at(const GGUFValue& a, size_t k) {
  GGUFValue v;
  v.type = a.elem_type;
  const uint8_t* p = reinterpret_cast<const uint8_t*>(a.data.data()) + k * elem_size(a.elem_type);
  using detail::load_le;
  switch (a.elem_type) {
    case GGUFType::U8: case GGUFType::Bool: v.u = p[0]; break;
    case GGUFType::I8: v.i = int8_t(p[0]); break;
    case GGUFType::U16: v.u = load_le<uint16_t>(p); break;
    case GGUFType::I16: v.i = load_le<int16_t>(p); break;
    case GGUFType::U32: v.u = load_le<uint32_t>(p); break;
    case GGUFType::I32: v.i = load_le<int32_t>(p); break;
    case GGUFType::U64: v.u = load_le<uint64_t>(p); break;
    case GGUFType::I64: v.i = load_le<int64_t>(p); break;
    case GGUFType::F32: v.f = load_le<float>(p); break;
    case GGUFType::F64: v.f = load_le<double>(p); break;
    default: break;
  }
  return v;
}

}  // namespace

GGUFValue GGUFValue::at(size_t k) const {
  if (!is_array()) wrong("an array", type);
  if (k >= count) throw IndexError(cat("GGUF metadata: index ", k, " out of range for an array of ", count));
  if (elem_type == GGUFType::Array) return arr[k];
  if (elem_type == GGUFType::String) {
    GGUFValue v;
    v.type = GGUFType::String;
    v.s = string_at(k);
    return v;
  }
  return number_at(*this, k);
}

int64_t GGUFValue::as_int() const {
  if (is_signed(type)) return i;
  if (is_unsigned(type)) {
    if (u > uint64_t(INT64_MAX)) throw FormatError(cat("GGUF metadata: value ", u, " does not fit in int64"));
    return int64_t(u);
  }
  wrong("an integer", type, elem_type);
}

uint64_t GGUFValue::as_uint() const {
  if (is_unsigned(type)) return u;
  if (is_signed(type)) {
    if (i < 0) throw FormatError(cat("GGUF metadata: expected a non-negative integer, found ", i));
    return uint64_t(i);
  }
  wrong("an integer", type, elem_type);
}

double GGUFValue::as_float() const {
  if (is_float(type)) return f;
  if (is_signed(type)) return double(i);
  if (is_unsigned(type)) return double(u);
  wrong("a number", type, elem_type);
}

const std::string& GGUFValue::as_string() const {
  if (type != GGUFType::String) wrong("a string", type, elem_type);
  return s;
}

std::string GGUFValue::string_at(size_t k) const {
  if (!is_array() || elem_type != GGUFType::String) wrong("an array of strings", type, elem_type);
  if (k >= count) throw IndexError(cat("GGUF metadata: index ", k, " out of range for an array of ", count));
  size_t b = k ? size_t(str_ends[k - 1]) : 0;
  return data.substr(b, size_t(str_ends[k]) - b);
}

std::vector<std::string> GGUFValue::as_strings() const {
  if (!is_array() || elem_type != GGUFType::String) wrong("an array of strings", type, elem_type);
  std::vector<std::string> r;
  r.reserve(size_t(count));
  for (size_t k = 0; k < count; ++k) r.push_back(string_at(k));
  return r;
}

std::vector<int64_t> GGUFValue::as_ints() const {
  if (!is_array() || !(is_signed(elem_type) || is_unsigned(elem_type))) wrong("an array of integers", type, elem_type);
  std::vector<int64_t> r;
  r.reserve(size_t(count));
  for (size_t k = 0; k < count; ++k) r.push_back(number_at(*this, k).as_int());
  return r;
}

std::vector<double> GGUFValue::as_floats() const {
  if (!is_array() || !(is_signed(elem_type) || is_unsigned(elem_type) || is_float(elem_type)))
    wrong("an array of numbers", type, elem_type);
  std::vector<double> r;
  r.reserve(size_t(count));
  for (size_t k = 0; k < count; ++k) r.push_back(number_at(*this, k).as_float());
  return r;
}

}  // namespace gk::io
