// CUDA copy/convert kernels between any two dtypes, and raw async copies.
#include "cuda/common/ew.cuh"
#include "ops/backend.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("copy");

namespace {
template <class I, class O>
struct ConvF {
  __device__ __forceinline__ O operator()(I x) const { return convert<O>(x); }
};
}  // namespace

void copy(const EwArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_dtype(a.out_dtype, [&](auto o) {
    using O = decltype(o);
    dispatch_dtype(a.in_dtype, [&](auto i) {
      using I = decltype(i);
      launch_unary<I, O>(a, ConvF<I, O>{}, st);
    });
  });
}

void memcpy_async(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  cudaMemcpyKind k = kind == 1 ? cudaMemcpyHostToDevice : kind == 2 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
  GK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)));
}

}  // namespace gk::cuda
