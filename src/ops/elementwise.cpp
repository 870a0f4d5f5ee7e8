// Front end of the elementwise ops: copy/convert, fill, arange, binary, unary,
// clamp, where.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "gpukit/ops.h"
#include "ops/common.h"

namespace gk {

namespace detail {
Device common_device(std::initializer_list<std::pair<const char*, const Array*>> args) {
  const char* first = nullptr;
  Device d;
  for (auto& [name, a] : args) {
    if (!a) continue;
    require_defined(*a, name);
    if (!first) {
      first = name;
      d = a->device();
    } else if (a->device() != d) {
      throw ValueError(cat(name, ": is on ", a->device().str(), " but ", first, " is on ", d.str(),
                           "; move them to one device first"));
    }
  }
  if (d.is_cuda()) check_device_usable(d);
  return d;
}
void require_defined(const Array& a, const char* arg) {
  if (!a.defined()) throw ValueError(cat(arg, ": array is undefined (null)"));
}
[[noreturn]] void no_cuda_backend() { throw ValueError("gpukit was built without CUDA kernels"); }
}  // namespace detail

EwArgs make_ew_args(const Array& out, std::initializer_list<const Array*> ins) {
  EwArgs a;
  a.nops = 1 + int(ins.size());
  a.numel = out.numel();
  a.out_dtype = out.dtype();
  int nd = out.ndim();
  std::vector<int64_t> shape(out.shape().begin(), out.shape().end());
  std::vector<std::vector<int64_t>> st(a.nops, std::vector<int64_t>(nd, 0));
  a.ptr[0] = out.data();
  for (int d = 0; d < nd; ++d) st[0][d] = out.strides()[d];
  int k = 1;
  for (const Array* in : ins) {
    if (in) {
      a.ptr[k] = in->data();
      a.in_dtype = in->dtype();
      for (int d = 0; d < nd; ++d) st[k][d] = in->shape()[d] == 1 && out.shape()[d] != 1 ? 0 : in->strides()[d];
    } else {
      a.scalar_slot = k;
    }
    ++k;
  }
  // Drop size-1 dims, then merge dim d into d-1 when contiguous for every operand.
  std::vector<int64_t> s2;
  std::vector<std::vector<int64_t>> t2(a.nops);
  for (int d = 0; d < nd; ++d) {
    if (shape[d] == 1) continue;
    s2.push_back(shape[d]);
    for (int o = 0; o < a.nops; ++o) t2[o].push_back(st[o][d]);
  }
  std::vector<int64_t> s3;
  std::vector<std::vector<int64_t>> t3(a.nops);
  for (size_t d = 0; d < s2.size(); ++d) {
    bool merge = !s3.empty();
    for (int o = 0; o < a.nops && merge; ++o) merge = t3[o].back() == t2[o][d] * s2[d];
    if (merge) {
      s3.back() *= s2[d];
      for (int o = 0; o < a.nops; ++o) t3[o].back() = t2[o][d];
    } else {
      s3.push_back(s2[d]);
      for (int o = 0; o < a.nops; ++o) t3[o].push_back(t2[o][d]);
    }
  }
  if (s3.size() > size_t(kMaxDims))
    throw ValueError(cat("arrays with more than ", kMaxDims, " non-mergeable dimensions are not supported (shape ",
                         shape_str(out.shape()), ")"));
  a.ndim = int(s3.size());
  for (int d = 0; d < a.ndim; ++d) {
    a.shape[d] = s3[d];
    for (int o = 0; o < a.nops; ++o) a.strides[o][d] = t3[o][d];
  }
  a.contiguous = a.ndim <= 1;
  for (int o = 0; o < a.nops && a.contiguous; ++o)
    if (o != a.scalar_slot && a.ndim == 1 && a.strides[o][0] != 1) a.contiguous = false;
  return a;
}

namespace {

bool ranges_overlap(const Array& x, const Array& y) {
  if (x.storage() != y.storage() && x.storage()->ptr != y.storage()->ptr) return false;
  if (x.numel() == 0 || y.numel() == 0) return false;
  auto span = [](const Array& a) {
    int64_t lo = a.offset(), hi = a.offset();
    for (int d = 0; d < a.ndim(); ++d) {
      int64_t e = (a.shape()[d] - 1) * a.strides()[d];
      (e < 0 ? lo : hi) += e;
    }
    return std::pair<int64_t, int64_t>(lo * int64_t(a.itemsize()), (hi + 1) * int64_t(a.itemsize()));
  };
  auto [a0, a1] = span(x);
  auto [b0, b1] = span(y);
  return a0 < b1 && b0 < a1;
}

void run_copy(const Array& dst, const Array& src, const Stream& s) {
  EwArgs a = make_ew_args(dst, {&src});
  if (a.numel == 0) return;
  if (dst.device().is_cpu()) return cpu::copy(a);
#if GPUKIT_WITH_CUDA
  detail::mark_used(dst, s);
  detail::mark_used(src, s);
  cuda::copy(a, s.handle());
#else
  (void)s;
  detail::no_cuda_backend();
#endif
}

#if GPUKIT_WITH_CUDA
constexpr size_t kChunk = size_t(32) << 20;
// Host (contiguous, pageable) -> device through pinned staging, chunked.
void upload(void* dst, const void* src, size_t bytes, const Stream& s) {
  for (size_t off = 0; off < bytes; off += kChunk) {
    size_t n = std::min(kChunk, bytes - off);
    PinnedBuffer b = pinned_acquire(n);
    std::memcpy(b.ptr, static_cast<const char*>(src) + off, n);
    cuda::memcpy_async(static_cast<char*>(dst) + off, b.ptr, n, 1, s.handle());
    pinned_release(b, s);
  }
}
void download(void* dst, const void* src, size_t bytes, const Stream& s) {
  for (size_t off = 0; off < bytes; off += kChunk) {
    size_t n = std::min(kChunk, bytes - off);
    PinnedBuffer b = pinned_acquire(n);
    cuda::memcpy_async(b.ptr, static_cast<const char*>(src) + off, n, 2, s.handle());
    s.synchronize();
    std::memcpy(static_cast<char*>(dst) + off, b.ptr, n);
    pinned_release(b, Stream());
  }
}
#endif

}  // namespace

void copy_into(const Array& dst, const Array& src_in, const Stream* sp) {
  detail::require_defined(dst, "dst");
  detail::require_defined(src_in, "src");
  Array src = src_in;
  if (src.shape() != dst.shape()) {
    Shape b = broadcast_shapes(dst.shape(), src.shape(), "src");
    if (b != dst.shape())
      throw ValueError(cat("src: shape ", shape_str(src.shape()), " cannot be broadcast to dst shape ",
                           shape_str(dst.shape())));
    src = src.broadcast_to(dst.shape());
  }
  if (dst.numel() == 0) return;
  Device dd = dst.device(), sd = src.device();
  if (dd == sd) {
    Stream s = resolve_stream(sp, dd);
    if (ranges_overlap(dst, src)) src = src.copy(&s);
    run_copy(dst, src, s);
    return;
  }
#if GPUKIT_WITH_CUDA
  if (sd.is_cpu()) {  // host -> device
    Stream s = resolve_stream(sp && sp->valid() && sp->device() == dd ? sp : nullptr, dd);
    Array h = src;
    if (h.dtype() != dst.dtype() || !h.is_contiguous()) h = h.astype(dst.dtype());
    if (dst.is_contiguous()) {
      detail::mark_used(dst, s);
      upload(dst.data(), h.data(), dst.nbytes(), s);
    } else {
      Array tmp = Array::empty(dst.shape(), dst.dtype(), dd, &s);
      upload(tmp.data(), h.data(), tmp.nbytes(), s);
      run_copy(dst, tmp, s);
    }
    return;
  }
  if (dd.is_cpu()) {  // device -> host
    Stream s = resolve_stream(sp && sp->valid() && sp->device() == sd ? sp : nullptr, sd);
    Array d = src.contiguous(&s);
    if (dst.is_contiguous() && dst.dtype() == d.dtype()) {
      download(dst.data(), d.data(), dst.nbytes(), s);
    } else {
      Array tmp = Array::empty(dst.shape(), d.dtype(), dd);
      download(tmp.data(), d.data(), tmp.nbytes(), s);
      run_copy(dst, tmp, Stream());
    }
    return;
  }
  // device -> other device: through the host.
  Array h = src.to(Device::cpu());
  copy_into(dst, h, sp);
#else
  throw ValueError("dst: cross-device copies need CUDA");
#endif
}

namespace {
// Checks that an integer scalar fits the integer dtype it meets.
void check_int_scalar(const Scalar& v, DType t, const char* arg) {
  if (!is_integral(t) || v.is_float) return;
  int64_t lo = 0, hi = 0;
  switch (t) {
    case DType::u8: lo = 0; hi = 255; break;
    case DType::i8: lo = -128; hi = 127; break;
    case DType::i16: lo = -32768; hi = 32767; break;
    case DType::i32: lo = INT32_MIN; hi = INT32_MAX; break;
    default: return;
  }
  if (v.i < lo || v.i > hi)
    throw ValueError(cat(arg, ": Python integer ", v.i, " is out of bounds for ", dtype_name(t)));
}
}  // namespace

Array full(const Shape& shape, Scalar value, DType dtype, Device device, const Stream* sp) {
  check_int_scalar(value, dtype, "fill_value");
  Stream s = resolve_stream(sp, device);
  Array out = Array::empty(shape, dtype, device, &s);
  EwArgs a = make_ew_args(out, {nullptr});
  a.scalar_f = value.f;
  a.scalar_i = value.is_float ? int64_t(value.f) : value.i;
  a.in_dtype = value.is_float ? DType::f64 : DType::i64;
  if (a.numel == 0) return out;
  if (device.is_cpu()) cpu::fill(a);
#if GPUKIT_WITH_CUDA
  else cuda::fill(a, s.handle());
#endif
  return out;
}

Array arange(double start, double stop, double step, DType dtype, Device device, const Stream* sp) {
  if (step == 0) throw ValueError("step: must not be zero");
  if (!std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    throw ValueError("start, stop and step must be finite");
  double n = std::ceil((stop - start) / step);
  if (!(n < 9.2e18))
    throw ValueError(cat("stop: arange(", start, ", ", stop, ", ", step, ") would have ", n,
                         " elements, more than fit in 64 bits"));
  int64_t len = n > 0 ? int64_t(n) : 0;
  Stream s = resolve_stream(sp, device);
  Array out = Array::empty({len}, dtype, device, &s);
  if (len == 0) return out;
  EwArgs a = make_ew_args(out, {});
  if (device.is_cpu()) cpu::arange(a, start, step);
#if GPUKIT_WITH_CUDA
  else cuda::arange(a, start, step, s.handle());
#endif
  return out;
}

const char* op_name(BinaryOp op) {
  static const char* n[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le",
                            "gt", "ge", "logical_and", "logical_or"};
  return n[int(op)];
}
const char* op_name(UnaryOp op) {
  static const char* n[] = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
                            "relu", "gelu", "gelu_tanh", "silu", "logical_not"};
  return n[int(op)];
}
bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

DType binary_result_dtype(BinaryOp op, DType a, DType b) {
  if (is_comparison(op)) return DType::b8;
  DType t = promote(a, b);
  if (op == BinaryOp::Div) return float_result(t);
  if (t == DType::b8 && op == BinaryOp::Sub)
    throw TypeError("b: subtraction of boolean arrays is not supported; use logical operations");
  return t;
}

namespace {
// The dtype the kernel computes on for a binary op whose operands promote to t.
DType binary_compute_dtype(BinaryOp op, DType t) {
  if (op == BinaryOp::Div) return float_result(t);
  return t;
}

void run_binary(BinaryOp op, EwArgs& a, Device d, const Stream& s) {
  if (a.numel == 0) return;
  if (d.is_cpu()) return cpu::binary(op, a);
#if GPUKIT_WITH_CUDA
  cuda::binary(op, a, s.handle());
#else
  (void)s;
  detail::no_cuda_backend();
#endif
}
}  // namespace

Array binary(BinaryOp op, const Array& a_in, const Array& b_in, const Stream* sp) {
  Device d = detail::common_device({{"a", &a_in}, {"b", &b_in}});
  Stream s = resolve_stream(sp, d);
  Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), op_name(op));
  DType t = binary_compute_dtype(op, promote(a_in.dtype(), b_in.dtype()));
  DType rt = binary_result_dtype(op, a_in.dtype(), b_in.dtype());
  Array a = a_in.dtype() == t ? a_in : a_in.astype(t, &s);
  Array b = b_in.dtype() == t ? b_in : b_in.astype(t, &s);
  Array out = Array::empty(shape, rt, d, &s);
  Array ab = a.broadcast_to(shape), bb = b.broadcast_to(shape);
  EwArgs args = make_ew_args(out, {&ab, &bb});
  args.in_dtype = t;
  detail::mark_used(a, s);
  detail::mark_used(b, s);
  run_binary(op, args, d, s);
  return out;
}

