// Fused inference ops (gpukit.nn): norms, gated activations, positions.
#include <nanobind/stl/pair.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/nn.h"

namespace gkpy {
using namespace gk;

namespace {
Array opt_array(nb::handle h, const char* arg, const Array& like) {
  return h.is_none() ? Array() : to_array(h, arg, &like);
}

nn::GatedAct gelu_kind(const std::string& approximate) {
  if (approximate == "none") return nn::GatedAct::GeGLU;
  if (approximate == "tanh") return nn::GatedAct::GeGLUTanh;
  throw ValueError(cat("approximate: must be 'none' (erf form) or 'tanh', got '", approximate, "'"));
}

nb::object gated_any(nn::GatedAct act, nb::handle gate, nb::handle up, nb::handle stream) {
  Stream st;
  const Stream* sp = to_stream(stream, st);
  Array g = to_array(gate, up.is_none() ? "x" : "gate");
  if (up.is_none()) return nb::cast(nn::gated_fused(act, g, sp));
  return nb::cast(nn::gated(act, g, to_array(up, "up", &g), sp));
}
}  // namespace

GK_BINDING(35, nn) {
  m.def("rms_norm", [](nb::handle xh, nb::handle wh, double eps, nb::handle residual, bool gemma, nb::handle stream)
            -> nb::object {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    Array x = to_array(xh, "x");
    Array w = to_array(wh, "w", &x);
    if (residual.is_none()) return nb::cast(nn::rms_norm(x, w, eps, gemma, sp));
    auto [y, r] = nn::rms_norm_residual(x, to_array(residual, "residual", &x), w, eps, gemma, sp);
    return nb::make_tuple(y, r);
  }, nb::arg("x"), nb::arg("w"), nb::arg("eps") = 1e-6, nb::arg("residual") = nb::none(), nb::arg("gemma") = false,
     nb::arg("stream") = nb::none(),
     "RMS norm over the last dimension: x / sqrt(mean(x**2) + eps) * w (gemma=True: * (1 + w)).\n"
     "With residual: r = x + residual (in x's dtype) and returns (rms_norm(r), r), in one kernel.");
  m.def("layer_norm", [](nb::handle xh, nb::handle wh, nb::handle bh, double eps, nb::handle stream) {
    Stream st;
    Array x = to_array(xh, "x");
    return nn::layer_norm(x, to_array(wh, "w", &x), opt_array(bh, "b", x), eps, to_stream(stream, st));
  }, nb::arg("x"), nb::arg("w"), nb::arg("b") = nb::none(), nb::arg("eps") = 1e-5, nb::arg("stream") = nb::none(),
     "Layer norm over the last dimension (biased variance): (x - mean) / sqrt(var + eps) * w + b.");
  m.def("swiglu", [](nb::handle gate, nb::handle up, nb::handle stream) {
    return gated_any(nn::GatedAct::SwiGLU, gate, up, stream);
  }, nb::arg("gate"), nb::arg("up") = nb::none(), nb::arg("stream") = nb::none(),
     "silu(gate) * up. With up=None, gate is one [..., 2I] tensor: gate = [..., :I], up = [..., I:].");
  m.def("geglu", [](nb::handle gate, nb::handle up, const std::string& approximate, nb::handle stream) {
    return gated_any(gelu_kind(approximate), gate, up, stream);
  }, nb::arg("gate"), nb::arg("up") = nb::none(), nb::arg("approximate") = "none", nb::arg("stream") = nb::none(),
     "gelu(gate) * up (approximate='none': erf form, 'tanh': tanh form). up=None: fused [..., 2I] input.");
  m.def("relu2", [](nb::handle xh, nb::handle stream) {
    Stream st;
    return nn::gated(nn::GatedAct::ReLU2, to_array(xh, "x"), Array(), to_stream(stream, st));
  }, nb::arg("x"), nb::arg("stream") = nb::none(), "relu(x) ** 2.");
}

}  // namespace gkpy
