// The engine's own decode kernels (src/cuda/llm_decode.cu, CPU references in
// src/llm/fused.cpp): the few launches of one decode layer, each written so that
// inside the captured step a kernel can start while the previous one finishes
// (programmatic dependent launch, PDL: a kernel first issues the loads that do not
// depend on the previous kernel, the weights, then waits for it with
// griddepcontrol.wait, and lets the next kernel launch early with
// griddepcontrol.launch_dependents). Without PDL (GPUKIT_PDL=0, or off Hopper) the
// waits are no-ops and the kernels run one after the other as usual.
//
// - project: y = x @ w^T (+ bias) for M <= 8 rows of bf16/f16 x and dense weight rows,
//   fp32 sums in a fixed order (the same bits for a row whatever M), rounded once;
//   with swiglu, w = [gate; up] (2n rows) and y = silu(g) * u of the rounded g, u
//   (one launch instead of GEMV + swiglu).
// - rope_append: one token per sequence: q rotated in place, k rotated and stored with
//   v into the paged cache at position pos[t] of sequence t (block_table row t); the
//   cos/sin formula of nn::rope (sincosf of the fp32 angle, times mscale). A token
//   whose destination is outside the pool is not stored (device index arrays are not
//   inspected on the host, like nn::kv_append).
// - add_rms_norm: r = round(x + residual), y = rms_norm(r) * w (nn::rms_norm_residual's
//   rule), one block per row.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>

#include "gpukit/array.h"
#include "gpukit/quant.h"
#include "gpukit/stream.h"
#include "gpukit/nn.h"

