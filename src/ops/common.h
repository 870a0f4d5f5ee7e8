// Helpers shared by the op front ends.
#pragma once
#include <initializer_list>

#include "gpukit/allocator.h"
#include "gpukit/array.h"
#include "gpukit/errors.h"
#include "ops/backend.h"

namespace gk::detail {

// All operands on one device; returns it. Throws ValueError naming the arguments.
Device common_device(std::initializer_list<std::pair<const char*, const Array*>> args);
// Marks arrays as used on `s` (allocator stream safety) when s is not their home stream.
inline void mark_used(const Array& a, const Stream& s) {
  const auto& st = a.storage();
  if (st && st->block && s.valid() && st->alloc_stream != s.handle()) record_stream(*st, s);
}
void require_defined(const Array& a, const char* arg);
// ValueError unless every CUDA kernel is compiled in.
[[noreturn]] void no_cuda_backend();

}  // namespace gk::detail
