// Matrix products: gk.matmul with out_dtype / allow_tf32 (replaces the plain one
// bound in reduce.cpp), gk.linear, gk.gate_up_swiglu, the matmul precision
// setting and cuBLASLt information (see include/gpukit/gemm.h).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/gemm.h"

namespace gkpy {
using namespace gk;

namespace {

std::pair<Array, Array> two_arrays(nb::handle a, nb::handle b, const char* an, const char* bn) {
  bool aa = nb::isinstance<Array>(a), ba = nb::isinstance<Array>(b);
  if (aa && ba) return {nb::cast<Array>(a), nb::cast<Array>(b)};
  if (aa) {
    Array x = nb::cast<Array>(a);
    return {x, to_array(b, bn, &x)};
  }
  if (ba) {
    Array y = nb::cast<Array>(b);
    return {to_array(a, an, &y), y};
  }
  return {to_array(a, an), to_array(b, bn)};
}

std::optional<bool> opt_bool(nb::handle h, const char* arg) {
  if (h.is_none()) return std::nullopt;
  if (!nb::isinstance<nb::bool_>(h)) throw TypeError(cat(arg, ": expected True, False or None"));
  return nb::cast<bool>(h);
}

Activation to_activation(nb::handle h) {
  if (h.is_none()) return Activation::none;
  if (!nb::isinstance<nb::str>(h)) throw TypeError("activation: expected None or a string");
  return parse_activation(nb::cast<std::string>(h));
}

const char* kMatmulDoc =
    "matmul(a, b, out_dtype=None, allow_tf32=None, stream=None)\n\n"
    "Matrix product with NumPy semantics (1-d operands, broadcast batch dimensions).\n"
    "float32/float16/bfloat16/float64; fp32 accumulation (fp64 for float64), rounded once\n"
    "to out_dtype (default: the promoted input dtype; float32, float16 or bfloat16, or\n"
    "float64 for float64 inputs). float32 is true FP32 unless allow_tf32=True or\n"
    "gk.set_matmul_precision('tf32'). On CUDA: cuBLASLt when available (reproducible\n"
    "configurations only), else gpukit's kernel. The same bits on every run.";

const char* kLinearDoc =
    "linear(x, w, bias=None, activation=None, residual=None, out_dtype=None, stream=None)\n\n"
    "act(x @ w.T + bias) + residual with x [..., K], w [N, K] (torch Linear layout),\n"
    "bias [N], residual of the result's shape [..., N]; activation None, 'gelu' (erf),\n"
    "'gelu_tanh' or 'silu'. Computed in fp32 (fp64 for float64) and rounded once; bias\n"
    "and residual are first converted to out_dtype.";

const char* kSwigluDoc =
    "gate_up_swiglu(x, w_gate_up, out_dtype=None, stream=None)\n\n"
    "silu(x @ Wg.T) * (x @ Wu.T) where w_gate_up [2*I, K] stacks Wg (first I rows) and\n"
    "Wu; x [..., K] -> [..., I]. fp32 products and SwiGLU, rounded once.";

}  // namespace

GK_BINDING(26, gemm) {
  if (nb::hasattr(m, "matmul")) nb::delattr(m, "matmul");
  m.def("matmul", [](nb::handle a, nb::handle b, nb::handle out_dtype, nb::handle allow_tf32, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    MatmulOptions o;
    o.out_dtype = to_dtype_opt(out_dtype, "out_dtype");
    o.allow_tf32 = opt_bool(allow_tf32, "allow_tf32");
    auto [x, y] = two_arrays(a, b, "a", "b");
    return matmul(x, y, o, sp);
  }, nb::arg("a"), nb::arg("b"), nb::arg("out_dtype") = nb::none(), nb::arg("allow_tf32") = nb::none(),
     nb::arg("stream") = nb::none(), kMatmulDoc);

  m.def("linear", [](nb::handle x, nb::handle w, nb::handle bias, nb::handle activation, nb::handle residual,
                     nb::handle out_dtype, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    auto [xa, wa] = two_arrays(x, w, "x", "w");
    Array ba, ra;
    if (!bias.is_none()) ba = to_array(bias, "bias", &xa);
    if (!residual.is_none()) ra = to_array(residual, "residual", &xa);
    return linear(xa, wa, bias.is_none() ? nullptr : &ba, to_activation(activation),
                  residual.is_none() ? nullptr : &ra, to_dtype_opt(out_dtype, "out_dtype"), sp);
  }, nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::arg("activation") = nb::none(),
     nb::arg("residual") = nb::none(), nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     kLinearDoc);

  m.def("gate_up_swiglu", [](nb::handle x, nb::handle w, nb::handle out_dtype, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    auto [xa, wa] = two_arrays(x, w, "x", "w_gate_up");
    return gate_up_swiglu(xa, wa, to_dtype_opt(out_dtype, "out_dtype"), sp);
  }, nb::arg("x"), nb::arg("w_gate_up"), nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     kSwigluDoc);

  // gemv and the quantized weights: python/src/quant.cpp

  m.def("int8_linear", [](nb::handle x, nb::handle w, nb::handle x_scale, nb::handle w_scale, nb::handle bias,
                          nb::handle out_dtype, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    auto [xa, wa] = two_arrays(x, w, "x", "w");
    Array xs, ws, b;
    if (!x_scale.is_none()) xs = to_array(x_scale, "x_scale", &xa);
    if (!w_scale.is_none()) ws = to_array(w_scale, "w_scale", &xa);
    if (!bias.is_none()) b = to_array(bias, "bias", &xa);
    return int8_linear(xa, wa, xs.defined() ? &xs : nullptr, ws.defined() ? &ws : nullptr,
                       b.defined() ? &b : nullptr, to_dtype_opt(out_dtype, "out_dtype"), sp);
  }, nb::arg("x"), nb::arg("w"), nb::arg("x_scale") = nb::none(), nb::arg("w_scale") = nb::none(),
     nb::arg("bias") = nb::none(), nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     "int8_linear(x, w, x_scale=None, w_scale=None, bias=None, out_dtype=None, stream=None)\n\n"
     "W8A8: int8 x [..., K] @ int8 w [N, K].T with exact int32 accumulation (K <= 131071). Without\n"
     "scales: the int32 products. With x_scale (per row of x, or one) and w_scale (per output\n"
     "channel, or one): acc * x_scale * w_scale (+ bias) in fp32, rounded once (default float32).");

  m.def("fp8_linear", [](nb::handle x, nb::handle w, nb::handle x_scale, nb::handle w_scale, nb::handle bias,
                         nb::handle out_dtype, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    auto [xa, wa] = two_arrays(x, w, "x", "w");
    if (x_scale.is_none() || w_scale.is_none()) throw ValueError("x_scale, w_scale: fp8_linear needs both scales");
    Array xs = to_array(x_scale, "x_scale", &xa), ws = to_array(w_scale, "w_scale", &xa), b;
    if (!bias.is_none()) b = to_array(bias, "bias", &xa);
    return fp8_linear(xa, wa, xs, ws, b.defined() ? &b : nullptr, to_dtype_opt(out_dtype, "out_dtype"), sp);
  }, nb::arg("x"), nb::arg("w"), nb::arg("x_scale").none(), nb::arg("w_scale").none(), nb::arg("bias") = nb::none(),
     nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     "fp8_linear(x, w, x_scale, w_scale, bias=None, out_dtype=None, stream=None)\n\n"
     "float8_e4m3fn x [..., K] @ w [N, K].T * x_scale * w_scale (+ bias) with per-tensor scales,\n"
     "fp32 accumulation, rounded once (default bfloat16).");

  m.def("fp8_block_linear", [](nb::handle x, nb::handle w, nb::handle x_scale, nb::handle w_scale, nb::handle bias,
                               nb::handle out_dtype, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    auto [xa, wa] = two_arrays(x, w, "x", "w");
    if (x_scale.is_none() || w_scale.is_none()) throw ValueError("x_scale, w_scale: fp8_block_linear needs both scales");
    Array xs = to_array(x_scale, "x_scale", &xa), ws = to_array(w_scale, "w_scale", &xa), b;
    if (!bias.is_none()) b = to_array(bias, "bias", &xa);
    return fp8_block_linear(xa, wa, xs, ws, b.defined() ? &b : nullptr, to_dtype_opt(out_dtype, "out_dtype"), sp);
  }, nb::arg("x"), nb::arg("w"), nb::arg("x_scale").none(), nb::arg("w_scale").none(), nb::arg("bias") = nb::none(),
     nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     "fp8_block_linear(x, w, x_scale, w_scale, bias=None, out_dtype=None, stream=None)\n\n"
     "float8_e4m3fn x [..., K] @ w [N, K].T with block scales: x_scale [..., ceil(K/128)] (one per 1x128\n"
     "block of x), w_scale [ceil(N/128), ceil(K/128)] (one per 128x128 block of w). Each 128-wide block\n"
     "of K is summed in fp32, multiplied by its two scales and added in fp32 (+ bias), rounded once\n"
     "(default bfloat16). cuBLASLt's block-scaled FP8 on CUDA when it takes the shape.");
  m.def("quantize_fp8_blocks", [](const Array& a, int64_t block_rows, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    auto [q, s] = quantize_fp8_blocks(a, block_rows, sp);
    return nb::make_tuple(q, s);
  }, nb::arg("a"), nb::arg("block_rows") = 1, nb::arg("stream") = nb::none(),
     "quantize_fp8_blocks(a, block_rows=1, stream=None) -> (q, scales)\n\n"
     "e4m3 block quantization for fp8_block_linear. block_rows=1: 1x128 blocks of an activation\n"
     "a [..., K] -> scales [..., ceil(K/128)]; block_rows=128: 128x128 blocks of a weight [N, K] ->\n"
     "scales [ceil(N/128), ceil(K/128)]. s = amax/448 per block (1 if all zero), q = e4m3(a/s), RNE.");

  m.def("set_matmul_precision", [](const std::string& p) {
    if (p == "highest" || p == "fp32" || p == "float32") return set_matmul_precision(MatmulPrecision::highest);
    if (p == "tf32") return set_matmul_precision(MatmulPrecision::tf32);
    throw ValueError(cat("precision: expected \"highest\" or \"tf32\", got \"", p, "\""));
  }, nb::arg("precision"),
        "Process-wide float32 matmul precision: 'highest' (true FP32, the default) or 'tf32'.");
  m.def("get_matmul_precision", [] {
    return std::string(matmul_precision() == MatmulPrecision::tf32 ? "tf32" : "highest");
  });

  m.def("_cublaslt_info", [] {
    blas::Info i = blas::cublaslt_info();
    nb::dict d;
    d["available"] = i.available;
    d["path"] = i.path;
    d["reason"] = i.reason;
    d["version"] = i.version;
    d["lt_calls"] = i.lt_calls;
    d["fallback_calls"] = i.fallback_calls;
    d["plans"] = i.plans;
    d["no_algo"] = i.no_algo;
    return d;
  });
  m.def("_cublaslt_add_search_paths", [](const std::vector<std::string>& p) { blas::cublaslt_add_search_paths(p); },
        nb::arg("paths"));
}

}  // namespace gkpy
