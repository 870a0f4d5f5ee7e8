// CUDA gated activations: one pass, out[r, i] = act(gate[r, i]) * up[r, i], with
// 16-byte vector accesses (several in flight per thread) when every row is
// dense and aligned, a scalar path otherwise.
#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("swiglu", "geglu", "geglu_tanh", "relu2");

namespace {
constexpr int kU = 4;  // vectors per thread

template <nn::GatedAct A, class T, int N>
__global__ void __launch_bounds__(kThreads) k_gated(GatedArgs a, int64_t nv, int64_t total) {
  using V = Vec<T, N>;
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* out = static_cast<T*>(a.out);
  const int64_t step = int64_t(gridDim.x) * kThreads * kU;  // grid-stride: the grid is capped
  for (int64_t base = int64_t(blockIdx.x) * kThreads * kU + threadIdx.x; base < total; base += step) {
    V g[kU], u[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      int64_t idx = base + int64_t(k) * kThreads;
      if (idx < total) {
        int64_t r = idx / nv, c = (idx - r * nv) * N;
        g[k] = *reinterpret_cast<const V*>(gate + r * a.gate_rs + c);
        if constexpr (A != nn::GatedAct::ReLU2) u[k] = *reinterpret_cast<const V*>(up + r * a.up_rs + c);
      }
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      int64_t idx = base + int64_t(k) * kThreads;
      if (idx < total) {
        int64_t r = idx / nv, c = (idx - r * nv) * N;
        V o;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float uv = 0.f;
          if constexpr (A != nn::GatedAct::ReLU2) uv = float(u[k].v[j]);
          o.v[j] = convert<T>(gated_fn<A, float>(float(g[k].v[j]), uv));
        }
        *reinterpret_cast<V*>(out + r * a.out_rs + c) = o;
      }
    }
  }
}

template <nn::GatedAct A, class T>
void launch(const GatedArgs& a, cudaStream_t st) {
  constexpr int N = 16 / sizeof(T);
  bool vec = a.I % N == 0 && a.gate_rs % N == 0 && a.out_rs % N == 0 && aligned16(a.gate) && aligned16(a.out) &&
             (A == nn::GatedAct::ReLU2 || (a.up_rs % N == 0 && aligned16(a.up)));
  if (vec) {
    int64_t nv = a.I / N, total = nv * a.rows;
    k_gated<A, T, N><<<grid_for(total, kThreads * kU), kThreads, 0, st>>>(a, nv, total);
  } else {
    int64_t total = a.I * a.rows;
    k_gated<A, T, 1><<<grid_for(total, kThreads * kU), kThreads, 0, st>>>(a, a.I, total);
  }
  GK_LAUNCH_CHECK(nn::gated_act_name(A));
}
}  // namespace

void gated(const GatedArgs& a, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    switch (a.act) {
      case nn::GatedAct::SwiGLU: return launch<nn::GatedAct::SwiGLU, T>(a, st);
      case nn::GatedAct::GeGLU: return launch<nn::GatedAct::GeGLU, T>(a, st);
      case nn::GatedAct::GeGLUTanh: return launch<nn::GatedAct::GeGLUTanh, T>(a, st);
      case nn::GatedAct::ReLU2: return launch<nn::GatedAct::ReLU2, T>(a, st);
    }
  });
}

}  // namespace gk::cuda
