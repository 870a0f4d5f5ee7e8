// Interop with other array libraries: DLPack (both directions, legacy and
// versioned capsules) and the CUDA Array Interface (version 3).
//
// Stream ordering on CUDA: an exporter records an event on gpukit's current
// stream and makes the consumer's stream wait on it; an importer passes
// gpukit's current stream to the producer (DLPack) or waits on the producer's
// stream (CUDA Array Interface).
#include <Python.h>

#include <cstring>
#include <limits>

#include "bind.h"
#include "dlpack_abi.h"
#include "core/cuda_util.h"
#include "gpukit/allocator.h"
#include "gpukit/errors.h"

namespace gkpy {
using namespace gk;

namespace {

constexpr const char* kLegacyName = "dltensor";
constexpr const char* kVersionedName = "dltensor_versioned";
constexpr const char* kUsedLegacyName = "used_dltensor";
constexpr const char* kUsedVersionedName = "used_dltensor_versioned";
constexpr int kMaxDims = 64;

[[noreturn]] void buffer_error(const std::string& msg) { throw nb::buffer_error(msg.c_str()); }

// ---- dtype mapping ----
dl::DataType to_dl(DType t) {
  uint8_t bits = uint8_t(itemsize(t) * 8);
  switch (t) {
    case DType::b8: return {dl::kBool, 8, 1};
    case DType::u8: return {dl::kUInt, 8, 1};
    case DType::i8: case DType::i16: case DType::i32: case DType::i64: return {dl::kInt, bits, 1};
    case DType::f8e4m3: return {dl::kFloat8_e4m3fn, 8, 1};
    case DType::f8e5m2: return {dl::kFloat8_e5m2, 8, 1};
    case DType::bf16: return {dl::kBfloat, 16, 1};
    case DType::f16: case DType::f32: case DType::f64: return {dl::kFloat, bits, 1};
  }
  return {dl::kFloat, bits, 1};
}

DType from_dl(dl::DataType d) {
  if (d.lanes != 1) throw TypeError(cat("dlpack: vector element types (", d.lanes, " lanes) are not supported"));
  switch (d.code) {
    case dl::kBool: if (d.bits == 8) return DType::b8; break;
    case dl::kUInt: if (d.bits == 8) return DType::u8; break;
    case dl::kInt:
      if (d.bits == 8) return DType::i8;
      if (d.bits == 16) return DType::i16;
      if (d.bits == 32) return DType::i32;
      if (d.bits == 64) return DType::i64;
      break;
    case dl::kFloat:
      if (d.bits == 16) return DType::f16;
      if (d.bits == 32) return DType::f32;
      if (d.bits == 64) return DType::f64;
      break;
    case dl::kBfloat: if (d.bits == 16) return DType::bf16; break;
    case dl::kFloat8_e4m3fn: if (d.bits == 8) return DType::f8e4m3; break;
    case dl::kFloat8_e5m2: if (d.bits == 8) return DType::f8e5m2; break;
    default: break;
  }
  static const char* names[] = {"int", "uint", "float", "opaque handle", "bfloat", "complex", "bool",
                                "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
                                "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"};
  std::string name = d.code < std::size(names) ? names[d.code] : cat("type code ", int(d.code));
  throw TypeError(cat("dlpack: element type ", name, " with ", int(d.bits), " bits is not supported by gpukit"));
}

// ---- devices and streams ----
Device cuda_device_checked(int64_t id, const char* what) {
  if (!built_with_cuda()) throw TypeError(cat(what, ": the data is on CUDA but gpukit was built without CUDA"));
  if (id < 0 || id >= cuda_device_count())
    throw ValueError(cat(what, ": the data is on cuda:", id, ", which is not an available CUDA device"));
  return Device::cuda(int(id));
}

Device from_dl_device(dl::Device d) {
  switch (d.device_type) {
    case dl::kCPU:
    case dl::kCUDAHost:  // pinned host memory: the CPU reads it directly
      return Device::cpu();
    case dl::kCUDA:
    case dl::kCUDAManaged:  // managed memory: used as memory of the GPU it belongs to
      return cuda_device_checked(d.device_id, "dlpack");
    default:
      throw TypeError(cat("dlpack: device type ", d.device_type,
                          " is not supported (gpukit accepts CPU, CUDA, CUDA host and CUDA managed memory)"));
  }
}

// Interprets a stream number of the DLPack / CUDA Array Interface protocols:
// 1 is the legacy default stream, 2 the per-thread default stream, others a
// cudaStream_t. Returns null for "no synchronization".
void* stream_handle(int64_t v) {
  if (v == -1) return nullptr;
  return reinterpret_cast<void*>(static_cast<uintptr_t>(v));
}

// Makes work later submitted to `consumer` wait for what is already on `producer`.
void order_streams(Device dev, void* producer, void* consumer) {
  if (!producer || !consumer || producer == consumer) return;
  Event e = Event::create(dev, false);
  e.record(Stream::external(dev, producer));
  Stream::external(dev, consumer).wait(e);
}

// ---- export ----
struct ExportCtx {
  Array keep;  // holds the memory until the consumer calls the deleter
  std::vector<int64_t> shape, strides;
};

template <class M>
void export_deleter(M* m) {
  if (!m) return;
  delete static_cast<ExportCtx*>(m->manager_ctx);
  delete m;
}

template <class M>
void capsule_destructor(PyObject* cap) {
  // Called when the capsule dies. If no consumer renamed it, we still own the tensor.
  const char* name = std::is_same_v<M, dl::ManagedTensorVersioned> ? kVersionedName : kLegacyName;
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  if (PyCapsule_IsValid(cap, name)) {
    auto* m = static_cast<M*>(PyCapsule_GetPointer(cap, name));
    if (m && m->deleter) m->deleter(m);
  }
  PyErr_Restore(t, v, tb);
}

template <class M>
nb::object make_capsule(const Array& a, bool versioned_minor1, bool copied) {
  auto ctx = std::make_unique<ExportCtx>();
  ctx->keep = a;
  ctx->shape = a.shape();
  ctx->strides = a.strides();
  auto m = std::make_unique<M>();
  std::memset(static_cast<void*>(m.get()), 0, sizeof(M));
  dl::Tensor& t = m->dl_tensor;
  t.data = a.numel() ? a.data() : nullptr;
  t.device = a.device().is_cuda() ? dl::Device{dl::kCUDA, a.device().index} : dl::Device{dl::kCPU, 0};
  t.ndim = a.ndim();
  t.dtype = to_dl(a.dtype());
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  m->manager_ctx = ctx.get();
  m->deleter = &export_deleter<M>;
  const char* name = kLegacyName;
  if constexpr (std::is_same_v<M, dl::ManagedTensorVersioned>) {
    m->version = {1, versioned_minor1 ? 1u : 0u};
    m->flags = copied ? dl::kFlagIsCopied : 0;
    name = kVersionedName;
  }
  PyObject* cap = PyCapsule_New(m.get(), name, &capsule_destructor<M>);
  if (!cap) throw nb::python_error();
  ctx.release();
  m.release();
  return nb::steal(cap);
}

int64_t to_int(nb::handle h, const char* what) {
  if (!PyLong_Check(h.ptr()) || PyBool_Check(h.ptr())) throw TypeError(cat(what, ": expected an int"));
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    throw ValueError(cat(what, ": integer out of range"));
  }
  return v;
}

std::optional<bool> opt_bool(nb::handle h, const char* arg) {
  if (h.is_none()) return std::nullopt;
  if (!PyBool_Check(h.ptr())) throw TypeError(cat(arg, ": expected True, False or None"));
  return h.ptr() == Py_True;
}

nb::object dlpack_export(const Array& self, nb::handle stream, nb::handle max_version, nb::handle dl_device,
                         nb::handle copy_h) {
  if (!self.defined()) throw ValueError("__dlpack__: undefined array");
  std::optional<bool> copy = opt_bool(copy_h, "copy");
  // Which capsule the consumer understands.
  bool versioned = false, minor1 = false;
  if (!max_version.is_none()) {
    if (!nb::isinstance<nb::tuple>(max_version) || nb::len(max_version) != 2)
      throw TypeError("max_version: expected a tuple (major, minor) or None");
    int64_t major = to_int(max_version[0], "max_version"), minor = to_int(max_version[1], "max_version");
    versioned = major >= 1;
    minor1 = major > 1 || (major == 1 && minor >= 1);
  }
  Array a = self;
  bool copied = false;
  if (!dl_device.is_none()) {
    if (!nb::isinstance<nb::tuple>(dl_device) || nb::len(dl_device) != 2)
      throw TypeError("dl_device: expected a tuple (device_type, device_id) or None");
    int64_t type = to_int(dl_device[0], "dl_device"), id = to_int(dl_device[1], "dl_device");
    Device target;
    if (type == dl::kCPU) target = Device::cpu();
    else if (type == dl::kCUDA) {
      if (id < 0 || id >= cuda_device_count()) buffer_error(cat("dl_device: cuda:", id, " is not available"));
      target = Device::cuda(int(id));
    } else {
      buffer_error(cat("dl_device: device type ", type, " is not supported by gpukit"));
    }
    if (target != a.device()) {
      if (copy == false)
        buffer_error(cat("__dlpack__: exporting a ", a.device().str(), " array to ", target.str(),
                         " needs a copy, but copy=False"));
      nb::gil_scoped_release rel;
      a = a.to(target);
      copied = true;
    }
  }
  if (copy == true && !copied) {
    a = a.copy();
    copied = true;
  }
  if (a.device().is_cuda()) {
    // The consumer's stream: None means the legacy default stream; -1 asks for no synchronization.
    void* consumer = reinterpret_cast<void*>(uintptr_t(1));
    if (!stream.is_none()) {
      if (!PyLong_Check(stream.ptr()) || PyBool_Check(stream.ptr()))
        throw TypeError("stream: expected an int (a cudaStream_t, 1, 2 or -1) or None");
      int64_t v = to_int(stream, "stream");
      if (v == 0)
        throw ValueError("stream: 0 is ambiguous in the DLPack protocol; pass 1 for the legacy default stream, "
                         "2 for the per-thread default stream");
      if (v < -1) throw ValueError(cat("stream: invalid stream ", v));
      consumer = stream_handle(v);
    }
    order_streams(a.device(), Stream::current(a.device()).handle(), consumer);
    // The consumer may still be using the memory when it releases it. For the legacy
    // default stream (torch's and CuPy's default), which never goes away, gpukit's
    // allocator then waits for that stream before reusing the block. (Other consumer
    // streams may be destroyed before the memory is freed, so they are not recorded.)
    if (consumer == reinterpret_cast<void*>(uintptr_t(1)))
      record_stream(*a.storage(), Stream::external(a.device(), consumer));
  }
  // (A stream given for a CPU array is ignored: there is nothing to order.)
  if (versioned) return make_capsule<dl::ManagedTensorVersioned>(a, minor1, copied);
  return make_capsule<dl::ManagedTensor>(a, false, copied);
}

// ---- import ----

// Validated view of a DLTensor or CUDA-array-interface description.
struct Layout {
  Shape shape;
  Strides strides;  // elements
  DType dtype = DType::f32;
  Device device;
  char* data = nullptr;  // address of element (0, ..., 0)
};

// Checks a foreign layout; returns the element span [lo, hi] relative to element
// (0, ..., 0). Throws before anything is owned.
std::pair<int64_t, int64_t> check_layout(const Layout& L, const char* what) {
  int64_t n = checked_numel(L.shape, L.dtype, what);
  int64_t isz = int64_t(itemsize(L.dtype));
  int64_t lo = 0, hi = 0;
  if (n == 0) return {0, 0};
  if (!L.data) throw ValueError(cat(what, ": null data pointer for a non-empty array"));
  if (reinterpret_cast<uintptr_t>(L.data) % uintptr_t(isz))
    throw ValueError(cat(what, ": data pointer is not aligned to the item size (", isz, " bytes)"));
  for (size_t i = 0; i < L.shape.size(); ++i) {
    int64_t e;
    bool bad = __builtin_mul_overflow(L.shape[i] - 1, L.strides[i], &e);
    if (!bad) bad = e < 0 ? __builtin_add_overflow(lo, e, &lo) : __builtin_add_overflow(hi, e, &hi);
    if (bad) throw ValueError(cat(what, ": strides overflow for shape ", shape_str(L.shape)));
  }
  int64_t span, bytes;
  if (__builtin_sub_overflow(hi, lo, &span) || __builtin_add_overflow(span, 1, &span) ||
      __builtin_mul_overflow(span, isz, &bytes) || __builtin_mul_overflow(-lo, isz, &bytes))
    throw ValueError(cat(what, ": strides overflow for shape ", shape_str(L.shape)));
  return {lo, hi};
}

// Wraps a checked layout (no copy). `owner` releases the foreign memory.
Array wrap(const Layout& L, std::pair<int64_t, int64_t> span, std::shared_ptr<void> owner) {
  auto [lo, hi] = span;
  int64_t isz = int64_t(itemsize(L.dtype));
  bool empty = checked_numel(L.shape, L.dtype) == 0;
  auto st = std::make_shared<Storage>();
  st->ptr = L.data + lo * isz;
  st->nbytes = empty ? 0 : size_t(hi - lo + 1) * size_t(isz);
  st->device = L.device;
  st->owner = std::move(owner);
  return Array::from_storage(std::move(st), L.shape, L.strides, -lo, L.dtype);
}

// A copy (asked for, or needed because gpukit arrays are always writable and the
// source is read-only). It is finished before the source is released.
Array finish_copy(const Array& view, bool read_only, std::optional<bool> copy, const char* what) {
  if (!read_only && copy != true) return view;
  if (copy == false)
    buffer_error(cat(what, ": the source is read-only and gpukit arrays are writable; a copy is needed but copy=False"));
  nb::gil_scoped_release rel;
  Array c = view.copy();
  if (c.device().is_cuda()) Stream::current(c.device()).synchronize();
  return c;
}

// Calls the DLPack deleter, with the GIL held (some producers touch Python objects).
struct DlOwner {
  void* managed;
  bool versioned;
  void operator()(void*) const {
    if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than crash
    PyGILState_STATE g = PyGILState_Ensure();
    if (versioned) {
      auto* m = static_cast<dl::ManagedTensorVersioned*>(managed);
      if (m->deleter) m->deleter(m);
    } else {
      auto* m = static_cast<dl::ManagedTensor*>(managed);
      if (m->deleter) m->deleter(m);
    }
    PyGILState_Release(g);
  }
};

Array dlpack_import(nb::handle cap, nb::handle copy_h) {
  std::optional<bool> copy = opt_bool(copy_h, "copy");
  PyObject* c = cap.ptr();
  if (!PyCapsule_CheckExact(c)) throw TypeError("from_dlpack: expected a DLPack capsule");
  const char* name = PyCapsule_GetName(c);
  if (!name) throw nb::python_error();
  bool versioned;
  if (std::strcmp(name, kVersionedName) == 0) versioned = true;
  else if (std::strcmp(name, kLegacyName) == 0) versioned = false;
  else if (std::strcmp(name, kUsedVersionedName) == 0 || std::strcmp(name, kUsedLegacyName) == 0)
    throw ValueError("from_dlpack: this DLPack capsule was already consumed");
  else throw TypeError(cat("from_dlpack: expected a DLPack capsule, got a capsule named '", name, "'"));
  void* managed = PyCapsule_GetPointer(c, name);
  if (!managed) throw nb::python_error();
  dl::Tensor* t;
  uint64_t flags = 0;
  if (versioned) {
    auto* m = static_cast<dl::ManagedTensorVersioned*>(managed);
    if (m->version.major != 1) {
      // Another ABI: only the deleter may be touched. Take ownership and release it.
      PyCapsule_SetName(c, kUsedVersionedName);
      if (m->deleter) m->deleter(m);
      buffer_error(cat("from_dlpack: DLPack major version ", m->version.major, " is not supported (gpukit reads 1)"));
    }
    t = &m->dl_tensor;
    flags = m->flags;
  } else {
    t = &static_cast<dl::ManagedTensor*>(managed)->dl_tensor;
  }
  // Validate before taking ownership: on error the capsule still frees the tensor.
  if (t->ndim < 0 || t->ndim > kMaxDims)
    throw ValueError(cat("from_dlpack: ndim ", t->ndim, " is out of range (0 to ", kMaxDims, ")"));
  if (t->ndim > 0 && !t->shape) throw ValueError("from_dlpack: null shape");
  Layout L;
  L.dtype = from_dl(t->dtype);
  L.device = from_dl_device(t->device);
  L.shape.assign(t->shape, t->shape + t->ndim);
  for (int64_t d : L.shape)
    if (d < 0) throw ValueError(cat("from_dlpack: negative dimension in shape ", shape_str(L.shape)));
  if (t->strides) L.strides.assign(t->strides, t->strides + t->ndim);
  else L.strides = contiguous_strides(L.shape);
  if (t->byte_offset > uint64_t(std::numeric_limits<int64_t>::max()))
    throw ValueError("from_dlpack: byte_offset out of range");
  L.data = static_cast<char*>(t->data) + t->byte_offset;
  auto span = check_layout(L, "from_dlpack");
  // Take ownership: rename the capsule, the deleter now belongs to the array.
  if (PyCapsule_SetName(c, versioned ? kUsedVersionedName : kUsedLegacyName) != 0) throw nb::python_error();
  std::shared_ptr<void> owner(managed, DlOwner{managed, versioned});  // calls the deleter itself if it throws
  Array a = wrap(L, span, std::move(owner));
  return finish_copy(a, flags & dl::kFlagReadOnly, copy, "from_dlpack");
}

// ---- CUDA Array Interface ----
// Raised for dtypes the interface cannot describe: a TypeError that is also an
// AttributeError, so hasattr() is False and consumers fall back to DLPack.
PyObject* g_no_typestr = nullptr;

nb::object cai_typestr(DType t) {
  switch (t) {
    case DType::b8: return nb::str("|b1");
    case DType::u8: return nb::str("|u1");
    case DType::i8: return nb::str("|i1");
    case DType::i16: return nb::str("<i2");
    case DType::i32: return nb::str("<i4");
    case DType::i64: return nb::str("<i8");
    case DType::f16: return nb::str("<f2");
    case DType::f32: return nb::str("<f4");
    case DType::f64: return nb::str("<f8");
    default: {
      std::string msg = cat("__cuda_array_interface__: dtype ", dtype_name(t),
                            " has no typestr in the CUDA Array Interface; use __dlpack__ instead");
      PyErr_SetString(g_no_typestr ? g_no_typestr : PyExc_TypeError, msg.c_str());
      throw nb::python_error();
    }
  }
}

DType parse_typestr(const std::string& s) {
  auto bad = [&]() -> DType {
    throw TypeError(cat("__cuda_array_interface__: typestr '", s, "' is not supported by gpukit"));
  };
  if (s.size() < 3) return bad();
  char order = s[0], kind = s[1];
  std::string size = s.substr(2);
  if (size != "1" && size != "2" && size != "4" && size != "8") return bad();
  int n = size[0] - '0';
  if (order == '>' && n > 1) throw TypeError(cat("__cuda_array_interface__: big-endian typestr '", s, "'"));
  if (order != '<' && order != '|' && order != '>' && order != '=') return bad();
  if (kind == 'b' && n == 1) return DType::b8;
  if (kind == 'u' && n == 1) return DType::u8;
  if (kind == 'i') return n == 1 ? DType::i8 : n == 2 ? DType::i16 : n == 4 ? DType::i32 : DType::i64;
  if (kind == 'f' && n > 1) return n == 2 ? DType::f16 : n == 4 ? DType::f32 : DType::f64;
  return bad();
}

nb::object cai_export(const Array& a) {
  if (!a.defined() || !a.device().is_cuda())
    throw nb::attribute_error("__cuda_array_interface__: only CUDA arrays have it (use __array__ or __dlpack__)");
  nb::object typestr = cai_typestr(a.dtype());
  nb::dict d;
  d["shape"] = shape_tuple(a.shape());
  d["typestr"] = typestr;
  nb::list descr;
  descr.append(nb::make_tuple(nb::str(""), typestr));
  d["descr"] = descr;
  d["data"] = nb::make_tuple(nb::int_(a.numel() ? reinterpret_cast<uintptr_t>(a.data()) : uintptr_t(0)), false);
  if (a.is_contiguous()) {
    d["strides"] = nb::none();
  } else {
    Shape bytes(a.strides());
    for (auto& s : bytes) s *= int64_t(a.itemsize());
    d["strides"] = shape_tuple(bytes);
  }
  d["version"] = 3;
  // The consumer must order its work after gpukit's current stream.
  d["stream"] = nb::int_(reinterpret_cast<uintptr_t>(Stream::current(a.device()).handle()));
  return d;
}

// The device a CUDA pointer belongs to.
Device device_of_pointer(const void* p) {
#if GPUKIT_WITH_CUDA
  if (!cuda_available()) throw TypeError("__cuda_array_interface__: CUDA is not available to gpukit");
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err == cudaErrorInvalidValue) {
    cudaGetLastError();
    throw ValueError("__cuda_array_interface__: data is not a CUDA pointer");
  }
  GK_CUDA_CHECK(err);
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)
    return cuda_device_checked(attr.device, "__cuda_array_interface__");
  if (attr.type == cudaMemoryTypeHost) return Device::cpu();  // pinned host memory
  throw ValueError("__cuda_array_interface__: data is not a CUDA device pointer");
