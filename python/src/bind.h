// Shared pieces of the nanobind bindings. Each binding file registers a function
// with GK_BINDING(name) { ... } that module.cpp calls once.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <functional>

#include "gpukit/array.h"
#include "gpukit/ops.h"

namespace nb = nanobind;

namespace gkpy {

struct BindingRegistrar {
  BindingRegistrar(int order, void (*fn)(nb::module_&));
};
void run_bindings(nb::module_& m);

// Argument conversion helpers: accept what a Python user would pass.
gk::DType to_dtype(nb::handle h, const char* arg = "dtype");           // gk.float32, "float32", numpy dtype
std::optional<gk::DType> to_dtype_opt(nb::handle h, const char* arg = "dtype");
gk::Device to_device(nb::handle h, const char* arg = "device");         // gk.Device, "cuda:0", None -> cpu
gk::Shape to_shape(nb::handle h, const char* arg = "shape");            // int or sequence of ints
const gk::Stream* to_stream(nb::handle h, gk::Stream& storage, const char* arg = "stream");
gk::Scalar to_scalar(nb::handle h, const char* arg);
bool is_scalar(nb::handle h);
// Python object -> Array on `like`'s device (Array, scalar handled by callers, NumPy, DLPack, lists).
gk::Array to_array(nb::handle h, const char* arg, const gk::Array* like = nullptr);
nb::object dtype_object(gk::DType t);  // the gk.<dtype> object
nb::tuple shape_tuple(const gk::Shape& s);

}  // namespace gkpy

#define GK_BINDING(order, name)                                                   \
  static void gk_bind_##name(nb::module_& m);                                     \
  static ::gkpy::BindingRegistrar gk_reg_##name(order, &gk_bind_##name);          \
  static void gk_bind_##name(nb::module_& m)
