// Argument checks shared by the engine's front ends (fused.cpp, fused_small.cpp).
#pragma once
#include <cstdint>

#include "gpukit/array.h"
#include "gpukit/errors.h"

namespace gk::llm::fused::checks {
[[maybe_unused]] inline bool al16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
inline void need_float(const Array& a, const char* arg) {
  if (a.dtype() != DType::f32 && a.dtype() != DType::f16 && a.dtype() != DType::bf16)
    throw TypeError(cat(arg, ": float32, float16 or bfloat16 expected, got ", dtype_name(a.dtype())));
}
inline void same_dtype(const Array& a, const Array& b, const char* arg) {
  if (a.dtype() != b.dtype())
    throw TypeError(cat(arg, ": dtype ", dtype_name(b.dtype()), " differs from ", dtype_name(a.dtype())));
}
}  // namespace gk::llm::fused::checks
