// The extension module gpukit._C: exception types, then every area's bindings.
#include <algorithm>
#include <vector>

#include "bind.h"
#include "gpukit/errors.h"

namespace gkpy {
namespace {
std::vector<std::pair<int, void (*)(nb::module_&)>>& bindings() {
  static std::vector<std::pair<int, void (*)(nb::module_&)>> v;
  return v;
}
}  // namespace

BindingRegistrar::BindingRegistrar(int order, void (*fn)(nb::module_&)) { bindings().emplace_back(order, fn); }

void run_bindings(nb::module_& m) {
  auto v = bindings();
  std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first < b.first; });
  for (auto& [o, fn] : v) fn(m);
}
}  // namespace gkpy

NB_MODULE(_C, m) {
  m.doc() = "gpukit native core";
  static nb::object CudaError = nb::steal(PyErr_NewExceptionWithDoc(
      "gpukit.CudaError", "A CUDA runtime error; sticky faults mark the device failed.", PyExc_RuntimeError, nullptr));
  static nb::object OOMError = nb::steal(PyErr_NewExceptionWithDoc(
      "gpukit.OutOfMemoryError", "The allocator could not satisfy a request.", PyExc_MemoryError, nullptr));
  static nb::object FormatError = nb::steal(PyErr_NewExceptionWithDoc(
      "gpukit.io.FormatError", "A malformed model or data file.", PyExc_ValueError, nullptr));
  m.attr("CudaError") = CudaError;
  m.attr("OutOfMemoryError") = OOMError;
  m.attr("FormatError") = FormatError;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const gk::FormatError& e) {
      PyErr_SetString(FormatError.ptr(), e.what());
    } catch (const gk::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const gk::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const gk::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const gk::OutOfMemoryError& e) {
      PyErr_SetString(OOMError.ptr(), e.what());
    } catch (const gk::CudaError& e) {
      PyErr_SetString(CudaError.ptr(), e.what());
    } catch (const gk::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  gkpy::run_bindings(m);
}
