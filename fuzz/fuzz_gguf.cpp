// libFuzzer target: the GGUF reader on arbitrary bytes. Every input must either
// parse (then metadata is read through every accessor and small tensors are
// dequantized) or raise FormatError.
#include <cstddef>
#include <cstdint>

#include "gpukit/errors.h"
#include "gpukit/io.h"

namespace {
void touch(const gk::io::GGUFValue& v, int depth) {
  auto guard = [](auto&& f) {
    try {
      f();
    } catch (const gk::FormatError&) {
    }
  };
  guard([&] { (void)v.as_int(); });
  guard([&] { (void)v.as_uint(); });
  guard([&] { (void)v.as_float(); });
  guard([&] { (void)v.as_string(); });
  guard([&] { (void)v.as_strings(); });
  guard([&] { (void)v.as_ints(); });
  guard([&] { (void)v.as_floats(); });
  if (v.is_array() && v.size() > 0) {
    touch(v.at(0), depth + 1);
    touch(v.at(v.size() - 1), depth + 1);
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    gk::io::GGUF g(gk::io::MappedFile::from_bytes(data, size, "fuzz.gguf"));
    for (const auto& [k, v] : g.metadata()) touch(v, 0);
    volatile uint8_t sink = 0;
    for (const auto& t : g.tensors()) {
      gk::Array r = g.raw(t.name);
      const uint8_t* p = static_cast<const uint8_t*>(r.data());
      if (r.nbytes()) sink = sink + p[0] + p[r.nbytes() - 1];
      if (gk::io::ggml_can_dequantize(t.type) && t.numel <= (1 << 16)) {
        (void)g.dequantize(t.name, gk::DType::f32);
        (void)g.dequantize(t.name, gk::DType::bf16);
      }
    }
    (void)sink;
  } catch (const gk::FormatError&) {
  }
  return 0;
}
