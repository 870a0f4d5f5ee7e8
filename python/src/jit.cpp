// gk.jit: NVRTC-compiled kernels. JitError, the JitKernel class and cache/NVRTC queries.
#include <nanobind/stl/pair.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/jit.h"

namespace gkpy {
using namespace gk;
using namespace gk::jit;

namespace {

nb::object g_jit_error;

std::string py_type_name(nb::handle h) { return nb::cast<std::string>(nb::str(h.type().attr("__name__"))); }

std::optional<DType> torch_dtype(nb::handle dt) {
  static const std::pair<const char*, DType> m[] = {
      {"torch.float32", DType::f32}, {"torch.float64", DType::f64}, {"torch.float16", DType::f16},
      {"torch.bfloat16", DType::bf16}, {"torch.int8", DType::i8}, {"torch.uint8", DType::u8},
      {"torch.int16", DType::i16}, {"torch.int32", DType::i32}, {"torch.int64", DType::i64},
      {"torch.bool", DType::b8}, {"torch.float8_e4m3fn", DType::f8e4m3}, {"torch.float8_e5m2", DType::f8e5m2}};
  std::string s = nb::cast<std::string>(nb::str(dt));
  for (auto& [n, t] : m)
    if (s == n) return t;
  return std::nullopt;
}

std::optional<DType> typestr_dtype(const std::string& s) {
  static const std::pair<const char*, DType> m[] = {
      {"<f4", DType::f32}, {"<f8", DType::f64}, {"<f2", DType::f16}, {"|i1", DType::i8}, {"|u1", DType::u8},
      {"<i2", DType::i16}, {"<i4", DType::i32}, {"<i8", DType::i64}, {"|b1", DType::b8}};
  for (auto& [n, t] : m)
    if (s == n) return t;
  return std::nullopt;
}

Arg to_arg(nb::handle h, size_t index) {
  Arg a;
  PyObject* o = h.ptr();
  if (h.is_none()) {
    a.kind = Arg::Null;
    a.what = "None";
    return a;
  }
  if (nb::isinstance<Array>(h)) {
    const Array* arr = nb::inst_ptr<Array>(h);
    if (!arr->defined()) throw ValueError(cat("argument ", index, ": undefined array"));
    a.kind = Arg::Pointer;
    a.ptr = arr->data();
    a.device = arr->device();
    a.dtype = arr->dtype();
    a.array = arr;
    a.what = "gpukit.Array";
    return a;
  }
  if (PyBool_Check(o)) {
    a.kind = Arg::Bool;
    a.b = o == Py_True;
    a.what = "bool";
    return a;
  }
  if (!PyLong_Check(o) && !PyFloat_Check(o) && PyNumber_Check(o)) {  // numpy.bool_
    std::string tn = py_type_name(h);
    if ((tn == "bool" || tn == "bool_") && nb::hasattr(h, "dtype")) {
      a.kind = Arg::Bool;
      a.b = PyObject_IsTrue(o) == 1;
      a.what = "numpy.bool";
      return a;
    }
  }
  if (PyLong_Check(o) || (PyIndex_Check(o) && !PyObject_HasAttrString(o, "__cuda_array_interface__") &&
                          !PyObject_HasAttrString(o, "data_ptr"))) {
    nb::object v = nb::steal(PyNumber_Index(o));
    if (!v.is_valid()) throw nb::python_error();
    a.kind = Arg::Int;
    a.what = PyLong_CheckExact(o) ? "int" : py_type_name(h);
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow > 0) {
      unsigned long long u = PyLong_AsUnsignedLongLong(v.ptr());
      if (PyErr_Occurred()) {
        PyErr_Clear();
        throw ValueError(cat("argument ", index, ": integer does not fit in 64 bits"));
      }
      a.big_unsigned = true;
      a.u = u;
    } else if (overflow < 0) {
      throw ValueError(cat("argument ", index, ": integer does not fit in 64 bits"));
    } else {
      a.i = x;
    }
    return a;
  }
  if (PyFloat_Check(o)) {
    a.kind = Arg::Float;
    a.f = PyFloat_AsDouble(o);
    a.what = "float";
    return a;
  }
  if (nb::hasattr(h, "data_ptr") && nb::hasattr(h, "device")) {  // torch.Tensor
    a.kind = Arg::Pointer;
    a.ptr = reinterpret_cast<void*>(nb::cast<uintptr_t>(h.attr("data_ptr")()));
    nb::object dev = h.attr("device");
    std::string type = nb::cast<std::string>(nb::str(dev.attr("type")));
    nb::object idx = dev.attr("index");
    a.device = type == "cuda" ? Device::cuda(idx.is_none() ? 0 : nb::cast<int>(idx)) : Device::cpu();
    if (nb::hasattr(h, "dtype")) a.dtype = torch_dtype(h.attr("dtype"));
    a.what = py_type_name(h);
    return a;
  }
  if (nb::hasattr(h, "__cuda_array_interface__")) {  // CuPy, Numba, ...
    nb::dict cai = nb::cast<nb::dict>(h.attr("__cuda_array_interface__"));
    nb::tuple data = nb::cast<nb::tuple>(cai["data"]);
    a.kind = Arg::Pointer;
    a.ptr = reinterpret_cast<void*>(nb::cast<uintptr_t>(data[0]));
    a.dtype = typestr_dtype(nb::cast<std::string>(cai["typestr"]));
    a.device = a.ptr ? pointer_device(a.ptr) : Device::cuda(0);
    a.what = py_type_name(h);
    return a;
  }
  if (PyNumber_Check(o) && nb::hasattr(h, "__float__")) {  // numpy.float32 and friends
    nb::object v = nb::steal(PyNumber_Float(o));
    if (!v.is_valid()) throw nb::python_error();
    a.kind = Arg::Float;
    a.f = PyFloat_AsDouble(v.ptr());
    a.what = py_type_name(h);
    return a;
  }
  a.kind = Arg::Other;  // the kernel's signature names the parameter in the TypeError
  a.what = py_type_name(h);
  return a;
}

Dim3 to_dim3(nb::handle h, const char* arg) {
  Dim3 d;
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
    d.x = nb::cast<int64_t>(h);
    return d;
  }
  if (nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h)) {
    nb::sequence s = nb::borrow<nb::sequence>(h);
    size_t n = nb::len(s);
    if (n >= 1 && n <= 3) {
      int64_t v[3] = {1, 1, 1};
      for (size_t i = 0; i < n; ++i) {
        nb::handle e = s[i];
        if (!PyLong_Check(e.ptr()) || PyBool_Check(e.ptr()))
          throw TypeError(cat(arg, ": expected an int or a tuple of 1 to 3 ints"));
        v[i] = nb::cast<int64_t>(e);
      }
      d.x = v[0];
      d.y = v[1];
      d.z = v[2];
      return d;
    }
  }
  throw TypeError(cat(arg, ": expected an int or a tuple of 1 to 3 ints, got ", py_type_name(h)));
}

