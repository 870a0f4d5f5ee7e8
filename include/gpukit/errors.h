// Typed errors. The Python bindings map them to ValueError, TypeError, IndexError,
// gpukit.OutOfMemoryError (a MemoryError), gpukit.CudaError and gpukit.io.FormatError.
#pragma once
#include <charconv>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

// Builds a message from pieces: cat("shape ", a, " vs ", b). Numbers are formatted
// with std::to_chars (no iostreams or locales involved).
template <class... A>
std::string cat(const A&... a);

namespace detail {
inline void cat_append(std::string& s, const std::string& v) { s += v; }
inline void cat_append(std::string& s, std::string_view v) { s += v; }
inline void cat_append(std::string& s, const char* v) { s += v ? v : "(null)"; }
inline void cat_append(std::string& s, char c) { s += c; }
inline void cat_append(std::string& s, bool b) { s += b ? "true" : "false"; }
template <class T>
  requires(std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>)
void cat_append(std::string& s, T v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  s.append(buf, r.ptr);
}
}  // namespace detail

}  // namespace gk

template <class... A>
std::string gk::cat(const A&... a) {
  std::string s;
  (detail::cat_append(s, a), ...);
  return s;
}

#define GK_CHECK_ARG(cond, ExcType, ...)              \
  do {                                                \
    if (!(cond)) throw ::gk::ExcType(::gk::cat(__VA_ARGS__)); \
  } while (0)
