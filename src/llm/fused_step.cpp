// Front ends of the engine's step kernels in src/cuda/llm_step.cu (see llm/fused.h):
// embedding + RMSNorm, the L2 prefetch, the quantized prefill GEMM.
#include <cmath>
#include <cstring>
#include <vector>

#include "gpukit/errors.h"
#include "gpukit/gemm.h"
#include "gpukit/ops.h"
#include "llm/fused.h"
#include "ops/common.h"
#include "ops/nn_args.h"
#if GPUKIT_WITH_CUDA
#include "core/cuda_util.h"
#endif

namespace gk::llm::fused {

namespace {
bool al(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }
}  // namespace

// ---- embedding + RMSNorm ----

bool embed_norm_supported(const Array& table, const Array& w) {
  if (!table.defined() || !w.defined() || table.ndim() != 2 || w.ndim() != 1) return false;
  if (table.dtype() != DType::bf16 && table.dtype() != DType::f16) return false;
  const int64_t H = table.shape(1);
  return w.dtype() == table.dtype() && w.shape(0) == H && H % 8 == 0 && H <= 8192 && H > 0 &&
         table.stride(1) == 1 && table.stride(0) % 8 == 0 && al(table.data(), 16) && w.stride(0) == 1 &&
         al(w.data(), 16) && w.device() == table.device();
}

std::pair<Array, Array> embed_norm(const Array& ids, const Array& table, const Array& w, double eps,
                                   const Stream* sp) {
  Device d = detail::common_device({{"ids", &ids}, {"table", &table}, {"w", &w}});
  Stream s = resolve_stream(sp, d);
  if (ids.dtype() != DType::i32 || ids.ndim() != 1) throw ValueError("ids: int32 [T] expected");
  if (table.ndim() != 2 || w.ndim() != 1 || w.shape(0) != table.shape(1) || w.dtype() != table.dtype())
    throw ValueError(cat("embed_norm: table [V, H] and w [H] of one dtype expected, got ", shape_str(table.shape()),
                         " and ", shape_str(w.shape())));
  if (!(eps >= 0) || !std::isfinite(eps)) throw ValueError("eps: must be finite and >= 0");
  Array id = ids.contiguous(&s);
  const int64_t T = id.shape(0), V = table.shape(0), H = table.shape(1);
  Array x = Array::empty({T, H}, table.dtype(), d, &s);
  Array h = Array::empty({T, H}, table.dtype(), d, &s);
  if (T == 0 || H == 0) return {h, x};
  if (d.is_cpu()) {  // the reference: the gathered row, then add_rms_norm's rule with no residual
    Array tb = table.contiguous();
    Array wc = w.contiguous();
    dispatch_float(table.dtype(), [&](auto tv) {
      using T_ = decltype(tv);
      const int32_t* ip = id.data_as<int32_t>();
      for (int64_t t = 0; t < T; ++t) {
        const int64_t v = ip[t];
        T_* xr = x.data_as<T_>() + t * H;
        T_* hr = h.data_as<T_>() + t * H;
        double ss = 0;
        for (int64_t i = 0; i < H; ++i) {
          xr[i] = v >= 0 && v < V ? tb.data_as<T_>()[v * H + i] : convert<T_>(0.f);
          ss += double(float(xr[i])) * double(float(xr[i]));
        }
        const double inv = 1.0 / std::sqrt(ss / double(H) + eps);
        for (int64_t i = 0; i < H; ++i)
          hr[i] = convert<T_>(float(double(float(xr[i])) * inv * double(float(wc.data_as<T_>()[i]))));
      }
    });
    return {h, x};
  }
#if GPUKIT_WITH_CUDA
  if (!embed_norm_supported(table, w))
    throw ValueError("embed_norm: the CUDA kernel needs bf16/fp16, H % 8 == 0, H <= 8192 and aligned dense rows");
  EmbedNormArgs a;
  a.ids = id.data_as<int32_t>();
  a.table = table.data();
  a.w = w.data();
  a.x_out = x.data();
  a.h_out = h.data();
  a.T = T;
  a.V = V;
  a.H = H;
  a.table_rs = table.stride(0);
  a.eps = float(eps);
  a.dtype = table.dtype();
  a.pdl = pdl_enabled(d);
  for (const Array* t : std::initializer_list<const Array*>{&id, &table, &w}) detail::mark_used(*t, s);
  cuda::llm_embed_norm(a, s.handle());
#else
  detail::no_cuda_backend();
#endif
  return {h, x};
}

// ---- L2 prefetch ----

void prefetch_l2(const PrefetchArgs& a, bool evict_last, const Stream& s) {
#if GPUKIT_WITH_CUDA
  if (a.n > 0 && s.valid()) cuda::llm_prefetch_l2(a, evict_last, s.handle());
#else
  (void)a, (void)evict_last, (void)s;
#endif
}

// ---- decode attention with RoPE and the KV append ----

bool attention_rope_supported(int64_t B, int64_t hq, int64_t hkv, int64_t D, int64_t max_keys, DType t) {
  return (t == DType::bf16 || t == DType::f16) && B >= 1 && B <= 8 && (D == 64 || D == 128) && hkv >= 1 &&
         hq % hkv == 0 && hq / hkv <= 8 && max_keys >= 1 && max_keys <= attention_rope_max_keys;
}

Array attention_rope(const Array& qkv, int64_t hq, const Array& k_cache, const Array& v_cache,
                     const Array& positions, const Array& block_table, const Rope& rope, const Array& counters,
                     const Stream* sp, int chunk, int trigger, const L2Range& l2, bool cluster, int* merge) {
  if (chunk != 64 && chunk != 128 && chunk != 256 && chunk != 384)
    throw ValueError(cat("chunk: 64, 128, 256 or 384 keys, got ", chunk));
  if (trigger < 0 || trigger > 3) throw ValueError(cat("trigger: 0, 1, 2 or 3, got ", trigger));
  Device d = detail::common_device({{"qkv", &qkv}, {"k_cache", &k_cache}, {"v_cache", &v_cache},
                                    {"positions", &positions}, {"block_table", &block_table}});
  Stream s = resolve_stream(sp, d);
  if (k_cache.ndim() != 4 || k_cache.shape() != v_cache.shape() || !k_cache.is_contiguous() || !v_cache.is_contiguous())
    throw ValueError("k_cache, v_cache: dense [blocks, block_size, Hkv, D] of one shape expected");
  if (qkv.dtype() != k_cache.dtype() || v_cache.dtype() != k_cache.dtype())
    throw TypeError("attention_rope: qkv and the caches must have one dtype");
  const int64_t hkv = k_cache.shape(2), D = k_cache.shape(3);
  if (qkv.ndim() != 2 || hq <= 0 || D % 2 || qkv.shape(1) != (hq + 2 * hkv) * D || (D > 1 && qkv.stride(1) != 1))
    throw ValueError(cat("qkv: [B, (hq + 2 hkv) D] = [B, ", (hq + 2 * hkv) * D, "] with dense rows expected, got ",
                         shape_str(qkv.shape())));
  const int64_t B = qkv.shape(0);
  if (positions.dtype() != DType::i32 || positions.ndim() != 1 || positions.shape(0) != B)
    throw ValueError(cat("positions: int32 (", B, ",) expected"));
  if (block_table.dtype() != DType::i32 || block_table.ndim() != 2 || block_table.shape(0) != B ||
      block_table.stride(1) != 1)
    throw ValueError(cat("block_table: int32 [", B, ", max_blocks] with dense rows expected"));
  const int rd = rope.rotary_dim ? *rope.rotary_dim : int(D);
  if (rd < 2 || rd > D || rd % 2 || rd / 2 > kFusedMaxFreqs)
    throw ValueError(cat("rotary_dim: must be even and in [2, head_dim = ", D, "], got ", rd));
  const int64_t Q = hq * D, KV = hkv * D;
  const int64_t max_keys = block_table.shape(1) * k_cache.shape(1);
  if (!d.is_cuda() || !attention_rope_supported(B, hq, hkv, D, max_keys, qkv.dtype())) {
    // the composition: rope_append on copies of q, k, v, then attention_decode
    Array q = qkv.narrow(1, 0, Q).contiguous(&s).reshape({B, hq, D});
    Array k = qkv.narrow(1, Q, KV).contiguous(&s).reshape({B, hkv, D});
    Array v = qkv.narrow(1, Q + KV, KV).contiguous(&s).reshape({B, hkv, D});
    rope_append(q, k, v, k_cache, v_cache, positions, block_table, rope, &s);
    Array lens = binary(BinaryOp::Add, positions, Scalar::of_int(1));
    return nn::attention_decode(q, k_cache, v_cache, lens, block_table);
  }
#if GPUKIT_WITH_CUDA
  if (!counters.defined() || counters.device() != d || counters.dtype() != DType::i32 || !counters.is_contiguous() ||
      counters.numel() < B * hkv)
    throw ValueError(cat("counters: int32 zeros on ", d.str(), " with at least ", B * hkv, " entries expected"));
  double mscale = 1.0;
  std::vector<double> f = nn::rope_inv_freq(rope.theta, rd, rope.scaling, &mscale);
  const int64_t S = (max_keys + chunk - 1) / chunk;
  Array out = Array::empty({B, hq, D}, qkv.dtype(), d, &s);
  Array ws = S > 1 ? Array::empty({cuda::llm_attention_ws_floats(B, hkv, S)}, DType::f32, d, &s) : Array();
  AttnArgs a;
  a.qkv = qkv.data();
  a.qkv_rs = qkv.stride(0);
  a.out = out.data();
  a.kc = k_cache.data();
  a.vc = v_cache.data();
  a.nb = k_cache.shape(0);
  a.bs = k_cache.shape(1);
  a.bt_stride = block_table.stride(0);
  a.max_blocks = block_table.shape(1);
  a.pos = positions.data_as<int32_t>();
  a.block_table = block_table.data_as<int32_t>();
  a.B = int(B);
  a.hq = int(hq);
  a.hkv = int(hkv);
  a.D = int(D);
  a.rd = rd;
  a.S = int(S);
  a.chunk = chunk;
  a.trigger = trigger;
  a.cluster = cluster;
  a.l2 = l2.aligned().p;
  a.l2_bytes = l2.aligned().bytes;
  a.l2_late = l2.late;
  a.interleaved = rope.interleaved;
  a.mscale = float(mscale);
  a.scale = float(1.0 / std::sqrt(double(D)));
  a.ws = ws.defined() ? ws.data_as<float>() : nullptr;
  a.counters = counters.data_as<int32_t>();
  a.stamps = attn_stamps(B * hkv * S * 8);
  a.mma = attention_mma();
  a.pad_kb = attention_pad_kb();
  a.push = attention_push();
  a.early = attention_early();
  a.wide = static_cast<unsigned char>(attention_wide());
  a.dtype = qkv.dtype();
  a.pdl = pdl_enabled(d);
  ProjRope pr;
  for (int i = 0; i < rd / 2; ++i) pr.inv_freq[i] = float(f[size_t(i)]);
  for (const Array* t : {&qkv, &k_cache, &v_cache, &positions, &block_table, &counters}) detail::mark_used(*t, s);
  const int mk = cuda::llm_attention_rope(a, pr, s.handle());
  o_stage_after_attention();
  if (merge) *merge = mk;
  return out;
#else
  (void)counters;
  detail::no_cuda_backend();
#endif
}

// ---- quantized prefill ----

Array dequant_linear(const Array& x, const QuantizedWeight& qw, DType out, const Stream* sp) {
#if GPUKIT_WITH_CUDA
  const Device d = x.device();
  if (!d.is_cuda() || x.ndim() != 2 || (x.dtype() != DType::bf16 && x.dtype() != DType::f16)) return {};
  if (out != DType::f32 && out != DType::bf16 && out != DType::f16) return {};
  int fmt = -1;
  if (qw.format == "fp8") fmt = 0;
  else if (qw.format == "int8") fmt = 1;
  else if (qw.format == "int4") fmt = 2;
  if (fmt < 0 || !qw.q.defined() || qw.q.ndim() != 2 || qw.q.device() != d || !qw.scales.defined()) return {};
  const int64_t m = x.shape(0), n = qw.q.shape(0), k = x.shape(1);
  if (k % 8 != 0 || k == 0 || n == 0 || m == 0) return {};
  if (qw.q.stride(1) != 1 || qw.q.stride(0) % 8 != 0 || !al(qw.q.data(), 8)) return {};
  if (fmt == 2) {
    if (qw.q.shape(1) != k / 2 || qw.group <= 0 || qw.group % 8 != 0 || k % qw.group != 0 || !qw.zeros.defined())
      return {};
    if (qw.scales.numel() != n * (k / qw.group) || qw.zeros.numel() != n * (k / qw.group)) return {};
  } else if (qw.q.shape(1) != k || qw.scales.numel() != n) {
    return {};
  }
  Stream s = resolve_stream(sp, d);
  Array sc = qw.scales.contiguous(&s);
  Array zr = fmt == 2 ? qw.zeros.contiguous(&s) : Array();
  if (sc.dtype() != DType::f32 || (zr.defined() && zr.dtype() != DType::u8)) return {};
  Array wd = Array::empty({n, k}, x.dtype(), d, &s);
  DequantArgs a;
  a.q = qw.q.data();
  a.scales = sc.data_as<float>();
  a.zeros = zr.defined() ? zr.data_as<uint8_t>() : nullptr;
  a.out = wd.data();
  a.n = n;
  a.k = k;
  a.q_rs = qw.q.stride(0);
  a.group = qw.group;
  a.fmt = fmt;
  a.out_dtype = x.dtype();
  for (const Array* t : std::initializer_list<const Array*>{&qw.q, &sc, &zr})
    if (t->defined()) detail::mark_used(*t, s);
  cuda::llm_dequant(a, s.handle());
  if (fmt == 2) return linear(x, wd, nullptr, Activation::none, nullptr, out, &s);
  Array acc = linear(x, wd, nullptr, Activation::none, nullptr, DType::f32, &s);
  Array y = Array::empty({m, n}, out, d, &s);
  cuda::llm_scale_cols(acc.data_as<float>(), sc.data_as<float>(), y.data(), m, n, out, s.handle());
  return y;
#else
  (void)x, (void)qw, (void)out, (void)sp;
  return {};
#endif
}

}  // namespace gk::llm::fused
