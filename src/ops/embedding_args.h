// Arguments of the embedding gather (src/ops/embedding.cpp, src/cpu/embedding.cpp,
// src/cuda/embedding.cu).
#pragma once
#include <cstdint>

#include "gpukit/dtype.h"

namespace gk {
struct EmbeddingArgs {
  const void* ids = nullptr;  // int32 or int64, contiguous [n]
  bool ids64 = false;
  const void* table = nullptr;  // [V, H], row stride table_rs (elements), columns dense
  int64_t vocab = 0, hidden = 0, table_rs = 0, n = 0;
  void* out = nullptr;  // contiguous [n, H]
  int elem_bytes = 4;
};
namespace cpu {
void embedding(const EmbeddingArgs& a);
}
namespace cuda {
void embedding(const EmbeddingArgs& a, void* stream);
}
}  // namespace gk
