// Front ends and CPU references of the engine's decode kernels (see llm/fused.h).
#include "llm/fused.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpukit/errors.h"
#include "gpukit/ops.h"
#include "ops/common.h"
#include "ops/nn_args.h"
#if GPUKIT_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_util.h"
#endif

namespace gk::llm::fused {

namespace {
[[maybe_unused]] bool al16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
void need_float(const Array& a, const char* arg) {
  if (a.dtype() != DType::f32 && a.dtype() != DType::f16 && a.dtype() != DType::bf16)
    throw TypeError(cat(arg, ": float32, float16 or bfloat16 expected, got ", dtype_name(a.dtype())));
}
void same_dtype(const Array& a, const Array& b, const char* arg) {
  if (a.dtype() != b.dtype())
    throw TypeError(cat(arg, ": dtype ", dtype_name(b.dtype()), " differs from ", dtype_name(a.dtype())));
}
}  // namespace

namespace {
std::atomic<int> g_pdl{-1};
thread_local bool t_no_pdl = false;
thread_local int t_grid_cap = 0;
}  // namespace
NoPdlScope::NoPdlScope(bool off) : prev(t_no_pdl) { t_no_pdl = t_no_pdl || off; }
NoPdlScope::~NoPdlScope() { t_no_pdl = prev; }
GridCapScope::GridCapScope(int cap) : prev(t_grid_cap) {
  if (cap > 0) t_grid_cap = cap;
}
GridCapScope::~GridCapScope() { t_grid_cap = prev; }
int grid_cap() { return t_grid_cap; }
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

// ---- rope_append ----

void rope_append(const Array& q, const Array& k, const Array& v, const Array& k_cache, const Array& v_cache,
                 const Array& positions, const Array& block_table, const Rope& rope, const Stream* sp,
                 const L2Range& l2) {
  Device d = detail::common_device({{"q", &q}, {"k", &k}, {"v", &v}, {"k_cache", &k_cache}, {"v_cache", &v_cache},
                                    {"positions", &positions}, {"block_table", &block_table}});
  Stream s = resolve_stream(sp, d);
  need_float(q, "q");
  for (auto [a, n] : {std::pair{&k, "k"}, {&v, "v"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}})
    same_dtype(q, *a, n);
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3)
    throw ValueError("rope_append: q [T, Hq, D], k and v [T, Hkv, D] expected");
  const int64_t T = q.shape(0), D = q.shape(2), hkv = k.shape(1);
  if (k.shape(0) != T || v.shape(0) != T || k.shape(2) != D || v.shape(2) != D || v.shape(1) != hkv)
    throw ValueError(cat("rope_append: shapes ", shape_str(q.shape()), ", ", shape_str(k.shape()), ", ",
                         shape_str(v.shape()), " do not agree"));
  if (k_cache.ndim() != 4 || k_cache.shape() != v_cache.shape() || k_cache.shape(2) != hkv || k_cache.shape(3) != D)
    throw ValueError(cat("k_cache: [blocks, block_size, ", hkv, ", ", D, "] expected for both caches, got ",
                         shape_str(k_cache.shape()), " and ", shape_str(v_cache.shape())));
  if (!k_cache.is_contiguous() || !v_cache.is_contiguous()) throw ValueError("k_cache, v_cache: must be dense");
  for (const Array* a : {&q, &k, &v})
    if (D > 1 && a->stride(2) != 1) throw ValueError("rope_append: q, k and v need a dense last dimension");
  if (positions.dtype() != DType::i32 || positions.ndim() != 1 || positions.shape(0) != T)
    throw ValueError(cat("positions: int32 (", T, ",) expected"));
  if (block_table.dtype() != DType::i32 || block_table.ndim() != 2 || block_table.shape(0) != T ||
      block_table.stride(1) != 1)
    throw ValueError(cat("block_table: int32 [", T, ", max_blocks] with dense rows expected"));
  const int rd = rope.rotary_dim ? *rope.rotary_dim : int(D);
  if (rd < 2 || rd > D || rd % 2 || rd / 2 > kFusedMaxFreqs)
    throw ValueError(cat("rotary_dim: must be even and in [2, head_dim = ", D, "], got ", rd));
  if (q.shape(1) > INT32_MAX / 1024 || hkv > INT32_MAX / 1024 || D > 1024) throw ValueError("rope_append: too large");
  double mscale = 1.0;
  std::vector<double> f = nn::rope_inv_freq(rope.theta, rd, rope.scaling, &mscale);
  RopeAppendArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.q_ts = q.stride(0), a.q_hs = q.stride(1), a.k_ts = k.stride(0), a.k_hs = k.stride(1);
  a.v_ts = v.stride(0), a.v_hs = v.stride(1);
  a.kc = k_cache.data();
  a.vc = v_cache.data();
  a.nb = k_cache.shape(0);
  a.bs = k_cache.shape(1);
  a.T = T;
  a.hq = int(q.shape(1));
  a.hkv = int(hkv);
  a.D = int(D);
  a.rd = rd;
  a.interleaved = rope.interleaved;
  a.pos = positions.data_as<int32_t>();
  a.block_table = block_table.data_as<int32_t>();
  a.bt_stride = block_table.stride(0);
  a.max_blocks = block_table.shape(1);
  a.mscale = float(mscale);
  a.dtype = q.dtype();
  for (int i = 0; i < rd / 2; ++i) a.inv_freq[i] = float(f[size_t(i)]);
  if (T == 0 || a.nb == 0 || a.bs == 0) return;
  if (d.is_cpu()) return ref_rope_append(a);
#if GPUKIT_WITH_CUDA
  a.pdl = pdl_enabled(d);
  a.l2 = l2.aligned().p;
  a.l2_bytes = l2.aligned().bytes;
  a.grid_cap = grid_cap();
  for (const Array* t : {&q, &k, &v, &k_cache, &v_cache, &positions, &block_table}) detail::mark_used(*t, s);
  cuda::llm_rope_append(a, s.handle());
#else
  detail::no_cuda_backend();
#endif
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
  for (const Array* t : std::initializer_list<const Array*>{&x, &wd, &b, &k_cache, &v_cache, &positions, &block_table})
    if (t->defined()) detail::mark_used(*t, s);
  cuda::llm_project(a, &pr, s.handle());
#else
  detail::no_cuda_backend();
#endif
  return q;
}

