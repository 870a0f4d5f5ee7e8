// Argument blocks of the fused inference ops (norms, gated activations, RoPE)
// and the entry points of both backends. Kernels see only these plain structs.
#pragma once
#include <algorithm>
#include <cstdint>

#include "gpukit/dtype.h"
#include "gpukit/errors.h"
#include "gpukit/nn.h"
#include "ops/ew_functors.h"
#include "ops/registry.h"

namespace gk {

// Row-wise normalization of `rows` rows of H elements (last dim dense).
// Row r of x starts at x + r * x_rs (element strides), likewise for the others.
struct NormArgs {
  const void* x = nullptr;
  const void* res = nullptr;   // optional residual input (rms_norm only)
  const void* w = nullptr;
  const void* b = nullptr;     // optional bias (layer_norm only)
  void* out = nullptr;
  void* res_out = nullptr;     // new residual, when res is given
  int64_t rows = 0, H = 0;
  int64_t x_rs = 0, res_rs = 0, out_rs = 0, res_out_rs = 0;
  DType dtype = DType::f32;    // of x, res, w, b, out, res_out
  double eps = 1e-6;
  bool gemma = false;          // rms_norm: scale by (1 + w)
  bool layer = false;          // layer_norm instead of rms_norm
};

// out[r, i] = act(gate[r, i]) * up[r, i] for r < rows, i < I.
struct GatedArgs {
  const void* gate = nullptr;
  const void* up = nullptr;  // null for ReLU2
  void* out = nullptr;
  int64_t rows = 0, I = 0;
  int64_t gate_rs = 0, up_rs = 0, out_rs = 0;  // row strides in elements (last dim dense)
  DType dtype = DType::f32;
  nn::GatedAct act = nn::GatedAct::SwiGLU;
};

// The gated activation on one (gate, up) pair, in compute type C (double on the
// CPU reference, float on CUDA).
template <nn::GatedAct A, class C>
GK_HD C gated_fn(C g, C u) {
  if constexpr (A == nn::GatedAct::SwiGLU) return ew::unary<UnaryOp::Silu, C>(g) * u;
  else if constexpr (A == nn::GatedAct::GeGLU) return ew::unary<UnaryOp::GeluErf, C>(g) * u;
  else if constexpr (A == nn::GatedAct::GeGLUTanh) return ew::unary<UnaryOp::GeluTanh, C>(g) * u;
  else {
    C r = ew::unary<UnaryOp::Relu, C>(g);
    return r * r;
  }
}

// Calls f(T{}) for the storage types the fused ops support (f32, f16, bf16).
template <class F>
decltype(auto) dispatch_float(DType t, F&& f) {
  switch (t) {
    case DType::f16: return f(f16{});
    case DType::bf16: return f(bf16{});
    default: return f(float{});
  }
}

constexpr int kMaxRopeFreqs = 512;  // rotary_dim <= 1024; the table travels in the kernel arguments

// Rotary embedding of q [T, hq, D] and k [T, hk, D] (k may be absent), last dim dense.
struct RopeArgs {
  const void* q = nullptr;
  void* q_out = nullptr;
  const void* k = nullptr;
  void* k_out = nullptr;
  int64_t q_ts = 0, q_hs = 0, qo_ts = 0, qo_hs = 0;  // token / head strides (elements)
  int64_t k_ts = 0, k_hs = 0, ko_ts = 0, ko_hs = 0;
  int hq = 0, hk = 0;
  int64_t T = 0;
  int D = 0, rd = 0;
  bool interleaved = false;
  bool copy_tail = false;  // out of place: copy dims [rd, D)
  const void* pos = nullptr;
  bool pos64 = false;
  float mscale = 1.f;
  DType dtype = DType::f32;
  float inv_freq[kMaxRopeFreqs] = {};
};

// Sinusoidal encodings [T, dim] (dense).
struct SinusoidArgs {
  const void* pos = nullptr;
  bool pos64 = false;
  void* out = nullptr;
  int64_t T = 0;
  int dim = 0;
  DType dtype = DType::f32;
  float inv_freq[kMaxRopeFreqs] = {};
};

// ALiBi bias [H, Lq, Lk] (dense) from float32 slopes [H].
struct AlibiArgs {
  const float* slopes = nullptr;
  void* out = nullptr;
  int H = 0;
  int64_t Lq = 0, Lk = 0;
  DType dtype = DType::f32;
};

// KV cache append; see nn::kv_append. Index arrays are int32 except slots (slots64).
struct KvAppendArgs {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_ts = 0, k_hs = 0, v_ts = 0, v_hs = 0;  // token / head strides of k_new, v_new
  void* kc = nullptr;
  void* vc = nullptr;  // dense [nb, bs, hkv, D]
  int64_t nb = 0, bs = 0;
  int hkv = 0, D = 0;
  int64_t T = 0;
  const void* slots = nullptr;  // mode 1
  bool slots64 = false;
  const int32_t* block_table = nullptr;  // mode 2 (null with seq_lens: contiguous, block = b)
  int64_t bt_stride = 0, max_blocks = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* cu = nullptr;  // [B+1] or null (one token per sequence)
  int B = 0;
  DType dtype = DType::f32;        // of k_new / v_new
  DType cache_dtype = DType::f32;  // dtype, or f8e4m3 with scales
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  // Fused RoPE on k (rope_rd > 0): the rotation of nn::rope over the first
  // rope_rd dims at rope_pos[t] (null: the token's cache position), NeoX or
  // interleaved pairs; k_out (optional, token / head strides ko_ts, ko_hs)
  // receives the rotated keys (dims past rope_rd copied).
  int rope_rd = 0;
  bool rope_il = false;
  const void* rope_pos = nullptr;
  bool rope_pos64 = false;
  float rope_mscale = 1.f;
  void* k_out = nullptr;
  int64_t ko_ts = 0, ko_hs = 0;
  float inv_freq[kMaxRopeFreqs] = {};
};

// The rope position of token t of a kv_append: rope_pos[t], else the cache
// position `pos` kv_dest found.
GK_HD int64_t kv_rope_pos(const KvAppendArgs& a, int64_t t, int64_t pos) {
  if (!a.rope_pos) return pos;
  return a.rope_pos64 ? static_cast<const int64_t*>(a.rope_pos)[t] : int64_t(static_cast<const int32_t*>(a.rope_pos)[t]);
}

// Destination (block, offset) of token t, or false to skip it; pos: the token's
// position in its sequence (-1 with a slot mapping). Shared by both backends.
GK_HD bool kv_dest(const KvAppendArgs& a, int64_t t, int64_t& blk, int64_t& off, int64_t& pos) {
  pos = -1;
  if (a.slots) {
    int64_t s = a.slots64 ? static_cast<const int64_t*>(a.slots)[t] : int64_t(static_cast<const int32_t*>(a.slots)[t]);
    if (s < 0 || s >= a.nb * a.bs) return false;
    blk = s / a.bs;
    off = s - blk * a.bs;
    return true;
  }
  int64_t b = t, j = 0;
  if (a.cu) {  // the sequence holding token t: largest b with cu[b] <= t
    int lo = 0, hi = a.B;  // invariant: cu[lo] <= t < cu[hi]
    if (t < a.cu[0] || t >= a.cu[a.B]) return false;
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      if (a.cu[mid] <= t) lo = mid;
      else hi = mid;
    }
    b = lo;
    j = t - a.cu[lo];
  } else if (t >= a.B) {
    return false;
  }
  pos = int64_t(a.seq_lens[b]) + j;
  if (pos < 0) return false;
  if (a.block_table) {
    int64_t li = pos / a.bs;
    if (li >= a.max_blocks) return false;
    blk = a.block_table[b * a.bt_stride + li];
    off = pos - li * a.bs;
  } else {
    blk = b;
    off = pos;
  }
  return blk >= 0 && blk < a.nb && off < a.bs;
}

