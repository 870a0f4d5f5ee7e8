// Fused inference ops (gpukit.nn): norms, gated activations, positions.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/nn.h"

namespace gkpy {
using namespace gk;

namespace {
Array opt_array(nb::handle h, const char* arg, const Array& like) {
  return h.is_none() ? Array() : to_array(h, arg, &like);
}

nn::GatedAct gelu_kind(const std::string& approximate) {
  if (approximate == "none") return nn::GatedAct::GeGLU;
  if (approximate == "tanh") return nn::GatedAct::GeGLUTanh;
  throw ValueError(cat("approximate: must be 'none' (erf form) or 'tanh', got '", approximate, "'"));
}

nb::object gated_any(nn::GatedAct act, nb::handle gate, nb::handle up, nb::handle stream) {
  Stream st;
  const Stream* sp = to_stream(stream, st);
  Array g = to_array(gate, up.is_none() ? "x" : "gate");
  if (up.is_none()) return nb::cast(nn::gated_fused(act, g, sp));
  return nb::cast(nn::gated(act, g, to_array(up, "up", &g), sp));
}
double dict_num(nb::dict d, std::initializer_list<const char*> keys, double dflt, bool* found = nullptr) {
  for (const char* k : keys)
    if (d.contains(k)) {
      nb::handle v = d[k];
      if (v.is_none()) continue;
      if (found) *found = true;
      try {
        return nb::cast<double>(v);
      } catch (const nb::cast_error&) {
        throw TypeError(cat("scaling['", k, "']: expected a number"));
      }
    }
  if (found) *found = false;
  return dflt;
}

// Hugging Face style rope_scaling dict -> RopeScaling.
nn::RopeScaling to_scaling(nb::handle h) {
  nn::RopeScaling sc;
  if (h.is_none()) return sc;
  if (!nb::isinstance<nb::dict>(h)) throw TypeError("scaling: expected a dict such as {'type': 'yarn', 'factor': 4}");
  nb::dict d = nb::borrow<nb::dict>(h);
  std::string type;
  for (const char* k : {"rope_type", "type"})
    if (d.contains(k)) type = nb::cast<std::string>(nb::str(d[k]));
  for (auto key : d.keys()) {
    std::string k = nb::cast<std::string>(nb::str(key));
    static const char* known[] = {"rope_type", "type", "factor", "alpha", "original_max_position",
                                  "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                                  "attention_factor", "low_freq_factor", "high_freq_factor"};
    bool ok = false;
    for (const char* n : known) ok = ok || k == n;
    if (!ok) throw ValueError(cat("scaling: unknown key '", k, "'"));
  }
  if (type == "linear") sc.kind = nn::RopeScalingKind::Linear;
  else if (type == "ntk" || type == "dynamic_ntk_fixed") sc.kind = nn::RopeScalingKind::NTK;
  else if (type == "yarn") sc.kind = nn::RopeScalingKind::YaRN;
  else if (type == "llama3") sc.kind = nn::RopeScalingKind::Llama3;
  else if (type == "default" || type == "none") sc.kind = nn::RopeScalingKind::None;
  else throw ValueError(cat("scaling: type '", type, "' is not one of linear, ntk, yarn, llama3"));
  sc.factor = dict_num(d, {"factor"}, 1.0);
  sc.alpha = dict_num(d, {"alpha"}, 0.0);
  sc.original_max_position = dict_num(d, {"original_max_position", "original_max_position_embeddings"}, 0.0);
  sc.beta_fast = dict_num(d, {"beta_fast"}, 32.0);
  sc.beta_slow = dict_num(d, {"beta_slow"}, 1.0);
  bool has_m = false;
  double m = dict_num(d, {"mscale", "attention_factor"}, 1.0, &has_m);
  if (has_m) sc.mscale = m;
  sc.low_freq_factor = dict_num(d, {"low_freq_factor"}, 1.0);
  sc.high_freq_factor = dict_num(d, {"high_freq_factor"}, 4.0);
  return sc;
}
}  // namespace

GK_BINDING(35, nn) {
  m.def("rms_norm", [](nb::handle xh, nb::handle wh, double eps, nb::handle residual, bool gemma, nb::handle stream)
            -> nb::object {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    Array x = to_array(xh, "x");
    Array w = to_array(wh, "w", &x);
    if (residual.is_none()) return nb::cast(nn::rms_norm(x, w, eps, gemma, sp));
    auto [y, r] = nn::rms_norm_residual(x, to_array(residual, "residual", &x), w, eps, gemma, sp);
    return nb::make_tuple(y, r);
  }, nb::arg("x"), nb::arg("w"), nb::arg("eps") = 1e-6, nb::arg("residual") = nb::none(), nb::arg("gemma") = false,
     nb::arg("stream") = nb::none(),
     "RMS norm over the last dimension: x / sqrt(mean(x**2) + eps) * w (gemma=True: * (1 + w)).\n"
     "With residual: r = x + residual (in x's dtype) and returns (rms_norm(r), r), in one kernel.");
  m.def("layer_norm", [](nb::handle xh, nb::handle wh, nb::handle bh, double eps, nb::handle stream) {
    Stream st;
    Array x = to_array(xh, "x");
    return nn::layer_norm(x, to_array(wh, "w", &x), opt_array(bh, "b", x), eps, to_stream(stream, st));
  }, nb::arg("x"), nb::arg("w"), nb::arg("b") = nb::none(), nb::arg("eps") = 1e-5, nb::arg("stream") = nb::none(),
     "Layer norm over the last dimension (biased variance): (x - mean) / sqrt(var + eps) * w + b.");
  m.def("swiglu", [](nb::handle gate, nb::handle up, nb::handle stream) {
    return gated_any(nn::GatedAct::SwiGLU, gate, up, stream);
  }, nb::arg("gate"), nb::arg("up") = nb::none(), nb::arg("stream") = nb::none(),
     "silu(gate) * up. With up=None, gate is one [..., 2I] tensor: gate = [..., :I], up = [..., I:].");
  m.def("geglu", [](nb::handle gate, nb::handle up, const std::string& approximate, nb::handle stream) {
    return gated_any(gelu_kind(approximate), gate, up, stream);
  }, nb::arg("gate"), nb::arg("up") = nb::none(), nb::arg("approximate") = "none", nb::arg("stream") = nb::none(),
     "gelu(gate) * up (approximate='none': erf form, 'tanh': tanh form). up=None: fused [..., 2I] input.");
  m.def("relu2", [](nb::handle xh, nb::handle stream) {
    Stream st;
    return nn::gated(nn::GatedAct::ReLU2, to_array(xh, "x"), Array(), to_stream(stream, st));
  }, nb::arg("x"), nb::arg("stream") = nb::none(), "relu(x) ** 2.");

  m.def("rope", [](nb::handle qh, nb::handle kh, nb::handle ph, double theta, std::optional<int> rotary_dim,
                   bool interleaved, nb::handle scaling, bool inplace, nb::handle stream) {
    Stream st;
    Array q = to_array(qh, "q");
    Array k = opt_array(kh, "k", q);
    auto [qo, ko] = nn::rope(q, k, to_array(ph, "positions", &q), theta, rotary_dim, interleaved, to_scaling(scaling),
                             inplace, to_stream(stream, st));
    return nb::make_tuple(qo, ko.defined() ? nb::cast(ko) : nb::none());
  }, nb::arg("q"), nb::arg("k") = nb::none(), nb::arg("positions"), nb::arg("theta") = 10000.0,
     nb::arg("rotary_dim") = nb::none(), nb::arg("interleaved") = false, nb::arg("scaling") = nb::none(),
     nb::arg("inplace") = false, nb::arg("stream") = nb::none(),
     "Rotary embedding of q [T, Hq, D] and k [T, Hkv, D] at per-token positions [T] (int32/int64).\n"
     "NeoX half-split pairs, or interleaved (GPT-J) pairs; the first rotary_dim dims rotate.\n"
     "scaling: None or a dict {'type': 'linear'|'ntk'|'yarn'|'llama3', 'factor', 'alpha',\n"
     "'original_max_position', 'beta_fast', 'beta_slow', 'mscale', 'low_freq_factor', 'high_freq_factor'}.\n"
     "Returns (q_out, k_out); inplace=True overwrites and returns q and k.");
  m.def("kv_append", [](nb::handle kh, nb::handle vh, const Array& kc, const Array& vc, nb::handle slot_mapping,
                        nb::handle block_table, nb::handle seq_lens, nb::handle cu_seqlens, nb::handle k_scale,
                        nb::handle v_scale, bool validate, nb::handle stream, bool rope, nb::handle positions,
                        double theta, std::optional<int> rotary_dim, bool interleaved, nb::handle scaling,
                        bool write_k) {
    Stream st;
    auto idx = [](nb::handle h, const char* arg) { return h.is_none() ? Array() : to_array(h, arg); };
    nn::KvIndex ix{idx(slot_mapping, "slot_mapping"), idx(block_table, "block_table"), idx(seq_lens, "seq_lens"),
                   idx(cu_seqlens, "cu_seqlens")};
    Array ks = k_scale.is_none() ? Array() : to_array(k_scale, "k_scale", &kc);
    Array vs = v_scale.is_none() ? Array() : to_array(v_scale, "v_scale", &kc);
    if (!rope) {
      if (!positions.is_none() || rotary_dim || interleaved || !scaling.is_none() || write_k)
        throw ValueError("positions, rotary_dim, interleaved, scaling, write_k: only with rope=True");
      nn::kv_append(to_array(kh, "k_new", &kc), to_array(vh, "v_new", &kc), kc, vc, ix, ks, vs, validate,
                    to_stream(stream, st));
      return;
    }
    nn::KvRope r{idx(positions, "positions"), theta, rotary_dim, interleaved, to_scaling(scaling), write_k};
    // write_k overwrites k_new: it must be a gpukit array or a DLPack tensor (viewed without a copy).
    if (write_k && !nb::isinstance<Array>(kh) && !nb::hasattr(kh, "__dlpack__"))
      throw TypeError("k_new: write_k=True needs a gpukit.Array or a DLPack tensor (it is overwritten)");
    Array k = to_array(kh, "k_new", &kc);
    nn::kv_append(k, to_array(vh, "v_new", &kc), kc, vc, ix, r, ks, vs, validate, to_stream(stream, st));
  }, nb::arg("k_new"), nb::arg("v_new"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("slot_mapping") = nb::none(),
     nb::arg("block_table") = nb::none(), nb::arg("seq_lens") = nb::none(), nb::arg("cu_seqlens") = nb::none(),
     nb::arg("k_scale") = nb::none(), nb::arg("v_scale") = nb::none(), nb::arg("validate") = false,
     nb::arg("stream") = nb::none(), nb::arg("rope") = false, nb::arg("positions") = nb::none(),
     nb::arg("theta") = 10000.0, nb::arg("rotary_dim") = nb::none(), nb::arg("interleaved") = false,
     nb::arg("scaling") = nb::none(), nb::arg("write_k") = false,
     "Appends k_new, v_new [T, Hkv, D] to a cache [num_blocks, block_size, Hkv, D] in place, by slot_mapping [T],\n"
     "by (block_table [B, max_blocks], seq_lens [B]) for a paged cache, or by seq_lens [B] alone for a contiguous\n"
     "cache [B, T_max, Hkv, D]; cu_seqlens [B+1] gives several new tokens per sequence (seq_lens: lengths before).\n"
     "Index arrays on the CPU are bounds-checked before the launch (validate=True also checks device ones, with a\n"
     "sync). A float8_e4m3fn cache takes per-head float32 k_scale/v_scale [Hkv].\n"
     "rope=True rotates k on the way, as gk.nn.rope does (theta, rotary_dim, interleaved, scaling): at positions\n"
     "[T] (int32/int64), or by default at each token's cache position; write_k=True also overwrites k_new with\n"
     "the rotated keys.");
  m.def("attention_decode", [](nb::handle qh, const Array& kc, const Array& vc, nb::handle lens, nb::handle bt,
                               std::optional<double> scale, std::optional<int64_t> window,
                               std::optional<double> softcap, nb::handle k_scale, nb::handle v_scale, bool validate,
                               nb::handle stream) {
    Stream st;
    return nn::attention_decode(to_array(qh, "q", &kc), kc, vc, to_array(lens, "seq_lens"),
                                bt.is_none() ? Array() : to_array(bt, "block_table"), scale, window, softcap,
                                k_scale.is_none() ? Array() : to_array(k_scale, "k_scale", &kc),
                                v_scale.is_none() ? Array() : to_array(v_scale, "v_scale", &kc), validate,
                                to_stream(stream, st));
  }, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("seq_lens"), nb::arg("block_table") = nb::none(),
     nb::arg("scale") = nb::none(), nb::arg("window") = nb::none(), nb::arg("softcap") = nb::none(),
     nb::arg("k_scale") = nb::none(), nb::arg("v_scale") = nb::none(), nb::arg("validate") = false,
     nb::arg("stream") = nb::none(),
     "One query per sequence, q [B, Hq, D], over a paged cache [num_blocks, block_size, Hkv, D] with block_table\n"
     "[B, max_blocks] (int32) or a contiguous cache [B, T_max, Hkv, D]; seq_lens [B] int32 (cached tokens, new one\n"
     "included). Hq % Hkv == 0 (MHA/GQA/MQA), head_dim 64/128/256; scale (default 1/sqrt(D)), sliding window\n"
     "(last `window` keys), logit soft-cap; a float8_e4m3fn cache takes per-head k_scale/v_scale [Hkv].\n"
     "Returns [B, Hq, D].");
  m.def("attention_prefill", [](nb::handle qh, nb::handle kh, nb::handle vh, nb::handle cuq, nb::handle cuk,
                                bool causal, std::optional<double> scale, std::optional<int64_t> window,
                                std::optional<double> softcap, nb::handle stream) {
    Stream st;
    Array q = to_array(qh, "q");
    return nn::attention_prefill(q, to_array(kh, "k", &q), to_array(vh, "v", &q),
                                 cuq.is_none() ? Array() : to_array(cuq, "cu_seqlens_q"),
                                 cuk.is_none() ? Array() : to_array(cuk, "cu_seqlens_k"), causal, scale, window,
                                 softcap, to_stream(stream, st));
  }, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q") = nb::none(),
     nb::arg("cu_seqlens_k") = nb::none(), nb::arg("causal") = true, nb::arg("scale") = nb::none(),
     nb::arg("window") = nb::none(), nb::arg("softcap") = nb::none(), nb::arg("stream") = nb::none(),
     "Attention of q [Tq, Hq, D] over k, v [Tk, Hkv, D], packed sequences given by cu_seqlens_q/_k (int32 [B+1]).\n"
     "causal: bottom-right aligned (query i sees keys j <= i + Lk - Lq). GQA: Hq % Hkv == 0; head_dim 64/128/256.\n"
     "The CUDA kernel runs on CUDA cores (correct, not tensor-core speed).");
  m.def("rope_inv_freq", [](double theta, int rotary_dim, nb::handle scaling) {
    double ms = 1;
    std::vector<double> f = nn::rope_inv_freq(theta, rotary_dim, to_scaling(scaling), &ms);
    return nb::make_tuple(f, ms);
  }, nb::arg("theta"), nb::arg("rotary_dim"), nb::arg("scaling") = nb::none(),
     "The float64 inverse-frequency table rope uses (before rounding to fp32) and the cos/sin scale.");
  m.def("alibi_slopes", [](int n, nb::handle device, nb::handle stream) {
    Stream st;
    return nn::alibi_slopes(n, to_device(device), to_stream(stream, st));
  }, nb::arg("n_heads"), nb::arg("device") = nb::none(), nb::arg("stream") = nb::none(),
     "ALiBi slopes (float32 [n_heads]).");
  m.def("alibi_bias", [](nb::handle sh, int64_t q_len, int64_t k_len, nb::handle dtype, nb::handle stream) {
    Stream st;
    return nn::alibi_bias(to_array(sh, "slopes"), q_len, k_len, dtype.is_none() ? DType::f32 : to_dtype(dtype),
                          to_stream(stream, st));
  }, nb::arg("slopes"), nb::arg("q_len"), nb::arg("k_len"), nb::arg("dtype") = nb::none(),
     nb::arg("stream") = nb::none(),
     "bias[h, i, j] = slopes[h] * (j - (i + k_len - q_len)), shape [H, q_len, k_len].");
  m.def("sinusoidal_positions", [](nb::handle ph, int dim, nb::handle dtype, nb::handle stream) {
    Stream st;
    return nn::sinusoidal_positions(to_array(ph, "positions"), dim, dtype.is_none() ? DType::f32 : to_dtype(dtype),
                                    to_stream(stream, st));
  }, nb::arg("positions"), nb::arg("dim"), nb::arg("dtype") = nb::none(), nb::arg("stream") = nb::none(),
     "Additive sinusoidal encodings [T, dim]: sin at even, cos at odd columns.");
}

}  // namespace gkpy