Array binary(BinaryOp op, const Array& a_in, Scalar v, bool scalar_first, const Stream* sp) {
  Device d = detail::common_device({{"a", &a_in}});
  Stream s = resolve_stream(sp, d);
  DType at = a_in.dtype();
  // Weak scalar: it adopts the array's dtype, except a float scalar with an
  // integer/bool array gives float32, and an int scalar with a bool array int64.
  DType t = at;
  if (v.is_float && !is_floating(at)) t = DType::f32;
  else if (!v.is_float && !v.is_bool && at == DType::b8) t = DType::i64;
  check_int_scalar(v, t, scalar_first ? "a" : "b");
  DType ct = binary_compute_dtype(op, t);
  DType rt = is_comparison(op) ? DType::b8 : ct;
  if (t == DType::b8 && op == BinaryOp::Sub) throw TypeError("b: subtraction of boolean values is not supported");
  Array a = at == ct ? a_in : a_in.astype(ct, &s);
  Array out = Array::empty(a.shape(), rt, d, &s);
  EwArgs args = scalar_first ? make_ew_args(out, {nullptr, &a}) : make_ew_args(out, {&a, nullptr});
  args.in_dtype = ct;
  args.scalar_f = v.f;
  args.scalar_i = v.is_float ? int64_t(v.f) : v.i;
  detail::mark_used(a, s);
  run_binary(op, args, d, s);
  return out;
}

