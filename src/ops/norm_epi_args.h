// The residual add + RMSNorm epilogue of a quantized decode GEMV (EngineOptions::fused_norm_epilogue;
// src/cuda/common/gemv_norm_epi.cuh): y = the GEMV's output [m, n] (written as usual), then, by
// the GEMV's last CTA to finish (an integer ticket on *counter, reset to 0 by that CTA):
// res_out = round(y + res), out = round(rms_norm(res_out) * w), with the per-thread partial sums
// and block reduction of the engine's add_rms_norm kernel (src/cuda/llm_small.cu) as it runs for
// rows of n elements (nt threads), so the same bits. counter == nullptr: no epilogue.
#pragma once
#include <cstdint>

namespace gk {

struct NormEpi {
  int* counter = nullptr;       // an int32 zero in device memory (left zero)
  const void* res = nullptr;    // [m, n] of the output dtype, rows res_rs elements apart
  const void* w = nullptr;      // [n]
  void* out = nullptr;          // [m, n] dense: the normalized rows
  void* res_out = nullptr;      // [m, n] dense: the new residual
  int64_t res_rs = 0;
  float eps = 1e-6f;
  int nt = 0;                   // add_rms_norm's threads per row for n (norm_epi_threads)
};

// add_rms_norm's block size for rows of h elements read as 16-byte vectors of 8 (bf16 / f16)
// (llm_add_rms_norm in src/cuda/llm_small.cu).
inline int norm_epi_threads(int64_t h) {
  const int64_t per = h / 8;
  const int64_t t = (per + 31) / 32 * 32;
  return int(t < 32 ? 32 : (t > 256 ? 256 : t));
}

// Launches of the epilogue since the process started (src/ops/norm_epi_stats.cpp; tests): fused
// in a GEMV's last CTA, or as its own launch after the GEMV.
void norm_epi_count(bool fused);
int64_t norm_epi_calls(bool fused);

}  // namespace gk
