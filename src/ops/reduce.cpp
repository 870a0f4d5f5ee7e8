// Front end of the reductions (sum, mean, max, min, argmax, argmin) and of
// softmax/log_softmax. Every problem is brought to the form [rows, cols]: the
// reduced axes are moved to the end (permute) and made contiguous, so one
// row-reduction kernel per backend serves every axis set. The reduction order
// within a row is fixed by the backend (no atomics), so results are the same
// bits on every run.
#include "ops/reduce.h"

#include <cmath>
#include <limits>

#include "ops/common.h"
#include "ops/reduce_functors.h"

namespace gk {

const char* op_name(ReduceOp op) {
  static const char* n[] = {"sum", "mean", "max", "min", "argmax", "argmin"};
  return n[int(op)];
}

namespace {

std::string axes_str(const std::vector<int>& ax) {
  std::string s = "(";
  for (size_t i = 0; i < ax.size(); ++i) s += (i ? ", " : "") + std::to_string(ax[i]);
  return s + (ax.size() == 1 ? ",)" : ")");
}

int norm_axis(int axis, int ndim) {
  if (axis < -ndim || axis >= ndim)
    throw IndexError(cat("axis: ", axis, " is out of bounds for an array of dimension ", ndim));
  return axis < 0 ? axis + ndim : axis;
}

// Which dimensions are reduced; null axes: all of them.
std::vector<bool> axis_mask(int ndim, const std::vector<int>* axes) {
  std::vector<bool> m(size_t(ndim), axes == nullptr);
  if (!axes) return m;
  for (int ax : *axes) {
    int d = norm_axis(ax, ndim);
    if (m[size_t(d)]) throw ValueError(cat("axis: duplicate value ", ax, " in axis ", axes_str(*axes)));
    m[size_t(d)] = true;
  }
  return m;
}

void run_reduce_rows(ReduceOp op, RowArgs& ra, Device d, const Stream& s, const Array& in) {
  if (d.is_cpu()) return cpu::reduce_rows(op, ra);
#if GPUKIT_WITH_CUDA
  size_t wb = cuda::reduce_rows_workspace(op, ra);
  Array work;  // returned to the allocator after the launch: reused only on `s`, in order
  if (wb) {
    work = Array::empty({int64_t(wb)}, DType::u8, d, &s);
    ra.work = work.data();
  }
  detail::mark_used(in, s);
  cuda::reduce_rows(op, ra, s.handle());
#else
  (void)s;
  (void)in;
  detail::no_cuda_backend();
#endif
}

bool is_arg(ReduceOp op) { return op == ReduceOp::Argmax || op == ReduceOp::Argmin; }

}  // namespace

namespace detail {

Array reduce_over(ReduceOp op, const Array& a, const std::vector<int>* axes, bool keepdims, const Stream* sp) {
  Device d = common_device({{"x", &a}});
  Stream s = resolve_stream(sp, d);
  if (is_arg(op) && axes && axes->size() != 1)
    throw ValueError(cat("axis: ", op_name(op), " takes a single axis or None, got ", axes_str(*axes)));
  int nd = a.ndim();
  std::vector<bool> mask = axis_mask(nd, axes);
  std::vector<int> perm;
  Shape kept, keep_shape;
  int64_t rows = 1, cols = 1;
  for (int i = 0; i < nd; ++i) {
    keep_shape.push_back(mask[size_t(i)] ? 1 : a.shape()[size_t(i)]);
    if (mask[size_t(i)]) continue;
    perm.push_back(i);
    kept.push_back(a.shape()[size_t(i)]);
    rows *= a.shape()[size_t(i)];
  }
  for (int i = 0; i < nd; ++i)
    if (mask[size_t(i)]) {
      perm.push_back(i);
      cols *= a.shape()[size_t(i)];
    }
  DType ot = red::reduce_out_dtype(op, a.dtype());
  const Shape& oshape = keepdims ? keep_shape : kept;
  if (cols == 0) {
    if (op == ReduceOp::Sum) return full(oshape, Scalar::of_int(0), ot, d, &s);
    if (op == ReduceOp::Mean) return full(oshape, Scalar::of(std::numeric_limits<double>::quiet_NaN()), ot, d, &s);
    throw ValueError(cat("zero-size array to reduction operation ", op_name(op), " which has no identity"));
  }
  Array out = Array::empty(oshape, ot, d, &s);
  if (rows == 0) return out;
  Array x = a.permute(perm).contiguous(&s);
  RowArgs ra;
  ra.in = x.data();
  ra.out = out.data();
  ra.rows = rows;
  ra.cols = cols;
  ra.in_row_stride = cols;
  ra.out_row_stride = 1;
  ra.in_dtype = x.dtype();
  ra.out_dtype = ot;
  run_reduce_rows(op, ra, d, s, x);
  return out;
}

}  // namespace detail

Array reduce(ReduceOp op, const Array& a, const std::vector<int>& axes, bool keepdims, const Stream* s) {
  return detail::reduce_over(op, a, axes.empty() ? nullptr : &axes, keepdims, s);
}

Array arg_reduce(ReduceOp op, const Array& a, std::optional<int> axis, bool keepdims, const Stream* s) {
  if (!is_arg(op)) throw ValueError(cat("op: arg_reduce takes argmax or argmin, got ", op_name(op)));
  std::vector<int> ax;
  if (axis) ax.push_back(*axis);
  return detail::reduce_over(op, a, axis ? &ax : nullptr, keepdims, s);
}

namespace {

Array softmax_impl(const Array& a_in, int axis, bool log, const Stream* sp) {
  Device d = detail::common_device({{"x", &a_in}});
  Stream s = resolve_stream(sp, d);
  DType t = float_result(a_in.dtype());
  bool scalar = a_in.ndim() == 0;
  Array a = scalar ? a_in.reshape({1}) : a_in;
  int nd = a.ndim();
  if (axis < -nd || axis >= nd)
    throw IndexError(cat("axis: ", axis, " is out of bounds for an array of dimension ", a_in.ndim()));
  int ax = axis < 0 ? axis + nd : axis;
  if (a.numel() == 0) return Array::empty(a_in.shape(), t, d, &s);
  std::vector<int> perm, inv(static_cast<size_t>(nd));
  for (int i = 0; i < nd; ++i)
    if (i != ax) perm.push_back(i);
  perm.push_back(ax);
  for (int i = 0; i < nd; ++i) inv[size_t(perm[size_t(i)])] = i;
  Array x = a.permute(perm);
  x = x.dtype() == t ? x.contiguous(&s) : x.astype(t, &s).contiguous(&s);
  Array out = Array::empty(x.shape(), t, d, &s);
  RowArgs ra;
  ra.in = x.data();
  ra.out = out.data();
  ra.cols = a.shape()[size_t(ax)];
  ra.rows = x.numel() / ra.cols;
  ra.in_row_stride = ra.out_row_stride = ra.cols;
  ra.in_dtype = ra.out_dtype = t;
  if (d.is_cpu()) {
    cpu::softmax_rows(ra, log);
  } else {
#if GPUKIT_WITH_CUDA
    detail::mark_used(x, s);
    cuda::softmax_rows(ra, log, s.handle());
#else
    detail::no_cuda_backend();
#endif
  }
  Array r = out.permute(inv);
  if (ax != nd - 1) r = r.contiguous(&s);
  return scalar ? r.reshape({}) : r;
}

}  // namespace

Array softmax(const Array& a, int axis, const Stream* s) { return softmax_impl(a, axis, false, s); }
Array log_softmax(const Array& a, int axis, const Stream* s) { return softmax_impl(a, axis, true, s); }

}  // namespace gk
