// Conversions from Python arguments to gpukit types.
#include <nanobind/ndarray.h>

#include "bind.h"
#include "gpukit/errors.h"

namespace gkpy {

using namespace gk;

nb::object dtype_object(DType t) {
  return nb::cast(t);
}

DType to_dtype(nb::handle h, const char* arg) {
  if (h.is_none()) throw TypeError(cat(arg, ": a dtype is required"));
  if (nb::isinstance<DType>(h)) return nb::cast<DType>(h);
  if (nb::isinstance<nb::str>(h)) return dtype_from_name(nb::cast<std::string>(h), arg);
  // NumPy dtypes and scalar types, torch dtypes, Python types: go by name.
  if (h.is(nb::handle((PyObject*)&PyFloat_Type))) return DType::f64;
  if (h.is(nb::handle((PyObject*)&PyLong_Type))) return DType::i64;
  if (h.is(nb::handle((PyObject*)&PyBool_Type))) return DType::b8;
  std::string name;
  if (nb::hasattr(h, "name") && nb::isinstance<nb::str>(h.attr("name"))) name = nb::cast<std::string>(h.attr("name"));
  else if (nb::hasattr(h, "__name__")) name = nb::cast<std::string>(h.attr("__name__"));
  else name = nb::cast<std::string>(nb::str(h));
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  return dtype_from_name(name, arg);
}

std::optional<DType> to_dtype_opt(nb::handle h, const char* arg) {
  if (h.is_none()) return std::nullopt;
  return to_dtype(h, arg);
}

Device to_device(nb::handle h, const char* arg) {
  if (h.is_none()) return Device::cpu();
  if (nb::isinstance<Device>(h)) {
    Device d = nb::cast<Device>(h);
    if (d.is_cuda()) return Device::parse(d.str(), arg);  // validates the index
    return d;
  }
  if (nb::isinstance<nb::str>(h)) return Device::parse(nb::cast<std::string>(h), arg);
  if (nb::hasattr(h, "type") && nb::hasattr(h, "index")) {  // torch.device
    std::string s = nb::cast<std::string>(nb::str(h));
    return Device::parse(s, arg);
  }
  throw TypeError(cat(arg, ": expected a device such as 'cpu' or 'cuda:0', got ",
                      nb::cast<std::string>(nb::str(h.type().attr("__name__")))));
}

Shape to_shape(nb::handle h, const char* arg) {
  Shape s;
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
    s.push_back(nb::cast<int64_t>(h));
  } else if (nb::isinstance<nb::sequence>(h) && !nb::isinstance<nb::str>(h)) {
    for (nb::handle x : nb::iter(h)) {
      if (!PyLong_Check(x.ptr()) && !PyIndex_Check(x.ptr()))
        throw TypeError(cat(arg, ": dimensions must be integers"));
      int64_t v;
      try {
        v = nb::cast<int64_t>(nb::int_(x));
      } catch (const nb::cast_error&) {
        throw ValueError(cat(arg, ": dimension does not fit in 64 bits"));
      }
      s.push_back(v);
    }
  } else {
    throw TypeError(cat(arg, ": expected an int or a sequence of ints"));
  }
  return s;
}

const Stream* to_stream(nb::handle h, Stream& storage, const char* arg) {
  if (h.is_none()) return nullptr;
  if (nb::isinstance<Stream>(h)) {
    storage = nb::cast<Stream>(h);
    return &storage;
  }
  throw TypeError(cat(arg, ": expected a gpukit.Stream or None"));
}

bool is_scalar(nb::handle h) {
  return PyBool_Check(h.ptr()) || PyLong_Check(h.ptr()) || PyFloat_Check(h.ptr());
}

Scalar to_scalar(nb::handle h, const char* arg) {
  if (PyBool_Check(h.ptr())) return Scalar::of_bool(h.ptr() == Py_True);
  if (PyLong_Check(h.ptr())) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
    if (overflow) throw ValueError(cat(arg, ": Python integer does not fit in 64 bits"));
    return Scalar::of_int(v);
  }
  if (PyFloat_Check(h.ptr())) return Scalar::of(PyFloat_AsDouble(h.ptr()));
  throw TypeError(cat(arg, ": expected a number, got ", nb::cast<std::string>(nb::str(h.type().attr("__name__")))));
}

nb::tuple shape_tuple(const Shape& s) {
  nb::list l;
  for (int64_t d : s) l.append(d);
  return nb::tuple(l);
}

Array to_array(nb::handle h, const char* arg, const Array* like) {
  if (nb::isinstance<Array>(h)) return nb::cast<Array>(h);
  nb::module_ gk = nb::module_::import_("gpukit");
  nb::object r;
  try {
    r = like ? gk.attr("asarray")(h, nb::arg("device") = nb::cast(like->device()))
             : gk.attr("asarray")(h);
  } catch (nb::python_error& e) {
    throw TypeError(cat(arg, ": cannot convert ", nb::cast<std::string>(nb::str(h.type().attr("__name__"))),
                        " to a gpukit.Array (", nb::cast<std::string>(nb::str(e.value())), ")"));
  }
  return nb::cast<Array>(r);
}

}  // namespace gkpy
