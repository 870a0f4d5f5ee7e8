// Front ends and CPU references of the engine's decode kernels (see llm/fused.h): PDL state,
// the projection GEMV (with its SwiGLU / RMSNorm / RoPE + KV append epilogues); rope_append,
// add_rms_norm, swiglu and the step's input update are in fused_small.cpp.
#include "llm/fused.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpukit/errors.h"
#include "gpukit/ops.h"
#include "llm/fused_checks.h"
#include "ops/common.h"
#include "ops/nn_args.h"
#if GPUKIT_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_util.h"
#endif

namespace gk::llm::fused {

using namespace checks;

namespace {
std::atomic<int> g_pdl{-1};
thread_local bool t_no_pdl = false;
thread_local int t_grid_cap = 0;
}  // namespace
NoPdlScope::NoPdlScope(bool off) : prev(t_no_pdl) { t_no_pdl = t_no_pdl || off; }
NoPdlScope::~NoPdlScope() { t_no_pdl = prev; }
PdlOnScope::PdlOnScope(bool on) : prev(t_no_pdl) { t_no_pdl = t_no_pdl && !on; }
PdlOnScope::~PdlOnScope() { t_no_pdl = prev; }
namespace {
thread_local int t_small_pdl = 0;
}  // namespace
SmallPdlScope::SmallPdlScope(int mask) : prev(t_small_pdl) { t_small_pdl = mask; }
SmallPdlScope::~SmallPdlScope() { t_small_pdl = prev; }
int small_pdl() { return t_small_pdl; }
GridCapScope::GridCapScope(int cap) : prev(t_grid_cap) {
  if (cap > 0) t_grid_cap = cap;
}
GridCapScope::~GridCapScope() { t_grid_cap = prev; }
int grid_cap() { return t_grid_cap; }
namespace {
thread_local int t_carveout = -1;
std::atomic<bool> g_carveout_used{false};
}  // namespace
CarveoutScope::CarveoutScope(int percent) : prev(t_carveout) {
  t_carveout = percent < 0 ? -1 : std::min(percent, 100);
  if (t_carveout >= 0) g_carveout_used.store(true, std::memory_order_relaxed);
}
CarveoutScope::~CarveoutScope() { t_carveout = prev; }
namespace {
thread_local bool t_wef = false;
thread_local bool t_amma = false;
thread_local int t_apad = 0;
thread_local bool t_apush = false;
}  // namespace
AttnMmaScope::AttnMmaScope(bool on, int pad_kb, bool push) : prev(t_amma), prev_pad(t_apad), prev_push(t_apush) {
  t_amma = on;
  t_apad = std::clamp(pad_kb, 0, 227);
  t_apush = push;
}
AttnMmaScope::~AttnMmaScope() {
  t_amma = prev;
  t_apad = prev_pad;
  t_apush = prev_push;
}
namespace {
thread_local bool t_aearly = false;
}  // namespace
AttnEarlyScope::AttnEarlyScope(bool on) : prev(t_aearly) { t_aearly = on; }
AttnEarlyScope::~AttnEarlyScope() { t_aearly = prev; }
bool attention_early() { return t_aearly; }
namespace {
thread_local int t_awide = 0;
}  // namespace
AttnWideScope::AttnWideScope(int wide) : prev(t_awide) { t_awide = wide == 2 || wide == 4 ? wide : wide < 0 ? 1 : 0; }
AttnWideScope::~AttnWideScope() { t_awide = prev; }
int attention_wide() { return t_awide; }
namespace {
thread_local bool t_ostage = false, t_ostage_next = false;
}  // namespace
OProjStageScope::OProjStageScope(bool on) : prev(t_ostage), prev_next(t_ostage_next) {
  t_ostage = on;
  t_ostage_next = false;
}
OProjStageScope::~OProjStageScope() {
  t_ostage = prev;
  t_ostage_next = prev_next;
}
void o_stage_after_attention() { t_ostage_next = t_ostage; }
bool o_stage_take() {
  const bool v = t_ostage_next;
  t_ostage_next = false;
  return v;
}
bool attention_push() { return t_apush; }
bool attention_mma() { return t_amma; }
int attention_pad_kb() { return t_apad; }
EvictFirstScope::EvictFirstScope(bool on) : prev(t_wef) { t_wef = on; }
EvictFirstScope::~EvictFirstScope() { t_wef = prev; }
bool weights_evict_first() { return t_wef; }

StreamWindowScope::StreamWindowScope(const Stream& s, const void* p, int64_t n) {
#if GPUKIT_WITH_CUDA
  if (!s.device().is_cuda() || p == nullptr || n <= 0) return;
  static int max_win[64] = {};  // cudaDevAttrMaxAccessPolicyWindowSize per device (+1: known)
  const int i = s.device().index < 64 ? s.device().index : 63;
  if (max_win[i] == 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxAccessPolicyWindowSize, s.device().index) != cudaSuccess) {
      (void)cudaGetLastError();
      v = 0;
    }
    max_win[i] = v + 1;
  }
  const int64_t cap = max_win[i] - 1;
  if (cap <= 0) return;
  cudaStreamAttrValue v = {};
  v.accessPolicyWindow.base_ptr = const_cast<void*>(p);
  v.accessPolicyWindow.num_bytes = size_t(std::min<int64_t>(n, cap));
  v.accessPolicyWindow.hitRatio = 1.0f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyStreaming;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  auto cs = static_cast<cudaStream_t>(s.handle());
  if (cudaStreamSetAttribute(cs, cudaStreamAttributeAccessPolicyWindow, &v) != cudaSuccess) {
    (void)cudaGetLastError();  // refused (e.g. during some captures): no window, nothing else changes
    return;
  }
  st = cs;
