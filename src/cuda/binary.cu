// CUDA kernels of the binary elementwise ops (arithmetic and comparisons).
#include "cuda/common/ew.cuh"
#include "ops/backend.h"
#include "ops/ew_dispatch.h"
#include "ops/ew_functors.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
                     "logical_and", "logical_or");

namespace {
template <BinaryOp OP, class C>
struct BinF {
  __device__ __forceinline__ auto operator()(C a, C b) const { return ew::binary<OP, C>(a, b); }
};

template <BinaryOp OP, class T>
void run(const EwArgs& a, cudaStream_t s) {
  using C = compute_t<T>;
  using R = std::conditional_t<(OP >= BinaryOp::Eq), bool, T>;
  C sv = C(0);
  if (a.scalar_slot > 0) {
    if constexpr (std::is_floating_point_v<C>) sv = C(convert<T>(a.scalar_f));
    else sv = C(a.scalar_i);
  }
  launch_binary<T, R>(a, BinF<OP, C>{}, sv, s);
}
}  // namespace

void binary(BinaryOp op, const EwArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  ew::dispatch_binary(op, a.in_dtype, [&]<BinaryOp OP, class T>() { run<OP, T>(a, st); });
}

}  // namespace gk::cuda
