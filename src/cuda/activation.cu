// CUDA gated activations: one pass, out[r, i] = act(gate[r, i]) * up[r, i].
//
// The [rows, I] problem is walked as one flat range of vectors (16 bytes when
// every row is dense and aligned, single elements otherwise); a vector's row
// comes from a multiply-shift division (32-bit indices when they fit). Full
// tiles of kThreads * U vectors run without bounds checks so that all loads of
// a thread are in flight before the first conversion.
//
// Math is fp32. For 16-bit storage, SwiGLU uses the hardware exp and divide
// (__expf, __fdividef: a few fp32 ulps, far below half a bf16/f16 ulp); for
// fp32 storage it keeps the correctly rounded-ish expf and the IEEE divide.
#include <algorithm>

#include "cuda/common/rows.cuh"
#include "cuda/common/vec.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("swiglu", "geglu", "geglu_tanh", "relu2");

namespace {

template <nn::GatedAct A, class T>
__device__ __forceinline__ float act(float g, float u) {
  if constexpr (A == nn::GatedAct::SwiGLU && !std::is_same_v<T, float>) return __fdividef(g, 1.f + __expf(-g)) * u;
  else return gated_fn<A, float>(g, u);
}

template <class I>
struct RowDiv {  // i / nv for the flat vector index i
  FastDiv fd;
  int64_t nv;
  __device__ __forceinline__ I row(I i) const {
    if constexpr (sizeof(I) == 4) return fd.div(i);
    else return i / nv;
  }
};

template <nn::GatedAct A, class T, int N, int U, class I>
__global__ void __launch_bounds__(kThreads) k_gated(const __grid_constant__ GatedArgs a, RowDiv<I> rd, I total) {
  constexpr bool kUp = A != nn::GatedAct::ReLU2;
  using RT = raw_t<T, N>;
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* out = static_cast<T*>(a.out);
  const I nv = I(rd.nv);
  auto offs = [&](I i, int64_t& go, int64_t& uo, int64_t& oo) {
    const I r = rd.row(i);
    const int64_t c = int64_t(i - r * nv) * N;
    go = int64_t(r) * a.gate_rs + c;
    uo = int64_t(r) * a.up_rs + c;
    oo = int64_t(r) * a.out_rs + c;
  };
  auto compute = [&](const RT& gr, const RT& ur, int64_t oo) {
    Vec<T, N> gv = as_vec<T, N>(gr), uv = as_vec<T, N>(ur);
    float o[N];
#pragma unroll
    for (int j = 0; j < N; ++j) o[j] = act<A, T>(float(gv.v[j]), kUp ? float(uv.v[j]) : 0.f);
    st_vec<T, N>(out + oo, 0, o);
  };
  constexpr I kTile = I(kThreads) * U;
  const I full = total / kTile;
  for (I tile = blockIdx.x; tile < full; tile += gridDim.x) {
    const I base = tile * kTile + threadIdx.x;
    RT g[U], u[U] = {};
    int64_t oo[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      int64_t go, uo;
      offs(base + I(k) * kThreads, go, uo, oo[k]);
      g[k] = ld_vec<T, N>(gate + go, 0);
      if constexpr (kUp) u[k] = ld_vec<T, N>(up + uo, 0);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) compute(g[k], u[k], oo[k]);
  }
  for (I i = full * kTile + I(blockIdx.x) * kThreads + threadIdx.x; i < total; i += I(gridDim.x) * kThreads) {
    int64_t go, uo, oo;
    offs(i, go, uo, oo);
    RT u = {};
    if constexpr (kUp) u = ld_vec<T, N>(up + uo, 0);
    compute(ld_vec<T, N>(gate + go, 0), u, oo);
  }
}

template <nn::GatedAct A, class T, int N>
void launch_n(const GatedArgs& a, cudaStream_t st) {
  const int64_t nv = a.I / N, total = nv * a.rows;
  const int u = tune("gated.unroll", 4);
  auto go = [&](auto uc, auto ic) {
    constexpr int U = decltype(uc)::value;
    using I = decltype(ic);
    RowDiv<I> rd{FastDiv(uint32_t(sizeof(I) == 4 ? nv : 1)), nv};
    unsigned grid = grid_for(total, kThreads * U);
    if (int bpsm = tune("gated.bpsm", 0); bpsm > 0)  // grid-stride with a fixed grid (benchmarking)
      grid = std::min<unsigned>(grid, unsigned(sm_count() * bpsm));
    k_gated<A, T, N, U, I><<<grid, kThreads, 0, st>>>(a, rd, I(total));
  };
  const bool small = total < (int64_t(1) << 31) - int64_t(kThreads) * 8;
  if (!small) go(std::integral_constant<int, 4>{}, int64_t{});
  else if (u == 2) go(std::integral_constant<int, 2>{}, uint32_t{});
  else if (u == 8) go(std::integral_constant<int, 8>{}, uint32_t{});
  else go(std::integral_constant<int, 4>{}, uint32_t{});
}

template <nn::GatedAct A, class T>
void launch(const GatedArgs& a, cudaStream_t st) {
  constexpr int N = kVecN<T>;
  bool vec = a.I % N == 0 && a.gate_rs % N == 0 && a.out_rs % N == 0 && aligned16(a.gate) && aligned16(a.out) &&
             (A == nn::GatedAct::ReLU2 || (a.up_rs % N == 0 && aligned16(a.up)));
  if (vec) launch_n<A, T, N>(a, st);
  else launch_n<A, T, 1>(a, st);
  GK_LAUNCH_CHECK(nn::gated_act_name(A));
}
}  // namespace

void gated(const GatedArgs& a, void* stream) {
  if (a.rows <= 0 || a.I <= 0) return;
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
