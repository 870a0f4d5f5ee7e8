// Front end of attention_decode: validate shapes, dtypes and (host-visible)
// lengths and block tables before any launch, allocate the output and the CUDA
// split workspace, dispatch.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "gpukit/nn.h"
#include "ops/common.h"
#include "ops/nn_args.h"

namespace gk::nn {

namespace {
int64_t at32(const Array& a, int64_t i, int64_t j = 0) {
  return a.data_as<int32_t>()[i * a.stride(0) + (a.ndim() > 1 ? j * a.stride(1) : 0)];
}

void validate_lens(const Array& lens, const Array& bt, int64_t nb, int64_t bs, int64_t cap) {
  for (int64_t b = 0; b < lens.shape(0); ++b) {
    int64_t L = at32(lens, b);
    if (L < 0) throw ValueError(cat("seq_lens: negative length ", L, " for sequence ", b));
    if (L > cap)
      throw ValueError(cat("seq_lens: sequence ", b, " has ", L, " tokens, longer than the cache capacity ", cap));
    if (bt.defined())
      for (int64_t li = 0; li < (L + bs - 1) / bs; ++li) {
        int64_t blk = at32(bt, b, li);
        if (blk < 0 || blk >= nb)
          throw IndexError(cat("block_table: block id ", blk, " at [", b, ", ", li, "] is outside the pool of ", nb,
                               " blocks"));
      }
  }
}
// GPUKIT_DECODE_SPLIT="min,max,target[,variant[,order]]" overrides the split constants (tuning); variant 1
// forces the CUDA-core kernel, 14 / 15 the fold kernel's chunk / group units, 2-13 and 16 pick the
// tensor-core kernel of attention_decode_mma.cu and its tuning variants, order is the CUDA-core kernel's
// CTA order (see src/cuda/attention_decode*.cu).
constexpr int kMaxVariant = 39;
constexpr bool kFoldDefault = true;  // as src/cuda/attention_decode.cu
// Split constants of the default tensor-core kernel (bf16 / fp16 caches, attention_decode_fold.cu): chunks of
// 32 .. 1024 keys, at most 128 per sequence (a long sequence alone still fills the GPU with chunks; its
// groups of 8 chunks are the work units when there are many sequences, see the kernel).
constexpr int kFoldChunkMin = 32, kFoldChunkMax = 1024, kFoldTargetSplits = 128;
[[maybe_unused]] void split_params(DecodeArgs& a) {
  const char* e = std::getenv("GPUKIT_DECODE_SPLIT");
  if (!e || !*e) {
    if (kFoldDefault && (a.dtype == DType::bf16 || a.dtype == DType::f16) && a.cache_dtype == a.dtype) {
      a.chunk_min = kFoldChunkMin;
      a.chunk_max = kFoldChunkMax;
      a.target_splits = kFoldTargetSplits;
    }
    return;
  }
  int v[5] = {0, 0, 0, 0, 0};
  int n = std::sscanf(e, "%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4]);
  if (n < 3 || v[0] < 32 || v[0] % 32 || v[1] < v[0] || v[1] > 4096 || (v[1] & (v[1] - 1)) || (v[0] & (v[0] - 1)) ||
      v[2] < 1 || v[3] < 0 || v[3] > kMaxVariant || v[4] < 0 || v[4] > 1)
    throw ValueError(cat("GPUKIT_DECODE_SPLIT: '", e,
                         "' is not 'min,max,target[,variant[,order]]' (powers of two, 32 <= min <= max <= 4096, "
                         "variant 0-", kMaxVariant, ", order 0-1)"));
  a.grid_order = v[4];
  a.chunk_min = v[0];
  a.chunk_max = v[1];
  a.target_splits = v[2];
  a.variant = v[3];
}
}  // namespace

Array attention_decode(const Array& q_in, const Array& kc, const Array& vc, const Array& lens_in,
                       const Array& bt_in, std::optional<double> scale, std::optional<int64_t> window,
                       std::optional<double> softcap, const Array& k_scale, const Array& v_scale, bool validate,
                       const Stream* sp) {
  Device d = detail::common_device({{"q", &q_in}, {"k_cache", &kc}, {"v_cache", &vc}});
  detail::require_defined(lens_in, "seq_lens");
  detail::require_half_or_float(q_in, "q");
  if (q_in.ndim() != 3) throw ValueError(cat("q: shape ", shape_str(q_in.shape()), " must be [B, Hq, D]"));
  const int64_t B = q_in.shape(0), Hq = q_in.shape(1), D = q_in.shape(2);
  if (kc.ndim() != 4)
    throw ValueError(cat("k_cache: shape ", shape_str(kc.shape()), " must be [num_blocks, block_size, Hkv, D]"));
  if (vc.shape() != kc.shape())
    throw ValueError(cat("v_cache: shape ", shape_str(vc.shape()), " does not match k_cache ", shape_str(kc.shape())));
  const bool fp8 = kc.dtype() == DType::f8e4m3;
  if (!fp8) detail::require_same_dtype(kc, "k_cache", q_in, "q");
  detail::require_same_dtype(vc, "v_cache", kc, "k_cache");
  if (!kc.is_contiguous() || !vc.is_contiguous()) throw ValueError("k_cache, v_cache: must be contiguous");
  const int64_t nb = kc.shape(0), bs = kc.shape(1), Hkv = kc.shape(2);
  if (kc.shape(3) != D)
    throw ValueError(cat("k_cache: head_dim ", kc.shape(3), " does not match q's ", D));
  if (D != 64 && D != 128 && D != 256) throw ValueError(cat("q: head_dim ", D, " is not supported (64, 128 or 256)"));
  if (Hkv <= 0 || Hq % Hkv != 0)
    throw ValueError(cat("q: ", Hq, " query heads is not a multiple of the cache's ", Hkv, " kv heads"));
  if (lens_in.dtype() != DType::i32 || lens_in.ndim() != 1 || lens_in.shape(0) != B)
    throw ValueError(cat("seq_lens: must be int32 [", B, "], got ", dtype_name(lens_in.dtype()), " ",
                         shape_str(lens_in.shape())));
  const bool paged = bt_in.defined();
  int64_t cap = bs;
  if (paged) {
    if (bt_in.dtype() != DType::i32 || bt_in.ndim() != 2 || bt_in.shape(0) != B)
      throw ValueError(cat("block_table: must be int32 [", B, ", max_blocks], got ", dtype_name(bt_in.dtype()), " ",
                           shape_str(bt_in.shape())));
    if (bs < 16 || bs > 256)
      throw ValueError(cat("k_cache: block_size ", bs, " is not supported by the paged cache (16 to 256)"));
    cap = bt_in.shape(1) * bs;
  } else if (nb != B) {
    throw ValueError(cat("k_cache: a contiguous cache [B, T_max, Hkv, D] needs B = ", B, " rows, got ", nb,
                         " (pass block_table for a paged cache)"));
  }
  if (fp8) {
    for (auto [sc, name] : {std::pair{&k_scale, "k_scale"}, std::pair{&v_scale, "v_scale"}}) {
      if (!sc->defined()) throw ValueError(cat(name, ": a float8_e4m3fn cache needs per-head float32 scales [Hkv]"));
      if (sc->device() != d) throw ValueError(cat(name, ": must be on ", d.str()));
      if (sc->dtype() != DType::f32 || sc->ndim() != 1 || sc->shape(0) != Hkv)
        throw ValueError(cat(name, ": must be float32 [", Hkv, "], got ", dtype_name(sc->dtype()), " ",
                             shape_str(sc->shape())));
    }
  } else if (k_scale.defined() || v_scale.defined()) {
    throw ValueError("k_scale: scales apply to a float8_e4m3fn cache only");
  }
  double sc = scale ? *scale : 1.0 / std::sqrt(double(D));
  if (!std::isfinite(sc)) throw ValueError("scale: must be finite");
  if (window && *window <= 0) throw ValueError(cat("window: must be > 0, got ", *window));
  if (softcap && !(std::isfinite(*softcap) && *softcap > 0)) throw ValueError("softcap: must be finite and > 0");
  for (const Array* x : {&lens_in, &bt_in})
    if (x->defined() && !x->device().is_cpu() && x->device() != d)
      throw ValueError(cat("seq_lens, block_table: must be on the CPU or on ", d.str()));
  Stream s = resolve_stream(sp, d);
  bool host = lens_in.device().is_cpu() && (!paged || bt_in.device().is_cpu());
  if (host) {
    validate_lens(lens_in, bt_in, nb, bs, cap);
  } else if (validate) {
    validate_lens(lens_in.to(Device::cpu(), &s), paged ? bt_in.to(Device::cpu(), &s) : Array(), nb, bs, cap);
  }
  Array lens = (lens_in.device() != d ? lens_in.to(d, &s, true) : lens_in).contiguous(&s);
  Array bt = paged ? (bt_in.device() != d ? bt_in.to(d, &s, true) : bt_in) : Array();
  if (paged && bt.stride(1) != 1) bt = bt.contiguous(&s);
  Array q = D > 1 && q_in.stride(2) != 1 ? q_in.contiguous(&s) : q_in;
  Array out = Array::empty({B, Hq, D}, q_in.dtype(), d, &s);
  DecodeArgs a;
  a.q = q.data();
  a.q_bs = B == 1 ? 0 : q.stride(0);  // (a stride of a size-1 dim is never used: any value, e.g. odd, is fine)
  a.q_hs = Hq == 1 ? 0 : q.stride(1);
  a.kc = kc.data();
  a.vc = vc.data();
  a.nb = nb;
  a.bs = bs;
  if (paged) {
    a.block_table = bt.data_as<int32_t>();
    a.bt_stride = bt.stride(0);
    a.max_blocks = bt.shape(1);
  }
  a.seq_lens = lens.data_as<int32_t>();
  a.out = out.data();
  a.B = int(B);
  a.hq = int(Hq);
  a.hkv = int(Hkv);
  a.D = int(D);
  a.capacity = cap;
  a.scale = float(sc);
  a.window = window ? *window : 0;
  a.softcap = softcap ? float(*softcap) : 0.f;
  a.dtype = q_in.dtype();
  a.cache_dtype = kc.dtype();
  Array ks, vs;
  if (fp8) {
    ks = k_scale.contiguous(&s);
    vs = v_scale.contiguous(&s);
    a.k_scale = ks.data_as<float>();
    a.v_scale = vs.data_as<float>();
  }
  if (B == 0 || Hq == 0) return out;
  for (const Array* x : std::initializer_list<const Array*>{&q, &kc, &vc, &lens, &bt, &ks, &vs})
    if (x->defined()) detail::mark_used(*x, s);
  if (d.is_cpu()) {
    cpu::attention_decode(a);
    return out;
  }
#if GPUKIT_WITH_CUDA
  split_params(a);
  a.nsplit = int(decode_splits_bound(cap, a.chunk_min, a.chunk_max, a.target_splits));
  if (a.nsplit > 65535) throw ValueError(cat("k_cache: capacity ", cap, " needs more than 65535 decode chunks"));
  // one workspace: partial outputs [B, Hq, nsplit, D], then their max / sum [B, Hq, nsplit, 2]
  const int64_t nws_o = B * Hq * a.nsplit * D;
  Array ws = Array::empty({nws_o + B * Hq * a.nsplit * 2}, DType::f32, d, &s);
  a.ws_o = ws.data_as<float>();
  a.ws_ml = a.ws_o + nws_o;
  cuda::attention_decode(a, s.handle());
#else
  detail::no_cuda_backend();
#endif
  return out;
}

Array attention_prefill(const Array& q_in, const Array& k_in, const Array& v_in, const Array& cuq_in,
                        const Array& cuk_in, bool causal, std::optional<double> scale, std::optional<int64_t> window,
                        std::optional<double> softcap, const Stream* sp) {
  Device d = detail::common_device({{"q", &q_in}, {"k", &k_in}, {"v", &v_in}});
  detail::require_half_or_float(q_in, "q");
  detail::require_same_dtype(k_in, "k", q_in, "q");
  detail::require_same_dtype(v_in, "v", q_in, "q");
  if (q_in.ndim() != 3) throw ValueError(cat("q: shape ", shape_str(q_in.shape()), " must be [tokens, Hq, D]"));
  if (k_in.ndim() != 3) throw ValueError(cat("k: shape ", shape_str(k_in.shape()), " must be [tokens, Hkv, D]"));
  if (v_in.shape() != k_in.shape())
    throw ValueError(cat("v: shape ", shape_str(v_in.shape()), " does not match k ", shape_str(k_in.shape())));
  const int64_t Tq = q_in.shape(0), Hq = q_in.shape(1), D = q_in.shape(2), Tk = k_in.shape(0), Hkv = k_in.shape(1);
  if (k_in.shape(2) != D) throw ValueError(cat("k: head_dim ", k_in.shape(2), " does not match q's ", D));
  if (D != 64 && D != 128 && D != 256) throw ValueError(cat("q: head_dim ", D, " is not supported (64, 128 or 256)"));
  if (Hkv <= 0 || Hq % Hkv != 0)
    throw ValueError(cat("q: ", Hq, " query heads is not a multiple of k's ", Hkv, " kv heads"));
  if (cuq_in.defined() != cuk_in.defined()) throw ValueError("cu_seqlens_q, cu_seqlens_k: give both or neither");
  double sc = scale ? *scale : 1.0 / std::sqrt(double(D));
  if (!std::isfinite(sc)) throw ValueError("scale: must be finite");
  if (window && *window <= 0) throw ValueError(cat("window: must be > 0, got ", *window));
  if (window && !causal) throw ValueError("window: only with causal=True");
  if (softcap && !(std::isfinite(*softcap) && *softcap > 0)) throw ValueError("softcap: must be finite and > 0");
  Stream s = resolve_stream(sp, d);
  Array cuq, cuk;
  int64_t B = 1;
  if (cuq_in.defined()) {
    for (auto [c, name] : {std::pair{&cuq_in, "cu_seqlens_q"}, std::pair{&cuk_in, "cu_seqlens_k"}}) {
      if (c->dtype() != DType::i32 || c->ndim() != 1 || c->shape(0) < 2)
        throw ValueError(cat(name, ": must be int32 [B + 1], got ", dtype_name(c->dtype()), " ", shape_str(c->shape())));
      if (!c->device().is_cpu() && c->device() != d) throw ValueError(cat(name, ": must be on the CPU or on ", d.str()));
    }
    if (cuq_in.shape(0) != cuk_in.shape(0))
      throw ValueError("cu_seqlens_q, cu_seqlens_k: must have the same length");
    B = cuq_in.shape(0) - 1;
    if (B > INT32_MAX) throw ValueError("cu_seqlens_q: too many sequences");
    for (auto [c, name, T] : {std::tuple{&cuq_in, "cu_seqlens_q", Tq}, std::tuple{&cuk_in, "cu_seqlens_k", Tk}}) {
      if (!c->device().is_cpu()) continue;  // device offsets: the kernel skips out-of-range sequences
      if (at32(*c, 0) != 0 || at32(*c, B) != T)
        throw ValueError(cat(name, ": must start at 0 and end at the token count ", T));
      for (int64_t b = 0; b < B; ++b)
        if (at32(*c, b + 1) < at32(*c, b)) throw ValueError(cat(name, ": must be non-decreasing (entry ", b + 1, ")"));
    }
    cuq = (cuq_in.device() != d ? cuq_in.to(d, &s, true) : cuq_in).contiguous(&s);
    cuk = (cuk_in.device() != d ? cuk_in.to(d, &s, true) : cuk_in).contiguous(&s);
  }
  Array q = D > 1 && q_in.stride(2) != 1 ? q_in.contiguous(&s) : q_in;
  // k and v rows are read with 16-byte vectors on CUDA: copy views that would break the alignment.
  auto rows16 = [&](const Array& x) {
    const int64_t N = int64_t(16 / x.itemsize());
    bool ok = x.stride(2) == 1 && reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && x.stride(0) % N == 0 &&
              x.stride(1) % N == 0;
    return ok || d.is_cpu() ? x : x.copy(&s);
  };
  Array k = rows16(k_in), v = rows16(v_in);
  Array out = Array::empty({Tq, Hq, D}, q_in.dtype(), d, &s);
  PrefillArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.q_ts = q.stride(0), a.q_hs = q.stride(1), a.k_ts = k.stride(0), a.k_hs = k.stride(1);
  a.v_ts = v.stride(0), a.v_hs = v.stride(1);
  a.out = out.data();
  if (cuq.defined()) {
    a.cu_q = cuq.data_as<int32_t>();
    a.cu_k = cuk.data_as<int32_t>();
  }
  a.B = int(B);
  a.Tq = Tq;
  a.Tk = Tk;
  a.hq = int(Hq);
  a.hkv = int(Hkv);
  a.D = int(D);
  a.scale = float(sc);
  a.causal = causal;
  a.window = window ? *window : 0;
  a.softcap = softcap ? float(*softcap) : 0.f;
  a.dtype = q_in.dtype();
  if (Tq == 0 || Hq == 0) return out;
  for (const Array* x : std::initializer_list<const Array*>{&q, &k, &v, &cuq, &cuk})
    if (x->defined()) detail::mark_used(*x, s);
  if (d.is_cpu()) {
    cpu::attention_prefill(a);
    return out;
  }
#if GPUKIT_WITH_CUDA
  cuda::attention_prefill(a, s.handle());
#else
  detail::no_cuda_backend();
#endif
  return out;
}

}  // namespace gk::nn
