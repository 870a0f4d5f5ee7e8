// gk::Array: an n-dimensional view (shape, strides in elements, offset) over a
// reference-counted Storage on one device.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpukit/device.h"
#include "gpukit/dtype.h"
#include "gpukit/stream.h"

namespace gk {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "(2, 3)"

// Bytes that back an array. Memory is either gpukit's (from the allocator) or
// external (NumPy, DLPack, mmap), kept alive by `owner`.
struct Storage {
  void* ptr = nullptr;
  size_t nbytes = 0;
  Device device;
  std::shared_ptr<void> owner;  // external memory: released when the last view dies
  // Allocator bookkeeping for gpukit-owned CUDA memory.
  void* block = nullptr;
  void* alloc_stream = nullptr;
  std::vector<Stream> used_on;  // other streams the memory was used on (record_stream)
  std::mutex mu;
  bool cpu_owned = false;
  ~Storage();
};

class Array {
 public:
  Array() = default;
  // Uninitialized contiguous array (row-major).
  static Array empty(const Shape& shape, DType dtype, Device device = {}, const Stream* stream = nullptr);
  // A view of external memory; `owner` keeps it alive. Bounds are not checked here:
  // callers validate them.
  static Array from_blob(void* data, const Shape& shape, const Strides& strides, DType dtype,
                         Device device, std::shared_ptr<void> owner, size_t nbytes);
  static Array from_storage(std::shared_ptr<Storage> st, const Shape& shape, const Strides& strides,
                            int64_t offset, DType dtype);

  bool defined() const { return bool(st_); }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t shape(int d) const { return shape_[norm_dim(d)]; }
  int64_t stride(int d) const { return strides_[norm_dim(d)]; }
  int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const { return st_ ? st_->device : Device{}; }
  int ndim() const { return int(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * gk::itemsize(dtype_); }
  size_t itemsize() const { return gk::itemsize(dtype_); }
  void* data() const { return st_ ? static_cast<char*>(st_->ptr) + offset_ * int64_t(itemsize()) : nullptr; }
  template <class T> T* data_as() const { return static_cast<T*>(data()); }
  const std::shared_ptr<Storage>& storage() const { return st_; }
  bool is_contiguous() const;
  // Normalizes a possibly negative dimension; throws IndexError naming `arg`.
  int norm_dim(int d, const char* arg = "dim") const;

  // ---- views (never copy) ----
  Array reshape(const Shape& shape) const;  // -1 allowed once; ValueError if strides forbid a view
  std::optional<Array> try_view(const Shape& shape) const;
  Array permute(const std::vector<int>& dims) const;
  Array transpose(int a, int b) const;
  Array T() const;  // reverses all dimensions
  Array slice(int dim, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step = 1) const;
  Array narrow(int dim, int64_t start, int64_t length) const;
  Array select(int dim, int64_t index) const;  // removes `dim`
  Array squeeze(std::optional<int> dim = std::nullopt) const;
  Array unsqueeze(int dim) const;
  Array broadcast_to(const Shape& shape) const;
  Array as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;
  Array view_dtype(DType dtype) const;  // reinterprets bytes; last dim rescaled

  // ---- copies (ops; run on `stream` or the current stream) ----
  Array contiguous(const Stream* s = nullptr) const;  // returns *this if already contiguous
  Array copy(const Stream* s = nullptr) const;
  Array astype(DType dtype, const Stream* s = nullptr) const;
  Array to(Device d, const Stream* s = nullptr, bool non_blocking = false) const;

 private:
  std::shared_ptr<Storage> st_;
  Shape shape_;
  Strides strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
};

Strides contiguous_strides(const Shape& shape);
// Number of elements, checked against overflow of the element and byte counts;
// throws ValueError naming `arg` for negative dimensions or overflow.
int64_t checked_numel(const Shape& shape, DType dtype, const char* arg = "shape");
// NumPy broadcasting of two shapes; ValueError naming the shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what = "operands");

}  // namespace gk
