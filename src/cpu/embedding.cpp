// CPU embedding gather: row copies (an out-of-range id gives a zero row; the
// front end rejects such ids when they are host-visible).
#include <cstring>

#include "ops/embedding_args.h"
#include "ops/registry.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("embedding");

void embedding(const EmbeddingArgs& a) {
  const size_t row = size_t(a.hidden) * size_t(a.elem_bytes);
  for (int64_t t = 0; t < a.n; ++t) {
    int64_t id = a.ids64 ? static_cast<const int64_t*>(a.ids)[t] : static_cast<const int32_t*>(a.ids)[t];
    char* dst = static_cast<char*>(a.out) + size_t(t) * row;
    if (id < 0 || id >= a.vocab) {
      std::memset(dst, 0, row);
      continue;
    }
    std::memcpy(dst, static_cast<const char*>(a.table) + size_t(id) * size_t(a.table_rs) * size_t(a.elem_bytes), row);
  }
}

}  // namespace gk::cpu
