// EngineOptions::quantized_swiglu_epi's front end (llm/fused_sge.h): the checks that choose the gate/up GEMV
// with the SwiGLU epilogue (src/cuda/gemv_w8.cu XM 4, src/cuda/gemv_w4_staged.cu MODE 111 / 115) and its
// launch; elsewhere gemv_quantized (or gemv_quantized_prepared) followed by the engine's SwiGLU, the same bits.
#include "llm/fused_sge.h"

#include <atomic>

#include "gpukit/errors.h"
#include "llm/fused.h"
#include "ops/common.h"
#include "ops/gemv_args.h"
#include "ops/gemv_sge.h"
#include "ops/quant_args.h"

namespace gk::llm::fused {

namespace {

std::atomic<int64_t> g_calls{0};

#if GPUKIT_WITH_CUDA
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
#endif

// The fused launch's arguments (y left for the caller), as gemv_quantized would make them, where the fused
// kernel takes (x, qw[, xh, xinv]) with this output type.
bool fused_args(const Array& x, const QuantizedWeight& qw, const Array* xh, const Array* xinv, DType out,
                QGemvArgs& a) {
#if GPUKIT_WITH_CUDA
  QFormat f;
  if (qw.format == "fp8") f = QFormat::fp8;
  else if (qw.format == "int8") f = QFormat::int8;
  else if (qw.format == "int4") f = QFormat::int4;
  else return false;
  if (out != DType::f32 && out != DType::f16 && out != DType::bf16) return false;
  const bool prep = xh != nullptr || xinv != nullptr;
  if (prep && (!xh || !xinv || !xh->defined() || !xinv->defined() || f == QFormat::int4)) return false;
  const Array& q = qw.q;
  const DType qt = f == QFormat::fp8 ? DType::f8e4m3 : (f == QFormat::int8 ? DType::i8 : DType::u8);
  if (!q.defined() || q.ndim() != 2 || q.dtype() != qt || !q.device().is_cuda() || q.stride(1) != 1) return false;
  const int64_t n = q.shape(0), k = f == QFormat::int4 ? 2 * q.shape(1) : q.shape(1);
  if (n <= 0 || k <= 0 || n % 2 != 0 || !aligned16(q.data()) || q.stride(0) % 16 != 0) return false;
  const Array& s = qw.scales;
  if (!s.defined() || s.dtype() != DType::f32 || s.device() != q.device() || !s.is_contiguous()) return false;
  if (f == QFormat::int4) {
    if (qw.group != 128 && qw.group != 64 && qw.group != 32) return false;
    const Shape gs{n, k / qw.group};
    const Array& z = qw.zeros;
    if (k % 128 != 0 || s.shape() != gs || !z.defined() || z.dtype() != DType::u8 || z.device() != q.device() ||
        !z.is_contiguous() || z.shape() != gs)
      return false;
  } else if (s.shape() != Shape{n}) {
    return false;
  }
  // x: bf16 [M, K] or [K], dense rows, 16-byte aligned, on the weights' device
  if (x.dtype() != DType::bf16 || x.device() != q.device() || (x.ndim() != 1 && x.ndim() != 2)) return false;
  const int64_t m = x.ndim() == 1 ? 1 : x.shape(0);
  if (m < 1 || m > 8 || x.shape(-1) != k || !x.is_contiguous() || !aligned16(x.data())) return false;
  a = QGemvArgs();
  a.x = x.data();
  a.x_dtype = DType::bf16;
  if (prep) {  // gemv_quantized_prepared's conditions; the GEMV reads xh (fp16) and xinv
    if (x.ndim() != 2 || xh->dtype() != DType::f16 || xh->shape() != x.shape() || xh->device() != x.device() ||
        !xh->is_contiguous() || !aligned16(xh->data()) || xinv->dtype() != DType::f32 || xinv->ndim() != 1 ||
        xinv->shape(0) != m || xinv->device() != x.device() || !xinv->is_contiguous())
      return false;
    a.x = xh->data();
    a.x_dtype = DType::f16;
    a.xprep_inv = xinv->data_as<float>();
  }
  a.x_rs = k;
  a.q = q.data();
  a.scales = s.data_as<float>();
  a.zeros = f == QFormat::int4 ? qw.zeros.data_as<uint8_t>() : nullptr;
  a.m = m;
  a.n = n;
  a.k = k;
  a.q_rs = q.stride(0);  // bytes: one byte per element
  a.group = qw.group;
  a.out_dtype = out;
  a.fmt = f;
  a.variant = gemv_variant();
  if (f == QFormat::int4) {
    a.split = cuda::qgemv_split(n, k, f, false);
    return cuda::gemv_w4_swiglu_epi_applies(a);
  }
  // fp8 / int8: where gemv_quantized takes the staged kernel (src/ops/quant.cpp)
  if (k % 64 != 0 || gemv_dense_path() == 1 || !gemv_w8_quant_enabled(n, k)) return false;
  a.w8 = true;
  a.split = cuda::gemv_w8_split(n, k, 1);
  a.w8_full = gemv_w8_full_ring();
  return cuda::gemv_w8_swiglu_epi_applies(a);
#else
  (void)x, (void)qw, (void)xh, (void)xinv, (void)out, (void)a;
  return false;
#endif
}

}  // namespace

bool swiglu_gemv_epi_applies(const Array& x, const QuantizedWeight& qw, const Array* xh, const Array* xinv) {
  QGemvArgs a;
  return x.defined() && fused_args(x, qw, xh, xinv, DType::bf16, a);
}

Array gemv_quantized_swiglu(const Array& x, const QuantizedWeight& qw, std::optional<DType> out_dtype,
                            const Array* xh, const Array* xinv, const Stream* sp) {
  if (!x.defined()) throw ValueError("x: undefined array");
  if (out_dtype && *out_dtype != DType::f32 && *out_dtype != DType::f16 && *out_dtype != DType::bf16)
    throw TypeError(cat("out_dtype: gemv produces float32, float16 or bfloat16, not ", dtype_name(*out_dtype)));
  if ((xh == nullptr) != (xinv == nullptr)) throw ValueError("xh, xinv: both or neither");
  QGemvArgs a;
  // bf16 x (the only x the fused kernel takes): gemv_quantized's and gemv_quantized_prepared's default output
  if (!fused_args(x, qw, xh, xinv, out_dtype.value_or(DType::bf16), a)) {
    // the composition: the GEMV (its checks and errors), then the engine's SwiGLU
    Array gu = xh ? gemv_quantized_prepared(x, *xh, *xinv, qw, out_dtype, sp) : gemv_quantized(x, qw, out_dtype, sp);
    const bool one = gu.ndim() == 1;
    if (gu.shape(-1) % 2 != 0)
      throw ValueError(cat("qw: the SwiGLU needs [gate; up] with an even row count, got ", gu.shape(-1)));
    Array act = swiglu(one ? gu.unsqueeze(0) : gu, sp);
    return one ? act.reshape({act.shape(1)}) : act;
  }
#if GPUKIT_WITH_CUDA
  const Device d = x.device();
  Stream s = resolve_stream(sp, d);
  const int64_t I = a.n / 2;
  Array y = Array::empty({a.m, I}, a.out_dtype, d, &s);
  a.y = y.data();
  const Array* used[] = {&x, &qw.q, &qw.scales, &qw.zeros, xh, xinv};
  for (const Array* t : used)
    if (t && t->defined()) detail::mark_used(*t, s);
  if (a.fmt == QFormat::int4) cuda::gemv_w4_swiglu_epi(a, s.handle());
  else cuda::gemv_w8_quant_swiglu_epi(a, s.handle());
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return x.ndim() == 1 ? y.reshape({I}) : y;
#else
  detail::no_cuda_backend();
#endif
}

int64_t swiglu_epi_calls() { return g_calls.load(std::memory_order_relaxed); }

}  // namespace gk::llm::fused