namespace gk::llm {

constexpr int kFusedMaxFreqs = 512;  // rotary_dim <= 1024

struct ProjArgs {
  const void* x = nullptr;  // [m, k], rows x_rs elements apart
  const void* w = nullptr;  // [n or 2n, k], rows w_rs elements apart
  const void* bias = nullptr;  // [n] (not with swiglu) or null
  void* y = nullptr;           // [m, n] dense
  int64_t m = 0, n = 0, k = 0, x_rs = 0, w_rs = 0;
  DType dtype = DType::bf16;  // of x, w, bias, y
  bool swiglu = false;
  bool out_f32 = false;  // y float32 (plain projections without tail): the sums unrounded (+ bias)
  // with out_f32: the greedy token of each row folded in with an integer atomicMax:
  // argmax_keys[i] = max over rows j of key(y[i, j], j) (advance_argmax decodes and resets it)
  unsigned long long* argmax_keys = nullptr;
  // norm in: x holds raw residual rows r (k = H); y = (W (r * norm_w)) * rsqrt(mean(r^2) +
  // norm_eps), fp32, rounded once (the normalized row itself is never rounded).
  const void* norm_w = nullptr;
  float norm_eps = 0.f;
  // plain projections: y = round(round(x W^T (+ bias)) + res[i]) (add_rms_norm's residual rule)
  const void* res = nullptr;
  int64_t res_rs = 0;
  bool vec = false;  // CUDA: 16-byte aligned rows and k % 8 == 0
  bool pdl = false;
  // tail (plain projections, n % 8 == 0): the last block to finish also writes
  // tail_res_out = round(y + tail_res) and tail_out = rms_norm(tail_res_out) * tail_w
  // (add_rms_norm's bits); tail_counter: a zeroed int32 (left zeroed).
  bool tail = false;
  int* tail_counter = nullptr;
  const void* tail_res = nullptr;
  const void* tail_w = nullptr;
  void* tail_out = nullptr;
  void* tail_res_out = nullptr;
  int64_t tail_res_rs = 0;
  float tail_eps = 0.f;
  // rope: w is a layer's [Q + 2 KV, k] q/k/v weight; instead of y, q (rotated) goes to
  // q_out [m, hq, D] and k (rotated), v into the paged cache at pos[i] of sequence i
  // (the rule of rope_append; bias added before the rotation).
  bool rope = false;
  void* q_out = nullptr;
  void* kc = nullptr;
  void* vc = nullptr;
  int64_t nb = 0, bs = 0, bt_stride = 0, max_blocks = 0;
  int hq = 0, hkv = 0, D = 0, rd = 0;
  bool interleaved = false;
  const int32_t* pos = nullptr;
  const int32_t* block_table = nullptr;
  float mscale = 1.f;
  // kv_l2 (plain projections): the grid's last 32 blocks bring the pages of positions
  // 0 .. kv_pos[i] of sequence i (kv_bt row i) of both caches into L2 before their weights
  // (bulk prefetch; the attention after this projection reads them)
  const void* kv_k = nullptr;
  const void* kv_v = nullptr;
  const int32_t* kv_pos = nullptr;
  const int32_t* kv_bt = nullptr;
  int64_t kv_page_bytes = 0, kv_bs = 0, kv_nb = 0, kv_bt_stride = 0, kv_max_blocks = 0;
  // weights_evict_first (m == 1, no tail / norm-in / kv_l2): weight loads with an L2
  // evict-first policy
  bool w_ef = false;
  // o_proj_stage (m == 1, plain, k / 8 <= 512, no out_f32 / argmax / evict-first): blocks of
  // 8 rows, 4 loaded into registers and 4 into shared memory (cp.async) before the PDL
  // wait (k_project_stage2). The same bits.
  bool stage2 = false;
};
// The rope frequencies of a rope projection: a second kernel parameter, so that the
// other projections launch with a small parameter block.
struct ProjRope {
  float inv_freq[kFusedMaxFreqs] = {};
};

struct RopeAppendArgs {
  void* q = nullptr;  // [T, hq, D], rotated in place
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_ts = 0, q_hs = 0, k_ts = 0, k_hs = 0, v_ts = 0, v_hs = 0;
  void* kc = nullptr;  // [nb, bs, hkv, D] dense
  void* vc = nullptr;
  int64_t nb = 0, bs = 0, T = 0;
  int hq = 0, hkv = 0, D = 0, rd = 0;
  bool interleaved = false;
  const int32_t* pos = nullptr;          // [T]
  const int32_t* block_table = nullptr;  // [T, max_blocks]
  int64_t bt_stride = 0, max_blocks = 0;
  float mscale = 1.f;
  DType dtype = DType::bf16;
  bool pdl = false;
  const void* l2 = nullptr;  // bytes brought into L2 before the wait (L2Range), or null
  int64_t l2_bytes = 0;
  int grid_cap = 0;  // at most this many blocks per token (0: one thread per item)
  float inv_freq[kFusedMaxFreqs] = {};
};

struct AddNormArgs {
  const void* x = nullptr;
  const void* res = nullptr;
  const void* w = nullptr;
  void* out = nullptr;      // [rows, H] dense
  void* res_out = nullptr;  // [rows, H] dense
  int64_t rows = 0, H = 0, x_rs = 0, res_rs = 0;
  float eps = 1e-6f;
  DType dtype = DType::bf16;
  bool vec = false;
  bool pdl = false;
  // EngineOptions::quantized_x_prep (bf16, the row-in-registers kernel only): also xh [rows, H]
  // fp16 = out * 2^c_r and xinv[r] = 2^-c_r, the fp8 / int8 staged GEMV's scaled x (the values
  // of its x kernel k_w8_xprep, src/cuda/gemv_w8.cu); nullptr: not written
  void* xh = nullptr;
  float* xinv = nullptr;
};

// The decode step's first launch: x_out = table[ids], h_out = rms_norm(x_out) * w.
struct EmbedNormArgs {
  const int32_t* ids = nullptr;  // [T]
  const void* table = nullptr;   // [V, H], rows table_rs elements apart
  const void* w = nullptr;       // [H]
  void* x_out = nullptr;         // [T, H] dense
  void* h_out = nullptr;         // [T, H] dense
  int64_t T = 0, V = 0, H = 0, table_rs = 0;
  float eps = 1e-6f;
  DType dtype = DType::bf16;
  bool pdl = false;
};

// Up to 4 byte ranges to bring into L2.
struct PrefetchArgs {
  const void* p[4] = {};
  int64_t bytes[4] = {};
  int n = 0;
};

// A quantized weight [n, k] expanded to out_dtype (prefill): fmt 0 fp8 e4m3, 1 int8
// (the code values; the per-row scale is applied after the GEMM), 2 int4 ((q - z) * s).
struct DequantArgs {
  const void* q = nullptr;  // rows q_rs bytes apart
  const float* scales = nullptr;   // int4 [n, k / group]
  const uint8_t* zeros = nullptr;  // int4 [n, k / group]
  void* out = nullptr;             // [n, k] dense
  int64_t n = 0, k = 0, q_rs = 0, group = 0;
  int fmt = 0;
  DType out_dtype = DType::bf16;
};

// Decode attention with RoPE and the KV append (src/cuda/llm_attention.cu).
struct AttnArgs {
  const void* qkv = nullptr;  // [B, (hq + 2 hkv) D], rows qkv_rs elements apart: q | k | v before RoPE
  void* out = nullptr;        // [B, hq, D] dense
  void* kc = nullptr;         // [nb, bs, hkv, D] dense
  void* vc = nullptr;
  int64_t qkv_rs = 0, nb = 0, bs = 0, bt_stride = 0, max_blocks = 0;
  const int32_t* pos = nullptr;          // [B]: the new token's position (attends to 0 .. pos)
  const int32_t* block_table = nullptr;  // [B, max_blocks]
  int B = 0, hq = 0, hkv = 0, D = 0, rd = 0, S = 0;  // S: chunks of the grid (the longest possible sequence)
  int chunk = 128;  // keys per chunk (64 or 128)
  // where the CTAs let the next kernel launch (griddepcontrol.launch_dependents): 0 before
  // waiting for the projection (after the cache loads), 1 after reading its output, 2
  // after P V (before the output / merge), 3 not at all (at exit)
  int trigger = 0;
  // chunks of 64 / 128 keys, 2 <= S <= 8: the S CTAs of a (sequence, kv head) form a thread
  // block cluster and merge through distributed shared memory (else the workspace merge)
  bool cluster = false;
  bool interleaved = false;
  float mscale = 1.f, scale = 1.f;
  const void* l2 = nullptr;  // bytes brought into L2 before the wait (L2Range), or null
  int64_t l2_bytes = 0;
  bool l2_late = false;     // ... after the cached K/V have landed instead (L2Range::late)
  float* ws = nullptr;      // S > 1: partials
  int* counters = nullptr;  // [B * hkv] zeros (left zero)
  // debug (fused::AttnStampScope): per CTA 8 %globaltimer stamps, or null
  unsigned long long* stamps = nullptr;
  DType dtype = DType::bf16;
  bool pdl = false;
  // fused::AttnMmaScope (EngineOptions::fused_attention_mma): scores on the tensor cores
  // and P V with 16-byte V reads (other bits, within rounding of the float64 attention)
  bool mma = false;
  // fused::AttnMmaScope's pad (EngineOptions::fused_attention_pad_kb): dynamic shared memory
  // of at least this many KiB per CTA (capped at what one CTA may have), so that no other
  // kernel's blocks share the attention's SMs. The same bits.
  int pad_kb = 0;
  // fused::AttnMmaScope's push (EngineOptions::fused_attention_push): with cluster and mma,
  // the chunks s > 0 store their partials into rank 0's shared memory (st.async + mbarrier)
  // instead of the two cluster barriers and rank 0's remote loads. The same bits.
  bool push = false;
  // fused::AttnEarlyScope (EngineOptions::fused_attention_early_rope): the RoPE cos / sin and
  // the new token's cache slot computed before the PDL wait (MMA, chunks of 64 / 128 keys;
  // ignored otherwise). The same bits.
  bool early = false;
  // fused::AttnWideScope (EngineOptions::fused_attention_wide): 2 / 4 times the warps per CTA
  // (MMA, chunks of 64 / 128 keys; ignored otherwise, and early with it), 1: 4 where the grid's
  // CTAs fit two per SM, else 2 (llm_attention_rope decides). The same bits.
  unsigned char wide = 0;
};

namespace fused {
// Bytes of a weight the next kernels read, brought into L2 by a kernel before its PDL
// wait (bulk prefetch; the start rounded up, the length down, to 16 bytes).
struct L2Range {
  const void* p = nullptr;
  int64_t bytes = 0;
  bool late = false;  // the fused attention: after its cached K/V have landed (rope_append: ignored)
  L2Range aligned() const {  // 16-byte aligned start and length (empty when nothing is left)
    const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = (a + 15) & ~uintptr_t(15);
    const int64_t n = p && bytes > int64_t(b - a) ? (bytes - int64_t(b - a)) & ~int64_t(15) : 0;
    return n > 0 ? L2Range{reinterpret_cast<const void*>(b), n, late} : L2Range{};
  }
};
struct Rope {
  double theta = 10000.0;
  std::optional<int> rotary_dim;
  bool interleaved = false;
  nn::RopeScaling scaling;
};
// Whether kernels launch with PDL (CUDA, sm_90+, and GPUKIT_PDL is not "0"; read once).
bool pdl_enabled(Device d);
// -1: as GPUKIT_PDL says (default), 0: off, 1: on where supported (benchmarks; takes
// effect at the next launch or capture).
void set_pdl(int mode);
// Turns PDL off for the engine's launches of this thread while it lives (off = true).
struct NoPdlScope {
  explicit NoPdlScope(bool off);
  ~NoPdlScope();
  NoPdlScope(const NoPdlScope&) = delete;
  NoPdlScope& operator=(const NoPdlScope&) = delete;
  bool prev;
};
// The opposite for one launch (EngineOptions::quantized_attention_pdl): while it lives and
// `on`, a NoPdlScope around it is lifted (pdl_enabled then follows set_pdl / GPUKIT_PDL).
struct PdlOnScope {
  explicit PdlOnScope(bool on);
  ~PdlOnScope();
  PdlOnScope(const PdlOnScope&) = delete;
  PdlOnScope& operator=(const PdlOnScope&) = delete;
  bool prev;
};
// EngineOptions::quantized_small_pdl: while it lives, a NoPdlScope is lifted for the
// add_rms_norm launches (mask bit 1) and the SwiGLU launches (bit 2) of this thread.
struct SmallPdlScope {
  explicit SmallPdlScope(int mask);
  ~SmallPdlScope();
  SmallPdlScope(const SmallPdlScope&) = delete;
  SmallPdlScope& operator=(const SmallPdlScope&) = delete;
  int prev;
};
int small_pdl();
// Caps the grids of the small PDL-chained kernels (swiglu, rope_append) launched by this
// thread while it lives at `cap` blocks (0: no cap): a kernel launched early parks its
// blocks on the SMs until the previous kernel ends, so a small grid leaves the previous
// kernel (a quantized GEMV with large CTAs) its occupancy. The same bits.
struct GridCapScope {
  explicit GridCapScope(int cap);
  ~GridCapScope();
  GridCapScope(const GridCapScope&) = delete;
  GridCapScope& operator=(const GridCapScope&) = delete;
  int prev;
};
int grid_cap();
// EngineOptions::quantized_full_ring: while it lives, the fp8 / int8 GEMVs launched by this
// thread take the staged kernel's full ring where it fits (mask: bit 1 N > K, bit 2 N <= K;
// gk::gemv_w8_set_full_ring). The same bits.
struct W8FullRingScope {
  explicit W8FullRingScope(int mask);
  ~W8FullRingScope();
  W8FullRingScope(const W8FullRingScope&) = delete;
  W8FullRingScope& operator=(const W8FullRingScope&) = delete;
  int prev;
};
// EngineOptions::carveout: the preferred shared memory carveout (percent of the SM's
// unified L1 / shared memory, cudaFuncAttributePreferredSharedMemoryCarveout) of the
// engine's kernels launched by this thread while it lives; -1: the driver's default.
// The attribute belongs to the kernel (all its launches, graph nodes included), so once
// any scope asked for one, every later engine launch sets its kernel's attribute again.
// The same bits (it moves no arithmetic).
struct CarveoutScope {
  explicit CarveoutScope(int percent);
  ~CarveoutScope();
  CarveoutScope(const CarveoutScope&) = delete;
  CarveoutScope& operator=(const CarveoutScope&) = delete;
  int prev;
};
// EngineOptions::quant_streaming: while it lives, kernels launched into stream s (graph
// captures included: the kernel nodes take the stream's attribute) treat the bytes
// [p, p + n) (capped at the device's largest access policy window) as streaming data in L2
// (cudaAccessPropertyStreaming: evicted first), for the quantized GEMVs that are not the
// engine's own kernels. Restores an empty window after. Does nothing on the CPU, where the
// attribute is refused, or with n <= 0. The same bits (only a cache policy).
struct StreamWindowScope {
  StreamWindowScope(const Stream& s, const void* p, int64_t n);
  ~StreamWindowScope();
  StreamWindowScope(const StreamWindowScope&) = delete;
  StreamWindowScope& operator=(const StreamWindowScope&) = delete;
  void* st = nullptr;  // cudaStream_t while a window is set
};
// EngineOptions::fused_attention_mma: the fused decode attention launched by this thread
// while it lives takes its tensor-core score pass and 16-byte P V pass (AttnArgs::mma).
// pad_kb: AttnArgs::pad_kb of those launches (EngineOptions::fused_attention_pad_kb).
struct AttnMmaScope {
  explicit AttnMmaScope(bool on, int pad_kb = 0, bool push = false);
  ~AttnMmaScope();
  AttnMmaScope(const AttnMmaScope&) = delete;
  AttnMmaScope& operator=(const AttnMmaScope&) = delete;
  bool prev;
  int prev_pad;
  bool prev_push;
};
bool attention_mma();
bool attention_push();
int attention_pad_kb();
// EngineOptions::fused_attention_early_rope: the fused decode attention launched by this
// thread while it lives computes its rotations' cos / sin and the new token's slot before
// its PDL wait (AttnArgs::early). The same bits.
struct AttnEarlyScope {
  explicit AttnEarlyScope(bool on);
  ~AttnEarlyScope();
  AttnEarlyScope(const AttnEarlyScope&) = delete;
  AttnEarlyScope& operator=(const AttnEarlyScope&) = delete;
  bool prev;
};
bool attention_early();
// EngineOptions::fused_attention_wide: the fused decode attention launched by this thread
// while it lives runs with `wide` (2 or 4; 0: off) times the warps per CTA (AttnArgs::wide);
// -1: by the launch's grid (AttnArgs::wide 1, see there).
// The same bits.
struct AttnWideScope {
  explicit AttnWideScope(int wide);
  ~AttnWideScope();
  AttnWideScope(const AttnWideScope&) = delete;
  AttnWideScope& operator=(const AttnWideScope&) = delete;
  int prev;
};
int attention_wide();
// EngineOptions::o_proj_stage: while it lives, the first engine projection launched by this
// thread after each fused attention (the output projection) stages half of its blocks'
// rows in shared memory before its PDL wait (ProjArgs::stage2). The same bits.
struct OProjStageScope {
  explicit OProjStageScope(bool on);
  ~OProjStageScope();
  OProjStageScope(const OProjStageScope&) = delete;
  OProjStageScope& operator=(const OProjStageScope&) = delete;
  bool prev, prev_next;
};
void o_stage_after_attention();  // the fused attention was launched: the next projection stages
bool o_stage_take();             // whether this projection stages (and clears the mark)
// EngineOptions::weights_evict_first: the projection GEMVs launched by this thread while it
// lives (one row of x, plain / SwiGLU / RoPE epilogues) load their weights with an L2
// evict-first policy. The same bits.
struct EvictFirstScope {
  explicit EvictFirstScope(bool on);
  ~EvictFirstScope();
  EvictFirstScope(const EvictFirstScope&) = delete;
  EvictFirstScope& operator=(const EvictFirstScope&) = delete;
  bool prev;
};
bool weights_evict_first();
// The value an engine launch sets its kernel's carveout attribute to (-1: the default),
// or -2: leave it (no scope has asked for a carveout in this process).
int launch_carveout();
// Debug: the fused attention launched by this thread while it lives writes, per CTA
// (index (b * hkv + kv head) * S + chunk), 8 %globaltimer stamps (ns) to p[cta * 8 + i]:
// 0 entry, 1 its K/V copies issued (before the PDL wait), 2 after the wait, 3 q / k / v
// read, rotated and appended, 4 the K/V copies landed, 5 softmax done, 6 P V done, 7 its
// output / partials written (a CTA that attends to nothing writes none). Launches whose
// grid needs more than n u64 write none.
unsigned long long* attn_stamps(int64_t need);  // the scope's buffer if it holds `need` u64
struct AttnStampScope {
  AttnStampScope(unsigned long long* p, int64_t n);
  ~AttnStampScope();
  AttnStampScope(const AttnStampScope&) = delete;
  AttnStampScope& operator=(const AttnStampScope&) = delete;
  unsigned long long* prev_p;
  int64_t prev_n;
};
struct TailNorm;  // internal (project_norm)
// out_f32: float32 output, the sums not rounded to the weight type (the lm head's logits;
// not with swiglu or tail).
// More of a projection's options (project_opts).
struct ProjOpts {
  bool swiglu = false;
  bool out_f32 = false;
  const Array* argmax_keys = nullptr;
  // x holds raw residual rows r: the product with rms_norm(r) * norm_w, the normalized row
  // not rounded (ProjArgs::norm_w); norm_w [K] of w's dtype
  const Array* norm_w = nullptr;
  double norm_eps = 1e-6;
  // plain projections: y = round(round(x @ w^T) + residual), residual [M, N] of w's dtype
  const Array* residual = nullptr;
  const struct TailNorm* tail = nullptr;
  // the KV cache pages the attention after this projection reads, brought into L2 by the
  // grid's last blocks (ProjArgs::kv_k); CUDA, plain projections
  const Array* kv_k = nullptr;  // [nb, bs, hkv, D] dense, like kv_v
  const Array* kv_v = nullptr;
  const Array* kv_pos = nullptr;  // int32 [M]: the new token's position
  const Array* kv_bt = nullptr;   // int32 [M, max_blocks]
};
Array project_opts(const Array& x, const Array& w, const Array& bias, const ProjOpts& o, const Stream* s = nullptr);
// argmax_keys (with out_f32): uint64 [M] device keys left by a previous advance_argmax (or
// zeros): each row's greedy token is folded into it (sampling::argmax's rule: NaN as
// -inf, ties to the lowest index).
Array project(const Array& x, const Array& w, const Array& bias = {}, bool swiglu = false, const Stream* s = nullptr,
              const TailNorm* tail = nullptr, bool out_f32 = false, const Array* argmax_keys = nullptr);
struct TailNorm {
  Array res, w;
  double eps;
  int32_t* counter;
  Array out, res_out;
};
void rope_append(const Array& q, const Array& k, const Array& v, const Array& k_cache, const Array& v_cache,
                 const Array& positions, const Array& block_table, const Rope& rope, const Stream* s = nullptr,
                 const L2Range& l2 = {});
// project + rope_append in one launch: x [M <= 8, H] @ w^T with w = [Wq; Wk; Wv]
// ([(hq + 2 hkv) D, H]) (+ bias); returns q [M, hq, D] rotated; k rotated and v stored
// into the caches at positions[i] of sequence i (block_table row i). The same bits as
// project then rope_append.
Array project_qkv_rope(const Array& x, const Array& w, const Array& bias, int64_t hq, const Array& k_cache,
                       const Array& v_cache, const Array& positions, const Array& block_table, const Rope& rope,
                       const Stream* s = nullptr);
std::pair<Array, Array> add_rms_norm(const Array& x, const Array& residual, const Array& w, double eps,
                                     const Stream* s = nullptr);
// EngineOptions::quantized_x_prep: add_rms_norm that also writes, where it can (CUDA, bf16,
// rows <= 8, H % 8 == 0, H <= 8192, aligned), xh [rows, H] fp16 = h * 2^c_r and xinv [rows]
// fp32 = 2^-c_r: the fp8 / int8 staged GEMV's scaled x (gemv_quantized_prepared); elsewhere
// xh and xinv stay undefined. h and the residual: the same bits as add_rms_norm.
struct AddNormPrep {
  Array h, res, xh, xinv;
};
AddNormPrep add_rms_norm_prep(const Array& x, const Array& residual, const Array& w, double eps,
                              const Stream* s = nullptr);

// project then add_rms_norm(y, residual, norm_w, eps) with the norm done by the
// projection's last block (one launch): returns y; h_out = the normalized rows, res_out
// = y + residual. counter: an int32 device array of zeros, slot < its size (left zero).
// The same bits as the two launches.
Array project_norm(const Array& x, const Array& w, const Array& residual, const Array& norm_w, double eps,
                   const Array& counter, int64_t slot, Array& h_out, Array& res_out, const Stream* s = nullptr);

// SwiGLU of gu [rows, 2 I] (gate then up, last dim dense): [rows, I], silu(g) * u
// rounded once (gk::nn::gated_fused's rule), PDL-chained on CUDA.
Array swiglu(const Array& gu, const Stream* s = nullptr);

// The decode step's input update in one launch: in = int32 [3, B] (ids, positions,
// lengths, dense): ids = tokens (int32 [B]), positions and lengths + 1.
void advance_inputs(const Array& in, const Array& tokens, const Stream* s = nullptr);
// The same from the argmax keys of project(..., argmax_keys): returns the tokens (int32
// [B]) and zeroes the keys for the next step.
Array advance_argmax(const Array& in, const Array& keys, const Stream* s = nullptr);

// The first launch of a decode step (src/llm/fused_step.cpp): x = table[ids] (the
// residual stream) and h = rms_norm(x) * w, add_rms_norm's sums (so the same bits as
// add_rms_norm(x, 0, w)). ids int32 [T] (an id outside the table gives zero rows),
// table [V, H] with dense rows, H a multiple of 8 and <= 8192 (bf16/fp16) on CUDA.
// Returns {h, x}. supported(): whether the CUDA kernel takes these arguments.
std::pair<Array, Array> embed_norm(const Array& ids, const Array& table, const Array& w, double eps,
                                   const Stream* s = nullptr);
bool embed_norm_supported(const Array& table, const Array& w);
// Fire-and-forget L2 prefetch of byte ranges on stream s (CUDA; nothing elsewhere).
void prefetch_l2(const PrefetchArgs& a, bool evict_last, const Stream& s);
// y = x @ dequantize(qw)^T for many rows of bf16/fp16 x on CUDA (prefill): the weight
// expanded to x's type (fp8 / int8 code values, exact; int4 (q - z) * s rounded once),
// cuBLASLt, then the per-row scale (fp8 / int8) on the float32 result. Returns an
// undefined array when the format or layout is not handled (the caller falls back).
Array dequant_linear(const Array& x, const QuantizedWeight& qw, DType out, const Stream* s = nullptr);

// Decode attention of one new token per sequence from the q/k/v projection's output
// qkv [B <= 8, (hq + 2 hkv) D] (before RoPE; bias added): q and k rotated as rope_append
// does, k and v stored in the paged caches at positions[b] (the rule of rope_append),
// and attention of the hq query heads over keys 0 .. positions[b] (scale 1/sqrt(D));
// returns [B, hq, D]. chunk: keys per CTA (64, 128, or 256 / 384 with one thread per
// key: one CTA per kv head for contexts that fit). counters: int32 device zeros, >= B * hkv (left zero). On CUDA
// one launch (src/cuda/llm_attention.cu, head_dim 64 or 128, <= 8 query heads per kv
// head, block_table.shape(1) * block_size keys at most attention_rope_max_keys);
// elsewhere rope_append + nn::attention_decode. supported(): whether the CUDA kernel
// takes these shapes.
Array attention_rope(const Array& qkv, int64_t hq, const Array& k_cache, const Array& v_cache,
                     const Array& positions, const Array& block_table, const Rope& rope, const Array& counters,
                     const Stream* s = nullptr, int chunk = 128, int trigger = 0, const L2Range& l2 = {},
                     bool cluster = false, int* merge = nullptr);  // merge: the kernel's (llm_attention_rope)
bool attention_rope_supported(int64_t B, int64_t hq, int64_t hkv, int64_t D, int64_t max_keys, DType t);
constexpr int64_t attention_rope_max_keys = 16384;

// CPU references (src/llm/fused.cpp)
void ref_project(const ProjArgs& a);
void ref_rope_append(const RopeAppendArgs& a);
void ref_add_rms_norm(const AddNormArgs& a);
}  // namespace fused

}  // namespace gk::llm

