// CPU reference of the gated activations: double math, one rounding to storage.
#include "ops/nn_args.h"

namespace gk::cpu {

GK_REGISTER_CPU_OPS("swiglu", "geglu", "geglu_tanh", "relu2");

namespace {
template <nn::GatedAct A, class T>
void run(const GatedArgs& a) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const T* g = static_cast<const T*>(a.gate) + r * a.gate_rs;
    const T* u = a.up ? static_cast<const T*>(a.up) + r * a.up_rs : nullptr;
    T* o = static_cast<T*>(a.out) + r * a.out_rs;
    for (int64_t i = 0; i < a.I; ++i) {
      double gv = double(convert<float>(g[i]));
      double uv = u ? double(convert<float>(u[i])) : 0.0;
      o[i] = convert<T>(float(gated_fn<A, double>(gv, uv)));
    }
  }
}
}  // namespace

void gated(const GatedArgs& a) {
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    switch (a.act) {
      case nn::GatedAct::SwiGLU: return run<nn::GatedAct::SwiGLU, T>(a);
      case nn::GatedAct::GeGLU: return run<nn::GatedAct::GeGLU, T>(a);
      case nn::GatedAct::GeGLUTanh: return run<nn::GatedAct::GeGLUTanh, T>(a);
      case nn::GatedAct::ReLU2: return run<nn::GatedAct::ReLU2, T>(a);
    }
  });
}

}  // namespace gk::cpu