// Decode attention; see nn::attention_decode. Caches dense [nb, bs, hkv, D].
struct DecodeArgs {
  const void* q = nullptr;  // [B, hq, D], row strides below, last dim dense
  int64_t q_bs = 0, q_hs = 0;
  const void* kc = nullptr;
  const void* vc = nullptr;
  int64_t nb = 0, bs = 0;
  const int32_t* block_table = nullptr;  // null: contiguous (block = b)
  int64_t bt_stride = 0, max_blocks = 0;
  const int32_t* seq_lens = nullptr;
  void* out = nullptr;  // [B, hq, D] dense
  int B = 0, hq = 0, hkv = 0, D = 0;
  int64_t capacity = 0;  // max cached tokens per sequence
  float scale = 1.f;
  int64_t window = 0;   // 0: none
  float softcap = 0.f;  // 0: none
  DType dtype = DType::f32;        // of q and out
  DType cache_dtype = DType::f32;  // dtype, or f8e4m3 with per-head scales
  const float* k_scale = nullptr;  // [hkv], fp8 cache only (value = stored * scale)
  const float* v_scale = nullptr;
  // CUDA flash-decoding split (see decode_chunk) and workspace: partial
  // (unnormalized) outputs and their max / sum per split.
  int chunk_min = nn::kDecodeChunkMin, chunk_max = nn::kDecodeChunkMax, target_splits = nn::kDecodeTargetSplits;
  int variant = 0;     // kernel tuning variant (0: default; see attention_decode.cu)
  int grid_order = 0;  // CTA order (0 or 1; see attention_decode.cu)
  float* ws_o = nullptr;  // [B, hq, nsplit, D]
  float* ws_ml = nullptr; // [B, hq, nsplit, 2]
  int nsplit = 0;         // workspace stride: decode_splits_bound(capacity)
};

