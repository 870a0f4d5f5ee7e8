// Typed errors. The Python bindings map them to ValueError, TypeError, IndexError,
// gpukit.OutOfMemoryError (a MemoryError), gpukit.CudaError and gpukit.io.FormatError.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

namespace gk {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ValueError : Error {
  using Error::Error;
};
struct TypeError : Error {
  using Error::Error;
};
struct IndexError : Error {
  using Error::Error;
};
// A malformed model or data file (safetensors, GGUF, tokenizer.json, ...).
struct FormatError : ValueError {
  using ValueError::ValueError;
};
// The allocator could not satisfy a request, even after releasing its cache.
struct OutOfMemoryError : Error {
  OutOfMemoryError(const std::string& msg, size_t requested, size_t in_use, size_t limit)
      : Error(msg), requested(requested), in_use(in_use), limit(limit) {}
  size_t requested, in_use, limit;
};
// A CUDA runtime or driver error. `sticky` marks errors that leave the device
// unusable (illegal address, launch failure, ...): the device is then marked failed.
struct CudaError : Error {
  CudaError(const std::string& msg, int code, bool sticky) : Error(msg), code(code), sticky(sticky) {}
  int code;
  bool sticky;
};

// Builds a message from pieces: fmt("shape ", a, " vs ", b).
template <class... A>
std::string cat(const A&... a);

}  // namespace gk

#include <sstream>
template <class... A>
std::string gk::cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

#define GK_CHECK_ARG(cond, ExcType, ...)              \
  do {                                                \
    if (!(cond)) throw ::gk::ExcType(::gk::cat(__VA_ARGS__)); \
  } while (0)
