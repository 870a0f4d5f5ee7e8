// Front ends and CPU references of the engine's small decode kernels (see llm/fused.h):
// q/k RoPE + paged KV append, residual add + RMSNorm, SwiGLU, the step's input update.
#include "llm/fused.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include "gpukit/errors.h"
#include "gpukit/ops.h"
#include "llm/fused_checks.h"
#include "ops/common.h"
#include "ops/gemv_args.h"
#include "ops/nn_args.h"
#if GPUKIT_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_util.h"
#endif

namespace gk::llm::fused {

using namespace checks;

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

namespace {
std::pair<Array, Array> add_rms_norm_impl(const Array& x, const Array& residual, const Array& w, double eps,
                                          const Stream* sp, Array* xh_out, Array* xinv_out);
}  // namespace

std::pair<Array, Array> add_rms_norm(const Array& x, const Array& residual, const Array& w, double eps,
                                     const Stream* sp) {
  return add_rms_norm_impl(x, residual, w, eps, sp, nullptr, nullptr);
}

AddNormPrep add_rms_norm_prep(const Array& x, const Array& residual, const Array& w, double eps, const Stream* sp) {
  AddNormPrep r;
  std::tie(r.h, r.res) = add_rms_norm_impl(x, residual, w, eps, sp, &r.xh, &r.xinv);
  return r;
}

namespace {
std::pair<Array, Array> add_rms_norm_impl(const Array& x, const Array& residual, const Array& w, double eps,
                                          const Stream* sp, Array* xh_out, Array* xinv_out) {
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
  {
    PdlOnScope lift((small_pdl() & 1) != 0);  // quantized_small_pdl: the norm with PDL
    a.pdl = pdl_enabled(d);
  }
  // quantized_x_prep: the row-in-registers kernel (H / 8 <= 1024 vectors), bf16, M <= 8
  if (xh_out && xinv_out && x.dtype() == DType::bf16 && a.vec && H % 8 == 0 && H <= 8192 && rows <= 8) {
    *xh_out = Array::empty({rows, H}, DType::f16, d, &s);
    *xinv_out = Array::empty({rows}, DType::f32, d, &s);
    a.xh = xh_out->data();
    a.xinv = xinv_out->data_as<float>();
  }
  for (const Array* t : {&xd, &rd, &wd}) detail::mark_used(*t, s);
  cuda::llm_add_rms_norm(a, s.handle());
#else
  (void)xh_out;
  (void)xinv_out;
  detail::no_cuda_backend();
#endif
  return {out, ro};
}
}  // namespace

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
  PdlOnScope lift((small_pdl() & 2) != 0);  // quantized_small_pdl: SwiGLU with PDL
  cuda::llm_swiglu(gu.data(), out.data(), rows, I, gu.stride(0), gu.dtype(), pdl_enabled(d), s.handle(), grid_cap());
#else
  detail::no_cuda_backend();
#endif
  return out;
}

// ---- W8FullRingScope ----

W8FullRingScope::W8FullRingScope(int mask) : prev(gemv_w8_full_ring()) { gemv_w8_set_full_ring(mask & 3); }
W8FullRingScope::~W8FullRingScope() { gemv_w8_set_full_ring(prev); }

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