std::vector<std::string> to_strings(nb::handle h, const char* arg) {
  std::vector<std::string> v;
  if (h.is_none()) return v;
  if (PyUnicode_Check(h.ptr())) return {nb::cast<std::string>(h)};
  for (nb::handle e : h) {
    if (!PyUnicode_Check(e.ptr())) throw TypeError(cat(arg, ": expected strings, got ", py_type_name(e)));
    v.push_back(nb::cast<std::string>(e));
  }
  return v;
}

std::vector<std::string> to_types(nb::handle h) {
  std::vector<std::string> v;
  for (nb::handle e : h) {
    if (PyUnicode_Check(e.ptr())) {
      v.push_back(nb::cast<std::string>(e));
    } else if (nb::isinstance<DType>(e)) {  // a scalar of that dtype
      static const std::pair<DType, const char*> m[] = {
          {DType::f32, "float"}, {DType::f64, "double"}, {DType::f16, "__half"}, {DType::bf16, "__nv_bfloat16"},
          {DType::i8, "int8_t"}, {DType::u8, "uint8_t"}, {DType::i16, "int16_t"}, {DType::i32, "int"},
          {DType::i64, "int64_t"}, {DType::b8, "bool"}};
      DType t = nb::cast<DType>(e);
      const char* n = nullptr;
      for (auto& [k, s] : m)
        if (k == t) n = s;
      if (!n) throw TypeError(cat("types: no scalar kernel parameter of dtype ", dtype_name(t)));
      v.push_back(n);
    } else {
      throw TypeError(cat("types: expected C++ type names (e.g. 'float*') or gpukit dtypes, got ", py_type_name(e)));
    }
  }
  return v;
}