void ref_rope_append(const RopeAppendArgs& a) {
  dispatch_float(a.dtype, [&](auto tv) {
    using T = decltype(tv);
    const int n = a.rd / 2;
    std::vector<float> cs(static_cast<size_t>(n)), sn(static_cast<size_t>(n));
    for (int64_t t = 0; t < a.T; ++t) {
      const int32_t p = a.pos[t];
      for (int i = 0; i < n; ++i) {
        const float ang = float(p) * a.inv_freq[i];
        cs[size_t(i)] = std::cos(ang) * a.mscale;
        sn[size_t(i)] = std::sin(ang) * a.mscale;
      }
      auto rot = [&](const T* src, T* dst, int i) {
        const int i1 = a.interleaved ? 2 * i : i, i2 = a.interleaved ? 2 * i + 1 : i + n;
        const float x1 = float(src[i1]), x2 = float(src[i2]);
        const T r1 = convert<T>(x1 * cs[size_t(i)] - x2 * sn[size_t(i)]);
        const T r2 = convert<T>(x2 * cs[size_t(i)] + x1 * sn[size_t(i)]);
        dst[i1] = r1;
        dst[i2] = r2;
      };
      for (int h = 0; h < a.hq; ++h) {
        T* q = static_cast<T*>(a.q) + t * a.q_ts + h * a.q_hs;
        for (int i = 0; i < n; ++i) rot(q, q, i);
      }
      if (p < 0) continue;
      const int64_t li = p / a.bs;
      if (li >= a.max_blocks) continue;
      const int64_t blk = a.block_table[t * a.bt_stride + li];
      if (blk < 0 || blk >= a.nb) continue;
      const int64_t base = (blk * a.bs + (p - li * a.bs)) * a.hkv * a.D;
      for (int h = 0; h < a.hkv; ++h) {
        const T* k = static_cast<const T*>(a.k) + t * a.k_ts + h * a.k_hs;
        const T* v = static_cast<const T*>(a.v) + t * a.v_ts + h * a.v_hs;
        T* kc = static_cast<T*>(a.kc) + base + h * a.D;
        T* vc = static_cast<T*>(a.vc) + base + h * a.D;
        for (int i = 0; i < n; ++i) rot(k, kc, i);
        for (int i = a.rd; i < a.D; ++i) kc[i] = k[i];
        for (int i = 0; i < a.D; ++i) vc[i] = v[i];
      }
    }
  });
}

