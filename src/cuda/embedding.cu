// CUDA embedding gather: one block per token copies its row (elements of 2, 4 or
// 8 bytes); an id outside [0, vocab) gives a zero row, so unvalidated device ids
// never read out of bounds.
#include <algorithm>

#include "core/cuda_util.h"
#include "gpukit/errors.h"
#include "ops/embedding_args.h"
#include "ops/registry.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("embedding");

namespace {
template <class E>
__global__ void k_embedding(EmbeddingArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t id = a.ids64 ? static_cast<const int64_t*>(a.ids)[t] : static_cast<const int32_t*>(a.ids)[t];
  E* dst = static_cast<E*>(a.out) + t * a.hidden;
  const bool ok = id >= 0 && id < a.vocab;
  const E* src = static_cast<const E*>(a.table) + (ok ? id : 0) * a.table_rs;
  for (int64_t j = threadIdx.x; j < a.hidden; j += blockDim.x) dst[j] = ok ? src[j] : E(0);
}

template <class E>
void launch(const EmbeddingArgs& a, cudaStream_t st) {
  const int threads = int(std::min<int64_t>(256, std::max<int64_t>(32, (a.hidden + 31) / 32 * 32)));
  k_embedding<E><<<unsigned(a.n), unsigned(threads), 0, st>>>(a);
  GK_LAUNCH_CHECK("embedding");
}
}  // namespace

void embedding(const EmbeddingArgs& a, void* stream) {
  if (a.n <= 0 || a.hidden <= 0) return;
  if (a.n > int64_t(INT32_MAX)) throw ValueError("embedding: too many ids for one launch");
  auto st = static_cast<cudaStream_t>(stream);
  switch (a.elem_bytes) {
    case 1: return launch<uint8_t>(a, st);
    case 2: return launch<uint16_t>(a, st);
    case 4: return launch<uint32_t>(a, st);
    case 8: return launch<uint64_t>(a, st);
    default: throw TypeError("embedding: unsupported element size");
  }
}

}  // namespace gk::cuda
