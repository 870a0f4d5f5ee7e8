// Front end of the gated activations (swiglu, geglu, relu2), on two inputs or on
// one concatenated [..., 2I] tensor: validate, allocate, dispatch.
#include "gpukit/nn.h"
#include "ops/common.h"
#include "ops/nn_args.h"

namespace gk::nn {

const char* gated_act_name(GatedAct a) {
  switch (a) {
    case GatedAct::SwiGLU: return "swiglu";
    case GatedAct::GeGLU: return "geglu";
    case GatedAct::GeGLUTanh: return "geglu_tanh";
    case GatedAct::ReLU2: return "relu2";
  }
  return "?";
}

namespace {
void run(const GatedArgs& a, Device d, const Stream& s) {
  if (a.rows == 0 || a.I == 0) return;
  if (d.is_cpu()) return cpu::gated(a);
#if GPUKIT_WITH_CUDA
  cuda::gated(a, s.handle());
#else
  (void)s;
  detail::no_cuda_backend();
#endif
}
}  // namespace

Array gated(GatedAct act, const Array& gate_in, const Array& up_in, const Stream* sp) {
  bool unary = act == GatedAct::ReLU2;
  const char* gname = unary ? "x" : "gate";
  Device d = unary ? detail::common_device({{gname, &gate_in}})
                   : detail::common_device({{"gate", &gate_in}, {"up", &up_in}});
  detail::require_half_or_float(gate_in, gname);
  if (!unary) {
    detail::require_same_dtype(up_in, "up", gate_in, "gate");
    if (up_in.shape() != gate_in.shape())
      throw ValueError(cat("up: shape ", shape_str(up_in.shape()), " does not match gate ",
                           shape_str(gate_in.shape())));
  }
  Stream s = resolve_stream(sp, d);
  detail::Rows g = detail::as_rows(gate_in, s);
  Array out = Array::empty(gate_in.shape(), gate_in.dtype(), d, &s);
  GatedArgs a;
  a.gate = g.a.data();
  a.gate_rs = g.rs;
  a.rows = g.rows;
  a.I = g.H;
  a.out = out.data();
  a.out_rs = g.H;
  a.dtype = gate_in.dtype();
  a.act = act;
  detail::mark_used(g.a, s);
  if (!unary) {
    detail::Rows u = detail::as_rows(up_in, s);
    a.up = u.a.data();
    a.up_rs = u.rs;
    detail::mark_used(u.a, s);
  }
  run(a, d, s);
  return out;
}

Array gated_fused(GatedAct act, const Array& x_in, const Stream* sp) {
  if (act == GatedAct::ReLU2) throw ValueError("relu2 has no gate: call it on one tensor");
  Device d = detail::common_device({{"x", &x_in}});
  detail::require_half_or_float(x_in, "x");
  if (x_in.ndim() < 1 || x_in.shape(-1) % 2 != 0)
    throw ValueError(cat("x: shape ", shape_str(x_in.shape()),
                         " must end in an even dimension 2*I (gate first half, up second half)"));
  Stream s = resolve_stream(sp, d);
  detail::Rows x = detail::as_rows(x_in, s);
  Shape oshape = x_in.shape();
  oshape.back() /= 2;
  Array out = Array::empty(oshape, x_in.dtype(), d, &s);
  GatedArgs a;
  a.rows = x.rows;
  a.I = x.H / 2;
  a.gate = x.a.data();
  a.up = static_cast<const char*>(x.a.data()) + a.I * int64_t(x.a.itemsize());
  a.gate_rs = a.up_rs = x.rs;
  a.out = out.data();
  a.out_rs = a.I;
  a.dtype = x_in.dtype();
  a.act = act;
  detail::mark_used(x.a, s);
  run(a, d, s);
  return out;
}

}  // namespace gk::nn
