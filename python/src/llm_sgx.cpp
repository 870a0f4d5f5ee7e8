// Binding of EngineOptions::fused_swiglu_x's op (src/llm/fused_sgx.h) for its tests and benchmarks:
// gpukit._C.llm.fused_swiglu_gemv / swiglu_x_applies / _swiglu_x_calls.
#include <nanobind/stl/string.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "llm/fused_sgx.h"

namespace gkpy {
using namespace gk;

namespace {
QuantizedWeight qw_from(const std::string& format, const Array& q, const Array& scales, std::optional<Array> zeros,
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

GK_BINDING(62, llm_sgx) {
  nb::module_ lm = nb::borrow<nb::module_>(m.attr("llm"));
  lm.def("fused_swiglu_gemv", [](const Array& gu, const std::string& format, const Array& q, const Array& scales,
                                 std::optional<Array> zeros, int64_t group, nb::handle out_dtype) {
    return llm::fused::swiglu_gemv_quantized(gu, qw_from(format, q, scales, zeros, group),
                                             to_dtype_opt(out_dtype, "out_dtype"));
  }, nb::arg("gu"), nb::arg("format"), nb::arg("q"), nb::arg("scales"), nb::arg("zeros") = nb::none(),
     nb::arg("group") = 128, nb::arg("out_dtype") = nb::none(),
     "gemv_quantized(fused_swiglu(gu), w) for gu [M, 2 I] or [2 I] (gate then up) and a fp8 / int8 / int4 weight "
     "[N, I] (EngineOptions::fused_swiglu_x): where swiglu_x_applies, one launch whose GEMV makes x itself (the "
     "same bits); elsewhere the SwiGLU kernel, then the GEMV.");
  lm.def("swiglu_x_applies", [](const Array& gu, const std::string& format, const Array& q, const Array& scales,
                                std::optional<Array> zeros, int64_t group) {
    return llm::fused::swiglu_x_applies(gu, qw_from(format, q, scales, zeros, group));
  }, nb::arg("gu"), nb::arg("format"), nb::arg("q"), nb::arg("scales"), nb::arg("zeros") = nb::none(),
     nb::arg("group") = 128, "Whether fused_swiglu_gemv takes the fused kernel for these arguments.");
  lm.def("_swiglu_x_calls", &llm::fused::swiglu_x_calls,
         "How many fused_swiglu_gemv calls (the engine's included) took the fused kernel so far.");
}

}  // namespace gkpy
