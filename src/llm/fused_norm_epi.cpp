// EngineOptions::fused_norm_epilogue (src/llm/fused_norm_epi.h): the quantized decode GEMV with
// the residual add + RMSNorm in its epilogue.
#include "llm/fused_norm_epi.h"

#include <cmath>
#include <tuple>

#include "gpukit/errors.h"
#include "llm/fused.h"
#include "llm/fused_checks.h"
#include "ops/common.h"
#include "ops/quant_norm_epi.h"

namespace gk::llm::fused {

using namespace checks;

bool quantized_add_norm_fusable(const Array& x, const QuantizedWeight& qw, const Array& residual, const Array& w,
                                const Array& counters, int64_t slot) {
  if (!x.defined() || !residual.defined() || !w.defined() || !counters.defined() || !qw.q.defined()) return false;
  const Device d = x.device();
  if (!d.is_cuda() || residual.device() != d || w.device() != d || counters.device() != d || qw.q.device() != d)
    return false;
  if (qw.format != "fp8" && qw.format != "int8" && qw.format != "int4") return false;
  const DType t = x.dtype();
  if ((t != DType::bf16 && t != DType::f16) || residual.dtype() != t || w.dtype() != t) return false;
  if (x.ndim() != 2 || x.shape(0) < 1 || x.shape(0) > 8 || qw.q.ndim() != 2) return false;
  const int64_t M = x.shape(0), N = qw.q.shape(0);
  if (N < 8 || N % 8 != 0 || residual.ndim() != 2 || residual.shape(0) != M || residual.shape(1) != N) return false;
  if (w.ndim() != 1 || w.shape(0) != N || w.stride(0) != 1 || !al16(w.data())) return false;
  if (residual.stride(1) != 1 || !al16(residual.data()) || (M > 1 && residual.stride(0) % 8 != 0)) return false;
  if (counters.dtype() != DType::i32 || !counters.is_contiguous() || slot < 0 || slot >= counters.numel())
    return false;
  return true;
}

std::pair<Array, Array> quantized_add_norm(const Array& x, const QuantizedWeight& qw, const Array& residual,
                                           const Array& w, double eps, const Array& counters, int64_t slot,
                                           const Stream* sp) {
  if (!quantized_add_norm_fusable(x, qw, residual, w, counters, slot)) {
    Array y = gemv_quantized(x, qw, x.dtype(), sp);
    return add_rms_norm(y, residual, w, eps, sp);
  }
  if (!(eps >= 0) || !std::isfinite(eps)) throw ValueError("eps: must be finite and >= 0");
  const Device d = x.device();
  Stream s = resolve_stream(sp, d);
  const int64_t M = x.shape(0), N = qw.q.shape(0);
  Array out = Array::empty({M, N}, x.dtype(), d, &s);
  Array ro = Array::empty({M, N}, x.dtype(), d, &s);
  NormEpi e;
  e.counter = counters.data_as<int32_t>() + slot;
  e.res = residual.data();
  e.res_rs = M == 1 ? N : residual.stride(0);
  e.w = w.data();
  e.out = out.data();
  e.res_out = ro.data();
  e.eps = float(eps);
  e.nt = norm_epi_threads(N);
  for (const Array* a : {&residual, &w, &counters}) detail::mark_used(*a, s);
  gemv_quantized_norm_epi(x, qw, e, &s);
  return {out, ro};
}

}  // namespace gk::llm::fused
