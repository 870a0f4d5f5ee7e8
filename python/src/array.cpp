// gpukit.Array: properties, views, indexing, NumPy conversion.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>

#include "bind.h"
#include "gpukit/errors.h"

namespace gkpy {
using namespace gk;

namespace {

nb::dlpack::dtype dl_dtype(DType t) {
  using nb::dlpack::dtype_code;
  switch (t) {
    case DType::b8: return {uint8_t(dtype_code::Bool), 8, 1};
    case DType::u8: case DType::f8e4m3: case DType::f8e5m2: return {uint8_t(dtype_code::UInt), 8, 1};
    case DType::i8: return {uint8_t(dtype_code::Int), 8, 1};
    case DType::i16: return {uint8_t(dtype_code::Int), 16, 1};
    case DType::i32: return {uint8_t(dtype_code::Int), 32, 1};
    case DType::i64: return {uint8_t(dtype_code::Int), 64, 1};
    case DType::f16: return {uint8_t(dtype_code::Float), 16, 1};
    case DType::bf16: return {uint8_t(dtype_code::UInt), 16, 1};
    case DType::f32: return {uint8_t(dtype_code::Float), 32, 1};
    case DType::f64: return {uint8_t(dtype_code::Float), 64, 1};
  }
  return {};
}

DType from_dl_dtype(nb::dlpack::dtype d, const char* arg) {
  using nb::dlpack::dtype_code;
  auto c = dtype_code(d.code);
  if (d.lanes != 1) throw TypeError(cat(arg, ": vector dtypes are not supported"));
  if (c == dtype_code::Bool) return DType::b8;
  if (c == dtype_code::Float && d.bits == 16) return DType::f16;
  if (c == dtype_code::Float && d.bits == 32) return DType::f32;
  if (c == dtype_code::Float && d.bits == 64) return DType::f64;
  if (c == dtype_code::Bfloat && d.bits == 16) return DType::bf16;
  if (c == dtype_code::Int && d.bits == 8) return DType::i8;
  if (c == dtype_code::Int && d.bits == 16) return DType::i16;
  if (c == dtype_code::Int && d.bits == 32) return DType::i32;
  if (c == dtype_code::Int && d.bits == 64) return DType::i64;
  if (c == dtype_code::UInt && d.bits == 8) return DType::u8;
  throw TypeError(cat(arg, ": unsupported element type (code ", int(d.code), ", ", int(d.bits), " bits)"));
}

// A zero-copy NumPy view of a CPU array (bf16/fp8 as uint16/uint8 bits; the
// Python layer re-views them with ml_dtypes).
nb::object numpy_view(const Array& a) {
  auto* keep = new Array(a);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Array*>(p); });
  std::vector<size_t> shape(a.shape().begin(), a.shape().end());
  std::vector<int64_t> strides(a.strides().begin(), a.strides().end());
  nb::ndarray<nb::numpy> arr(a.data(), size_t(a.ndim()), shape.data(), owner, strides.data(), dl_dtype(a.dtype()),
                             nb::device::cpu::value, 0);
  return nb::cast(arr, nb::rv_policy::reference);
}

// One step of a basic index: applies key element `k` at dimension `dim` of `a`.
Array apply_index(const nb::tuple& key, const Array& src) {
  // Count dims consumed, expand the ellipsis.
  int consumed = 0, ellipsis = -1;
  for (size_t i = 0; i < key.size(); ++i) {
    nb::handle k = key[i];
    if (k.is(nb::ellipsis())) {
      if (ellipsis >= 0) throw IndexError("index: an index can only have a single ellipsis ('...')");
      ellipsis = int(i);
    } else if (!k.is_none()) {
      ++consumed;
    }
  }
  if (consumed > src.ndim())
    throw IndexError(cat("index: too many indices for array: array is ", src.ndim(), "-dimensional, but ", consumed,
                         " were indexed"));
  Array a = src;
  int dim = 0;
  for (size_t i = 0; i < key.size(); ++i) {
    nb::handle k = key[i];
    if (k.is(nb::ellipsis())) {
      dim += src.ndim() - consumed;
    } else if (k.is_none()) {
      a = a.unsqueeze(dim);
      ++dim;
    } else if (PySlice_Check(k.ptr())) {
      auto get = [&](const char* attr) -> std::optional<int64_t> {
        nb::object v = k.attr(attr);
        if (v.is_none()) return std::nullopt;
        if (!PyIndex_Check(v.ptr())) throw TypeError("index: slice indices must be integers or None");
        return nb::cast<int64_t>(nb::int_(v));
      };
      auto step = get("step");
      a = a.slice(dim, get("start"), get("stop"), step ? *step : 1);
      ++dim;
    } else if (PyIndex_Check(k.ptr()) && !PyBool_Check(k.ptr())) {
      a = a.select(dim, nb::cast<int64_t>(nb::int_(k)));
    } else {
      throw IndexError(cat("index: only integers, slices, None and ... are valid indices (advanced indexing with ",
                           nb::cast<std::string>(nb::str(k.type().attr("__name__"))), " is not supported)"));
    }
  }
  return a;
}

