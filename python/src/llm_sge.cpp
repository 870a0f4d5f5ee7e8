// Binding of EngineOptions::quantized_swiglu_epi's op (src/llm/fused_sge.h) for its tests and benchmarks:
// gpukit._C.llm.gemv_quantized_swiglu / swiglu_gemv_epi_applies / _swiglu_epi_calls.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "llm/fused_sge.h"

namespace gkpy {
using namespace gk;

namespace {
QuantizedWeight sge_qw(const std::string& format, const Array& q, const Array& scales, std::optional<Array> zeros,
                       int64_t group) {
  if (format != "fp8" && format != "int8" && format != "int4")
    throw ValueError(cat("format: fp8, int8 or int4, got '", format, "'"));
  QuantizedWeight qw;
  qw.format = format;
  qw.q = q;
  qw.scales = scales;
  if (zeros) qw.zeros = *zeros;
  qw.group = format == "int4" ? group : 0;
  return qw;
}
}  // namespace

GK_BINDING(62, llm_sge) {
  nb::module_ lm = nb::borrow<nb::module_>(m.attr("llm"));
  lm.def("gemv_quantized_swiglu", [](const Array& x, const std::string& format, const Array& q, const Array& scales,
                                     std::optional<Array> zeros, int64_t group, nb::handle out_dtype,
                                     std::optional<Array> xh, std::optional<Array> xinv) {
    if (xh.has_value() != xinv.has_value()) throw ValueError("xh, xinv: both or neither");
    return llm::fused::gemv_quantized_swiglu(x, sge_qw(format, q, scales, zeros, group),
                                             to_dtype_opt(out_dtype, "out_dtype"), xh ? &*xh : nullptr,
                                             xinv ? &*xinv : nullptr);
  }, nb::arg("x"), nb::arg("format"), nb::arg("q"), nb::arg("scales"), nb::arg("zeros") = nb::none(),
     nb::arg("group") = 128, nb::arg("out_dtype") = nb::none(), nb::arg("xh") = nb::none(), nb::arg("xinv") = nb::none(),
     "SwiGLU of gemv_quantized(x, w) for w = [gate; up] (2 I rows; fp8 / int8 / int4): [M, I] (EngineOptions::"
     "quantized_swiglu_epi). With xh / xinv: gemv_quantized_prepared's scaled fp16 x. Where swiglu_gemv_epi_applies, "
     "one launch whose epilogue applies the SwiGLU (the same bits); elsewhere the GEMV, then the SwiGLU kernel.");
  lm.def("swiglu_gemv_epi_applies", [](const Array& x, const std::string& format, const Array& q, const Array& scales,
                                       std::optional<Array> zeros, int64_t group, std::optional<Array> xh,
                                       std::optional<Array> xinv) {
    return llm::fused::swiglu_gemv_epi_applies(x, sge_qw(format, q, scales, zeros, group), xh ? &*xh : nullptr,
                                               xinv ? &*xinv : nullptr);
  }, nb::arg("x"), nb::arg("format"), nb::arg("q"), nb::arg("scales"), nb::arg("zeros") = nb::none(),
     nb::arg("group") = 128, nb::arg("xh") = nb::none(), nb::arg("xinv") = nb::none(),
     "Whether gemv_quantized_swiglu takes the fused kernel for these arguments.");
  lm.def("_swiglu_epi_calls", &llm::fused::swiglu_epi_calls,
         "How many gemv_quantized_swiglu calls (the engine's included) took the fused kernel so far.");
}

}  // namespace gkpy
