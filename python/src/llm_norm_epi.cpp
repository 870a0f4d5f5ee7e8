// Bindings of EngineOptions::fused_norm_epilogue's op (src/llm/fused_norm_epi.h) for its tests:
// gpukit._C.llm.fused_quantized_add_norm / quantized_add_norm_fusable, gpukit._C._gemv_norm_epi_calls.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "llm/fused_norm_epi.h"
#include "ops/norm_epi_args.h"

namespace gkpy {
using namespace gk;

namespace {
QuantizedWeight qw_make(const std::string& fmt, const Array& q, const Array& scales, std::optional<Array> zeros,
                        int64_t group) {
  if (fmt != "fp8" && fmt != "int8" && fmt != "int4")
    throw ValueError(cat("fmt: fp8, int8 or int4 expected, got '", fmt, "'"));
  QuantizedWeight w;
  w.format = fmt;
  w.q = q;
  w.scales = scales;
  if (zeros) w.zeros = *zeros;
  w.group = group;
  return w;
}
}  // namespace

GK_BINDING(62, llm_norm_epi) {
  nb::module_ lm = nb::borrow<nb::module_>(m.attr("llm"));
  lm.def("fused_quantized_add_norm",
         [](const std::string& fmt, const Array& q, const Array& scales, std::optional<Array> zeros, int64_t group,
            const Array& x, const Array& residual, const Array& w, double eps, const Array& counters, int64_t slot) {
           return llm::fused::quantized_add_norm(x, qw_make(fmt, q, scales, zeros, group), residual, w, eps, counters,
                                                 slot);
         },
         nb::arg("fmt"), nb::arg("q"), nb::arg("scales"), nb::arg("zeros").none(), nb::arg("group"), nb::arg("x"),
         nb::arg("residual"), nb::arg("w"), nb::arg("eps"), nb::arg("counters"), nb::arg("slot"),
         "(h, res): gemv_quantized(x, qw) then add_rms_norm(y, residual, w, eps), the norm in the GEMV's last CTA "
         "where it can (EngineOptions::fused_norm_epilogue; counters: int32 device zeros, slot < their size).");
  lm.def("quantized_add_norm_fusable",
         [](const std::string& fmt, const Array& q, const Array& scales, std::optional<Array> zeros, int64_t group,
            const Array& x, const Array& residual, const Array& w, const Array& counters, int64_t slot) {
           return llm::fused::quantized_add_norm_fusable(x, qw_make(fmt, q, scales, zeros, group), residual, w,
                                                         counters, slot);
         },
         nb::arg("fmt"), nb::arg("q"), nb::arg("scales"), nb::arg("zeros").none(), nb::arg("group"), nb::arg("x"),
         nb::arg("residual"), nb::arg("w"), nb::arg("counters"), nb::arg("slot"),
         "Whether fused_quantized_add_norm passes the epilogue to the GEMV launcher.");
  m.def("_gemv_norm_epi_calls", []() { return std::make_pair(norm_epi_calls(true), norm_epi_calls(false)); },
        "(fused, separate): the quantized GEMV norm epilogues run in a GEMV's last CTA / as their own launch.");
}

}  // namespace gkpy