nb::tuple as_key(nb::handle key) {
  if (nb::isinstance<nb::tuple>(key)) return nb::borrow<nb::tuple>(key);
  return nb::make_tuple(key);
}

Array from_numpy(nb::ndarray<nb::ro, nb::device::cpu> arr, nb::handle dtype_override) {
  Shape shape(arr.ndim());
  Strides strides(arr.ndim());
  for (size_t i = 0; i < arr.ndim(); ++i) {
    shape[i] = int64_t(arr.shape(i));
    strides[i] = arr.stride(i);
  }
  DType t = dtype_override.is_none() ? from_dl_dtype(arr.dtype(), "array") : to_dtype(dtype_override);
  if (itemsize(t) * 8 != arr.dtype().bits) throw TypeError("dtype: item size does not match the array's");
  // Keep the NumPy array alive for as long as any view of it lives.
  nb::object keep = nb::cast(arr);
  auto* ref = new nb::object(keep);
  std::shared_ptr<void> owner(ref, [](void* p) {
    nb::gil_scoped_acquire g;
    delete static_cast<nb::object*>(p);
  });
  // Bytes spanned (for bounds of later as_strided views).
  int64_t lo = 0, hi = 0;
  int64_t n = 1;
  for (size_t i = 0; i < arr.ndim(); ++i) {
    n *= shape[i];
    int64_t e = (shape[i] - 1) * strides[i];
    (e < 0 ? lo : hi) += e;
  }
  if (lo < 0) {
    // negative strides: base the storage at the lowest address
    char* base = static_cast<char*>(const_cast<void*>(arr.data())) + lo * int64_t(itemsize(t));
    size_t nbytes = size_t(hi - lo + 1) * itemsize(t);
    auto st = std::make_shared<Storage>();
    st->ptr = base;
    st->nbytes = n ? nbytes : 0;
    st->owner = owner;
    return Array::from_storage(st, shape, strides, -lo, t);
  }
  size_t nbytes = n ? size_t(hi + 1) * itemsize(t) : 0;
  return Array::from_blob(const_cast<void*>(arr.data()), shape, strides, t, Device::cpu(), owner, nbytes);
}

}  // namespace

