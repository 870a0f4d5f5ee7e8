// EngineOptions::fused_swiglu_x's front end (llm/fused_sgx.h): the checks that choose the fused
// kernel (src/cuda/gemv_w8.cu XM 3, src/cuda/gemv_w4_staged.cu MODE 15) and its launch; elsewhere
// the engine's SwiGLU followed by gemv_quantized, the same bits.
#include "llm/fused_sgx.h"

#include <atomic>

#include "gpukit/errors.h"
#include "llm/fused.h"
#include "ops/common.h"
#include "ops/gemv_args.h"
#include "ops/gemv_swiglu_x.h"
#include "ops/quant_args.h"

namespace gk::llm::fused {

namespace {

std::atomic<int64_t> g_calls{0};

#if GPUKIT_WITH_CUDA
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
#endif

// The fused launch's arguments (y, part left for the caller) where the fused kernel takes (gu, qw).
bool fused_args(const Array& gu, const QuantizedWeight& qw, QGemvArgs& a) {
#if GPUKIT_WITH_CUDA
  QFormat f;
  if (qw.format == "fp8") f = QFormat::fp8;
  else if (qw.format == "int8") f = QFormat::int8;
  else if (qw.format == "int4") f = QFormat::int4;
  else return false;
  const Array& q = qw.q;
  const DType qt = f == QFormat::fp8 ? DType::f8e4m3 : (f == QFormat::int8 ? DType::i8 : DType::u8);
  if (!q.defined() || q.ndim() != 2 || q.dtype() != qt || !q.device().is_cuda() || q.stride(1) != 1) return false;
  const int64_t n = q.shape(0), k = f == QFormat::int4 ? 2 * q.shape(1) : q.shape(1);
  if (n <= 0 || k <= 0 || !aligned16(q.data()) || q.stride(0) % 16 != 0) return false;
  const Array& s = qw.scales;
  if (!s.defined() || s.dtype() != DType::f32 || s.device() != q.device() || !s.is_contiguous()) return false;
  if (f == QFormat::int4) {
    const Shape gs{n, k / 128};
    const Array& z = qw.zeros;
    if (qw.group != 128 || k % 128 != 0 || s.shape() != gs || !z.defined() || z.dtype() != DType::u8 ||
        z.device() != q.device() || !z.is_contiguous() || z.shape() != gs)
      return false;
  } else if (s.shape() != Shape{n}) {
    return false;
  }
  // gu: one bf16 row of 2 K, dense, 16-byte aligned, on the weights' device
  if (gu.dtype() != DType::bf16 || gu.device() != q.device() || (gu.ndim() != 1 && gu.ndim() != 2)) return false;
  if ((gu.ndim() == 2 && gu.shape(0) != 1) || gu.shape(-1) != 2 * k || gu.stride(-1) != 1 || !aligned16(gu.data()))
    return false;
  a = QGemvArgs();
  a.x = gu.data();
  a.x_rs = 2 * k;
  a.q = q.data();
  a.scales = s.data_as<float>();
  a.zeros = f == QFormat::int4 ? qw.zeros.data_as<uint8_t>() : nullptr;
  a.m = 1;
  a.n = n;
  a.k = k;
  a.q_rs = q.stride(0);  // bytes: one byte per element
  a.group = qw.group;
  a.x_dtype = DType::bf16;
  a.fmt = f;
  a.variant = gemv_variant();
  if (f == QFormat::int4) {
    a.split = cuda::qgemv_split(n, k, f, false);
    return cuda::gemv_w4_swiglu_x_applies(a);
  }
  // fp8 / int8: where gemv_quantized takes the staged kernel (src/ops/quant.cpp)
  if (k % 64 != 0 || gemv_dense_path() == 1 || !gemv_w8_quant_enabled(n, k)) return false;
  a.w8 = true;
  a.split = cuda::gemv_w8_split(n, k, 1);
  a.w8_full = gemv_w8_full_ring();
  return cuda::gemv_w8_swiglu_x_applies(1, n, k, f, a.w8_full);
#else
  (void)gu, (void)qw, (void)a;
  return false;
#endif
}

}  // namespace

bool swiglu_x_applies(const Array& gu, const QuantizedWeight& qw) {
  QGemvArgs a;
  return gu.defined() && fused_args(gu, qw, a);
}

Array swiglu_gemv_quantized(const Array& gu, const QuantizedWeight& qw, std::optional<DType> out_dtype,
                            const Stream* sp) {
  if (!gu.defined()) throw ValueError("gu: undefined array");
  if (out_dtype && *out_dtype != DType::f32 && *out_dtype != DType::f16 && *out_dtype != DType::bf16)
    throw TypeError(cat("out_dtype: gemv produces float32, float16 or bfloat16, not ", dtype_name(*out_dtype)));
  QGemvArgs a;
  if (!fused_args(gu, qw, a)) {  // the engine's SwiGLU, then the GEMV (its checks and errors)
    if (gu.ndim() != 1 && gu.ndim() != 2)
      throw ValueError(cat("gu: [M, 2 I] or [2 I] expected, got shape ", shape_str(gu.shape())));
    const bool one = gu.ndim() == 1;
    Array act = swiglu(one ? gu.unsqueeze(0) : gu, sp);
    Array y = gemv_quantized(act, qw, out_dtype, sp);
    return one ? y.reshape({y.shape(1)}) : y;
  }
#if GPUKIT_WITH_CUDA
  const Device d = gu.device();
  Stream s = resolve_stream(sp, d);
  const DType out = out_dtype.value_or(DType::bf16);
  a.out_dtype = out;
  Array y = Array::empty({1, a.n}, out, d, &s);
  Array part;
  if (a.split > 1) {
    part = Array::empty({int64_t(a.split), 1, a.n}, DType::f32, d, &s);
    a.part = part.data_as<float>();
  }
  a.y = y.data();
  const Array* used[] = {&gu, &qw.q, &qw.scales, &qw.zeros};
  for (const Array* t : used)
    if (t->defined()) detail::mark_used(*t, s);
  if (a.fmt == QFormat::int4) cuda::gemv_w4_swiglu_x(a, s.handle());
  else cuda::gemv_w8_quant_swiglu_x(a, s.handle());
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return gu.ndim() == 1 ? y.reshape({a.n}) : y;
#else
  detail::no_cuda_backend();
#endif
}

int64_t swiglu_x_calls() { return g_calls.load(std::memory_order_relaxed); }

}  // namespace gk::llm::fused