#else
  (void)p;
  throw TypeError("__cuda_array_interface__: gpukit was built without CUDA");
#endif
}

Array cai_import(nb::handle desc, nb::handle keep, nb::handle copy_h) {
  std::optional<bool> copy = opt_bool(copy_h, "copy");
  if (!nb::isinstance<nb::dict>(desc)) throw TypeError("__cuda_array_interface__: expected a dict");
  nb::dict d = nb::borrow<nb::dict>(desc);
  auto get = [&](const char* k) -> nb::object {
    if (!d.contains(k)) return nb::none();
    return d[k];
  };
  for (const char* k : {"shape", "typestr", "data", "version"})
    if (!d.contains(k)) throw ValueError(cat("__cuda_array_interface__: missing the '", k, "' entry"));
  int64_t version = to_int(get("version"), "__cuda_array_interface__ version");
  if (version < 0 || version > 3) throw ValueError(cat("__cuda_array_interface__: version ", version, " is not supported"));
  if (!get("mask").is_none()) throw ValueError("__cuda_array_interface__: masked arrays are not supported");
  Layout L;
  if (!nb::isinstance<nb::str>(get("typestr"))) throw TypeError("__cuda_array_interface__: 'typestr' must be a str");
  L.dtype = parse_typestr(nb::cast<std::string>(get("typestr")));
  L.shape = to_shape(get("shape"), "__cuda_array_interface__ shape");
  if (L.shape.size() > size_t(kMaxDims)) throw ValueError("__cuda_array_interface__: too many dimensions");
  for (int64_t s : L.shape)
    if (s < 0) throw ValueError(cat("__cuda_array_interface__: negative dimension in shape ", shape_str(L.shape)));
  checked_numel(L.shape, L.dtype, "__cuda_array_interface__");
  nb::object data = get("data");
  if (!nb::isinstance<nb::tuple>(data) || nb::len(data) != 2)
    throw TypeError("__cuda_array_interface__: 'data' must be a tuple (pointer, read_only)");
  if (!PyLong_Check(nb::object(data[0]).ptr())) throw TypeError("__cuda_array_interface__: the data pointer must be an int");
  unsigned long long ptr = PyLong_AsUnsignedLongLong(nb::object(data[0]).ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw ValueError("__cuda_array_interface__: the data pointer is out of range");
  }
  bool read_only = PyObject_IsTrue(nb::object(data[1]).ptr()) == 1;
  nb::object strides = get("strides");
  int64_t isz = int64_t(itemsize(L.dtype));
  if (strides.is_none()) {
    L.strides = contiguous_strides(L.shape);
  } else {
    Shape b = to_shape(strides, "__cuda_array_interface__ strides");
    if (b.size() != L.shape.size())
      throw ValueError(cat("__cuda_array_interface__: ", b.size(), " strides for shape ", shape_str(L.shape)));
    for (int64_t& s : b) {
      if (s % isz) throw ValueError(cat("__cuda_array_interface__: stride ", s, " is not a multiple of the item size"));
      s /= isz;
    }
    L.strides = b;
  }
  L.data = reinterpret_cast<char*>(ptr);
  auto span = check_layout(L, "__cuda_array_interface__");
  if (checked_numel(L.shape, L.dtype) > 0) {
    L.device = device_of_pointer(L.data);
  } else {
    L.device = cuda_available() ? Device::cuda(0) : Device::cpu();
  }
  // The producer's stream: our current stream waits on it (None: nothing to wait for).
  nb::object s = get("stream");
  if (!s.is_none() && L.device.is_cuda()) {
    if (!PyLong_Check(s.ptr()) || PyBool_Check(s.ptr()))
      throw TypeError("__cuda_array_interface__: 'stream' must be an int or None");
    int64_t v = to_int(s, "__cuda_array_interface__ stream");
    if (v == 0) v = 1;  // disallowed by the spec; read as the legacy default stream
    if (v < -1) throw ValueError(cat("__cuda_array_interface__: invalid stream ", v));
    order_streams(L.device, stream_handle(v), Stream::current(L.device).handle());
  }
  auto* ref = new nb::object(nb::borrow(keep));
  std::shared_ptr<void> owner(ref, [](void* p) {
    if (!Py_IsInitialized()) return;
    PyGILState_STATE g = PyGILState_Ensure();
    delete static_cast<nb::object*>(p);
    PyGILState_Release(g);
  });
  Array a = wrap(L, span, std::move(owner));
  return finish_copy(a, read_only, copy, "__cuda_array_interface__");
}

}  // namespace