Array unary(UnaryOp op, const Array& x_in, const Stream* sp) {
  Device d = detail::common_device({{"x", &x_in}});
  Stream s = resolve_stream(sp, d);
  DType t = x_in.dtype();
  bool needs_float = op != UnaryOp::Neg && op != UnaryOp::Abs && op != UnaryOp::Relu && op != UnaryOp::LogicalNot;
  if (needs_float) t = float_result(t);
  if (op == UnaryOp::Neg && t == DType::b8) throw TypeError("x: negation of a boolean array is not supported; use logical_not");
  Array x = x_in.dtype() == t ? x_in : x_in.astype(t, &s);
  Array out = Array::empty(x.shape(), op == UnaryOp::LogicalNot ? DType::b8 : t, d, &s);
  EwArgs a = make_ew_args(out, {&x});
  a.in_dtype = t;
  if (a.numel == 0) return out;
  detail::mark_used(x, s);
  if (d.is_cpu()) cpu::unary(op, a);
#if GPUKIT_WITH_CUDA
  else cuda::unary(op, a, s.handle());
#endif
  return out;
}

Array clamp(const Array& x_in, std::optional<Scalar> lo, std::optional<Scalar> hi, const Stream* sp) {
  Device d = detail::common_device({{"x", &x_in}});
  Stream s = resolve_stream(sp, d);
  DType t = x_in.dtype();
  if (t == DType::b8) throw TypeError("x: clamp of a boolean array is not supported");
  if ((lo && lo->is_float) || (hi && hi->is_float)) t = float_result(t);
  if (lo && !lo->is_float) check_int_scalar(*lo, t, "min");
  if (hi && !hi->is_float) check_int_scalar(*hi, t, "max");
  Array x = x_in.dtype() == t ? x_in : x_in.astype(t, &s);
  Array out = Array::empty(x.shape(), t, d, &s);
  EwArgs a = make_ew_args(out, {&x});
  a.in_dtype = t;
  if (a.numel == 0) return out;
  double l = lo ? (lo->is_float ? lo->f : double(lo->i)) : 0, h = hi ? (hi->is_float ? hi->f : double(hi->i)) : 0;
  detail::mark_used(x, s);
  if (d.is_cpu()) cpu::clamp(a, bool(lo), l, bool(hi), h);
#if GPUKIT_WITH_CUDA
  else cuda::clamp(a, bool(lo), l, bool(hi), h, s.handle());
#endif
  return out;
}

