// Bounds-checked little-endian reading of untrusted bytes, and overflow-checked
// arithmetic. Every failure throws gk::FormatError naming the file and the field.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/utf8.h"
#include "gpukit/errors.h"

namespace gk::io::detail {

// a + b, a * b on uint64 with overflow detection.
inline bool add_ovf(uint64_t a, uint64_t b, uint64_t* r) { return __builtin_add_overflow(a, b, r); }
inline bool mul_ovf(uint64_t a, uint64_t b, uint64_t* r) { return __builtin_mul_overflow(a, b, r); }

template <class T>
inline T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  return v;
}

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, const std::string& what) : p_(data), n_(size), what_(what) {}
  size_t pos() const { return pos_; }
  size_t size() const { return n_; }
  size_t remaining() const { return n_ - pos_; }

  [[noreturn]] void fail(const std::string& msg) const {
    throw FormatError(cat(what_, ": ", msg, " (at byte offset ", pos_, ")"));
  }
  void need(uint64_t nbytes, const char* field) const {
    if (nbytes > remaining())
      fail(cat("truncated file: ", field, " needs ", nbytes, " bytes but only ", remaining(), " remain"));
  }
  template <class T>
  T read(const char* field) {
    need(sizeof(T), field);
    T v = load_le<T>(p_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  // A view of the next n bytes (checked), advancing past them.
  std::string_view bytes(uint64_t n, const char* field) {
    need(n, field);
    std::string_view v(reinterpret_cast<const char*>(p_ + pos_), size_t(n));
    pos_ += size_t(n);
    return v;
  }
  void skip(uint64_t n, const char* field) { bytes(n, field); }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  std::string what_;
};

// Validates UTF-8 (no overlongs, no surrogates, at most U+10FFFF).
inline bool valid_utf8(std::string_view s) { return utf8::valid(s); }

// A printable, length-limited rendering of an untrusted name for error messages.
inline std::string quote(std::string_view s) {
  std::string r = "'";
  size_t lim = s.size() < 80 ? s.size() : 80;
  for (size_t k = 0; k < lim; ++k) {
    unsigned char c = static_cast<unsigned char>(s[k]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      r += char(c);
    } else {
      static const char* hex = "0123456789abcdef";
      r += "\\x";
      r += hex[c >> 4];
      r += hex[c & 15];
    }
  }
  if (lim < s.size()) r += "...";
  return r + "'";
}

}  // namespace gk::io::detail
