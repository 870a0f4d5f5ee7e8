// The quantized decode GEMV with the residual add + RMSNorm epilogue (ops/norm_epi_args.h,
// common/gemv_norm_epi.cuh): the routing of QGemvArgs with epi.counter set (cuda::qgemv sends
// them here) and the epilogue's own launch for the kernels and configurations that do not
// take it (the same bits).
#include "common/gemv_norm_epi.cuh"
#include "common/gemv.cuh"
#include "common/gemv_w4_launch.cuh"
#include "cuda/gemv_norm_epi.h"
#include "core/cuda_util.h"
#include "ops/gemv_args.h"
#include "ops/quant_args.h"

namespace gk::cuda {

namespace {
template <class T>
__global__ void __launch_bounds__(256) k_norm_epi(const NormEpi e, const T* y, int64_t m, int64_t n) {
  __shared__ float scratch[norm_epi::kScratchFloats];
  gemv_detail::pdl_trigger();
  gemv_detail::pdl_wait();
  norm_epi::rows_any<T>(e, y, m, n, scratch);
}
}  // namespace

void norm_epi_launch(const NormEpi& e, DType out, const void* y, int64_t m, int64_t n, cudaStream_t st) {
  if (m <= 0 || n <= 0) return;
  if (e.nt < 32 || e.nt > 256 || e.nt % 32 != 0) throw ValueError("gemv norm epilogue: bad block size");
  norm_epi_count(false);
  if (out == DType::bf16)
    gemv_detail::launch_ex(k_norm_epi<bf16>, dim3(1), e.nt, 0, st, true, e, static_cast<const bf16*>(y), m, n);
  else if (out == DType::f16)
    gemv_detail::launch_ex(k_norm_epi<f16>, dim3(1), e.nt, 0, st, true, e, static_cast<const f16*>(y), m, n);
  else
    throw TypeError("gemv norm epilogue: bfloat16 or float16 output expected");
  GK_LAUNCH_CHECK("gemv_norm_epi");
}

// qgemv then the epilogue: the fp8 / int8 staged kernel and the int4 staged kernel take it themselves (in
// their last CTA where their configuration has it, else as a launch after them); every other kernel runs
// as usual, then the epilogue's own launch.
void qgemv_norm_epi(const QGemvArgs& a, const NormEpi& e, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  if (a.m <= 0 || a.n <= 0) return;
  if (a.out_dtype != DType::bf16 && a.out_dtype != DType::f16)
    throw TypeError("gemv norm epilogue: bfloat16 or float16 output expected");
  if (a.w8) return gemv_w8_quant_epi(a, e, stream);  // src/cuda/gemv_w8.cu
  if (a.fmt == QFormat::int4 && a.variant != 1 && a.variant != 3 && w4_staged_applies(a)) {
    if (a.x_dtype == DType::bf16) return launch_w4_staged_epi<bf16>(a, e, st);
    if (a.x_dtype == DType::f16) return launch_w4_staged_epi<f16>(a, e, st);
  }
  qgemv(a, stream);
  norm_epi_launch(e, a.out_dtype, a.y, a.m, a.n, st);
}

}  // namespace gk::cuda
