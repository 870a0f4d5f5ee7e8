// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator shared, bit for bit, by the CPU reference
// and the CUDA kernels. gpukit keys it with the 64-bit seed and uses the counter
// (position low, position high, row tag, 0), so a draw depends only on
// (seed, position, row tag) -- never on the batch slot, the launch or the run.
#pragma once
#include <cstdint>

#include "gpukit/numeric.h"

namespace gk::philox {

struct U4 {
  uint32_t v[4];
};

GK_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

// Ten rounds; the key is bumped between rounds (nine bumps).
GK_HD U4 philox4x32_10(U4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(M0, c.v[0], hi0, lo0);
    mulhilo(M1, c.v[2], hi1, lo1);
    U4 n = {{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    c = n;
    k0 += W0;
    k1 += W1;
  }
  return c;
}

// The 64 random bits of one draw keyed by (seed, position, row tag).
GK_HD uint64_t draw_bits(uint64_t seed, uint64_t position, uint32_t row_tag) {
  U4 c = {{uint32_t(position), uint32_t(position >> 32), row_tag, 0u}};
  U4 r = philox4x32_10(c, uint32_t(seed), uint32_t(seed >> 32));
  return (uint64_t(r.v[0]) << 32) | uint64_t(r.v[1]);
}

}  // namespace gk::philox