#else
  (void)s, (void)p, (void)n;
#endif
}
StreamWindowScope::~StreamWindowScope() {
#if GPUKIT_WITH_CUDA
  if (!st) return;
  cudaStreamAttrValue v = {};
  v.accessPolicyWindow.num_bytes = 0;
  v.accessPolicyWindow.hitRatio = 0.f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyNormal;
  v.accessPolicyWindow.missProp = cudaAccessPropertyNormal;
  if (cudaStreamSetAttribute(static_cast<cudaStream_t>(st), cudaStreamAttributeAccessPolicyWindow, &v) != cudaSuccess)
    (void)cudaGetLastError();
#endif
}
namespace {
thread_local unsigned long long* t_stamps = nullptr;
thread_local int64_t t_stamps_n = 0;
}  // namespace
AttnStampScope::AttnStampScope(unsigned long long* p, int64_t n) : prev_p(t_stamps), prev_n(t_stamps_n) {
  t_stamps = p;
  t_stamps_n = p ? n : 0;
}
AttnStampScope::~AttnStampScope() {
  t_stamps = prev_p;
  t_stamps_n = prev_n;
}
unsigned long long* attn_stamps(int64_t need) { return t_stamps && need <= t_stamps_n ? t_stamps : nullptr; }
int launch_carveout() { return g_carveout_used.load(std::memory_order_relaxed) ? t_carveout : -2; }
void set_pdl(int mode) {
  if (mode < -1 || mode > 1) throw ValueError(cat("pdl: expected -1, 0 or 1, got ", mode));
  g_pdl.store(mode);
}

bool pdl_enabled(Device d) {
#if GPUKIT_WITH_CUDA
  if (!d.is_cuda() || t_no_pdl) return false;
  static const bool env_on = [] {
    const char* e = std::getenv("GPUKIT_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  const int mode = g_pdl.load();
  if (mode == 0 || (mode < 0 && !env_on)) return false;
  static int major[64] = {};
  const int i = d.index < 64 ? d.index : 63;
  if (major[i] == 0) {
    int v = 0;
    GK_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, d.index));
    major[i] = v;
  }
  return major[i] >= 9;
#else
  (void)d;
  return false;
#endif
}

