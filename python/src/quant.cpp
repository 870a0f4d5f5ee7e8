// Decode GEMV and quantized weights: gk.gemv, gk.quantize_<fmt>, gk.dequantize_<fmt>,
// gk.gemv_<fmt> for fp8, int8, int4, nvf4 and the GGUF blocks q8_0, q4_0, q4_1, q4_k,
// q6_k (formats and rounding rules: include/gpukit/quant.h, src/cpu/quant*.cpp).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>

#include <deque>
#include <string>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/gemm.h"
#include "gpukit/quant.h"
#include "ops/gemv_args.h"

namespace gkpy {
using namespace gk;

namespace {

QuantizedWeight qw_of(const char* f, nb::handle q, nb::handle scales, nb::handle zeros, int64_t group,
                      nb::handle tensor_scale = nb::none()) {
  QuantizedWeight w;
  w.format = f;
  if (q.is_none()) throw ValueError("q: missing");
  if (scales.is_none()) throw ValueError(cat("scales: missing (", f, " needs scales)"));
  w.q = to_array(q, "q");
  w.scales = to_array(scales, "scales", &w.q);
  if (!zeros.is_none()) w.zeros = to_array(zeros, "zeros", &w.q);
  if (!tensor_scale.is_none()) w.tensor_scale = to_array(tensor_scale, "tensor_scale", &w.q);
  w.group = group;
  return w;
}

QuantizedWeight gguf_of(const char* f, nb::handle q) {
  if (q.is_none()) throw ValueError("q: missing");
  QuantizedWeight w;
  w.format = f;
  w.q = to_array(q, "q");
  return w;
}

Array run(const QuantizedWeight& w, nb::handle x, nb::handle out_dtype, nb::handle stream) {
  Stream st;
  const Stream* sp = to_stream(stream, st);
  Array xa = to_array(x, "x", &w.q);
  return gemv_quantized(xa, w, to_dtype_opt(out_dtype, "out_dtype"), sp);
}

}  // namespace

GK_BINDING(27, quant) {
  m.def("gemv", [](nb::handle x, nb::handle w, nb::handle out_dtype, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    Array xa, wa;
    if (nb::isinstance<Array>(x) && !nb::isinstance<Array>(w)) {
      xa = nb::cast<Array>(x);
      wa = to_array(w, "w", &xa);
    } else {
      wa = to_array(w, "w");
      xa = to_array(x, "x", &wa);
    }
    return gemv(xa, wa, to_dtype_opt(out_dtype, "out_dtype"), sp);
  }, nb::arg("x"), nb::arg("w"), nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     "gemv(x, w, out_dtype=None, stream=None)\n\n"
     "Decode GEMV x @ w.T for x [M, K] (M = 1..8) or [K] and bfloat16/float16 w [N, K]; x is\n"
     "converted to w's dtype, fp32 accumulation, rounded once (out_dtype: w's dtype or float32).\n"
     "More than 8 rows run as linear(). Deterministic (no atomics; fixed split-K order).");

  m.def("_gemv_set_dense_path", &gemv_set_dense_path, nb::arg("path"),
        "Benchmarking switch for bf16/fp16/fp8/int8: -1 default (the staged tensor-core kernel where it applies), "
        "0 CUDA-core, 1 per-lane tensor-core, 2 staged tensor-core kernel.");
  m.def("_gemv_dense_path", &gemv_dense_path);
  m.def("_gemv_set_variant", &gemv_set_variant, nb::arg("variant"),
        "Benchmarking switch of the GEMV kernels: 0 default (PDL), 1 a 2-stage ring (int4, GGUF: the older kernels), "
        "2 no PDL.");

  m.def("_gemv_w8_set_full_ring", &gemv_w8_set_full_ring, nb::arg("mask"),
        "The fp8 / int8 staged GEMV's full ring for this thread's launches (EngineOptions::quantized_full_ring): "
        "mask 0..3, bit 1 N > K, bit 2 N <= K (the same bits).");
  m.def("_gemv_w8_full_ring", &gemv_w8_full_ring);
  m.def("_gemv_quantized_prepared_calls", &gemv_quantized_prepared_calls);
  m.def("_gemv_quantized_prepared",
        [](const char* fmt, nb::handle q, nb::handle s, const Array& x, nb::handle xh, nb::handle xinv,
           nb::handle o) {
          const std::string f = fmt;
          if (f != "fp8" && f != "int8") throw ValueError(cat("fmt: fp8 or int8, got '", f, "'"));
          QuantizedWeight w = qw_of(f == "fp8" ? "fp8" : "int8", q, s, nb::none(), 0);
          Array xa = xh.is_none() ? Array() : nb::cast<Array>(xh);
          Array ia = xinv.is_none() ? Array() : nb::cast<Array>(xinv);
          return gemv_quantized_prepared(x, xa, ia, w, to_dtype_opt(o, "out_dtype"));
        },
        nb::arg("fmt"), nb::arg("q"), nb::arg("scales"), nb::arg("x"), nb::arg("xh").none(), nb::arg("xinv").none(),
        nb::arg("out_dtype") = nb::none(),
        "gemv_quantized_prepared (EngineOptions::quantized_x_prep): fp8 / int8 weights, bf16 x [M, K] and its "
        "scaled fp16 copy xh with xinv = 2^-c per row (llm.fused_add_rms_norm_prep); elsewhere gemv_quantized(x).");
  m.def("_gemv_int4_swiglu",
        [](const Array& x, nb::handle q, nb::handle s, nb::handle z, int64_t group, nb::handle o) -> nb::object {
          Array y = gemv_quantized_swiglu(x, qw_of("int4", q, s, z, group), to_dtype_opt(o, "out_dtype"));
          return y.defined() ? nb::cast(y) : nb::none();
        },
        nb::arg("x"), nb::arg("q"), nb::arg("scales"), nb::arg("zeros"), nb::arg("group") = 128,
        nb::arg("out_dtype") = nb::none(),
        "gemv_quantized_swiglu (EngineOptions::quantized_swiglu): silu(x g^T) * (x u^T) for int4 weights q = [gate; "
        "up] (2 I rows) in one launch, g and u rounded to out_dtype first; None where that kernel does not run.");
  m.def("_gemv_w8_stamps", &gemv_w8_stamps, nb::arg("on"),
        "Diagnostic (session 11): per-CTA %globaltimer stamps of the staged fp8 / int8 GEMV's default kinds for the "
        "launches that follow (on: the buffer cleared), or off.");
  m.def("_gemv_w8_stamps_read",
        []() {
          std::vector<uint64_t> st;
          const std::vector<int64_t> meta = gemv_w8_stamps_read(st);
          nb::list ml;
          for (size_t i = 0; i + 6 <= meta.size(); i += 6)
            ml.append(nb::make_tuple(meta[i], meta[i + 1], meta[i + 2], meta[i + 3], meta[i + 4], meta[i + 5]));
          return nb::make_tuple(ml, nb::bytes(reinterpret_cast<const char*>(st.data()), st.size() * sizeof(uint64_t)));
        },
        "(slots: (seq, n, k, ctas, split, warps) each, seq -1 unused; bytes of uint64 [512][2048][8] stamps: entry, "
        "copies issued, PDL wait returned, first stage landed, loop left, sums added, stored (ns), SM id).");
  m.def("_gemv_w8_full_ring_depth", &gemv_w8_full_ring_depth, nb::arg("n"), nb::arg("k"), nb::arg("mask"),
        "The full ring's depth for fp8 weights [n, k] with bf16 x on the current device (0: not taken).");

  // ---- per-channel / group formats ----
  m.def("quantize_fp8", [](const Array& w) {
    auto q = quantize_weight(w, "fp8");
    return nb::make_tuple(q.q, q.scales);
  }, nb::arg("w"), "(q float8_e4m3fn [N, K], scales float32 [N]): w ~ q * scales[:, None]; s = max|row| / 448.");
  m.def("quantize_int8", [](const Array& w) {
    auto q = quantize_weight(w, "int8");
    return nb::make_tuple(q.q, q.scales);
  }, nb::arg("w"), "(q int8 [N, K], scales float32 [N]): w ~ q * scales[:, None]; s = max|row| / 127, q in -127..127.");
  m.def("quantize_int4", [](const Array& w, int64_t group) {
    auto q = quantize_weight(w, "int4", group);
    return nb::make_tuple(q.q, q.scales, q.zeros);
  }, nb::arg("w"), nb::arg("group") = 128,
     "(q uint8 [N, K/2] (even k in the low nibble), scales float32 [N, K/group], zeros uint8 [N, K/group]):\n"
     "w ~ (q - zero) * scale per group of 32, 64 or 128 weights; asymmetric, zero representable.");
  m.def("quantize_nvf4", [](const Array& w) {
    auto q = quantize_weight(w, "nvf4");
    return nb::make_tuple(q.q, q.scales, q.tensor_scale);
  }, nb::arg("w"),
     "(q uint8 [N, K/2] e2m1 codes (even k in the low nibble), block_scales float8_e4m3fn [N, K/16],\n"
     "tensor_scale float32 [1]): w ~ e2m1(q) * block_scale * tensor_scale (NVF4, emulated on Hopper).");
  m.def("dequantize_fp8", [](nb::handle q, nb::handle s) { return dequantize_weight(qw_of("fp8", q, s, nb::none(), 0)); },
        nb::arg("q"), nb::arg("scales").none(), "Exact float32 values of an fp8 weight.");
  m.def("dequantize_int8", [](nb::handle q, nb::handle s) { return dequantize_weight(qw_of("int8", q, s, nb::none(), 0)); },
        nb::arg("q"), nb::arg("scales").none(), "Exact float32 values of an int8 weight.");
  m.def("dequantize_int4", [](nb::handle q, nb::handle s, nb::handle z, int64_t group) {
    return dequantize_weight(qw_of("int4", q, s, z, group));
  }, nb::arg("q"), nb::arg("scales").none(), nb::arg("zeros").none(), nb::arg("group") = 128,
     "Exact float32 values of an int4 weight.");
  m.def("dequantize_nvf4", [](nb::handle q, nb::handle s, nb::handle ts) {
    return dequantize_weight(qw_of("nvf4", q, s, nb::none(), 0, ts));
  }, nb::arg("q"), nb::arg("block_scales").none(), nb::arg("tensor_scale").none(),
     "Exact float32 values of an NVF4 weight: (e2m1(q) * block_scale) * tensor_scale.");
  m.def("gemv_fp8", [](nb::handle x, nb::handle q, nb::handle s, nb::handle o, nb::handle st) {
    return run(qw_of("fp8", q, s, nb::none(), 0), x, o, st);
  }, nb::arg("x"), nb::arg("q"), nb::arg("scales").none(), nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     "x @ dequantize_fp8(q, scales).T for x [M <= 8, K] or [K] (bf16/fp16; float32 x is rounded to bf16).");
  m.def("gemv_int8", [](nb::handle x, nb::handle q, nb::handle s, nb::handle o, nb::handle st) {
    return run(qw_of("int8", q, s, nb::none(), 0), x, o, st);
  }, nb::arg("x"), nb::arg("q"), nb::arg("scales").none(), nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     "x @ dequantize_int8(q, scales).T for x [M <= 8, K] or [K].");
  m.def("gemv_int4", [](nb::handle x, nb::handle q, nb::handle s, nb::handle z, int64_t group, nb::handle o,
                        nb::handle st) { return run(qw_of("int4", q, s, z, group), x, o, st); },
        nb::arg("x"), nb::arg("q"), nb::arg("scales").none(), nb::arg("zeros").none(), nb::arg("group") = 128,
        nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
        "x @ dequantize_int4(q, scales, zeros, group).T for x [M <= 8, K] or [K].");
  m.def("gemv_nvf4", [](nb::handle x, nb::handle q, nb::handle s, nb::handle ts, nb::handle o, nb::handle st) {
    return run(qw_of("nvf4", q, s, nb::none(), 0, ts), x, o, st);
  }, nb::arg("x"), nb::arg("q"), nb::arg("block_scales").none(), nb::arg("tensor_scale").none(),
     nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     "x @ dequantize_nvf4(q, block_scales, tensor_scale).T for x [M <= 8, K] or [K].");

  // ---- GGUF blocks, read directly ----
  static const char* const kGguf[][2] = {{"q8_0", "32 * 34"}, {"q4_0", "32 * 18"}, {"q4_1", "32 * 20"},
                                         {"q4_k", "256 * 144"}, {"q6_k", "256 * 210"}};
  static std::deque<std::string> names;  // nanobind keeps the name and doc pointers
  auto keep = [](std::string v) { return names.emplace_back(std::move(v)).c_str(); };
  for (auto& fb : kGguf) {
    const char* f = fb[0];
    std::string blocks = cat("uint8 [N, K/", fb[1], "]");
    m.def(keep(cat("quantize_", f)), [f](const Array& w) { return quantize_weight(w, f).q; }, nb::arg("w"),
          keep(cat("GGUF ", f, " blocks ", blocks, " of float weights w [N, K] (rules: src/cpu/quant_gguf.cpp).")));
    m.def(keep(cat("dequantize_", f)), [f](nb::handle q) { return dequantize_weight(gguf_of(f, q)); }, nb::arg("q"),
          keep(cat("Exact float32 values [N, K] of GGUF ", f, " blocks ", blocks, ".")));
    m.def(keep(cat("gemv_", f)), [f](nb::handle x, nb::handle q, nb::handle o, nb::handle st) {
      return run(gguf_of(f, q), x, o, st);
    }, nb::arg("x"), nb::arg("q"), nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
          keep(cat("x @ dequantize_", f, "(q).T reading the GGUF blocks directly; x [M <= 8, K] or [K].")));
  }
}

}  // namespace gkpy