GK_BINDING(10, array) {
  nb::enum_<DType>(m, "DType", "Element type of a gpukit.Array.")
      .value("bool", DType::b8).value("uint8", DType::u8).value("int8", DType::i8).value("int16", DType::i16)
      .value("int32", DType::i32).value("int64", DType::i64).value("float8_e4m3fn", DType::f8e4m3)
      .value("float8_e5m2", DType::f8e5m2).value("float16", DType::f16).value("bfloat16", DType::bf16)
      .value("float32", DType::f32).value("float64", DType::f64);
  m.def("dtype_itemsize", [](nb::handle t) { return itemsize(to_dtype(t)); }, nb::arg("dtype"));
  m.def("dtype_name", [](nb::handle t) { return std::string(dtype_name(to_dtype(t))); }, nb::arg("dtype"));
  m.def("promote_types", [](nb::handle a, nb::handle b) { return promote(to_dtype(a, "a"), to_dtype(b, "b")); },
        nb::arg("a"), nb::arg("b"), "The dtype two arrays promote to in an elementwise op.");

  nb::class_<Device>(m, "Device")
      .def("__init__", [](Device* d, nb::handle spec) { new (d) Device(to_device(spec)); }, nb::arg("spec"))
      .def_prop_ro("type", [](const Device& d) { return d.is_cpu() ? "cpu" : "cuda"; })
      .def_prop_ro("index", [](const Device& d) { return d.index; })
      .def("__str__", &Device::str)
      .def("__repr__", [](const Device& d) { return "gpukit.Device('" + d.str() + "')"; })
      .def("__eq__", [](const Device& a, nb::handle b) {
        try {
          return a == to_device(b);
        } catch (...) {
          return false;
        }
      })
      .def("__hash__", [](const Device& d) { return int(d.kind) * 1000 + d.index; });

  nb::class_<Array> cls(m, "Array", "An n-dimensional array on the CPU or a CUDA device.");
  cls.def_prop_ro("shape", [](const Array& a) { return shape_tuple(a.shape()); })
      .def_prop_ro("strides", [](const Array& a) { return shape_tuple(a.strides()); }, "Strides in elements.")
      .def_prop_ro("offset", &Array::offset, "Offset of the first element in its storage, in elements.")
      .def_prop_ro("dtype", &Array::dtype)
      .def_prop_ro("device", &Array::device)
      .def_prop_ro("ndim", &Array::ndim)
      .def_prop_ro("size", &Array::numel)
      .def_prop_ro("nbytes", &Array::nbytes)
      .def_prop_ro("itemsize", [](const Array& a) { return a.itemsize(); })
      .def("numel", &Array::numel)
      .def("is_contiguous", &Array::is_contiguous)
      .def("data_ptr", [](const Array& a) { return reinterpret_cast<uintptr_t>(a.data()); },
           "Address of the first element (device address for CUDA arrays).")
      .def("storage_nbytes", [](const Array& a) { return a.storage()->nbytes; })
      .def("shares_memory", [](const Array& a, const Array& b) { return a.storage() == b.storage(); })
      .def("__len__", [](const Array& a) {
        if (a.ndim() == 0) throw TypeError("len() of a 0-d array");
        return a.shape()[0];
      })
      // views
      .def("reshape", [](const Array& a, nb::args shape) {
        if (shape.size() == 1 && !PyLong_Check(shape[0].ptr())) return a.reshape(to_shape(shape[0]));
        return a.reshape(to_shape(shape));
      }, "Reshapes without copying; raises ValueError when the strides do not allow a view.")
      .def("view", [](const Array& a, nb::args shape) {
        if (shape.size() == 1 && !PyLong_Check(shape[0].ptr())) return a.reshape(to_shape(shape[0]));
        return a.reshape(to_shape(shape));
      })
      .def("view_dtype", [](const Array& a, nb::handle t) { return a.view_dtype(to_dtype(t)); }, nb::arg("dtype"))
      .def("permute", [](const Array& a, nb::args dims) {
        std::vector<int> d;
        nb::handle src = (dims.size() == 1 && !PyLong_Check(dims[0].ptr())) ? dims[0] : nb::handle(dims);
        for (nb::handle x : nb::iter(src)) d.push_back(nb::cast<int>(x));
        return a.permute(d);
      })
      .def("transpose", [](const Array& a, nb::args dims) {
        if (dims.size() == 0) return a.T();
        if (dims.size() == 2 && PyLong_Check(dims[0].ptr())) return a.transpose(nb::cast<int>(dims[0]), nb::cast<int>(dims[1]));
        std::vector<int> d;
        nb::handle src = dims.size() == 1 ? dims[0] : nb::handle(dims);
        for (nb::handle x : nb::iter(src)) d.push_back(nb::cast<int>(x));
        return a.permute(d);
      })
      .def_prop_ro("T", &Array::T)
      .def("narrow", &Array::narrow, nb::arg("dim"), nb::arg("start"), nb::arg("length"))
      .def("select", &Array::select, nb::arg("dim"), nb::arg("index"))
      .def("squeeze", &Array::squeeze, nb::arg("dim") = nb::none())
      .def("unsqueeze", &Array::unsqueeze, nb::arg("dim"))
      .def("broadcast_to", [](const Array& a, nb::handle s) { return a.broadcast_to(to_shape(s)); }, nb::arg("shape"))
      .def("as_strided", [](const Array& a, nb::handle shape, nb::handle strides, int64_t offset) {
        return a.as_strided(to_shape(shape), to_shape(strides, "strides"), offset);
      }, nb::arg("shape"), nb::arg("strides"), nb::arg("offset") = 0)
      .def("__getitem__", [](const Array& a, nb::handle key) { return apply_index(as_key(key), a); })
      // copies
      .def("contiguous", [](const Array& a, nb::handle stream) {
        Stream st;
        return a.contiguous(to_stream(stream, st));
      }, nb::arg("stream") = nb::none())
      .def("copy", [](const Array& a, nb::handle stream) {
        Stream st;
        return a.copy(to_stream(stream, st));
      }, nb::arg("stream") = nb::none())
      .def("astype", [](const Array& a, nb::handle t, nb::handle stream) {
        Stream st;
        return a.astype(to_dtype(t), to_stream(stream, st));
      }, nb::arg("dtype"), nb::arg("stream") = nb::none())
      .def("to", [](const Array& a, nb::handle dev, nb::handle stream, bool non_blocking) {
        Stream st;
        const Stream* sp = to_stream(stream, st);
        Device d = to_device(dev);
        nb::gil_scoped_release rel;
        return a.to(d, sp, non_blocking);
      }, nb::arg("device"), nb::arg("stream") = nb::none(), nb::arg("non_blocking") = false)
      .def("_numpy_raw", [](const Array& a) {
        if (!a.device().is_cpu()) throw ValueError("array: not on the CPU");
        return numpy_view(a);
      });

  m.def("_from_numpy", &from_numpy, nb::arg("array"), nb::arg("dtype") = nb::none(),
        "Zero-copy view of a NumPy array (dtype overrides the element type of bit-compatible data).");
  m.def("_setitem", [](const Array& a, nb::handle key, nb::handle value, nb::handle stream) {
    Array view = apply_index(as_key(key), a);
    Stream st;
    const Stream* sp = to_stream(stream, st);
    if (is_scalar(value)) {
      Array v = full({}, to_scalar(value, "value"), view.dtype(), view.device(), sp);
      copy_into(view, v, sp);
    } else {
      copy_into(view, to_array(value, "value", &a), sp);
    }
  }, nb::arg("array"), nb::arg("key"), nb::arg("value"), nb::arg("stream") = nb::none());
  m.def("copy_into", [](const Array& dst, const Array& src, nb::handle stream) {
    Stream st;
    copy_into(dst, src, to_stream(stream, st));
  }, nb::arg("dst"), nb::arg("src"), nb::arg("stream") = nb::none(), "Copies src into dst (broadcasting, converting).");
  m.def("empty", [](nb::handle shape, nb::handle dtype, nb::handle device, nb::handle stream) {
    Stream st;
    return Array::empty(to_shape(shape), dtype.is_none() ? DType::f32 : to_dtype(dtype), to_device(device),
                        to_stream(stream, st));
  }, nb::arg("shape"), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), nb::arg("stream") = nb::none());
  m.def("full", [](nb::handle shape, nb::handle value, nb::handle dtype, nb::handle device, nb::handle stream) {
    Stream st;
    Scalar v = to_scalar(value, "fill_value");
    DType t = dtype.is_none() ? (v.is_bool ? DType::b8 : v.is_float ? DType::f32 : DType::i64) : to_dtype(dtype);
    return full(to_shape(shape), v, t, to_device(device), to_stream(stream, st));
  }, nb::arg("shape"), nb::arg("fill_value"), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
        nb::arg("stream") = nb::none());
  m.def("arange", [](double start, nb::handle stop, double step, nb::handle dtype, nb::handle device, nb::handle stream,
                     bool all_int) {
    Stream st;
    double b = start, e;
    if (stop.is_none()) {
      b = 0;
      e = start;
    } else {
      e = nb::cast<double>(stop);
    }
    DType t = dtype.is_none() ? (all_int ? DType::i64 : DType::f32) : to_dtype(dtype);
    return arange(b, e, step, t, to_device(device), to_stream(stream, st));
  }, nb::arg("start"), nb::arg("stop") = nb::none(), nb::arg("step") = 1.0, nb::arg("dtype") = nb::none(),
        nb::arg("device") = nb::none(), nb::arg("stream") = nb::none(), nb::arg("_all_int") = false);
}

}  // namespace gkpy
