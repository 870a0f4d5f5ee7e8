// Argument block of the sampling ops, shared by the front end (src/ops/sampling.cpp)
// and both backends, and the per-element rules both backends must apply
// identically (see include/gpukit/sampling.h for the user-facing definitions).
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "gpukit/dtype.h"
#include "gpukit/numeric.h"

namespace gk {

// A per-row parameter: a device array of B values, or one value for every row.
template <class T>
struct RowParam {
  const T* ptr = nullptr;
  T value{};
  GK_HD T at(int64_t r) const { return ptr ? ptr[r] : value; }
};

// Sequence positions: int64, or int32 (the engine's lengths) read without a conversion launch.
struct RowPos {
  const int64_t* ptr = nullptr;
  const int32_t* ptr32 = nullptr;
  int64_t value = 0;
  GK_HD int64_t at(int64_t r) const { return ptr ? ptr[r] : (ptr32 ? int64_t(ptr32[r]) : value); }
};

enum class SampleMode : uint8_t {
  Draw,     // tokens (+ logprobs): the whole decode step
  Filter,   // processed logits with filtered-out entries set to -inf -> out
  Process,  // processed logits (bias, penalties, bans, EOS; temperature if asked) -> out
};

struct SampleArgs {
  // logits [B, V], element stride 1, row stride in elements; f32, bf16 or f16
  const void* logits = nullptr;
  DType dtype = DType::f32;
  int64_t B = 0, V = 0, row_stride = 0;
  SampleMode mode = SampleMode::Draw;
  bool scale_by_temperature = true;  // Process mode: divide by T where T > 0

  RowParam<float> temperature{nullptr, 1.f}, top_p{nullptr, 1.f}, min_p{nullptr, 0.f}, typical_p{nullptr, 1.f};
  RowParam<float> repetition{nullptr, 1.f}, presence{nullptr, 0.f}, frequency{nullptr, 0.f};
  RowParam<int32_t> top_k{nullptr, 0}, min_tokens{nullptr, 0}, generated{nullptr, 0};
  RowParam<int64_t> seed{nullptr, 0};
  RowPos position;
  bool row_tag_is_index = false;  // sample(): the row tag is the batch index; decode_step: 0

  // token history [B, Hmax] (row stride hist_stride) with lengths [B]
  const int32_t* history = nullptr;
  int64_t hist_stride = 0, hist_max = 0;
  RowParam<int32_t> hist_len{nullptr, 0};
  // logit bias: [V] (bias_row_stride 0) or [B, V]
  const float* bias = nullptr;
  int64_t bias_row_stride = 0;
  // banned ids: [N] shared (banned_row_stride 0) or [B, N]
  const int32_t* banned = nullptr;
  int64_t n_banned = 0, banned_row_stride = 0;
  // EOS ids masked while generated < min_tokens
  const int32_t* eos = nullptr;
  int64_t n_eos = 0;

  // outputs
  int32_t* tokens = nullptr;  // [B]
  float* logprobs = nullptr;  // [B] or null
  int top_n = 0;
  int32_t* top_ids = nullptr;  // [B, top_n]
  float* top_logprobs = nullptr;
  float* out = nullptr;  // [B, V] contiguous (Filter / Process)

