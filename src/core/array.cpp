#include "gpukit/array.h"

#include <algorithm>
#include <numeric>

#include "gpukit/allocator.h"
#include "gpukit/errors.h"
#include "gpukit/ops.h"

namespace gk {

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    r += std::to_string(s[i]);
    if (s.size() == 1 || i + 1 < s.size()) r += ",";
    if (i + 1 < s.size()) r += " ";
  }
  return r + ")";
}

Strides contiguous_strides(const Shape& shape) {
  Strides st(shape.size());
  int64_t acc = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

int64_t checked_numel(const Shape& shape, DType dtype, const char* arg) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw ValueError(cat(arg, ": negative dimension in shape ", shape_str(shape)));
    if (d != 0 && n > INT64_MAX / d)
      throw ValueError(cat(arg, ": shape ", shape_str(shape), " has more elements than fit in 64 bits"));
    n *= d;
  }
  if (n > INT64_MAX / int64_t(itemsize(dtype)))
    throw ValueError(cat(arg, ": shape ", shape_str(shape), " of ", dtype_name(dtype),
                         " needs more bytes than fit in 64 bits"));
  return n;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what) {
  size_t n = std::max(a.size(), b.size());
  Shape r(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw ValueError(cat(what, ": shapes ", shape_str(a), " and ", shape_str(b), " cannot be broadcast together"));
    r[i] = da == 1 ? db : da;
  }
  return r;
}

Array Array::empty(const Shape& shape, DType dtype, Device device, const Stream* stream) {
  int64_t n = checked_numel(shape, dtype);
  Stream s = resolve_stream(stream, device);
  Array a;
  a.st_ = allocate(device, size_t(n) * gk::itemsize(dtype), s);
  a.shape_ = shape;
  a.strides_ = contiguous_strides(shape);
  a.dtype_ = dtype;
  return a;
}

Array Array::from_blob(void* data, const Shape& shape, const Strides& strides, DType dtype, Device device,
                       std::shared_ptr<void> owner, size_t nbytes) {
  if (shape.size() != strides.size())
    throw ValueError(cat("strides: ", strides.size(), " strides for a shape of ", shape.size(), " dimensions"));
  checked_numel(shape, dtype);
  auto st = std::make_shared<Storage>();
  st->ptr = data;
  st->nbytes = nbytes;
  st->device = device;
  st->owner = std::move(owner);
  return from_storage(std::move(st), shape, strides, 0, dtype);
}

Array Array::from_storage(std::shared_ptr<Storage> st, const Shape& shape, const Strides& strides, int64_t offset,
                          DType dtype) {
  Array a;
  a.st_ = std::move(st);
  a.shape_ = shape;
  a.strides_ = strides;
  a.offset_ = offset;
  a.dtype_ = dtype;
  return a;
}

int64_t Array::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

bool Array::is_contiguous() const {
  int64_t acc = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (shape_[i] == 0) return true;
    if (strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

int Array::norm_dim(int d, const char* arg) const {
  int n = ndim();
  if (d < -n || d >= n || n == 0)
    throw IndexError(cat(arg, ": dimension ", d, " is out of range for an array of ", n, " dimensions"));
  return d < 0 ? d + n : d;
}

std::optional<Array> Array::try_view(const Shape& shape) const {
  // Walk the old and new shapes in chunks of equal element count; each old chunk
  // must be contiguous in itself (NumPy's rule).
  Strides ns(shape.size());
  int64_t n_old = numel();
  if (n_old <= 1) {
    Array r = *this;
    r.shape_ = shape;
    r.strides_ = contiguous_strides(shape);
    return r;
  }
  size_t oi = 0, ni = 0;
  while (oi < shape_.size() && ni < shape.size()) {
    size_t oj = oi + 1, nj = ni + 1;
    int64_t po = shape_[oi], pn = shape[ni];
    while (po != pn) {
      if (po < pn) po *= shape_[oj++];
      else pn *= shape[nj++];
    }
    int prev = -1;
    for (size_t k = oi; k < oj; ++k) {
      if (shape_[k] == 1) continue;
      if (prev >= 0 && strides_[prev] != strides_[k] * shape_[k]) return std::nullopt;
      prev = int(k);
    }
    // innermost stride of the chunk
    int64_t inner = 1;
    for (size_t k = oj; k-- > oi;)
      if (shape_[k] != 1) { inner = strides_[k]; break; }
    int64_t acc = inner;
    for (size_t k = nj; k-- > ni;) {
      ns[k] = acc;
      acc *= shape[k];
    }
    oi = oj;
    ni = nj;
  }
  for (; ni < shape.size(); ++ni) ns[ni] = 1;  // trailing 1s
  Array r = *this;
  r.shape_ = shape;
  r.strides_ = ns;
  return r;
}

Array Array::reshape(const Shape& shape_in) const {
  Shape shape = shape_in;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw ValueError("shape: only one dimension can be -1");
      infer = int(i);
    } else if (shape[i] < 0) {
      throw ValueError(cat("shape: invalid dimension ", shape[i], " in ", shape_str(shape)));
    } else {
      known *= shape[i];
    }
  }
  int64_t n = numel();
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      throw ValueError(cat("shape: cannot reshape array of shape ", shape_str(shape_), " into ", shape_str(shape_in)));
    shape[infer] = n / known;
  }
  if (checked_numel(shape, dtype_) != n)
    throw ValueError(cat("shape: cannot reshape array of shape ", shape_str(shape_), " (", n, " elements) into ",
                         shape_str(shape_in)));
  auto v = try_view(shape);
  if (!v)
    throw ValueError(cat("shape: cannot reshape array of shape ", shape_str(shape_), " with strides ",
                         shape_str(strides_), " into ", shape_str(shape_in),
                         " without a copy; call .contiguous() first"));
  return *v;
}

