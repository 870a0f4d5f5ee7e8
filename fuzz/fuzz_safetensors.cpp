// libFuzzer target: the safetensors reader on arbitrary bytes. Every input must
// either parse (then each tensor view is read end to end) or raise FormatError.
#include <cstddef>
#include <cstdint>

#include "gpukit/errors.h"
#include "gpukit/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    gk::io::SafeTensors st(gk::io::MappedFile::from_bytes(data, size, "fuzz.safetensors"));
    volatile uint8_t sink = 0;
    for (const auto& t : st.tensors()) {
      gk::Array a = st.get(t.name);
      const uint8_t* p = static_cast<const uint8_t*>(a.data());
      size_t n = a.nbytes();
      if (n) sink = sink + p[0] + p[n - 1];
      (void)st.info(t.name);
    }
    for (const auto& [k, v] : st.metadata()) sink = sink + uint8_t(k.size() + v.size());
    (void)sink;
  } catch (const gk::FormatError&) {
  }
  return 0;
}