// ---- project ----

Array project(const Array& x, const Array& w, const Array& bias, bool swiglu, const Stream* sp, const TailNorm* tail,
              bool out_f32, const Array* argmax_keys) {
  ProjOpts o;
  o.swiglu = swiglu;
  o.tail = tail;
  o.out_f32 = out_f32;
  o.argmax_keys = argmax_keys;
  return project_opts(x, w, bias, o, sp);
}

Array project_opts(const Array& x_in, const Array& w, const Array& bias, const ProjOpts& opt, const Stream* sp) {
  const bool swiglu = opt.swiglu, out_f32 = opt.out_f32;
  const TailNorm* tail = opt.tail;
  const Array* argmax_keys = opt.argmax_keys;
  Device d = detail::common_device({{"x", &x_in}, {"w", &w}});
  Stream s = resolve_stream(sp, d);
  if (w.dtype() != DType::bf16 && w.dtype() != DType::f16)
    throw TypeError(cat("w: project reads bfloat16 or float16 weights, got ", dtype_name(w.dtype())));
  same_dtype(w, x_in, "x");
  if (w.ndim() != 2 || x_in.ndim() != 2)
    throw ValueError(cat("project: x [M, K] and w [N, K] expected, got ", shape_str(x_in.shape()), " and ",
                         shape_str(w.shape())));
  const int64_t m = x_in.shape(0), k = w.shape(1), nw = w.shape(0);
  if (x_in.shape(1) != k)
    throw ValueError(cat("project: x has ", x_in.shape(1), " features but w has ", k, " columns"));
  if (m > 8) throw ValueError(cat("x: project takes at most 8 rows, got ", m));
  if (swiglu && nw % 2) throw ValueError(cat("w: swiglu needs [gate; up] with an even row count, got ", nw));
  if (swiglu && bias.defined()) throw ValueError("bias: not supported with swiglu");
  if (out_f32 && (swiglu || tail)) throw ValueError("project: a float32 output only for plain projections");
  if (argmax_keys && (!out_f32 || !argmax_keys->defined() || argmax_keys->dtype() != DType::i64 ||
                      argmax_keys->ndim() != 1 || argmax_keys->shape(0) != x_in.shape(0) ||
                      !argmax_keys->is_contiguous() || argmax_keys->device() != d))
    throw ValueError("argmax_keys: int64 [M] on the device of x (with a float32 output) expected");
  const int64_t n = swiglu ? nw / 2 : nw;
  if (bias.defined()) {
    same_dtype(w, bias, "bias");
    if (bias.device() != d) throw ValueError(cat("bias: must be on ", d.str()));
    if (bias.ndim() != 1 || bias.shape(0) != n) throw ValueError(cat("bias: shape (", n, ",) expected"));
  }
  if (opt.norm_w) {
    const Array& nw_ = *opt.norm_w;
    if (!nw_.defined() || nw_.ndim() != 1 || nw_.shape(0) != k || nw_.dtype() != w.dtype() || nw_.device() != d ||
        (k > 1 && nw_.stride(0) != 1) || !al16(nw_.data()))
      throw ValueError(cat("norm_w: a dense aligned (", k, ",) array of the weights' dtype on ", d.str(), " expected"));
    if (tail) throw ValueError("project: norm_w not with a tail norm");
    if (!(opt.norm_eps >= 0) || !std::isfinite(opt.norm_eps)) throw ValueError("norm_eps: must be finite and >= 0");
  }
  if (opt.residual) {
    const Array& r = *opt.residual;
    if (swiglu || out_f32 || tail) throw ValueError("residual: only for plain projections with the weights' dtype");
    if (!r.defined() || r.ndim() != 2 || r.shape(0) != m || r.shape(1) != n || r.dtype() != w.dtype() ||
        r.device() != d || (n > 1 && r.stride(1) != 1))
      throw ValueError(cat("residual: [", m, ", ", n, "] of the weights' dtype with dense rows expected"));
  }
  Array x = x_in.stride(1) == 1 || k <= 1 ? x_in : x_in.contiguous(&s);
  Array wd = w.stride(1) == 1 || k <= 1 ? w : w.contiguous(&s);
  Array b = bias.defined() ? bias.contiguous(&s) : Array();
  Array y = Array::empty({m, n}, out_f32 ? DType::f32 : w.dtype(), d, &s);
  if (y.numel() == 0) return y;
  ProjArgs a;
  a.out_f32 = out_f32;
  a.x = x.data();
  a.w = wd.data();
  a.bias = b.defined() ? b.data() : nullptr;
  a.y = y.data();
  a.m = m;
  a.n = n;
  a.k = k;
  a.x_rs = m == 1 ? k : x.stride(0);  // one row: its stride is irrelevant (a size-1 dim may carry any stride)
  a.w_rs = wd.stride(0);
  a.dtype = w.dtype();
  a.swiglu = swiglu;
  if (opt.norm_w) {
    a.norm_w = opt.norm_w->data();
    a.norm_eps = float(opt.norm_eps);
  }
  if (opt.residual) {
    a.res = opt.residual->data();
    a.res_rs = opt.residual->stride(0);
  }
  if (d.is_cpu()) {
    ref_project(a);
    if (argmax_keys) {  // the kernel's key rule on the host
      auto* keys = static_cast<uint64_t*>(argmax_keys->data());
      const float* yp = y.data_as<float>();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          float v = yp[i * n + j];
          if (v != v) v = -INFINITY;
          if (v == 0.f) v = 0.f;
          uint32_t u;
          std::memcpy(&u, &v, 4);
          const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
          const uint64_t key = (uint64_t(ord) << 32) | (0xffffffffu - uint32_t(j));
          keys[i] = std::max(keys[i], key);
        }
    }
    return y;
  }