Array where(const Array& cond_in, const Array& a_in, const Array& b_in, const Stream* sp) {
  Device d = detail::common_device({{"cond", &cond_in}, {"a", &a_in}, {"b", &b_in}});
  Stream s = resolve_stream(sp, d);
  Shape shape = broadcast_shapes(broadcast_shapes(cond_in.shape(), a_in.shape(), "where"), b_in.shape(), "where");
  DType t = promote(a_in.dtype(), b_in.dtype());
  Array c = cond_in.dtype() == DType::b8 ? cond_in : cond_in.astype(DType::b8, &s);
  Array a = a_in.dtype() == t ? a_in : a_in.astype(t, &s);
  Array b = b_in.dtype() == t ? b_in : b_in.astype(t, &s);
  Array out = Array::empty(shape, t, d, &s);
  Array cb = c.broadcast_to(shape), ab = a.broadcast_to(shape), bb = b.broadcast_to(shape);
  EwArgs args = make_ew_args(out, {&cb, &ab, &bb});
  args.in_dtype = t;
  if (args.numel == 0) return out;
  for (auto* x : {&c, &a, &b}) detail::mark_used(*x, s);
  if (d.is_cpu()) cpu::where(args);
#if GPUKIT_WITH_CUDA
  else cuda::where(args, s.handle());
#endif
  return out;
}

}  // namespace gk