// The attended key range [start, L) of sequence b: L = seq_lens[b] clamped to
// [0, capacity], start = L - window (>= 0) with a window. Shared by both backends.
GK_HD void decode_span(const DecodeArgs& a, int b, int64_t& L, int64_t& start) {
  L = a.seq_lens[b];
  L = L < 0 ? 0 : (L > a.capacity ? a.capacity : L);
  start = a.window > 0 && L - a.window > 0 ? L - a.window : 0;
}

// Chunk length (tokens) of the flash-decoding split of n attended keys: the
// smallest chunk_min * 2^k <= chunk_max giving at most target_splits chunks, but
// at least min(ceil(n / 4) rounded up to a power of two, 4 * chunk_min, chunk_max)
// (at most 4 chunks while they are shorter than 4 * chunk_min: fewer partial
// results for mid-length sequences). It depends only on n and the fixed
// parameters (powers of two), never on the batch.
GK_HD int64_t decode_chunk(int64_t n, int cmin, int cmax, int target) {
  int64_t c = cmin;
  while (c < cmax && (n + c - 1) / c > target) c *= 2;
  int64_t f = 1;
  while (f < (n + 3) / 4 && f < 4LL * cmin && f < cmax) f *= 2;
  return c > f ? c : f;
}
GK_HD int64_t decode_nsplit(int64_t n, int cmin, int cmax, int target) {
  if (n <= 0) return 0;
  int64_t c = decode_chunk(n, cmin, cmax, target);
  return (n + c - 1) / c;
}
// The most chunks any sequence of at most cap keys is split into.
inline int64_t decode_splits_bound(int64_t cap, int cmin, int cmax, int target) {
  int64_t lo = (cap + cmin - 1) / cmin, hi = (cap + cmax - 1) / cmax;
  return std::max<int64_t>(1, std::max<int64_t>(std::min<int64_t>(target, lo), hi));
}

