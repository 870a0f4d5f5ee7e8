// gpukit._C.io: safetensors and GGUF readers (the Python API is python/gpukit/io.py).
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/io.h"

namespace gkpy {
using namespace gk;
using namespace gk::io;

namespace {

// A string as str when it is valid UTF-8, else as bytes (GGUF strings are not
// required to be UTF-8).
nb::object py_str(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "strict");
  if (o) return nb::steal(o);
  PyErr_Clear();
  return nb::bytes(s.data(), s.size());
}

nb::object py_value(const GGUFValue& v) {
  switch (v.type) {
    case GGUFType::Bool: return nb::bool_(v.u != 0);
    case GGUFType::U8: case GGUFType::U16: case GGUFType::U32: case GGUFType::U64: return nb::int_(v.u);
    case GGUFType::I8: case GGUFType::I16: case GGUFType::I32: case GGUFType::I64: return nb::int_(v.i);
    case GGUFType::F32: case GGUFType::F64: return nb::float_(v.f);
    case GGUFType::String: return py_str(v.s);
    case GGUFType::Array: {
      nb::list l;
      if (v.elem_type == GGUFType::String) {
        for (size_t k = 0; k < v.count; ++k) l.append(py_str(v.string_at(k)));
      } else if (v.elem_type == GGUFType::Array) {
        for (auto& e : v.arr) l.append(py_value(e));
      } else {
        for (size_t k = 0; k < v.count; ++k) l.append(py_value(v.at(k)));
      }
      return l;
    }
  }
  return nb::none();
}

nb::dict str_map(const std::map<std::string, std::string>& m) {
  nb::dict d;
  for (auto& [k, v] : m) d[py_str(k)] = py_str(v);
  return d;
}

}  // namespace