Array Array::permute(const std::vector<int>& dims) const {
  if (int(dims.size()) != ndim())
    throw ValueError(cat("dims: permutation of ", dims.size(), " dimensions for an array of ", ndim()));
  std::vector<bool> seen(ndim(), false);
  Array r = *this;
  for (int i = 0; i < ndim(); ++i) {
    int d = norm_dim(dims[i], "dims");
    if (seen[d]) throw ValueError(cat("dims: dimension ", d, " repeated in permutation"));
    seen[d] = true;
    r.shape_[i] = shape_[d];
    r.strides_[i] = strides_[d];
  }
  return r;
}

Array Array::transpose(int a, int b) const {
  a = norm_dim(a, "dim0");
  b = norm_dim(b, "dim1");
  Array r = *this;
  std::swap(r.shape_[a], r.shape_[b]);
  std::swap(r.strides_[a], r.strides_[b]);
  return r;
}

Array Array::T() const {
  Array r = *this;
  std::reverse(r.shape_.begin(), r.shape_.end());
  std::reverse(r.strides_.begin(), r.strides_.end());
  return r;
}

Array Array::slice(int dim, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step) const {
  dim = norm_dim(dim);
  if (step == 0) throw ValueError("step: slice step cannot be zero");
  int64_t n = shape_[dim];
  int64_t b, e;
  // Python slice semantics (clamping out-of-range bounds).
  if (step > 0) {
    b = start ? (*start < 0 ? std::max<int64_t>(*start + n, 0) : std::min(*start, n)) : 0;
    e = stop ? (*stop < 0 ? std::max<int64_t>(*stop + n, 0) : std::min(*stop, n)) : n;
  } else {
    b = start ? (*start < 0 ? std::max<int64_t>(*start + n, -1) : std::min(*start, n - 1)) : n - 1;
    e = stop ? (*stop < 0 ? std::max<int64_t>(*stop + n, -1) : std::min(*stop, n - 1)) : -1;
  }
  int64_t len = 0;
  if (step > 0 && e > b) len = (e - b + step - 1) / step;
  if (step < 0 && b > e) len = (b - e + (-step) - 1) / (-step);
  Array r = *this;
  r.shape_[dim] = len;
  r.strides_[dim] = strides_[dim] * step;
  if (len > 0) r.offset_ += b * strides_[dim];
  return r;
}

Array Array::narrow(int dim, int64_t start, int64_t length) const {
  dim = norm_dim(dim);
  int64_t n = shape_[dim];
  if (start < 0) start += n;
  if (start < 0 || length < 0 || start + length > n)
    throw IndexError(cat("start: narrow(", dim, ", ", start, ", ", length, ") out of range for size ", n));
  Array r = *this;
  r.shape_[dim] = length;
  r.offset_ += start * strides_[dim];
  return r;
}

Array Array::select(int dim, int64_t index) const {
  dim = norm_dim(dim);
  int64_t n = shape_[dim];
  if (index < -n || index >= n)
    throw IndexError(cat("index: ", index, " is out of bounds for dimension ", dim, " with size ", n));
  if (index < 0) index += n;
  Array r = *this;
  r.offset_ += index * strides_[dim];
  r.shape_.erase(r.shape_.begin() + dim);
  r.strides_.erase(r.strides_.begin() + dim);
  return r;
}

