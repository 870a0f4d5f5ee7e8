// Front end of matmul: NumPy semantics (a 1-d operand gets a dimension added
// for the product and removed from the result; batch dimensions broadcast),
// float32/float16/bfloat16 (and float64) inputs promoted to one dtype, fp32
// accumulation (f64 for float64), any strides. The result is contiguous, of
// out_dtype (default: the promoted dtype). CUDA runs through detail::run_gemm
// (cuBLASLt when present; src/ops/gemm.cpp).
#include "gpukit/gemm.h"
#include "ops/common.h"
#include "ops/gemm.h"

namespace gk {

namespace {

void check_matmul_dtype(DType t, const char* arg) {
  if (t != DType::f32 && t != DType::f16 && t != DType::bf16 && t != DType::f64)
    throw TypeError(cat(arg, ": matmul supports float32, float16, bfloat16 and float64 arrays, got ",
                        dtype_name(t)));
}

}  // namespace

Array matmul(const Array& a_in, const Array& b_in, const Stream* sp) { return matmul(a_in, b_in, MatmulOptions{}, sp); }

Array matmul(const Array& a_in, const Array& b_in, const MatmulOptions& opt, const Stream* sp) {
  Device d = detail::common_device({{"a", &a_in}, {"b", &b_in}});
  Stream s = resolve_stream(sp, d);
  auto shapes = [&] { return cat("shapes ", shape_str(a_in.shape()), " and ", shape_str(b_in.shape())); };
  if (a_in.ndim() == 0 || b_in.ndim() == 0)
    throw ValueError(cat(a_in.ndim() == 0 ? "a" : "b", ": matmul needs arrays of at least 1 dimension (",
                         shapes(), ")"));
  check_matmul_dtype(a_in.dtype(), "a");
  check_matmul_dtype(b_in.dtype(), "b");
  DType t = promote(a_in.dtype(), b_in.dtype());
  DType out = opt.out_dtype.value_or(t);
  bool out_ok = out == DType::f32 || out == t || (t == DType::f32 && (out == DType::f16 || out == DType::bf16)) ||
                (t != DType::f64 && (out == DType::f16 || out == DType::bf16));
  if (!out_ok)
    throw TypeError(cat("out_dtype: matmul of ", dtype_name(t), " inputs can produce float32, float16 or bfloat16",
                        t == DType::f64 ? " or float64" : "", ", not ", dtype_name(out)));
  const bool tf32 = t == DType::f32 && opt.allow_tf32.value_or(matmul_precision() == MatmulPrecision::tf32);
  bool a1 = a_in.ndim() == 1, b1 = b_in.ndim() == 1;
  Array a = a1 ? a_in.unsqueeze(0) : a_in;
  Array b = b1 ? b_in.unsqueeze(1) : b_in;
  int64_t m = a.shape(-2), k = a.shape(-1), kb = b.shape(-2), n = b.shape(-1);
  if (k != kb)
    throw ValueError(cat("matmul: ", shapes(), " are not aligned: a has ", k, " columns (last dimension) but b has ",
                         kb, b1 ? " rows (its only dimension)" : " rows (dimension -2)"));
  Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(ab, bb, "matmul");
  } catch (const ValueError&) {
    throw ValueError(cat("matmul: batch dimensions of ", shapes(), " cannot be broadcast together"));
  }
  if (batch.size() > size_t(kMaxDims))
    throw ValueError(cat("matmul: more than ", kMaxDims, " batch dimensions are not supported (", shapes(), ")"));
  Shape full_shape = batch;
  full_shape.push_back(m);
  full_shape.push_back(n);
  Shape res_shape = batch;
  if (!a1) res_shape.push_back(m);
  if (!b1) res_shape.push_back(n);
  checked_numel(full_shape, out, "matmul result");
  if (a.dtype() != t) a = a.astype(t, &s);
  if (b.dtype() != t) b = b.astype(t, &s);
  Array c = Array::empty(full_shape, out, d, &s);
  if (c.numel() > 0) {
    MatmulArgs ma;
    auto fill = [&] {
      ma = MatmulArgs{};
      ma.a = a.data();
      ma.b = b.data();
      ma.c = c.data();
      ma.m = m;
      ma.n = n;
      ma.k = k;
      ma.batch = 1;
      ma.batch_ndim = int(batch.size());
      int nb = int(batch.size()), na = int(a.ndim() - 2), nbb = int(b.ndim() - 2);
      for (int i = 0; i < nb; ++i) {
        ma.batch_shape[i] = batch[size_t(i)];
        ma.batch *= batch[size_t(i)];
        int ia = i - (nb - na), ib = i - (nb - nbb);
        ma.a_batch_strides[i] = ia >= 0 && a.shape()[size_t(ia)] != 1 ? a.strides()[size_t(ia)] : 0;
        ma.b_batch_strides[i] = ib >= 0 && b.shape()[size_t(ib)] != 1 ? b.strides()[size_t(ib)] : 0;
      }
      ma.a_rs = a.stride(-2);
      ma.a_cs = a.stride(-1);
      ma.b_rs = b.stride(-2);
      ma.b_cs = b.stride(-1);
      ma.c_rs = n;
      ma.c_cs = 1;
      ma.dtype = t;
      ma.out_dtype = out;
      ma.allow_tf32 = tf32;
    };
    fill();
    int64_t abs_ = 0, bbs_ = 0;
    if (d.is_cuda() && !detail::collapse_batch(ma, &abs_, &bbs_)) {
      // Batch strides that no single stride describes: materialize both operands
      // with the full batch shape so that cuBLASLt's strided batch applies.
      Shape sa = batch, sb = batch;
      sa.push_back(m);
      sa.push_back(k);
      sb.push_back(k);
      sb.push_back(n);
      a = a.broadcast_to(sa).contiguous(&s);
      b = b.broadcast_to(sb).contiguous(&s);
      fill();
    }
    if (d.is_cuda()) {
      detail::mark_used(a, s);
      detail::mark_used(b, s);
    }
    detail::run_gemm(ma, d, s);
  }
  return c.reshape(res_shape);
}

}  // namespace gk
