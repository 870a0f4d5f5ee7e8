// Front ends of the mixture-of-experts ops (include/gpukit/moe.h): argument checks
// before any launch, allocation, and the CPU / CUDA dispatch. moe_mlp chains them for
// the Mixtral layer of the engine (src/llm/moe.cpp).
#include "gpukit/moe.h"

#include <algorithm>

#include "gpukit/gemm.h"
#include "ops/common.h"
#include "ops/moe_args.h"

namespace gk {

namespace {

bool is_half_or_f32(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

void require_i32(const Array& a, const char* arg, const char* op) {
  if (a.dtype() != DType::i32) throw TypeError(cat(arg, ": ", op, " takes int32, got ", dtype_name(a.dtype())));
}

// The ids must index experts: checked on the host (a copy for device arrays) because
// an out-of-range id would make the kernels write out of bounds.
void check_ids(const Array& ids, int64_t e, const Stream& s, const char* arg) {
  Array h = ids.to(Device{}, &s).contiguous();
  const int32_t* p = h.data_as<int32_t>();
  for (int64_t i = 0; i < h.numel(); ++i)
    if (p[i] < 0 || p[i] >= e)
      throw IndexError(cat(arg, ": value ", p[i], " at flat index ", i, " is outside [0, ", e, ")"));
}

}  // namespace

MoeRouting moe_topk_gating(const Array& logits_in, int64_t k, bool renormalize, const Stream* sp) {
  Device d = detail::common_device({{"logits", &logits_in}});
  Stream s = resolve_stream(sp, d);
  if (!is_half_or_f32(logits_in.dtype()))
    throw TypeError(cat("logits: moe_topk_gating takes float32, float16 or bfloat16, got ", dtype_name(logits_in.dtype())));
  if (logits_in.ndim() != 2)
    throw ValueError(cat("logits: moe_topk_gating needs [tokens, experts], got shape ", shape_str(logits_in.shape())));
  const int64_t t = logits_in.shape(0), e = logits_in.shape(1);
  if (e < 1 || e > 1024) throw ValueError(cat("logits: the number of experts must be in [1, 1024], got ", e));
  if (k < 1 || k > e) throw ValueError(cat("k: must be in [1, ", e, "] (the number of experts), got ", k));
  Array logits = logits_in.contiguous(&s);
  MoeRouting r;
  r.expert_ids = Array::empty({t, k}, DType::i32, d, &s);
  r.weights = Array::empty({t, k}, DType::f32, d, &s);
  if (t == 0) return r;
  MoeGatingArgs a;
  a.logits = logits.data();
  a.dtype = logits.dtype();
  a.t = t;
  a.e = e;
  a.k = k;
  a.renormalize = renormalize;
  a.ids = r.expert_ids.data_as<int32_t>();
  a.weights = r.weights.data_as<float>();
  if (d.is_cpu()) {
    cpu::moe_topk_gating(a);
  } else {
#if GPUKIT_WITH_CUDA
    detail::mark_used(logits, s);
    cuda::moe_topk_gating(a, s.handle());
#else
    detail::no_cuda_backend();
#endif
  }
  return r;
}

namespace {
// `check`: validate device-resident indices on the host first (the public ops do; moe_mlp
// skips it for the ids it made itself, so that a CUDA graph can capture it: no host copy).
MoePermutation permute_impl(const Array& x, const Array& ids_in, int64_t num_experts, const Stream* sp, bool check) {
  Device d = detail::common_device({{"x", &x}, {"expert_ids", &ids_in}});
  Stream s = resolve_stream(sp, d);
  require_i32(ids_in, "expert_ids", "moe_permute");
  if (x.ndim() != 2) throw ValueError(cat("x: moe_permute needs [tokens, hidden], got shape ", shape_str(x.shape())));
  if (ids_in.ndim() != 2 || ids_in.shape(0) != x.shape(0))
    throw ValueError(cat("expert_ids: moe_permute needs [tokens, k] with tokens = ", x.shape(0), ", got shape ",
                         shape_str(ids_in.shape())));
  if (num_experts < 1 || num_experts > 1024)
    throw ValueError(cat("num_experts: must be in [1, 1024], got ", num_experts));
  const int64_t t = x.shape(0), k = ids_in.shape(1), h = x.shape(1);
  if (t * k > INT32_MAX) throw ValueError("moe_permute: more than 2^31 rows");
  Array ids = ids_in.contiguous(&s);
  if (check) check_ids(ids, num_experts, s, "expert_ids");
  MoePermutation p;
  p.x_sorted = Array::empty({t * k, h}, x.dtype(), d, &s);
  p.offsets = Array::empty({num_experts + 1}, DType::i32, d, &s);
  p.slot_pos = Array::empty({t, k}, DType::i32, d, &s);
  p.sorted_token = Array::empty({t * k}, DType::i32, d, &s);
  Array x2 = x.stride(1) == 1 || h <= 1 ? x : x.contiguous(&s);
  MoePermuteArgs a;
  a.ids = ids.data_as<int32_t>();
  a.t = t;
  a.k = k;
  a.e = num_experts;
  a.h = h;
  a.x = x2.data();
  a.x_rs = t == 1 ? h : x2.stride(0);
  a.dtype = x.dtype();
  a.x_sorted = p.x_sorted.data();
  a.offsets = p.offsets.data_as<int32_t>();
  a.slot_pos = p.slot_pos.data_as<int32_t>();
  a.sorted_token = p.sorted_token.data_as<int32_t>();
  if (d.is_cpu()) {
    cpu::moe_permute(a);
  } else {
#if GPUKIT_WITH_CUDA
    detail::mark_used(x2, s);
    detail::mark_used(ids, s);
    cuda::moe_permute(a, s.handle());
#else
    detail::no_cuda_backend();
#endif
  }
  return p;
}

Array unpermute_impl(const Array& y_sorted, const Array& slot_pos_in, const Array& weights_in,
                     std::optional<DType> out_dtype, const Stream* sp, bool check) {
  Device d = detail::common_device({{"y_sorted", &y_sorted}, {"slot_pos", &slot_pos_in}, {"weights", &weights_in}});
  Stream s = resolve_stream(sp, d);
  if (!is_half_or_f32(y_sorted.dtype()))
    throw TypeError(cat("y_sorted: moe_unpermute takes float32, float16 or bfloat16, got ", dtype_name(y_sorted.dtype())));
  require_i32(slot_pos_in, "slot_pos", "moe_unpermute");
  if (y_sorted.ndim() != 2) throw ValueError(cat("y_sorted: expected [rows, hidden], got shape ", shape_str(y_sorted.shape())));
  if (slot_pos_in.ndim() != 2) throw ValueError(cat("slot_pos: expected [tokens, k], got shape ", shape_str(slot_pos_in.shape())));
  if (weights_in.shape() != slot_pos_in.shape())
    throw ValueError(cat("weights: expected the shape of slot_pos ", shape_str(slot_pos_in.shape()), ", got ",
                         shape_str(weights_in.shape())));
  if (!is_half_or_f32(weights_in.dtype())) throw TypeError("weights: expected a float array");
  const int64_t t = slot_pos_in.shape(0), k = slot_pos_in.shape(1), h = y_sorted.shape(1), r = y_sorted.shape(0);
  DType out = out_dtype.value_or(y_sorted.dtype());
  if (!is_half_or_f32(out)) throw TypeError(cat("out_dtype: moe_unpermute produces float32, float16 or bfloat16"));
  Array pos = slot_pos_in.contiguous(&s);
  if (check) {
    if (r == 0 && pos.numel() > 0) throw IndexError("slot_pos: y_sorted has no rows");
    check_ids(pos, std::max<int64_t>(r, 1), s, "slot_pos");  // every position must be a row of y_sorted
  }
  Array wts = weights_in.astype(DType::f32, &s).contiguous(&s);
  Array ys = y_sorted.contiguous(&s);
  Array y = Array::empty({t, h}, out, d, &s);
  if (y.numel() == 0) return y;
  MoeUnpermuteArgs a;
  a.y_sorted = ys.data();
  a.in_dtype = ys.dtype();
  a.out_dtype = out;
  a.slot_pos = pos.data_as<int32_t>();
  a.weights = wts.data_as<float>();
  a.t = t;
  a.k = k;
  a.h = h;
  a.r = r;
  a.out = y.data();
  if (d.is_cpu()) {
    cpu::moe_unpermute(a);
  } else {
#if GPUKIT_WITH_CUDA
    for (const Array* u : {&pos, &wts, &ys}) detail::mark_used(*u, s);
    cuda::moe_unpermute(a, s.handle());
#else
    detail::no_cuda_backend();
#endif
  }
  return y;
}

Array grouped_impl(const Array& x_in, const Array& w_in, const Array& offsets_in, std::optional<DType> out_dtype,
                   const Stream* sp, bool check) {
  Device d = detail::common_device({{"x", &x_in}, {"w", &w_in}, {"offsets", &offsets_in}});
  Stream s = resolve_stream(sp, d);
  if (!is_half_or_f32(x_in.dtype()))
    throw TypeError(cat("x: moe_grouped_gemm takes bfloat16, float16 or float32, got ", dtype_name(x_in.dtype())));
  if (w_in.dtype() != x_in.dtype())
    throw TypeError(cat("w: moe_grouped_gemm needs w of x's dtype ", dtype_name(x_in.dtype()), ", got ",
                        dtype_name(w_in.dtype())));
  require_i32(offsets_in, "offsets", "moe_grouped_gemm");
  if (x_in.ndim() != 2) throw ValueError(cat("x: moe_grouped_gemm needs [rows, K], got shape ", shape_str(x_in.shape())));
  if (w_in.ndim() != 3)
    throw ValueError(cat("w: moe_grouped_gemm needs [experts, N, K], got shape ", shape_str(w_in.shape())));
  if (w_in.shape(2) != x_in.shape(1))
    throw ValueError(cat("moe_grouped_gemm: x has ", x_in.shape(1), " features but w has ", w_in.shape(2),
                         " (shape ", shape_str(w_in.shape()), ")"));
  const int64_t e = w_in.shape(0), n = w_in.shape(1), kd = w_in.shape(2), r = x_in.shape(0);
  if (offsets_in.ndim() != 1 || offsets_in.shape(0) != e + 1)
    throw ValueError(cat("offsets: expected shape (", e + 1, ",) for ", e, " experts, got ", shape_str(offsets_in.shape())));
  if (r > INT32_MAX) throw ValueError("x: more than 2^31 rows");
  if (e < 1 || e > 1024) throw ValueError(cat("w: the number of experts must be in [1, 1024], got ", e));
  DType out = out_dtype.value_or(x_in.dtype());
  if (!is_half_or_f32(out)) throw TypeError("out_dtype: moe_grouped_gemm produces float32, float16 or bfloat16");
  Array offsets = offsets_in.contiguous(&s);
  // The offsets must be non-decreasing from 0 to at most R: checked before any launch (always
  // on the CPU, where it costs no sync and the reference kernel does not clamp them).
  if (check || d.is_cpu()) {
    Array h = offsets.to(Device{}, &s).contiguous();
    const int32_t* o = h.data_as<int32_t>();
    if (o[0] != 0) throw ValueError(cat("offsets: must start at 0, got ", o[0]));
    for (int64_t i = 0; i < e; ++i)
      if (o[i + 1] < o[i] || o[i + 1] > r)
        throw ValueError(cat("offsets: must be non-decreasing and at most ", r, " (the rows of x); offsets[", i + 1,
                             "] = ", o[i + 1], " after ", o[i]));
  }
  Array x = x_in.contiguous(&s), w = w_in.contiguous(&s);
  checked_numel({r, n}, out, "moe_grouped_gemm result");
  Array y = Array::empty({r, n}, out, d, &s);
  if (y.numel() == 0) return y;
  MoeGemmArgs a;
  a.x = x.data();
  a.w = w.data();
  a.offsets = offsets.data_as<int32_t>();
  a.y = y.data();
  a.r = r;
  a.e = e;
  a.n = n;
  a.kdim = kd;
  a.dtype = x.dtype();
  a.out_dtype = out;
  if (d.is_cpu()) {
    cpu::moe_grouped_gemm(a);
  } else {
#if GPUKIT_WITH_CUDA
    for (const Array* u : {&x, &w, &offsets}) detail::mark_used(*u, s);
    cuda::moe_grouped_gemm(a, s.handle());
#else
    detail::no_cuda_backend();
#endif
  }
  return y;
}
}  // namespace

MoePermutation moe_permute(const Array& x, const Array& expert_ids, int64_t num_experts, const Stream* s) {
  return permute_impl(x, expert_ids, num_experts, s, true);
}
Array moe_unpermute(const Array& y_sorted, const Array& slot_pos, const Array& weights, std::optional<DType> out_dtype,
                    const Stream* s) {
  return unpermute_impl(y_sorted, slot_pos, weights, out_dtype, s, true);
}
Array moe_grouped_gemm(const Array& x, const Array& w, const Array& offsets, std::optional<DType> out_dtype,
                       const Stream* s, bool validate) {
  return grouped_impl(x, w, offsets, out_dtype, s, validate);
}

Array moe_mlp(const Array& x, const Array& gate_w, const Array& w13, const Array& w2, int64_t top_k,
              const Stream* sp) {
  Device d = detail::common_device({{"x", &x}, {"gate_w", &gate_w}, {"w13", &w13}, {"w2", &w2}});
  Stream s = resolve_stream(sp, d);
  if (x.ndim() != 2) throw ValueError(cat("x: moe_mlp needs [tokens, hidden], got shape ", shape_str(x.shape())));
  if (gate_w.ndim() != 2 || gate_w.shape(1) != x.shape(1))
    throw ValueError(cat("gate_w: expected [experts, ", x.shape(1), "], got shape ", shape_str(gate_w.shape())));
  const int64_t e = gate_w.shape(0), hdim = x.shape(1);
  if (w13.ndim() != 3 || w13.shape(0) != e || w13.shape(2) != hdim || w13.shape(1) % 2)
    throw ValueError(cat("w13: expected [", e, ", 2*I, ", hdim, "], got shape ", shape_str(w13.shape())));
  const int64_t inter = w13.shape(1) / 2;
  if (w2.ndim() != 3 || w2.shape(0) != e || w2.shape(1) != hdim || w2.shape(2) != inter)
    throw ValueError(cat("w2: expected [", e, ", ", hdim, ", ", inter, "], got shape ", shape_str(w2.shape())));
  const DType dt = w13.dtype();
  Array logits = linear(x, gate_w, nullptr, Activation::none, nullptr, DType::f32, &s);
  MoeRouting rt = moe_topk_gating(logits, top_k, /*renormalize=*/true, &s);
  Array xin = x.dtype() == dt ? x : x.astype(dt, &s);
  MoePermutation p = permute_impl(xin, rt.expert_ids, e, &s, false);
  const int64_t rows = p.x_sorted.shape(0);
  Array hmid = Array::empty({rows, inter}, dt, d, &s);
  bool fused = false;  // the gate-up product with SwiGLU in its epilogue (Hopper kernel), same bits
#if GPUKIT_WITH_CUDA
  if (!d.is_cpu() && hmid.numel() > 0 && hdim > 0) {
    Array w13c = w13.contiguous(&s);
    MoeGemmArgs a;
    a.x = p.x_sorted.data();
    a.w = w13c.data();
    a.offsets = p.offsets.data_as<int32_t>();
    a.y = hmid.data();
    a.r = rows;
    a.e = e;
    a.n = 2 * inter;
    a.kdim = hdim;
    a.dtype = dt;
    a.out_dtype = dt;
    a.swiglu = true;
    for (const Array* u : {&p.x_sorted, &w13c, &p.offsets}) detail::mark_used(*u, s);
    fused = cuda::moe_grouped_gemm_swiglu(a, s.handle());
  }
#endif
  if (!fused && hmid.numel() > 0) {
    Array acc = grouped_impl(p.x_sorted, w13, p.offsets, DType::f32, &s, false);  // [R, 2I] fp32
    EpilogueArgs ea;
    ea.acc = acc.data();
    ea.out = hmid.data();
    ea.m = acc.shape(0);
    ea.n = inter;
    ea.acc_dtype = DType::f32;
    ea.out_dtype = dt;
    ea.swiglu = true;
    if (d.is_cpu()) {
      cpu::gemm_epilogue(ea);
    } else {
#if GPUKIT_WITH_CUDA
      cuda::gemm_epilogue(ea, s.handle());
#else
      detail::no_cuda_backend();
#endif
    }
  }
  Array down = grouped_impl(hmid, w2, p.offsets, dt, &s, false);  // [R, H]
  return unpermute_impl(down, p.slot_pos, rt.weights, x.dtype(), &s, false);
}

}  // namespace gk