// The cache row of key position j of sequence b, or -1 when its block id is
// outside the pool (masked). Shared by both backends.
GK_HD int64_t decode_row(const DecodeArgs& a, int b, int64_t j) {
  int64_t blk = b, off = j;
  if (a.block_table) {
    blk = a.block_table[b * a.bt_stride + j / a.bs];
    off = j % a.bs;
  }
  if (blk < 0 || blk >= a.nb) return -1;
  return blk * a.bs + off;
}

// Prefill attention; see nn::attention_prefill. Last dims dense.
struct PrefillArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_ts = 0, q_hs = 0, k_ts = 0, k_hs = 0, v_ts = 0, v_hs = 0;
  void* out = nullptr;  // [Tq, hq, D] dense
  const int32_t* cu_q = nullptr;  // null (with cu_k null): one sequence
  const int32_t* cu_k = nullptr;
  int B = 1;
  int64_t Tq = 0, Tk = 0;
  int hq = 0, hkv = 0, D = 0;
  float scale = 1.f;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.f;
  DType dtype = DType::f32;
};

// The key range [lo, hi) (sequence-relative) and key offset k0 of query token t;
// false when the token has no keys or its sequence metadata is out of range.
GK_HD bool prefill_range(const PrefillArgs& a, int64_t t, int64_t& k0, int64_t& lo, int64_t& hi) {
  int64_t q0 = 0, Lq = a.Tq, Lk = a.Tk;
  k0 = 0;
  if (a.cu_q) {
    int l = 0, h = a.B;  // largest b with cu_q[b] <= t
    if (t < a.cu_q[0] || t >= a.cu_q[a.B]) return false;
    while (h - l > 1) {
      int m = (l + h) / 2;
      if (a.cu_q[m] <= t) l = m;
      else h = m;
    }
    q0 = a.cu_q[l];
    Lq = int64_t(a.cu_q[l + 1]) - q0;
    k0 = a.cu_k[l];
    Lk = int64_t(a.cu_k[l + 1]) - k0;
    if (k0 < 0 || Lk < 0 || k0 + Lk > a.Tk) return false;
  }
  const int64_t i = t - q0, p = i + Lk - Lq;
  hi = a.causal ? (p + 1 < Lk ? p + 1 : Lk) : Lk;
  lo = a.window > 0 ? (p - a.window + 1 > 0 ? p - a.window + 1 : 0) : 0;
  return hi > lo;
}

namespace cpu {
void attention_prefill(const PrefillArgs& a);
void attention_decode(const DecodeArgs& a);
void kv_append(const KvAppendArgs& a);
void rope(const RopeArgs& a);
void sinusoidal(const SinusoidArgs& a);
void alibi_bias(const AlibiArgs& a);
void norm(const NormArgs& a);
void gated(const GatedArgs& a);
}  // namespace cpu

namespace cuda {
void attention_prefill(const PrefillArgs& a, void* stream);
void attention_decode(const DecodeArgs& a, void* stream);
void kv_append(const KvAppendArgs& a, void* stream);
void rope(const RopeArgs& a, void* stream);
void sinusoidal(const SinusoidArgs& a, void* stream);
void alibi_bias(const AlibiArgs& a, void* stream);
void norm(const NormArgs& a, void* stream);
void gated(const GatedArgs& a, void* stream);
}  // namespace cuda

}  // namespace gk

namespace gk::detail {
// A float32/float16/bfloat16 check naming the argument (TypeError otherwise).
void require_half_or_float(const Array& a, const char* arg);
// Same dtype as `ref` (TypeError naming both).
void require_same_dtype(const Array& a, const char* arg, const Array& ref, const char* ref_arg);
// Views x [..., H] as rows x H with a dense last dimension and one row stride.
// Returns x itself when possible, else a contiguous copy made on s.
struct Rows {
  Array a;
  int64_t rows = 0, H = 0, rs = 0;
};
Rows as_rows(const Array& x, const Stream& s);
}  // namespace gk::detail
