// The fixed-point weight floor(det_exp(d) 2^40) of the sampling ops for d in [-28, 0] (the
// only range where it is not 0), with no conversion instructions: they issue at 1/8 of the
// float rate on Hopper and det_exp_core + weight_of take three per entry (rint, float->int,
// float->u64). Bit-identical to smp::weight_of(smp::det_exp(d)) there:
//  - rint(kf) as (kf + 1.5 2^23) - 1.5 2^23 (round to nearest even, |kf| < 2^22), the
//    integer from the sum's bits;
//  - one exact scaling by 2^k instead of two (k >= -41 and the polynomial is in [0.7, 1.5]:
//    every product is normal, so both are exact and equal);
//  - floor of the float v = e 2^40 from its exponent and mantissa bits.
// Host and device (the host build checks it against the reference exhaustively).
#pragma once
#include <cstdint>

#include "ops/sampling_args.h"

namespace gk::smp {

GK_HD uint64_t floor_u64_of(float v) {  // v >= 0 finite, v < 2^64
  const uint32_t b = f32_bits(v);
  const int ex = int(b >> 23) - 150;  // v = mant 2^ex
  const uint64_t mant = uint64_t((b & 0x7fffffu) | 0x800000u);
  if (ex < -23) return 0;  // v < 1
  return ex >= 0 ? mant << ex : mant >> (-ex);
}

// d in [-28, 0]: e = det_exp(d) (also returned), the weight floor(e 2^40).
GK_HD uint64_t live_weight(float d, float* e_out) {
  const float kf = fmul_rn(d, 1.44269502f);
  const float tk = fadd_rn(kf, 12582912.0f);
  const int ki = int(f32_bits(tk)) - 0x4B400000;
  const float k = fsub_rn(tk, 12582912.0f);
  const float e = fmul_rn(exp_reduced(d, k), bits_f32(uint32_t(127 + ki) << 23));
  if (e_out) *e_out = e;
  return floor_u64_of(fmul_rn(e, kWeightScale));
}

}  // namespace gk::smp