  // CUDA scratch: f32 [B, work_stride] processed logits and the workspace of
  // cuda::sample_workspace_bytes(*this) bytes (per-row state, histograms, partials).
  float* work = nullptr;
  int64_t work_stride = 0;
  void* ws = nullptr;
};

namespace smp {

constexpr float kWeightScale = 1099511627776.0f;  // 2^40

// NaN -> -inf (masked); +inf -> the largest finite float (so exp stays defined).
GK_HD float sanitize(float x) {
  if (x != x) return -INFINITY;
  if (x == INFINITY) return FLT_MAX;
  return x;
}

// Processed logits that overflowed to +inf (bias, penalty, temperature) count as FLT_MAX.
GK_HD float finite_top(float x) { return x == INFINITY ? FLT_MAX : x; }

// Float operations rounded once each, never fused into an FMA: the CPU reference
// and the CUDA kernels get the same bits (nvcc would otherwise contract a*b+c).
GK_HD float fmul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GK_HD float fadd_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
GK_HD float fsub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// CTRL-style repetition penalty, then OpenAI-style frequency and presence.
GK_HD float penalize(float x, int32_t count, float rep, float presence, float frequency) {
  if (rep != 1.f) x = x > 0.f ? x / rep : fmul_rn(x, rep);
  if (frequency != 0.f) x = fsub_rn(x, fmul_rn(frequency, float(count)));
  if (presence != 0.f) x = fsub_rn(x, presence);
  return x;
}

// exp(d - k ln2) for the integer k nearest d / ln2: the reduction (two-part ln2) and the
// Horner polynomial (terms 1/7! .. 1), each operation rounded once (det_exp_core and the
// sampling kernels' live_weight, src/cuda/common/sampling_weight.cuh).
GK_HD float exp_reduced(float d, float k) {
  float r = fadd_rn(d, fmul_rn(k, -0.693145751953125f));  // ln2 high part: 16 bits, k * it exact
  r = fadd_rn(r, fmul_rn(k, -1.42860677e-06f));           // ln2 low part
  float p = 1.98412698e-04f;                               // 1/7!
  p = fadd_rn(fmul_rn(p, r), 1.38888889e-03f);
  p = fadd_rn(fmul_rn(p, r), 8.33333333e-03f);
  p = fadd_rn(fmul_rn(p, r), 4.16666667e-02f);
  p = fadd_rn(fmul_rn(p, r), 1.66666667e-01f);
  p = fadd_rn(fmul_rn(p, r), 0.5f);
  p = fadd_rn(fmul_rn(p, r), 1.0f);
  return fadd_rn(fmul_rn(p, r), 1.0f);
}

// exp(d) for d <= 0 (d = s - max), computed with the same rounded float operations
// on the host and the device, so CPU and CUDA weights are bit-identical (within
// ~2 ulp of the true exp; the masses, thresholds and draws are then equal exactly).
// Range reduction d = k ln2 + r (ln2 split in two, k ln2_hi exact), degree-7
// Taylor/Horner on |r| <= ln2/2, then the exact scaling by 2^k. NaN or -inf -> 0.
// The polynomial and scaling of det_exp for d in (-104, 0] (no range checks, no branches).
GK_HD float det_exp_core(float d) {
  const float kf = fmul_rn(d, 1.44269502f);
#if defined(__CUDA_ARCH__)
  const float k = rintf(kf);
#else
  const float k = std::nearbyint(kf);
#endif
  float p = exp_reduced(d, k);
  // 2^k, k in [-150, 0]: two exact power-of-two factors (the second may round into subnormals)
  const int ki = int(k);
  const int k1 = ki / 2, k2 = ki - k1;
  p = fmul_rn(p, bits_f32(uint32_t(127 + k1) << 23));
  return fmul_rn(p, bits_f32(uint32_t(127 + k2) << 23));
}
GK_HD float det_exp(float d) {
  if (!(d > -104.f)) return 0.f;
  if (d > 0.f) d = 0.f;
  return det_exp_core(d);
}

// A uint32 whose unsigned order is the float order (no NaNs here).
GK_HD uint32_t order_key(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) == 0) u = 0;  // -0 == +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Fixed-point weight of a token: floor(exp(s - m) * 2^40). The max token weighs 2^40;
// tokens under 2^-40 of the max weigh 0 and are never drawn.
GK_HD uint64_t weight_of(float e) {
  float v = e * kWeightScale;  // exact (power of two)
  return v >= 1.f ? uint64_t(v) : 0;
}
GK_HD float rel_exp(float s, float m) { return det_exp(fsub_rn(s, m)); }
// w * (s - m) rounded to an integer (exact sums for the entropy).
GK_HD int64_t weighted_logit(uint64_t w, float sm) {
  double v = double(w) * double(sm);
#if defined(__CUDA_ARCH__)
  return __double2ll_rn(v);
#else
  return std::llrint(v);
#endif
}
// Typical-p order key: larger = closer to the entropy. mean = sum(w (s-m)) / sum(w).
GK_HD uint32_t typical_key(float sm, double mean) {
  double d = double(sm) - mean;
  float df = float(d < 0 ? -d : d);
  return order_key(-df);
}
// floor(p * W) in double arithmetic (the same on host and device).
GK_HD uint64_t frac_target(float p, uint64_t W) { return uint64_t(double(p) * double(W)); }
// floor(W * bits / 2^64): the draw's target in [0, W).
GK_HD uint64_t scale_draw(uint64_t W, uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(W, bits);
#else
  return uint64_t((unsigned __int128)W * bits >> 64);
#endif
}

// Effective per-row parameters. Out-of-range values: the CPU front end raises
// before running; the CUDA path (no host sync) applies these documented rules.
struct RowCfg {
  bool greedy;
  float temp;
  int64_t top_k;  // 0: off
  float top_p;    // 1: off
  float min_p;    // 0: off
  float typical;  // 1: off
  float rep, presence, frequency;
};
GK_HD RowCfg row_cfg(const SampleArgs& a, int64_t r) {
  RowCfg c;
  float t = a.temperature.at(r);
  c.greedy = !(t > 0.f);
  c.temp = c.greedy ? 1.f : t;
  int64_t k = a.top_k.at(r);
  c.top_k = (k <= 0 || k >= a.V) ? 0 : k;
  float p = a.top_p.at(r);
  c.top_p = (p > 0.f && p < 1.f) ? p : 1.f;
  float mp = a.min_p.at(r);
  c.min_p = (mp > 0.f && mp <= 1.f) ? mp : 0.f;
  float tp = a.typical_p.at(r);
  c.typical = (tp > 0.f && tp < 1.f) ? tp : 1.f;
  float rp = a.repetition.at(r);
  c.rep = rp > 0.f && rp < INFINITY ? rp : 1.f;
  c.presence = a.presence.at(r);
  c.frequency = a.frequency.at(r);
  if (c.presence != c.presence) c.presence = 0.f;
  if (c.frequency != c.frequency) c.frequency = 0.f;
  return c;
}

}  // namespace smp

