// Front ends of the FP8 products: fp8_linear (per-tensor scales), fp8_block_linear
// (1x128 activation / 128x128 weight block scales) and quantize_fp8_blocks.
//
// On CUDA both GEMMs go to cuBLASLt's FP8 kernels when the problem meets their
// requirements (TN layout, every dimension a multiple of 16, 16-byte aligned
// pointers; block scales also K a multiple of 512 so that the weight-scale rows need
// no padding; checked in src/blas/cublaslt.cpp) and otherwise to gpukit's own path:
// per-tensor: an exact true-FP32 GEMM of the converted operands plus a scaling pass;
// block scales: src/cuda/fp8_block.cu, which follows the CPU reference bit for bit.
#include <algorithm>
#include <utility>

#include "blas/cublaslt.h"
#include "gpukit/gemm.h"
#include "ops/common.h"
#include "ops/fp8_block_args.h"
#include "ops/gemm.h"

namespace gk {

using detail::rows_view;

Array fp8_linear(const Array& x, const Array& w, const Array& x_scale, const Array& w_scale, const Array* bias_in,
                 std::optional<DType> out_dtype, const Stream* sp) {
  Device d = detail::common_device({{"x", &x}, {"w", &w}, {"x_scale", &x_scale}, {"w_scale", &w_scale},
                                    {"bias", bias_in ? bias_in : &x}});
  Stream s = resolve_stream(sp, d);
  for (auto [a, name] : {std::pair{&x, "x"}, std::pair{&w, "w"}})
    if (a->dtype() != DType::f8e4m3 && a->dtype() != DType::f8e5m2)
      throw TypeError(cat(name, ": fp8_linear takes float8_e4m3fn or float8_e5m2, got ", dtype_name(a->dtype())));
  [[maybe_unused]] const bool both_e4m3 = x.dtype() == DType::f8e4m3 && w.dtype() == DType::f8e4m3;
  if (x.ndim() < 1) throw ValueError("x: fp8_linear needs an array of at least 1 dimension");
  if (w.ndim() != 2) throw ValueError(cat("w: fp8_linear needs a 2-d weight [N, K], got shape ", shape_str(w.shape())));
  const int64_t k = x.shape(-1), n = w.shape(0);
  if (w.shape(1) != k)
    throw ValueError(cat("fp8_linear: x has ", k, " features (shape ", shape_str(x.shape()), ") but w has ",
                         w.shape(1), " columns (shape ", shape_str(w.shape()), ")"));
  for (auto [a, name] : {std::pair{&x_scale, "x_scale"}, std::pair{&w_scale, "w_scale"}}) {
    if (a->numel() != 1) throw ValueError(cat(name, ": fp8_linear takes one per-tensor scale, got shape ", shape_str(a->shape())));
    if (!is_floating(a->dtype()) || is_fp8(a->dtype())) throw TypeError(cat(name, ": expected a float scale"));
  }
  DType out = out_dtype.value_or(DType::bf16);
  if (out != DType::f32 && out != DType::f16 && out != DType::bf16)
    throw TypeError(cat("out_dtype: fp8_linear produces float32, float16 or bfloat16, not ", dtype_name(out)));
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  int64_t m = 1;
  for (int64_t v : lead) m *= v;
  Shape out_shape = lead;
  out_shape.push_back(n);
  checked_numel(out_shape, out, "fp8_linear result");
  Array bias;
  if (bias_in) {
    if (bias_in->ndim() != 1 || bias_in->shape(0) != n)
      throw ValueError(cat("bias: expected shape (", n, ",), got ", shape_str(bias_in->shape())));
    bias = bias_in->astype(out, &s).contiguous(&s);
  }
  Array xs = x_scale.astype(DType::f32, &s).reshape({1}).contiguous(&s);
  Array ws = w_scale.astype(DType::f32, &s).reshape({1}).contiguous(&s);
  Array y = Array::empty(out_shape, out, d, &s);
  if (y.numel() == 0) return y;
  Array x2 = rows_view(x, m, k, s);
#if GPUKIT_WITH_CUDA
  // One cuBLASLt call (scales applied inside, rounded once) for e4m3 x e4m3; an e5m2
  // operand takes the general path (exact for every fp8 value).
  if (d.is_cuda() && !bias.defined() && k > 0 && both_e4m3) {
    detail::mark_used(x2, s);
    detail::mark_used(w, s);
    blas::LtGemm g;
    g.a = x2.data();
    g.b = w.data();
    g.d = y.data();
    g.m = m;
    g.n = n;
    g.k = k;
    g.a_rs = x2.stride(0);
    g.a_cs = x2.stride(1);
    g.b_rs = w.stride(1);
    g.b_cs = w.stride(0);
    g.ldd = n;
    g.ab_dtype = DType::f8e4m3;
    g.d_dtype = out;
    g.a_scale = xs.data_as<float>();
    g.b_scale = ws.data_as<float>();
    if (blas::matmul(g, d.index, s.handle())) return y;
  }
#endif
  // General path: fp8 values are exact in float32, so a true-FP32 GEMM of the converted
  // operands gives the fp32-accumulated product; the scales (and bias) follow in one pass.
  Array xf = x2.astype(DType::f32, &s), wf = w.astype(DType::f32, &s);
  Array acc = Array::empty({m, n}, DType::f32, d, &s);
  detail::run_gemm(detail::rows_times_wt(xf, wf, acc, n, DType::f32, DType::f32), d, s);
  Array xsv = xs.broadcast_to({m}).contiguous(&s), wsv = ws.broadcast_to({n}).contiguous(&s);
  detail::scale_epilogue(acc, xsv, wsv, bias, y, m, n, out, d, s);
  return y;
}

namespace {

void check_fp8_operands(const Array& x, const Array& w, const char* op) {
  if (x.dtype() != DType::f8e4m3) throw TypeError(cat("x: ", op, " takes float8_e4m3fn, got ", dtype_name(x.dtype())));
  if (w.dtype() != DType::f8e4m3) throw TypeError(cat("w: ", op, " takes float8_e4m3fn, got ", dtype_name(w.dtype())));
  if (x.ndim() < 1) throw ValueError(cat("x: ", op, " needs an array of at least 1 dimension"));
  if (w.ndim() != 2) throw ValueError(cat("w: ", op, " needs a 2-d weight [N, K], got shape ", shape_str(w.shape())));
  if (w.shape(1) != x.shape(-1))
    throw ValueError(cat(op, ": x has ", x.shape(-1), " features (shape ", shape_str(x.shape()), ") but w has ",
                         w.shape(1), " columns (shape ", shape_str(w.shape()), ")"));
}

// A float32 scale array of exactly `shape` (any float dtype in, contiguous out).
Array scales_of(const Array& a, const Shape& shape, const char* arg, const char* what, const Stream& s) {
  if (!is_floating(a.dtype()) || is_fp8(a.dtype()))
    throw TypeError(cat(arg, ": scales are float arrays, got ", dtype_name(a.dtype())));
  if (a.shape() != shape)
    throw ValueError(cat(arg, ": expected ", what, " of shape ", shape_str(shape), ", got ", shape_str(a.shape())));
  return a.astype(DType::f32, &s).contiguous(&s);
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Array fp8_block_linear(const Array& x, const Array& w, const Array& x_scale, const Array& w_scale,
                       const Array* bias_in, std::optional<DType> out_dtype, const Stream* sp) {
  Device d = detail::common_device({{"x", &x}, {"w", &w}, {"x_scale", &x_scale}, {"w_scale", &w_scale},
                                    {"bias", bias_in ? bias_in : &x}});
  Stream s = resolve_stream(sp, d);
  check_fp8_operands(x, w, "fp8_block_linear");
  const int64_t k = x.shape(-1), n = w.shape(0), nb = cdiv(k, kFp8Block);
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  int64_t m = 1;
  for (int64_t v : lead) m *= v;
  DType out = out_dtype.value_or(DType::bf16);
  if (out != DType::f32 && out != DType::f16 && out != DType::bf16)
    throw TypeError(cat("out_dtype: fp8_block_linear produces float32, float16 or bfloat16, not ", dtype_name(out)));
  Shape xs_shape = lead;
  xs_shape.push_back(nb);
  Array xs = scales_of(x_scale, xs_shape, "x_scale", "one scale per 1x128 block of x (x.shape[:-1] + (ceil(K/128),))", s)
                 .reshape({m, nb});
  Array ws = scales_of(w_scale, {cdiv(n, kFp8Block), nb}, "w_scale", "one scale per 128x128 block of w", s);
  Shape out_shape = lead;
  out_shape.push_back(n);
  checked_numel(out_shape, out, "fp8_block_linear result");
  Array bias;
  if (bias_in) {
    if (!is_floating(bias_in->dtype()) || is_fp8(bias_in->dtype()))
      throw TypeError(cat("bias: expected a float array, got ", dtype_name(bias_in->dtype())));
    if (bias_in->ndim() != 1 || bias_in->shape(0) != n)
      throw ValueError(cat("bias: expected shape (", n, ",), got ", shape_str(bias_in->shape())));
    bias = bias_in->astype(out, &s).contiguous(&s);
  }
  Array y = Array::empty(out_shape, out, d, &s);
  if (y.numel() == 0) return y;
  Array x2 = rows_view(x, m, k, s);
  if (x2.stride(1) != 1) x2 = x2.contiguous(&s);
  Array w2 = w.stride(1) == 1 ? w : w.contiguous(&s);
  Fp8BlockArgs a;
  a.x = static_cast<const uint8_t*>(x2.data());
  a.w = static_cast<const uint8_t*>(w2.data());
  a.xs = xs.data_as<float>();
  a.ws = ws.data_as<float>();
  a.bias = bias.defined() ? bias.data() : nullptr;
  a.out = y.data();
  a.m = m;
  a.n = n;
  a.k = k;
  a.x_rs = m == 1 ? k : x2.stride(0);
  a.w_rs = n == 1 ? k : w2.stride(0);
  a.out_dtype = out;
  if (d.is_cpu()) {
    cpu::fp8_block_gemm(a);  // K = 0: y = bias (or 0)
    return y;
  }
#if GPUKIT_WITH_CUDA
  for (const Array* t : {&x2, &w2, &xs, &ws, &bias})
    if (t->defined()) detail::mark_used(*t, s);
  if (!bias.defined() && k > 0 && nb % 4 == 0) {
    // cuBLASLt's layouts: activation scales M-contiguous [L, M] (VEC128_32F); weight
    // scales K-contiguous [ceil(N/128), L] with L a multiple of 4 (BLK128x128_32F).
    Array xs_t = xs.transpose(0, 1).contiguous(&s);
    detail::mark_used(xs_t, s);
    blas::LtGemm g;
    g.a = x2.data();
    g.b = w2.data();
    g.d = y.data();
    g.m = m;
    g.n = n;
    g.k = k;
    g.a_rs = a.x_rs;
    g.a_cs = 1;
    g.b_rs = 1;
    g.b_cs = a.w_rs;
    g.ldd = n;
    g.ab_dtype = DType::f8e4m3;
    g.d_dtype = out;
    g.a_scale = xs_t.data_as<float>();
    g.b_scale = ws.data_as<float>();
    g.a_scale_mode = blas::ScaleMode::vec128;
    g.b_scale_mode = blas::ScaleMode::blk128x128;
    if (blas::matmul(g, d.index, s.handle())) return y;
  }
  blas::count_fallback();
  cuda::fp8_block_gemm(a, s.handle());
  return y;
#else
  detail::no_cuda_backend();
#endif
}

std::pair<Array, Array> quantize_fp8_blocks(const Array& a_in, int64_t block_rows, const Stream* sp) {
  Device d = detail::common_device({{"a", &a_in}});
  Stream s = resolve_stream(sp, d);
  if (block_rows != 1 && block_rows != kFp8Block)
    throw ValueError(cat("block_rows: quantize_fp8_blocks takes 1 (activations, 1x128 blocks) or 128 (weights, "
                         "128x128 blocks), got ", block_rows));
  if (a_in.dtype() != DType::f32 && a_in.dtype() != DType::f16 && a_in.dtype() != DType::bf16)
    throw TypeError(cat("a: quantize_fp8_blocks takes float32, float16 or bfloat16, got ", dtype_name(a_in.dtype())));
  if (a_in.ndim() < 1 || (block_rows == kFp8Block && a_in.ndim() != 2))
    throw ValueError(cat("a: quantize_fp8_blocks needs ", block_rows == 1 ? "at least 1 dimension" : "a 2-d weight [N, K]",
                         ", got shape ", shape_str(a_in.shape())));
  const int64_t cols = a_in.shape(-1), rows = a_in.numel() / std::max<int64_t>(cols, 1);
  Shape lead(a_in.shape().begin(), a_in.shape().end() - 1);
  Shape s_shape = lead;
  if (block_rows == kFp8Block) s_shape = {cdiv(rows, kFp8Block)};
  s_shape.push_back(cdiv(cols, kFp8Block));
  Array q = Array::empty(a_in.shape(), DType::f8e4m3, d, &s);
  Array sc = Array::empty(s_shape, DType::f32, d, &s);
  if (q.numel() == 0) return {q, sc};
  Array a2 = rows_view(a_in, rows, cols, s);
  if (a2.stride(1) != 1) a2 = a2.contiguous(&s);
  Fp8QuantArgs qa;
  qa.in = a2.data();
  qa.in_dtype = a2.dtype();
  qa.rows = rows;
  qa.cols = cols;
  qa.in_rs = rows == 1 ? cols : a2.stride(0);
  qa.block_rows = block_rows;
  qa.q = static_cast<uint8_t*>(q.data());
  qa.s = sc.data_as<float>();
  if (d.is_cpu()) {
    cpu::quantize_fp8_blocks(qa);
  } else {
#if GPUKIT_WITH_CUDA
    detail::mark_used(a2, s);
    cuda::quantize_fp8_blocks(qa, s.handle());
#else
    detail::no_cuda_backend();
#endif
  }
  return {q, sc};
}

}  // namespace gk