// ---- add_rms_norm ----

std::pair<Array, Array> add_rms_norm(const Array& x, const Array& residual, const Array& w, double eps,
                                     const Stream* sp) {
  Device d = detail::common_device({{"x", &x}, {"residual", &residual}, {"w", &w}});
  Stream s = resolve_stream(sp, d);
  need_float(x, "x");
  same_dtype(x, residual, "residual");
  same_dtype(x, w, "w");
  if (x.ndim() != 2 || residual.shape() != x.shape())
    throw ValueError(cat("add_rms_norm: x and residual [rows, H] of one shape expected, got ", shape_str(x.shape()),
                         " and ", shape_str(residual.shape())));
  const int64_t rows = x.shape(0), H = x.shape(1);
  if (w.ndim() != 1 || w.shape(0) != H) throw ValueError(cat("w: shape (", H, ",) expected"));
  if (!(eps >= 0) || !std::isfinite(eps)) throw ValueError("eps: must be finite and >= 0");
  Array xd = x.stride(1) == 1 || H <= 1 ? x : x.contiguous(&s);
  Array rd = residual.stride(1) == 1 || H <= 1 ? residual : residual.contiguous(&s);
  Array wd = w.contiguous(&s);
  Array out = Array::empty({rows, H}, x.dtype(), d, &s);
  Array ro = Array::empty({rows, H}, x.dtype(), d, &s);
  if (out.numel() == 0) return {out, ro};
  AddNormArgs a;
  a.x = xd.data();
  a.res = rd.data();
  a.w = wd.data();
  a.out = out.data();
  a.res_out = ro.data();
  a.rows = rows;
  a.H = H;
  a.x_rs = rows == 1 ? H : xd.stride(0);  // one row: any stride of the size-1 dim
  a.res_rs = rows == 1 ? H : rd.stride(0);
  a.eps = float(eps);
  a.dtype = x.dtype();
  if (d.is_cpu()) {
    ref_add_rms_norm(a);
    return {out, ro};
  }
#if GPUKIT_WITH_CUDA
  const int64_t vn = 16 / int64_t(itemsize(x.dtype()));
  a.vec = H % vn == 0 && a.x_rs % vn == 0 && a.res_rs % vn == 0 && al16(a.x) && al16(a.res) && al16(a.w) &&
          al16(a.out) && al16(a.res_out);
  a.pdl = pdl_enabled(d);
  for (const Array* t : {&xd, &rd, &wd}) detail::mark_used(*t, s);
  cuda::llm_add_rms_norm(a, s.handle());
#else
  detail::no_cuda_backend();
#endif
  return {out, ro};
}

void ref_add_rms_norm(const AddNormArgs& a) {
  dispatch_float(a.dtype, [&](auto tv) {
    using T = decltype(tv);
    const T* w = static_cast<const T*>(a.w);
    for (int64_t r = 0; r < a.rows; ++r) {
      const T* x = static_cast<const T*>(a.x) + r * a.x_rs;
      const T* res = static_cast<const T*>(a.res) + r * a.res_rs;
      T* out = static_cast<T*>(a.out) + r * a.H;
      T* ro = static_cast<T*>(a.res_out) + r * a.H;
      double ss = 0;
      for (int64_t i = 0; i < a.H; ++i) {
        ro[i] = convert<T>(float(x[i]) + float(res[i]));
        ss += double(float(ro[i])) * double(float(ro[i]));
      }
      const double inv = 1.0 / std::sqrt(ss / double(a.H) + double(a.eps));
      for (int64_t i = 0; i < a.H; ++i) out[i] = convert<T>(float(double(float(ro[i])) * inv * double(float(w[i]))));
    }
  });
}

// ---- swiglu ----

