// Front end of the decode GEMV (see include/gpukit/gemm.h and src/cuda/gemv.cu).
#include <atomic>

#include "gpukit/gemm.h"
#include "ops/common.h"
#include "ops/gemv_args.h"

namespace gk {

namespace {
std::atomic<int> g_dense_path{-1};
// The per-lane tensor-core kernel (gemv_mma.cuh) only on request: on the H200 (session 3,
// checkpoint B) it read bf16 at 69 / 66 / 91% of the copy bandwidth at M = 1. The choice
// between kernels never depends on M.
constexpr bool kDenseMmaDefault = false;
// The staged tensor-core kernel (src/cuda/gemv_w8.cu) for bf16/fp16 weights by default: on
// the H200 (2026-11-30 session 4, checkpoint A) 98 / 95 / 100% of the copy bandwidth at M = 1
// against 93 / 89 / 105% for the CUDA-core kernel, and 94 / 93 / 100% at M = 8 against 35%.
constexpr bool kDenseW8Default = true;
}  // namespace
void gemv_set_dense_path(int path) {
  if (path < -1 || path > 2) throw ValueError(cat("path: expected -1, 0, 1 or 2, got ", path));
  g_dense_path.store(path);
}
int gemv_dense_path() { return g_dense_path.load(); }
namespace {
std::atomic<int> g_variant{0};
}
void gemv_set_variant(int v) {
  if (v < 0 || v > 66) throw ValueError(cat("variant: expected 0..66 (0, 1, 2; 3..66: 4-bit / GGUF kernel variants, see bench/gemv.py), got ", v));
  g_variant.store(v);
}
int gemv_variant() { return g_variant.load(); }

namespace {
// The staged tensor-core kernel (src/cuda/gemv_w8.cu) for fp8 / int8 weights by default (H200,
// checkpoint A: fp8 77 / 69 / 98%, int8 75 / 67 / 96% of copy at M = 1 against 69 / 73 / 83%
// and 65 / 70 / 76% for the CUDA-core kernel).
constexpr bool kW8QuantDefault = true;
}  // namespace
bool gemv_w8_quant_enabled(int64_t, int64_t k) {
  const int path = g_dense_path.load();
  return k > 0 && k % 64 == 0 && (path == 2 || (path < 0 && kW8QuantDefault));
}

namespace {
thread_local int t_w8_full = 0;
}  // namespace
void gemv_w8_set_full_ring(int mask) {
  if (mask < 0 || mask > 3) throw ValueError(cat("full ring: a mask 0..3, got ", mask));
  t_w8_full = mask;
}
int gemv_w8_full_ring() { return t_w8_full; }
void gemv_w8_stamps(bool on) {
#if GPUKIT_WITH_CUDA
  if (on) cuda::gemv_w8_stamps_start();
  else cuda::gemv_w8_stamps_stop();
#else
  if (on) throw ValueError("gemv_w8_stamps: this build has no CUDA");
#endif
}
std::vector<int64_t> gemv_w8_stamps_read(std::vector<uint64_t>& out) {
#if GPUKIT_WITH_CUDA
  return cuda::gemv_w8_stamps_read(out);
#else
  out.clear();
  throw ValueError("gemv_w8_stamps_read: this build has no CUDA");
#endif
}
int gemv_w8_full_ring_depth(int64_t n, int64_t k, int mask) {
#if GPUKIT_WITH_CUDA
  return cuda::gemv_w8_full_depth(n, k, mask);
#else
  (void)n, (void)k, (void)mask;
  return 0;
#endif
}

Array gemv(const Array& x_in, const Array& w_in, std::optional<DType> out_dtype, const Stream* sp) {
  Device d = detail::common_device({{"x", &x_in}, {"w", &w_in}});
  Stream s = resolve_stream(sp, d);
  if (w_in.dtype() != DType::bf16 && w_in.dtype() != DType::f16)
    throw TypeError(cat("w: gemv reads bfloat16 or float16 weights, got ", dtype_name(w_in.dtype())));
  DType xt = x_in.dtype();
  if (xt != DType::f32 && xt != DType::f16 && xt != DType::bf16)
    throw TypeError(cat("x: gemv takes float32, float16 or bfloat16 activations, got ", dtype_name(xt)));
  if (w_in.ndim() != 2) throw ValueError(cat("w: gemv needs a 2-d weight [N, K], got shape ", shape_str(w_in.shape())));
  if (x_in.ndim() != 1 && x_in.ndim() != 2)
    throw ValueError(cat("x: gemv needs [K] or [M, K], got shape ", shape_str(x_in.shape())));
  const int64_t k = w_in.shape(1), n = w_in.shape(0);
  if (x_in.shape(-1) != k)
    throw ValueError(cat("gemv: x has ", x_in.shape(-1), " features (shape ", shape_str(x_in.shape()),
                         ") but w has ", k, " columns (shape ", shape_str(w_in.shape()), ")"));
  DType out = out_dtype.value_or(w_in.dtype());
  if (out != DType::f32 && out != DType::f16 && out != DType::bf16)
    throw TypeError(cat("out_dtype: gemv produces float32, float16 or bfloat16, not ", dtype_name(out)));
  const bool one = x_in.ndim() == 1;
  const int64_t m = one ? 1 : x_in.shape(0);
  if (m > 8) return linear(x_in.astype(w_in.dtype(), &s), w_in, nullptr, Activation::none, nullptr, out, &s);
  Array x = (one ? x_in.unsqueeze(0) : x_in);
  x = x.dtype() == w_in.dtype() ? x.contiguous(&s) : x.astype(w_in.dtype(), &s);
  Array w = w_in.stride(1) == 1 || k <= 1 ? w_in : w_in.contiguous(&s);
  Array y = Array::empty({m, n}, out, d, &s);
  if (y.numel() > 0) {
    GemvArgs a;
    a.x = x.data();
    a.w = w.data();
    a.y = y.data();
    a.m = m;
    a.n = n;
    a.k = k;
    a.x_rs = k;
    a.w_rs = w.stride(0);
    a.dtype = w.dtype();
    a.out_dtype = out;
    if (d.is_cpu()) {
      cpu::gemv(a);
    } else {
#if GPUKIT_WITH_CUDA
      auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
      if (!al16(a.x)) {  // x is small: an aligned copy keeps the 16-byte path for aligned weights
        x = x.copy(&s);
        a.x = x.data();
      }
      a.vec = al16(a.w) && al16(a.x) && a.w_rs % 8 == 0 && k % 8 == 0;
      const int path = g_dense_path.load();
      a.mma = a.vec && k % 32 == 0 && (path == 1 || (path < 0 && kDenseMmaDefault));
      a.w8 = a.vec && k > 0 && k % 32 == 0 && (path == 2 || (path < 0 && kDenseW8Default));
      a.split = a.w8 ? cuda::gemv_w8_split(n, k, 2) : (a.vec ? cuda::gemv_split(n, k, a.mma) : 1);
      a.variant = g_variant.load();
      Array part;
      if (a.split > 1) {
        part = Array::empty({int64_t(a.split), m, n}, DType::f32, d, &s);
        a.part = part.data_as<float>();
      }
      detail::mark_used(x, s);
      detail::mark_used(w, s);
      if (a.w8) cuda::gemv_w8_dense(a, s.handle());
      else cuda::gemv(a, s.handle());
#else
      detail::no_cuda_backend();
#endif
    }
  }
  return one ? y.reshape({n}) : y;
}

}  // namespace gk
