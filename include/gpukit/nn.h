// Fused inference ops: normalization, gated activations, rotary/ALiBi/sinusoidal
// positions. Storage dtypes float32, float16 and bfloat16; the math is fp32 on
// CUDA and fp64 in the CPU reference. Every op validates its arguments before
// any launch (ValueError/TypeError naming the argument), takes an optional
// stream (null: the device's current stream), never synchronizes the host and
// allocates only its outputs, so it can be captured in a graph.
#pragma once
#include <optional>
#include <string>
#include <utility>

#include "gpukit/array.h"

namespace gk::nn {

// ---- normalization over the last dimension of x [..., H] ----
// y = x / sqrt(mean(x^2) + eps) * w           (gemma: * (1 + w))
// w: [H], same dtype as x. x's last dimension must be dense (stride 1); the
// leading dimensions may be strided.
Array rms_norm(const Array& x, const Array& w, double eps, bool gemma = false, const Stream* s = nullptr);
// Fused residual form: r = x + residual (rounded to x's dtype), y = rms_norm(r).
// One kernel; returns (y, r). residual has x's shape and dtype.
std::pair<Array, Array> rms_norm_residual(const Array& x, const Array& residual, const Array& w, double eps,
                                          bool gemma = false, const Stream* s = nullptr);
// y = (x - mean) / sqrt(var + eps) * w + b  (biased variance); b may be undefined (no bias).
Array layer_norm(const Array& x, const Array& w, const Array& b, double eps, const Stream* s = nullptr);

// ---- gated activations ----
enum class GatedAct : uint8_t { SwiGLU, GeGLU, GeGLUTanh, ReLU2 };
const char* gated_act_name(GatedAct a);
// act(gate) * up for gate and up of one shape [..., I] (up ignored and may be
// undefined for ReLU2, which is relu(x)^2 on `gate`).
Array gated(GatedAct act, const Array& gate, const Array& up, const Stream* s = nullptr);
// Fused form on one concatenated [..., 2I] tensor: gate = x[..., :I], up = x[..., I:].
Array gated_fused(GatedAct act, const Array& x, const Stream* s = nullptr);

}  // namespace gk::nn
