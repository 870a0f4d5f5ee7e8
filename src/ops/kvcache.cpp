// Front end of kv_append: validate shapes and dtypes, validate the index arrays
// on the host when they are host-visible, move them to the cache's device, and
// dispatch. The cache is updated in place.
#include <algorithm>

#include "gpukit/nn.h"
#include "ops/common.h"
#include "ops/nn_args.h"

namespace gk::nn {

namespace {
// An int32 (or, for slots, int32/int64) 1-D/2-D index array.
void check_index(const Array& a, const char* arg, int ndim, bool allow64) {
  if (a.dtype() != DType::i32 && !(allow64 && a.dtype() == DType::i64))
    throw TypeError(cat(arg, ": dtype ", dtype_name(a.dtype()), " is not supported (", allow64 ? "int32 or int64" : "int32",
                        ")"));
  if (a.ndim() != ndim) throw ValueError(cat(arg, ": must be ", ndim, "-D, got shape ", shape_str(a.shape())));
}

int64_t at(const Array& a, int64_t i, int64_t j = 0) {
  int64_t off = i * a.stride(0) + (a.ndim() > 1 ? j * a.stride(1) : 0);
  return a.dtype() == DType::i64 ? a.data_as<int64_t>()[off] : int64_t(a.data_as<int32_t>()[off]);
}

// Host-side validation of the index arrays (all on the CPU here).
void validate_host(const KvIndex& ix, int64_t T, int64_t nb, int64_t bs, bool paged) {
  if (ix.slot_mapping.defined()) {
    for (int64_t t = 0; t < T; ++t) {
      int64_t s = at(ix.slot_mapping, t);
      if (s >= nb * bs)
        throw IndexError(cat("slot_mapping: slot ", s, " of token ", t, " is outside the cache (", nb, " blocks x ", bs,
                             " = ", nb * bs, " slots)"));
    }
    return;
  }
  const int64_t B = ix.seq_lens.shape(0);
  if (ix.cu_seqlens.defined()) {
    if (at(ix.cu_seqlens, 0) != 0 || at(ix.cu_seqlens, B) != T)
      throw ValueError(cat("cu_seqlens: must start at 0 and end at the token count ", T));
    for (int64_t b = 0; b < B; ++b)
      if (at(ix.cu_seqlens, b + 1) < at(ix.cu_seqlens, b))
        throw ValueError(cat("cu_seqlens: must be non-decreasing (entry ", b + 1, ")"));
  }
  const int64_t cap = paged ? ix.block_table.shape(1) * bs : bs;
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = ix.cu_seqlens.defined() ? at(ix.cu_seqlens, b + 1) - at(ix.cu_seqlens, b) : 1;
    int64_t len = at(ix.seq_lens, b);
    if (len < 0) throw ValueError(cat("seq_lens: negative length ", len, " for sequence ", b));
    if (len + n > cap)
      throw ValueError(cat("seq_lens: sequence ", b, " has ", len, " tokens + ", n, " new > cache capacity ", cap,
                           paged ? " (max_blocks x block_size)" : " (T_max)"));
    if (paged && n > 0) {
      for (int64_t li = len / bs; li <= (len + n - 1) / bs; ++li) {
        int64_t blk = at(ix.block_table, b, li);
        if (blk < 0 || blk >= nb)
          throw IndexError(cat("block_table: block id ", blk, " at [", b, ", ", li, "] is outside the pool of ", nb,
                               " blocks"));
      }
    }
  }
}
void append_impl(const Array& k_new, const Array& v_new, const Array& k_cache, const Array& v_cache,
                 const KvIndex& ix_in, const KvRope* rope, const Array& k_scale, const Array& v_scale, bool validate,
                 const Stream* sp);
}  // namespace