std::vector<Arg> to_args(const nb::args& args, size_t first) {
  std::vector<Arg> v;
  v.reserve(args.size() - first);
  for (size_t i = first; i < args.size(); ++i) v.push_back(to_arg(args[i], i - first));
  return v;
}

}  // namespace

GK_BINDING(50, jit) {
  g_jit_error = nb::steal(PyErr_NewExceptionWithDoc(
      "gpukit.JitError",
      "A CUDA C++ compile error from gk.jit. Attributes: log (NVRTC's full log), line (1-based line of the "
      "first error, or None) and source_line.",
      PyExc_RuntimeError, nullptr));
  m.attr("JitError") = g_jit_error;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const JitError& e) {
      nb::object exc = g_jit_error(nb::str(e.what()));
      exc.attr("log") = nb::str(e.log.c_str());
      exc.attr("line") = e.line > 0 ? nb::object(nb::int_(e.line)) : nb::none();
      exc.attr("source_line") = e.line > 0 ? nb::object(nb::str(e.source_line.c_str())) : nb::none();
      PyErr_SetObject(g_jit_error.ptr(), exc.ptr());
    }
  });

  m.def("_jit_available", &available);
  m.def("_jit_unavailable_reason", &unavailable_reason);
  m.def("_jit_nvrtc_path", &nvrtc_path);
  m.def("_jit_nvrtc_version", &nvrtc_version);
  m.def("_jit_supported_archs", &supported_archs);
  m.def("_jit_include_dirs", &default_include_dirs);
  m.def("_jit_add_search_paths", &add_search_paths, nb::arg("libs"), nb::arg("includes"));
  m.def("_jit_cache_dir", &cache_dir);
  m.def("_jit_clear_memory_cache", &clear_memory_cache);
  m.def("_jit_reset_stats", &reset_stats);
  m.def("_jit_stats", [] {
    Stats s = stats();
    nb::dict r;
    r["nvrtc_compiles"] = s.nvrtc_compiles;
    r["memory_hits"] = s.memory_hits;
    r["disk_hits"] = s.disk_hits;
    r["disk_writes"] = s.disk_writes;
    r["disk_errors"] = s.disk_errors;
    r["library_loads"] = s.library_loads;
    r["launches"] = s.launches;
    return r;
  });
  m.def("_jit_find_signature", [](const std::string& source, const std::string& name) -> nb::object {
    auto sig = find_signature(source, name);
    if (!sig) return nb::none();
    nb::list r;
    for (size_t i = 0; i < sig->params.size(); ++i) r.append(nb::make_tuple(sig->params[i].spelling, sig->names[i]));
    return r;
  }, nb::arg("source"), nb::arg("name"), "The parsed parameter list: [(type, name), ...] or None (for tests).");
  m.def("_jit_parse_type", [](const std::string& t) {
    ParamType p = parse_type(t, "type");
    nb::dict r;
    static const char* kinds[] = {"pointer", "int", "uint", "float", "bool"};
    r["kind"] = kinds[int(p.kind)];
    r["size"] = p.size;
    r["dtype"] = p.elem ? nb::object(dtype_object(*p.elem)) : nb::none();
    return r;
  }, nb::arg("type"));

  nb::class_<Kernel>(m, "JitKernel", "A kernel compiled by gk.jit. Call it as kernel(grid, block, *args, "
                                     "shared_mem=0, stream=None).")
      .def("__init__", [](Kernel* k, const std::string& source, const std::string& name, nb::handle options,
                          nb::handle arch, nb::handle types, nb::handle device, bool cache) {
        std::optional<std::vector<std::string>> ty;
        if (!types.is_none()) ty = to_types(types);
        std::optional<Device> dev;
        if (!device.is_none()) dev = to_device(device);
        std::string a = arch.is_none() ? std::string() : nb::cast<std::string>(arch);
        auto opts = to_strings(options, "options");
        nb::gil_scoped_release rel;
        new (k) Kernel(Kernel::create(source, name, std::move(opts), std::move(a), std::move(ty), dev, cache));
      }, nb::arg("source"), nb::arg("name"), nb::arg("options") = nb::none(), nb::arg("arch") = nb::none(),
           nb::arg("types") = nb::none(), nb::arg("device") = nb::none(), nb::arg("cache") = true)
      .def_prop_ro("name", &Kernel::name)
      .def_prop_ro("lowered_name", [](const Kernel& k) { return k.program()->lowered_name; })
      .def_prop_ro("arch", [](const Kernel& k) { return k.program()->arch; })
      .def_prop_ro("is_cubin", [](const Kernel& k) { return k.program()->cubin; })
      .def_prop_ro("binary", [](const Kernel& k) {
        const auto& b = k.program()->binary;
        return nb::bytes(b.data(), b.size());
      })
      .def_prop_ro("log", [](const Kernel& k) { return k.program()->log; })
      .def_prop_ro("cache_key", [](const Kernel& k) { return k.program()->key; })
      .def_prop_ro("origin", [](const Kernel& k) { return k.program()->origin; },
                   "Where the code came from when first compiled: 'nvrtc', 'disk' (or 'memory').")
      .def_prop_ro("param_types", [](const Kernel& k) {
        std::vector<std::string> v;
        for (const auto& p : k.signature().params) v.push_back(p.spelling);
        return v;
      })
      .def_prop_ro("param_names", [](const Kernel& k) { return k.signature().names; })
      .def("pack_args", [](const Kernel& k, nb::args args) {
        std::string b = k.pack(to_args(args, 0));
        return nb::bytes(b.data(), b.size());
      }, "Checks and packs arguments as the kernel's parameter buffer (no launch); for tests and debugging.")
      .def("__call__", [](const Kernel& k, nb::args args, nb::kwargs kwargs) {
        size_t shared_mem = 0;
        Stream storage;
        const Stream* sp = nullptr;
        nb::handle stream_obj;
        for (auto [key, value] : kwargs) {
          std::string kname = nb::cast<std::string>(key);
          if (kname == "shared_mem") {
            if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr()))
              throw TypeError("shared_mem: expected an int (bytes)");
            int64_t v = nb::cast<int64_t>(value);
            if (v < 0) throw ValueError(cat("shared_mem: must be >= 0, got ", v));
            shared_mem = size_t(v);
          } else if (kname == "stream") {
            stream_obj = value;
          } else {
            throw TypeError(cat("kernel call: unexpected keyword argument '", kname, "'"));
          }
        }
        if (args.size() < 2) throw TypeError("kernel call: expected kernel(grid, block, *args, shared_mem=0, stream=None)");
        Dim3 grid = to_dim3(args[0], "grid"), block = to_dim3(args[1], "block");
        std::vector<Arg> a = to_args(args, 2);
        if (stream_obj.is_valid() && !stream_obj.is_none()) {
          if (nb::isinstance<Stream>(stream_obj)) {
            sp = to_stream(stream_obj, storage);
          } else {
            nb::object h;
            if (nb::hasattr(stream_obj, "cuda_stream")) h = stream_obj.attr("cuda_stream");  // torch
            else if (nb::hasattr(stream_obj, "ptr")) h = stream_obj.attr("ptr");             // CuPy
            else throw TypeError(cat("stream: expected a gpukit.Stream, a torch/CuPy stream or None, got ",
                                     py_type_name(stream_obj)));
            Device d = Device::cuda(0);
            for (const auto& x : a)
              if (x.kind == Arg::Pointer && x.device && x.device->is_cuda()) {
                d = *x.device;
                break;
              }
            storage = Stream::external(d, reinterpret_cast<void*>(nb::cast<uintptr_t>(h)));
            sp = &storage;
          }
        }
        k.launch(grid, block, a, shared_mem, sp);
      })
      .def("__repr__", [](const Kernel& k) {
        return cat("gpukit.JitKernel('", k.name(), "', arch='", k.program()->arch, "')");
      });
}

}  // namespace gkpy