#if GPUKIT_WITH_CUDA
  if (!al16(a.x) || a.x_rs % 8 != 0) {  // x is small: an aligned copy
    x = x.copy(&s);
    a.x = x.data();
    a.x_rs = k;
  }
  a.vec = al16(a.w) && a.w_rs % 8 == 0 && k % 8 == 0 && al16(a.x);
  if (!a.vec) throw ValueError("w: project needs 16-byte aligned weight rows and K % 8 == 0");
  a.pdl = pdl_enabled(d);
  a.w_ef = t_wef;
  a.stage2 = o_stage_take();
  if (argmax_keys) a.argmax_keys = static_cast<unsigned long long*>(argmax_keys->data());
  if (opt.kv_k && opt.kv_v && opt.kv_pos && opt.kv_bt && !swiglu && !tail) {
    const Array &kc = *opt.kv_k, &vc = *opt.kv_v, &ps = *opt.kv_pos, &bt = *opt.kv_bt;
    const bool ok = kc.defined() && vc.defined() && kc.ndim() == 4 && kc.shape() == vc.shape() && kc.is_contiguous() &&
                    vc.is_contiguous() && kc.device() == d && vc.device() == d && ps.defined() &&
                    ps.dtype() == DType::i32 && ps.ndim() == 1 && ps.shape(0) == m && ps.is_contiguous() &&
                    ps.device() == d && bt.defined() && bt.dtype() == DType::i32 && bt.ndim() == 2 &&
                    bt.shape(0) == m && bt.stride(1) == 1 && bt.device() == d && al16(kc.data()) && al16(vc.data());
    const int64_t page = ok ? int64_t(kc.nbytes()) / std::max<int64_t>(kc.shape(0), 1) : 0;
    if (ok && page > 0 && page % 16 == 0 && page <= 65536) {
      a.kv_k = kc.data();
      a.kv_v = vc.data();
      a.kv_pos = ps.data_as<int32_t>();
      a.kv_bt = bt.data_as<int32_t>();
      a.kv_page_bytes = page;
      a.kv_bs = kc.shape(1);
      a.kv_nb = kc.shape(0);
      a.kv_bt_stride = bt.stride(0);
      a.kv_max_blocks = bt.shape(1);
    }
  }
  if (tail) {
    a.tail = true;
    a.tail_counter = tail->counter;
    a.tail_res = tail->res.data();
    a.tail_res_rs = tail->res.stride(0);
    a.tail_w = tail->w.data();
    a.tail_out = tail->out.data();
    a.tail_res_out = tail->res_out.data();
    a.tail_eps = float(tail->eps);
    for (const Array* t : {&tail->res, &tail->w}) detail::mark_used(*t, s);
  }
  for (const Array* t : {&x, &wd, &b})
    if (t->defined()) detail::mark_used(*t, s);
  for (const Array* t : {opt.norm_w, opt.residual})
    if (t) detail::mark_used(*t, s);
  cuda::llm_project(a, nullptr, s.handle());