namespace gk::cuda {
// src/cuda/llm_decode.cu (CUDA builds only)
void llm_project(const llm::ProjArgs& a, const llm::ProjRope* rope, void* stream);
void llm_rope_append(const llm::RopeAppendArgs& a, void* stream);
void llm_add_rms_norm(const llm::AddNormArgs& a, void* stream);
void llm_advance(int32_t* in, const int32_t* tokens, int64_t B, bool pdl, void* stream);
void llm_advance_argmax(int32_t* in, unsigned long long* keys, int32_t* tokens, int64_t B, bool pdl, void* stream);
void llm_swiglu(const void* gu, void* out, int64_t rows, int64_t I, int64_t gu_rs, DType t, bool pdl, void* stream,
                int grid_cap = 0);
// src/cuda/llm_attention.cu
// Returns how the chunks merge: 0 one chunk or the workspace, 1 the cluster (pull), 2 push;
// plus 4 where the kernels of AttnArgs::wide ran, and 8 where they ran with 4 times the warps.
int llm_attention_rope(const llm::AttnArgs& a, const llm::ProjRope& rope, void* stream);
int64_t llm_attention_ws_floats(int64_t B, int64_t hkv, int64_t S);
// src/cuda/llm_attention_wide.cu: the kernels of AttnArgs::wide (called by llm_attention_rope,
// which checks the arguments; cl / push: the merge it chose)
void llm_attention_rope_wide(const llm::AttnArgs& a, const llm::ProjRope& rope, void* stream, bool cl, bool push);
// src/cuda/llm_step.cu
void llm_embed_norm(const llm::EmbedNormArgs& a, void* stream);
void llm_prefetch_l2(const llm::PrefetchArgs& a, bool evict_last, void* stream);
void llm_dequant(const llm::DequantArgs& a, void* stream);
void llm_scale_cols(const float* acc, const float* scales, void* y, int64_t m, int64_t n, DType out, void* stream);
}  // namespace gk::cuda