GK_BINDING(15, dlpack) {
  nb::handle cls = nb::type<Array>();
  nb::setattr(cls, "__dlpack__", nb::cpp_function(
      [](const Array& self, nb::handle stream, nb::handle max_version, nb::handle dl_device, nb::handle copy) {
        return dlpack_export(self, stream, max_version, dl_device, copy);
      },
      nb::is_method(), nb::kw_only(), nb::arg("stream") = nb::none(), nb::arg("max_version") = nb::none(),
      nb::arg("dl_device") = nb::none(), nb::arg("copy") = nb::none(),
      "Exports the array as a DLPack capsule (the Python array API protocol). stream: the consumer's CUDA "
      "stream (None: legacy default, 1: legacy default, 2: per-thread default, -1: no synchronization)."));
  nb::setattr(cls, "__dlpack_device__", nb::cpp_function(
      [](const Array& self) {
        Device d = self.device();
        return d.is_cuda() ? nb::make_tuple(int(dl::kCUDA), d.index) : nb::make_tuple(int(dl::kCPU), 0);
      },
      nb::is_method(), "(device_type, device_id) of the DLPack protocol."));
  nb::object bases = nb::make_tuple(nb::handle(PyExc_AttributeError), nb::handle(PyExc_TypeError));
  g_no_typestr = PyErr_NewException("gpukit.CudaArrayInterfaceTypeError", bases.ptr(), nullptr);
  if (!g_no_typestr) throw nb::python_error();
  m.attr("CudaArrayInterfaceTypeError") = nb::handle(g_no_typestr);
  nb::object property = nb::module_::import_("builtins").attr("property");
  nb::setattr(cls, "__cuda_array_interface__", property(nb::cpp_function(
      [](const Array& self) { return cai_export(self); }, nb::is_method(),
      "The CUDA Array Interface (version 3) of a CUDA array.")));
  m.def("_from_dlpack_capsule", &dlpack_import, nb::arg("capsule"), nb::arg("copy") = nb::none(),
        "Wraps a DLPack capsule ('dltensor' or 'dltensor_versioned') without copying and marks it consumed.");
  m.def("_from_cai", &cai_import, nb::arg("interface"), nb::arg("owner"), nb::arg("copy") = nb::none(),
        "Wraps memory described by a __cuda_array_interface__ dict; owner is kept alive.");
}

}  // namespace gkpy