Array Array::squeeze(std::optional<int> dim) const {
  Array r = *this;
  if (dim) {
    int d = norm_dim(*dim);
    if (shape_[d] != 1)
      throw ValueError(cat("dim: cannot squeeze dimension ", d, " of size ", shape_[d]));
    r.shape_.erase(r.shape_.begin() + d);
    r.strides_.erase(r.strides_.begin() + d);
    return r;
  }
  r.shape_.clear();
  r.strides_.clear();
  for (int i = 0; i < ndim(); ++i)
    if (shape_[i] != 1) {
      r.shape_.push_back(shape_[i]);
      r.strides_.push_back(strides_[i]);
    }
  return r;
}

Array Array::unsqueeze(int dim) const {
  int n = ndim() + 1;
  if (dim < -n || dim >= n)
    throw IndexError(cat("dim: ", dim, " is out of range for unsqueeze of an array of ", ndim(), " dimensions"));
  if (dim < 0) dim += n;
  Array r = *this;
  int64_t st = dim < ndim() ? strides_[dim] * shape_[dim] : 1;
  r.shape_.insert(r.shape_.begin() + dim, 1);
  r.strides_.insert(r.strides_.begin() + dim, st);
  return r;
}

Array Array::broadcast_to(const Shape& shape) const {
  if (shape.size() < shape_.size())
    throw ValueError(cat("shape: cannot broadcast ", shape_str(shape_), " to ", shape_str(shape)));
  checked_numel(shape, dtype_);
  Array r = *this;
  size_t lead = shape.size() - shape_.size();
  r.shape_ = shape;
  r.strides_.assign(shape.size(), 0);
  for (size_t i = 0; i < shape_.size(); ++i) {
    int64_t want = shape[lead + i];
    if (shape_[i] == want) r.strides_[lead + i] = strides_[i];
    else if (shape_[i] == 1) r.strides_[lead + i] = 0;
    else throw ValueError(cat("shape: cannot broadcast ", shape_str(shape_), " to ", shape_str(shape)));
  }
  return r;
}

Array Array::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  if (shape.size() != strides.size()) throw ValueError("strides: must have one entry per dimension");
  int64_t n = checked_numel(shape, dtype_);
  // Bounds: every reachable element must lie inside the storage.
  int64_t lo = offset, hi = offset;
  if (n > 0)
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t span = (shape[i] - 1) * strides[i];
      (span < 0 ? lo : hi) += span;
    }
  int64_t cap = int64_t(st_->nbytes / itemsize());
  if (n > 0 && (lo < 0 || hi >= cap))
    throw ValueError(cat("strides: view ", shape_str(shape), " with strides ", shape_str(strides), " at offset ",
                         offset, " reaches outside the storage of ", cap, " elements"));
  Array r = *this;
  r.shape_ = shape;
  r.strides_ = strides;
  r.offset_ = offset;
  return r;
}

Array Array::view_dtype(DType dt) const {
  size_t a = itemsize(), b = gk::itemsize(dt);
  if (a == b) {
    Array r = *this;
    r.dtype_ = dt;
    return r;
  }
  if (ndim() == 0 || strides_.back() != 1)
    throw ValueError("dtype: a view with another item size needs a last dimension of stride 1");
  if ((int64_t(a) * shape_.back()) % int64_t(b) != 0 || (offset_ * int64_t(a)) % int64_t(b) != 0)
    throw ValueError("dtype: the last dimension's byte size is not a multiple of the new item size");
  Array r = *this;
  r.dtype_ = dt;
  r.shape_.back() = shape_.back() * int64_t(a) / int64_t(b);
  for (int i = 0; i + 1 < ndim(); ++i) {
    if ((strides_[i] * int64_t(a)) % int64_t(b) != 0) throw ValueError("dtype: strides are not multiples of the new item size");
    r.strides_[i] = strides_[i] * int64_t(a) / int64_t(b);
  }
  r.offset_ = offset_ * int64_t(a) / int64_t(b);
  return r;
}

Array Array::contiguous(const Stream* s) const {
  if (is_contiguous()) return *this;
  return copy(s);
}

Array Array::copy(const Stream* s) const {
  Array out = Array::empty(shape_, dtype_, device(), s);
  copy_into(out, *this, s);
  return out;
}

Array Array::astype(DType dt, const Stream* s) const {
  Array out = Array::empty(shape_, dt, device(), s);
  copy_into(out, *this, s);
  return out;
}

Array Array::to(Device d, const Stream* s, bool non_blocking) const {
  if (d == device()) return *this;
  const Stream* ss = (s && s->valid() && s->device() == d) || (s && s->valid() && s->device() == device()) ? s : nullptr;
  Array out = Array::empty(shape_, dtype_, d, d.is_cuda() ? ss : nullptr);
  copy_into(out, *this, ss);
  if (!non_blocking && d.is_cuda()) resolve_stream(ss, d).synchronize();
  return out;
}

}  // namespace gk
