// EngineOptions::fused_norm_epilogue: a quantized decode projection followed by the residual add +
// RMSNorm, in one launch where the GEMV kernel takes the norm in its epilogue (its last CTA to
// finish; src/cuda/common/gemv_norm_epi.cuh), else the two launches. The same bits either way.
#pragma once
#include <cstdint>
#include <utility>

#include "gpukit/array.h"
#include "gpukit/quant.h"
#include "gpukit/stream.h"

namespace gk::llm::fused {

// y = gemv_quantized(x, qw, x's dtype) then add_rms_norm(y, residual, w, eps): returns {h, res_out}
// (add_rms_norm's pair: the normalized rows and y + residual), the same bits as the two calls. y
// itself is written to a temporary that nothing else reads. counters: an int32 device array of
// zeros (left zero), slot < its size (the engine gives each projection of a step its own).
// Where quantized_add_norm_fusable() is false: the two calls.
std::pair<Array, Array> quantized_add_norm(const Array& x, const QuantizedWeight& qw, const Array& residual,
                                           const Array& w, double eps, const Array& counters, int64_t slot,
                                           const Stream* s = nullptr);
// Whether quantized_add_norm passes the epilogue to the GEMV (CUDA, fp8 / int8 / int4, x bf16 / f16
// [1 <= M <= 8, K], residual [M, N] and w [N] of x's dtype with N % 8 == 0, 16-byte aligned rows, a
// valid counter slot). The GEMV's launcher then does it in the kernel's last CTA where its
// configuration has the epilogue (fp8 / int8: the default staged kernel, one slice of K; int4 g32 /
// g64 / g128: the default MODE 11 kernel at M = 1, one slice of K), else as a launch after the GEMV.
bool quantized_add_norm_fusable(const Array& x, const QuantizedWeight& qw, const Array& residual, const Array& w,
                                const Array& counters, int64_t slot);

}  // namespace gk::llm::fused