#else
  detail::no_cuda_backend();
#endif
  return y;
}

Array project_norm(const Array& x, const Array& w, const Array& residual, const Array& norm_w, double eps,
                   const Array& counter, int64_t slot, Array& h_out, Array& res_out, const Stream* sp) {
  const Device d = x.device();
  const bool kernel = d.is_cuda() && x.defined() && w.defined() && residual.defined() && norm_w.defined() &&
                      w.ndim() == 2 && residual.ndim() == 2 && norm_w.ndim() == 1 && x.ndim() == 2 &&
                      residual.dtype() == w.dtype() && norm_w.dtype() == w.dtype() &&
                      residual.shape(0) == x.shape(0) && residual.shape(1) == w.shape(0) &&
                      norm_w.shape(0) == w.shape(0) && w.shape(0) % 8 == 0 && residual.device() == d &&
                      norm_w.device() == d && (residual.shape(1) <= 1 || residual.stride(1) == 1) &&
                      residual.stride(0) % 8 == 0 && al16(residual.data()) && norm_w.stride(0) == 1 &&
                      al16(norm_w.data()) && counter.defined() && counter.device() == d &&
                      counter.dtype() == DType::i32 && counter.is_contiguous() && slot >= 0 && slot < counter.numel();
  if (!kernel) {  // two launches (and the CPU)
    Array y = project(x, w, Array(), false, sp);
    std::tie(h_out, res_out) = add_rms_norm(y, residual, norm_w, eps, sp);
    return y;
  }
  Stream s = resolve_stream(sp, d);
  const int64_t m = x.shape(0), n = w.shape(0);
  h_out = Array::empty({m, n}, w.dtype(), d, &s);
  res_out = Array::empty({m, n}, w.dtype(), d, &s);
  TailNorm t{residual, norm_w, eps, counter.data_as<int32_t>() + slot, h_out, res_out};
  return project(x, w, Array(), false, sp, &t);
}

void ref_project(const ProjArgs& a) {
  dispatch_float(a.dtype, [&](auto tv) {
    using T = decltype(tv);
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.w);
    T* y = static_cast<T*>(a.y);
    const T* nw = static_cast<const T*>(a.norm_w);
    auto dot = [&](int64_t i, int64_t row) {
      float acc = 0.f;
      if (nw) {  // norm in: (sum of r * norm_w * w) * rsqrt(mean(r^2) + eps)
        float ss = 0.f;
        for (int64_t e = 0; e < a.k; ++e) {
          const float r = float(x[i * a.x_rs + e]);
          ss += r * r;
          acc += (r * float(nw[e])) * float(w[row * a.w_rs + e]);
        }
        return acc * (1.0f / std::sqrt(ss / float(a.k) + a.norm_eps));
      }
      for (int64_t e = 0; e < a.k; ++e) acc += float(x[i * a.x_rs + e]) * float(w[row * a.w_rs + e]);
      return acc;
    };
    for (int64_t i = 0; i < a.m; ++i)
      for (int64_t j = 0; j < a.n; ++j) {
        if (a.swiglu) {
          const float g = float(convert<T>(dot(i, j))), u = float(convert<T>(dot(i, a.n + j)));
          y[i * a.n + j] = convert<T>(gated_fn<nn::GatedAct::SwiGLU, float>(g, u));
        } else if (a.out_f32) {
          const float v = dot(i, j);
          static_cast<float*>(a.y)[i * a.n + j] = a.bias ? v + float(static_cast<const T*>(a.bias)[j]) : v;
        } else {
          T v = convert<T>(dot(i, j));
          if (a.bias) v = convert<T>(float(v) + float(static_cast<const T*>(a.bias)[j]));
          if (a.res) v = convert<T>(float(v) + float(static_cast<const T*>(a.res)[i * a.res_rs + j]));
          y[i * a.n + j] = v;
        }
      }
  });
}