GK_BINDING(30, io) {
  nb::module_ io = m.def_submodule("io", "Model-file readers: safetensors and GGUF.");
  io.attr("FormatError") = m.attr("FormatError");

  nb::class_<TensorInfo>(io, "TensorInfo", "A safetensors tensor: name, dtype, shape, data offsets.")
      .def_ro("name", &TensorInfo::name)
      .def_ro("dtype", &TensorInfo::dtype)
      .def_prop_ro("shape", [](const TensorInfo& t) { return shape_tuple(t.shape); })
      .def_prop_ro("data_offsets", [](const TensorInfo& t) { return nb::make_tuple(t.begin, t.end); })
      .def_prop_ro("nbytes", [](const TensorInfo& t) { return t.end - t.begin; })
      .def("__repr__", [](const TensorInfo& t) {
        return cat("TensorInfo(name='", t.name, "', dtype=", dtype_name(t.dtype), ", shape=", shape_str(t.shape),
                   ", data_offsets=(", t.begin, ", ", t.end, "))");
      });

  nb::class_<SafeTensors>(io, "SafeTensorsFile", "One memory-mapped .safetensors file.")
      .def(nb::init<const std::string&>(), nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
      .def("keys", [](const SafeTensors& s) {
        std::vector<std::string> r;
        for (auto& t : s.tensors()) r.push_back(t.name);
        return r;
      }, "Tensor names in the order of their data.")
      .def("info", &SafeTensors::info, nb::arg("name"), nb::rv_policy::copy)
      .def("get", &SafeTensors::get, nb::arg("name"), "Zero-copy CPU view of a tensor.")
      .def("__contains__", &SafeTensors::contains)
      .def_prop_ro("metadata", [](const SafeTensors& s) { return str_map(s.metadata()); })
      .def_prop_ro("path", &SafeTensors::path)
      .def_prop_ro("data_start", &SafeTensors::data_start);

  nb::class_<ShardedSafeTensors>(io, "ShardedSafeTensors",
                                 "A checkpoint: a .safetensors file, a directory, or an index .json.")
      .def(nb::init<const std::string&>(), nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
      .def("keys", &ShardedSafeTensors::names)
      .def("info", &ShardedSafeTensors::info, nb::arg("name"), nb::rv_policy::copy)
      .def("get", &ShardedSafeTensors::get, nb::arg("name"))
      .def("__contains__", &ShardedSafeTensors::contains)
      .def("shard_path", [](const ShardedSafeTensors& s, const std::string& n) { return s.shard_of(n).path(); })
      .def_prop_ro("num_shards", [](const ShardedSafeTensors& s) { return s.shards().size(); })
      .def_prop_ro("metadata", [](const ShardedSafeTensors& s) { return str_map(s.metadata()); });

  io.def("save_safetensors", [](const std::string& path, const std::vector<std::pair<std::string, Array>>& tensors,
                                const std::map<std::string, std::string>& metadata) {
    nb::gil_scoped_release g;
    save_safetensors(path, tensors, metadata);
  }, nb::arg("path"), nb::arg("tensors"), nb::arg("metadata") = std::map<std::string, std::string>{});

  nb::class_<GGUFTensorInfo>(io, "GGUFTensorInfo", "A GGUF tensor: name, dims, ggml type, offset, size.")
      .def_ro("name", &GGUFTensorInfo::name)
      .def_prop_ro("dims", [](const GGUFTensorInfo& t) { return shape_tuple(t.dims); },
                   "GGUF order: dims[0] varies fastest.")
      .def_prop_ro("shape", [](const GGUFTensorInfo& t) { return shape_tuple(t.shape()); }, "Row-major shape.")
      .def_prop_ro("type", [](const GGUFTensorInfo& t) { return std::string(ggml_type_name(t.type)); })
      .def_prop_ro("type_id", [](const GGUFTensorInfo& t) { return uint32_t(t.type); })
      .def_ro("offset", &GGUFTensorInfo::offset)
      .def_ro("nbytes", &GGUFTensorInfo::nbytes)
      .def_ro("numel", &GGUFTensorInfo::numel)
      .def("__repr__", [](const GGUFTensorInfo& t) {
        return cat("GGUFTensorInfo(name='", t.name, "', type=", ggml_type_name(t.type), ", shape=",
                   shape_str(t.shape()), ", offset=", t.offset, ", nbytes=", t.nbytes, ")");
      });

  nb::class_<GGUF>(io, "GGUFFile", "A memory-mapped GGUF file (versions 2 and 3).")
      .def(nb::init<const std::string&>(), nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("version", &GGUF::version)
      .def_prop_ro("alignment", &GGUF::alignment)
      .def_prop_ro("data_start", &GGUF::data_start)
      .def_prop_ro("path", &GGUF::path)
      .def("metadata_keys", [](const GGUF& g) {
        nb::list l;
        for (auto& k : g.metadata_order()) l.append(py_str(k));
        return l;
      }, "Metadata keys in file order.")
      .def("metadata_value", [](const GGUF& g, const std::string& key) {
        const GGUFValue* v = g.find(key);
        if (!v) throw IndexError(cat("no metadata key '", key, "'"));
        return py_value(*v);
      }, nb::arg("key"))
      .def("metadata_type", [](const GGUF& g, const std::string& key) {
        const GGUFValue* v = g.find(key);
        if (!v) throw IndexError(cat("no metadata key '", key, "'"));
        return v->is_array() ? cat("array[", gguf_type_name(v->elem_type), "]") : std::string(gguf_type_name(v->type));
      }, nb::arg("key"))
      .def("tensors", [](const GGUF& g) { return g.tensors(); })
      .def("info", &GGUF::info, nb::arg("name"), nb::rv_policy::copy)
      .def("__contains__", &GGUF::contains)
      .def("raw", &GGUF::raw, nb::arg("name"), "The tensor's bytes (quantized blocks) as a zero-copy uint8 view.")
      .def("dequantize", [](const GGUF& g, const std::string& name, nb::handle dtype) {
        DType t = to_dtype(dtype);
        nb::gil_scoped_release r;
        return g.dequantize(name, t);
      }, nb::arg("name"), nb::arg("dtype") = "float32");
}

}  // namespace gkpy