void kv_append(const Array& k_new, const Array& v_new, const Array& k_cache, const Array& v_cache,
               const KvIndex& ix_in, const Array& k_scale, const Array& v_scale, bool validate, const Stream* sp) {
  append_impl(k_new, v_new, k_cache, v_cache, ix_in, nullptr, k_scale, v_scale, validate, sp);
}

void kv_append(const Array& k_new, const Array& v_new, const Array& k_cache, const Array& v_cache,
               const KvIndex& ix_in, const KvRope& rope, const Array& k_scale, const Array& v_scale, bool validate,
               const Stream* sp) {
  append_impl(k_new, v_new, k_cache, v_cache, ix_in, &rope, k_scale, v_scale, validate, sp);
}

namespace {
void append_impl(const Array& k_new, const Array& v_new, const Array& k_cache, const Array& v_cache,
                 const KvIndex& ix_in, const KvRope* rope, const Array& k_scale, const Array& v_scale, bool validate,
                 const Stream* sp) {
  Device d = detail::common_device({{"k_new", &k_new}, {"v_new", &v_new}, {"k_cache", &k_cache}, {"v_cache", &v_cache}});
  detail::require_half_or_float(k_new, "k_new");
  detail::require_same_dtype(v_new, "v_new", k_new, "k_new");
  if (k_new.ndim() != 3) throw ValueError(cat("k_new: shape ", shape_str(k_new.shape()), " must be [tokens, Hkv, D]"));
  if (v_new.shape() != k_new.shape())
    throw ValueError(cat("v_new: shape ", shape_str(v_new.shape()), " does not match k_new ", shape_str(k_new.shape())));
  const int64_t T = k_new.shape(0), H = k_new.shape(1), D = k_new.shape(2);
  if (k_cache.ndim() != 4)
    throw ValueError(cat("k_cache: shape ", shape_str(k_cache.shape()), " must be [num_blocks, block_size, Hkv, D]"));
  if (v_cache.shape() != k_cache.shape())
    throw ValueError(cat("v_cache: shape ", shape_str(v_cache.shape()), " does not match k_cache ",
                         shape_str(k_cache.shape())));
  if (k_cache.shape(2) != H || k_cache.shape(3) != D)
    throw ValueError(cat("k_cache: shape ", shape_str(k_cache.shape()), " does not hold [", H, ", ", D,
                         "] heads of k_new ", shape_str(k_new.shape())));
  if (!k_cache.is_contiguous()) throw ValueError("k_cache: must be contiguous (it is updated in place)");
  if (!v_cache.is_contiguous()) throw ValueError("v_cache: must be contiguous (it is updated in place)");
  detail::require_same_dtype(v_cache, "v_cache", k_cache, "k_cache");
  const bool fp8 = k_cache.dtype() == DType::f8e4m3;
  if (!fp8) detail::require_same_dtype(k_cache, "k_cache", k_new, "k_new");
  if (fp8) {
    for (auto [sc, name] : {std::pair{&k_scale, "k_scale"}, std::pair{&v_scale, "v_scale"}}) {
      if (!sc->defined()) throw ValueError(cat(name, ": a float8_e4m3fn cache needs per-head float32 scales [Hkv]"));
      if (sc->device() != d) throw ValueError(cat(name, ": must be on ", d.str()));
      if (sc->dtype() != DType::f32 || sc->ndim() != 1 || sc->shape(0) != H)
        throw ValueError(cat(name, ": must be float32 [", H, "], got ", dtype_name(sc->dtype()), " ",
                             shape_str(sc->shape())));
    }
  } else if (k_scale.defined() || v_scale.defined()) {
    throw ValueError("k_scale: scales apply to a float8_e4m3fn cache only");
  }
  const int64_t nb = k_cache.shape(0), bs = k_cache.shape(1);
  KvIndex ix = ix_in;
  const bool by_slot = ix.slot_mapping.defined();
  const bool paged = !by_slot && ix.block_table.defined();
  if (by_slot) {
    if (ix.block_table.defined() || ix.seq_lens.defined() || ix.cu_seqlens.defined())
      throw ValueError("slot_mapping: give either slot_mapping or (block_table, seq_lens), not both");
    check_index(ix.slot_mapping, "slot_mapping", 1, true);
    if (ix.slot_mapping.shape(0) != T)
      throw ValueError(cat("slot_mapping: shape ", shape_str(ix.slot_mapping.shape()), " must be (", T, ",)"));
  } else {
    if (!ix.seq_lens.defined()) throw ValueError("seq_lens: required unless slot_mapping is given");
    check_index(ix.seq_lens, "seq_lens", 1, false);
    const int64_t B = ix.seq_lens.shape(0);
    if (B > INT32_MAX) throw ValueError("seq_lens: too many sequences");
    if (paged) {
      check_index(ix.block_table, "block_table", 2, false);
      if (ix.block_table.shape(0) != B)
        throw ValueError(cat("block_table: shape ", shape_str(ix.block_table.shape()), " must have ", B,
                             " rows (one per sequence in seq_lens)"));
      if (bs < 16 || bs > 256)
        throw ValueError(cat("k_cache: block_size ", bs, " is not supported by the paged cache (16 to 256)"));
    }
    if (ix.cu_seqlens.defined()) {
      check_index(ix.cu_seqlens, "cu_seqlens", 1, false);
      if (ix.cu_seqlens.shape(0) != B + 1)
        throw ValueError(cat("cu_seqlens: shape ", shape_str(ix.cu_seqlens.shape()), " must be (", B + 1, ",)"));
    } else if (B != T) {
      throw ValueError(cat("seq_lens: ", B, " sequences but ", T, " new tokens; give cu_seqlens for several tokens per sequence"));
    }
  }
  // Fused RoPE: rotary dim, the frequency table (validates theta and scaling), positions.
  int rd = 0;
  double mscale = 1.0;
  std::vector<double> inv_freq;
  Array rpos;
  if (rope) {
    rd = rope->rotary_dim ? *rope->rotary_dim : int(D);
    if (rd < 2 || rd > D || rd % 2)
      throw ValueError(cat("rotary_dim: must be even and in [2, head_dim = ", D, "], got ", rd));
    inv_freq = rope_inv_freq(rope->theta, rd, rope->scaling, &mscale);
    rpos = rope->positions;
    if (rpos.defined()) {
      if (rpos.dtype() != DType::i32 && rpos.dtype() != DType::i64)
        throw TypeError(cat("positions: dtype ", dtype_name(rpos.dtype()), " is not supported (int32 or int64)"));
      if (rpos.ndim() != 1 || rpos.shape(0) != T)
        throw ValueError(cat("positions: shape ", shape_str(rpos.shape()), " must be (", T, ",), one per new token"));
      if (!rpos.device().is_cpu() && rpos.device() != d)
        throw ValueError(cat("positions: must be on the CPU or on ", d.str()));
      if (rpos.device().is_cpu())
        for (int64_t t = 0; t < T; ++t)
          if (int64_t p = at(rpos, t); p < 0)
            throw ValueError(cat("positions: negative position ", p, " at token ", t));
    } else if (by_slot) {
      throw ValueError("positions: required for RoPE with a slot_mapping (the cache position is unknown)");
    }
    if (rope->write_k && D > 1 && k_new.stride(2) != 1)
      throw ValueError("k_new: write_k needs a dense last dimension (k_new is overwritten in place)");
  }
  Stream s = resolve_stream(sp, d);
  // Host validation: index arrays on the CPU always; device ones when asked (a sync).
  std::vector<Array*> idx = {&ix.slot_mapping, &ix.block_table, &ix.seq_lens, &ix.cu_seqlens};
  bool all_host = true, any_dev = false;
  for (Array* a : idx)
    if (a->defined()) {
      if (a->device().is_cpu()) continue;
      all_host = false;
      any_dev = true;
      if (a->device() != d) throw ValueError(cat("index arrays must be on the CPU or on ", d.str()));
    }
  if (all_host) {
    validate_host(ix, T, nb, bs, paged);
  } else if (validate) {
    KvIndex h;
    Array* hv[] = {&h.slot_mapping, &h.block_table, &h.seq_lens, &h.cu_seqlens};
    for (int i = 0; i < 4; ++i)
      if (idx[i]->defined()) *hv[i] = idx[i]->to(Device::cpu(), &s);
    validate_host(h, T, nb, bs, paged);
  }
  (void)any_dev;
  // Move host index arrays to the cache's device (stream ordered), dense.
  for (Array* a : idx)
    if (a->defined()) {
      if (a->device() != d) *a = a->to(d, &s, /*non_blocking=*/true);
      *a = a->contiguous(&s);
    }
  if (rpos.defined()) {
    if (rpos.device() != d) rpos = rpos.to(d, &s, /*non_blocking=*/true);
    rpos = rpos.contiguous(&s);
  }
  Array kn = D > 1 && k_new.stride(2) != 1 ? k_new.contiguous(&s) : k_new;
  Array vn = D > 1 && v_new.stride(2) != 1 ? v_new.contiguous(&s) : v_new;
  KvAppendArgs a;
  a.k = kn.data();
  a.v = vn.data();
  a.k_ts = kn.stride(0), a.k_hs = kn.stride(1), a.v_ts = vn.stride(0), a.v_hs = vn.stride(1);
  a.kc = k_cache.data();
  a.vc = v_cache.data();
  a.nb = nb;
  a.bs = bs;
  a.hkv = int(H);
  a.D = int(D);
  a.T = T;
  if (by_slot) {
    a.slots = ix.slot_mapping.data();
    a.slots64 = ix.slot_mapping.dtype() == DType::i64;
  } else {
    a.seq_lens = ix.seq_lens.data_as<int32_t>();
    a.B = int(ix.seq_lens.shape(0));
    if (paged) {
      a.block_table = ix.block_table.data_as<int32_t>();
      a.bt_stride = ix.block_table.stride(0);
      a.max_blocks = ix.block_table.shape(1);
    }
    if (ix.cu_seqlens.defined()) a.cu = ix.cu_seqlens.data_as<int32_t>();
  }
  a.dtype = k_new.dtype();
  a.cache_dtype = k_cache.dtype();
  if (rope) {
    a.rope_rd = rd;
    a.rope_il = rope->interleaved;
    a.rope_mscale = float(mscale);
    for (int i = 0; i < rd / 2; ++i) a.inv_freq[i] = float(inv_freq[size_t(i)]);
    if (rpos.defined()) {
      a.rope_pos = rpos.data();
      a.rope_pos64 = rpos.dtype() == DType::i64;
    }
    if (rope->write_k) {  // kn is k_new itself (dense last dimension checked above)
      a.k_out = kn.data();
      a.ko_ts = kn.stride(0);
      a.ko_hs = kn.stride(1);
    }
  }
  Array ks, vs;
  if (fp8) {
    ks = k_scale.contiguous(&s);
    vs = v_scale.contiguous(&s);
    a.k_scale = ks.data_as<float>();
    a.v_scale = vs.data_as<float>();
  }
  if (T == 0 || H == 0 || D == 0 || nb == 0 || bs == 0) return;
  for (const Array* x : std::initializer_list<const Array*>{&kn, &vn, &k_cache, &v_cache, &ks, &vs})
    if (x->defined()) detail::mark_used(*x, s);
  for (Array* x : idx)
    if (x->defined()) detail::mark_used(*x, s);
  if (rpos.defined()) detail::mark_used(rpos, s);
  if (d.is_cpu()) return cpu::kv_append(a);
#if GPUKIT_WITH_CUDA
  cuda::kv_append(a, s.handle());
#else
  detail::no_cuda_backend();
#endif
}
}  // namespace

}  // namespace gk::nn