Array project_qkv_rope(const Array& x_in, const Array& w, const Array& bias, int64_t hq, const Array& k_cache,
                       const Array& v_cache, const Array& positions, const Array& block_table, const Rope& rope,
                       const Stream* sp) {
  Device d = detail::common_device({{"x", &x_in}, {"w", &w}, {"k_cache", &k_cache}, {"v_cache", &v_cache},
                                    {"positions", &positions}, {"block_table", &block_table}});
  Stream s = resolve_stream(sp, d);
  if (w.dtype() != DType::bf16 && w.dtype() != DType::f16)
    throw TypeError(cat("w: project_qkv_rope reads bfloat16 or float16 weights, got ", dtype_name(w.dtype())));
  same_dtype(w, x_in, "x");
  same_dtype(w, k_cache, "k_cache");
  same_dtype(w, v_cache, "v_cache");
  if (w.ndim() != 2 || x_in.ndim() != 2 || x_in.shape(1) != w.shape(1))
    throw ValueError(cat("project_qkv_rope: x [M, K] and w [N, K] expected, got ", shape_str(x_in.shape()), " and ",
                         shape_str(w.shape())));
  const int64_t m = x_in.shape(0), k = w.shape(1), n = w.shape(0);
  if (m > 8) throw ValueError(cat("x: project_qkv_rope takes at most 8 rows, got ", m));
  if (k_cache.ndim() != 4 || k_cache.shape() != v_cache.shape() || !k_cache.is_contiguous() ||
      !v_cache.is_contiguous())
    throw ValueError("k_cache, v_cache: dense [blocks, block_size, Hkv, D] of one shape expected");
  const int64_t hkv = k_cache.shape(2), D = k_cache.shape(3);
  if (hq <= 0 || D % 2 || D > 1024 || hq > INT32_MAX / 1024 || n != (hq + 2 * hkv) * D)
    throw ValueError(cat("w: ", n, " rows, expected (hq + 2 hkv) * D = (", hq, " + 2 * ", hkv, ") * ", D,
                         " with an even D"));
  if (positions.dtype() != DType::i32 || positions.ndim() != 1 || positions.shape(0) != m)
    throw ValueError(cat("positions: int32 (", m, ",) expected"));
  if (block_table.dtype() != DType::i32 || block_table.ndim() != 2 || block_table.shape(0) != m ||
      block_table.stride(1) != 1)
    throw ValueError(cat("block_table: int32 [", m, ", max_blocks] with dense rows expected"));
  if (bias.defined()) {
    same_dtype(w, bias, "bias");
    if (bias.device() != d || bias.ndim() != 1 || bias.shape(0) != n)
      throw ValueError(cat("bias: shape (", n, ",) on ", d.str(), " expected"));
  }
  const int rd = rope.rotary_dim ? *rope.rotary_dim : int(D);
  if (rd < 2 || rd > D || rd % 2 || rd / 2 > kFusedMaxFreqs)
    throw ValueError(cat("rotary_dim: must be even and in [2, head_dim = ", D, "], got ", rd));
  double mscale = 1.0;
  std::vector<double> f = nn::rope_inv_freq(rope.theta, rd, rope.scaling, &mscale);
  Array x = x_in.stride(1) == 1 || k <= 1 ? x_in : x_in.contiguous(&s);
  Array wd = w.stride(1) == 1 || k <= 1 ? w : w.contiguous(&s);
  Array b = bias.defined() ? bias.contiguous(&s) : Array();
  Array q = Array::empty({m, hq, D}, w.dtype(), d, &s);
  if (q.numel() == 0 && k_cache.numel() == 0) return q;
  ProjArgs a;
  a.x = x.data();
  a.w = wd.data();
  a.bias = b.defined() ? b.data() : nullptr;
  a.m = m;
  a.n = n;
  a.k = k;
  a.x_rs = m == 1 ? k : x.stride(0);  // one row: its stride is irrelevant (a size-1 dim may carry any stride)
  a.w_rs = wd.stride(0);
  a.dtype = w.dtype();
  a.rope = true;
  a.q_out = q.data();
  a.kc = k_cache.data();
  a.vc = v_cache.data();
  a.nb = k_cache.shape(0);
  a.bs = k_cache.shape(1);
  a.bt_stride = block_table.stride(0);
  a.max_blocks = block_table.shape(1);
  a.hq = int(hq);
  a.hkv = int(hkv);
  a.D = int(D);
  a.rd = rd;
  a.interleaved = rope.interleaved;
  a.pos = positions.data_as<int32_t>();
  a.block_table = block_table.data_as<int32_t>();
  a.mscale = float(mscale);
  ProjRope pr;
  for (int i = 0; i < rd / 2; ++i) pr.inv_freq[i] = float(f[size_t(i)]);
  if (d.is_cpu()) {  // the reference: project, then rope_append on views of its output
    Array y = Array::empty({m, n}, w.dtype(), d);
    ProjArgs p = a;
    p.rope = false;
    p.y = y.data();
    ref_project(p);  // (+ bias: the rounding steps of the plain path)
    RopeAppendArgs r;
    r.q = y.data();
    r.k = static_cast<const uint8_t*>(y.data()) + hq * D * int64_t(itemsize(a.dtype));
    r.v = static_cast<const uint8_t*>(y.data()) + (hq + hkv) * D * int64_t(itemsize(a.dtype));
    r.q_ts = r.k_ts = r.v_ts = n;
    r.q_hs = r.k_hs = r.v_hs = D;
    r.kc = a.kc;
    r.vc = a.vc;
    r.nb = a.nb;
    r.bs = a.bs;
    r.T = m;
    r.hq = a.hq;
    r.hkv = a.hkv;
    r.D = a.D;
    r.rd = rd;
    r.interleaved = a.interleaved;
    r.pos = a.pos;
    r.block_table = a.block_table;
    r.bt_stride = a.bt_stride;
    r.max_blocks = a.max_blocks;
    r.mscale = a.mscale;
    r.dtype = a.dtype;
    std::copy(std::begin(pr.inv_freq), std::end(pr.inv_freq), std::begin(r.inv_freq));
    if (a.nb > 0 && a.bs > 0) ref_rope_append(r);
    copy_into(q.reshape({m, hq * D}), y.narrow(1, 0, hq * D));
    return q;
  }
#if GPUKIT_WITH_CUDA
  if (!al16(a.x) || a.x_rs % 8 != 0) {
    x = x.copy(&s);
    a.x = x.data();
    a.x_rs = k;
  }
  a.vec = al16(a.w) && a.w_rs % 8 == 0 && k % 8 == 0 && al16(a.x);
  if (!a.vec) throw ValueError("w: project_qkv_rope needs 16-byte aligned weight rows and K % 8 == 0");
  a.pdl = pdl_enabled(d);
  a.w_ef = t_wef;
  for (const Array* t : std::initializer_list<const Array*>{&x, &wd, &b, &k_cache, &v_cache, &positions, &block_table})
    if (t->defined()) detail::mark_used(*t, s);
  cuda::llm_project(a, &pr, s.handle());
#else
  detail::no_cuda_backend();
#endif
  return q;
}

}  // namespace gk::llm::fused