Array swiglu(const Array& gu, const Stream* sp) {
  need_float(gu, "gu");
  if (gu.ndim() != 2 || gu.shape(1) % 2 || (gu.shape(1) > 1 && gu.stride(1) != 1))
    throw ValueError(cat("swiglu: gu [rows, 2 I] with a dense last dimension expected, got ", shape_str(gu.shape())));
  const Device d = gu.device();
  Stream s = resolve_stream(sp, d);
  const int64_t rows = gu.shape(0), I = gu.shape(1) / 2;
  Array out = Array::empty({rows, I}, gu.dtype(), d, &s);
  if (out.numel() == 0) return out;
  if (d.is_cpu()) {
    dispatch_float(gu.dtype(), [&](auto tv) {
      using T = decltype(tv);
      const T* g = gu.data_as<T>();
      T* o = out.data_as<T>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < I; ++j)
          o[r * I + j] = convert<T>(gated_fn<nn::GatedAct::SwiGLU, float>(float(g[r * gu.stride(0) + j]),
                                                                           float(g[r * gu.stride(0) + I + j])));
    });
    return out;
  }
#if GPUKIT_WITH_CUDA
  detail::mark_used(gu, s);
  cuda::llm_swiglu(gu.data(), out.data(), rows, I, gu.stride(0), gu.dtype(), pdl_enabled(d), s.handle(), grid_cap());
#else
  detail::no_cuda_backend();
#endif
  return out;
}

// ---- advance_inputs ----

void advance_inputs(const Array& in, const Array& tokens, const Stream* sp) {
  Device d = detail::common_device({{"in", &in}, {"tokens", &tokens}});
  Stream s = resolve_stream(sp, d);
  if (in.dtype() != DType::i32 || tokens.dtype() != DType::i32) throw TypeError("advance_inputs: int32 arrays expected");
  if (in.ndim() != 2 || in.shape(0) != 3 || !in.is_contiguous() || tokens.ndim() != 1 ||
      tokens.shape(0) != in.shape(1) || !tokens.is_contiguous())
    throw ValueError(cat("advance_inputs: dense in [3, B] and tokens [B] expected, got ", shape_str(in.shape()), " and ",
                         shape_str(tokens.shape())));
  const int64_t B = in.shape(1);
  int32_t* p = in.data_as<int32_t>();
  const int32_t* t = tokens.data_as<int32_t>();
  if (d.is_cpu()) {
    for (int64_t b = 0; b < B; ++b) {
      p[b] = t[b];
      p[B + b] += 1;
      p[2 * B + b] += 1;
    }
    return;
  }
#if GPUKIT_WITH_CUDA
  detail::mark_used(tokens, s);
  cuda::llm_advance(p, t, B, pdl_enabled(d), s.handle());
#else
  detail::no_cuda_backend();
#endif
}

Array advance_argmax(const Array& in, const Array& keys, const Stream* sp) {
  Device d = detail::common_device({{"in", &in}, {"keys", &keys}});
  Stream s = resolve_stream(sp, d);
  if (in.dtype() != DType::i32 || keys.dtype() != DType::i64) throw TypeError("advance_argmax: int32 in, int64 keys");
  if (in.ndim() != 2 || in.shape(0) != 3 || !in.is_contiguous() || keys.ndim() != 1 ||
      keys.shape(0) != in.shape(1) || !keys.is_contiguous())
    throw ValueError(cat("advance_argmax: dense in [3, B] and keys [B] expected, got ", shape_str(in.shape()), " and ",
                         shape_str(keys.shape())));
  const int64_t B = in.shape(1);
  Array tokens = Array::empty({B}, DType::i32, d, &s);
  int32_t* p = in.data_as<int32_t>();
  auto* k = static_cast<uint64_t*>(keys.data());
  int32_t* t = tokens.data_as<int32_t>();
  if (d.is_cpu()) {
    for (int64_t b = 0; b < B; ++b) {
      t[b] = k[b] ? int32_t(0xffffffffu - uint32_t(k[b] & 0xffffffffu)) : 0;
      k[b] = 0;
      p[b] = t[b];
      p[B + b] += 1;
      p[2 * B + b] += 1;
    }
    return tokens;
  }
#if GPUKIT_WITH_CUDA
  cuda::llm_advance_argmax(p, reinterpret_cast<unsigned long long*>(k), t, B, pdl_enabled(d), s.handle());
#else
  detail::no_cuda_backend();
#endif
  return tokens;
}

}  // namespace gk::llm::fused