namespace cpu {
void sample_rows(const SampleArgs& a);
void topk_rows(const void* logits, DType dt, int64_t B, int64_t V, int64_t row_stride, int64_t k, float* values,
               int32_t* indices);
}  // namespace cpu
namespace cuda {
// Scratch sizes of sample_rows: the f32 work row stride (elements) and the workspace bytes.
int64_t sample_work_stride(int64_t V);
int64_t sample_workspace_bytes(const SampleArgs& a);
void sample_rows(const SampleArgs& a, void* stream);
// The one-launch cluster path (src/cuda/sampling_fused.cu): Draw mode without typical-p or
// top-n logprobs; sample_rows takes it whenever fused_sample_ok (no work / workspace needed).
bool fused_sample_ok(const SampleArgs& a);
void fused_sample_rows(const SampleArgs& a, void* stream);
// argmax: partials of ceil(V / 4096) chunks per row, argmax_workspace_bytes(B, V) bytes.
int64_t argmax_workspace_bytes(int64_t B, int64_t V);
void topk_rows(const void* logits, DType dt, int64_t B, int64_t V, int64_t row_stride, int64_t k, float* values,
               int32_t* indices, void* stream);
void argmax_rows(const void* logits, DType dt, int64_t B, int64_t V, int64_t row_stride, int32_t* out, void* ws,
                 void* stream);
}  // namespace cuda

}  // namespace gk
