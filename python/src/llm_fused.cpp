// Bindings of the engine's decode kernels (src/llm/fused.h) for their tests:
// gpukit._C.llm.fused_project / fused_rope_append / fused_add_rms_norm.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "llm/fused.h"

namespace gkpy {
using namespace gk;

GK_BINDING(61, llm_fused) {
  nb::module_ lm = nb::borrow<nb::module_>(m.attr("llm"));
  lm.def("fused_project", [](const Array& x, const Array& w, std::optional<Array> bias, bool swiglu, bool out_f32,
                             std::optional<Array> argmax_keys) {
    return llm::fused::project(x, w, bias ? *bias : Array(), swiglu, nullptr, nullptr, out_f32,
                               argmax_keys ? &*argmax_keys : nullptr);
  }, nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::arg("swiglu") = false, nb::arg("out_f32") = false,
     nb::arg("argmax_keys") = nb::none(),
     "x [M<=8, K] @ w[N, K]^T (+ bias), or with swiglu silu(x @ gate^T) * (x @ up^T) for w = [gate; up]; "
     "out_f32: float32 sums, not rounded; argmax_keys (int64 [M], with out_f32): each row's greedy key folded in.");
  lm.def("fused_project_opts", [](const Array& x, const Array& w, std::optional<Array> bias, bool swiglu,
                                  std::optional<Array> norm_w, double norm_eps, std::optional<Array> residual,
                                  bool out_f32) {
    llm::fused::ProjOpts o;
    o.swiglu = swiglu;
    o.out_f32 = out_f32;
    if (norm_w) o.norm_w = &*norm_w;
    o.norm_eps = norm_eps;
    if (residual) o.residual = &*residual;
    return llm::fused::project_opts(x, w, bias ? *bias : Array(), o);
  }, nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::arg("swiglu") = false,
     nb::arg("norm_w") = nb::none(), nb::arg("norm_eps") = 1e-6, nb::arg("residual") = nb::none(),
     nb::arg("out_f32") = false,
     "project with the norm inside (x: raw residual rows; product with rms_norm(x) * norm_w, not rounded) and/or "
     "the residual added in the epilogue (round(round(y) + residual)).");
  lm.def("fused_advance_argmax", [](const Array& in, const Array& keys) { return llm::fused::advance_argmax(in, keys); },
         nb::arg("in"), nb::arg("keys"),
         "tokens (int32 [B]) decoded from the argmax keys, which are zeroed; in [3, B]: ids = tokens, positions and "
         "lengths + 1.");
  lm.def("fused_embed_norm", [](const Array& ids, const Array& table, const Array& w, double eps) {
    return llm::fused::embed_norm(ids, table, w, eps);
  }, nb::arg("ids"), nb::arg("table"), nb::arg("w"), nb::arg("eps") = 1e-6,
     "(rms_norm(table[ids]) * w, table[ids]); ids outside the table give zero rows.");
  lm.def("fused_dequant_linear", [](const Array& x, const Array& q, const Array& scales, std::optional<Array> zeros,
                                    const std::string& format, int64_t group, std::optional<std::string> out) {
    QuantizedWeight qw;
    qw.format = format;
    qw.q = q;
    qw.scales = scales;
    if (zeros) qw.zeros = *zeros;
    qw.group = group;
    const DType ot = out ? dtype_from_name(*out) : x.dtype();
    Array y = llm::fused::dequant_linear(x, qw, ot);
    if (!y.defined()) throw ValueError("dequant_linear: this format / layout / device is not handled");
    return y;
  }, nb::arg("x"), nb::arg("q"), nb::arg("scales"), nb::arg("zeros") = nb::none(), nb::arg("format"),
     nb::arg("group") = 0, nb::arg("out") = nb::none(),
     "x @ dequantize(q)^T for many rows on CUDA (the quantized prefill's GEMM).");
  lm.def("fused_project_norm", [](const Array& x, const Array& w, const Array& residual, const Array& norm_w,
                                  double eps) {
    Array ctr = full({1}, Scalar::of_int(0), DType::i32, x.device());
    Array h, r;
    Array y = llm::fused::project_norm(x, w, residual, norm_w, eps, ctr, 0, h, r);
    return nb::make_tuple(y, h, r, ctr);
  }, nb::arg("x"), nb::arg("w"), nb::arg("residual"), nb::arg("norm_w"), nb::arg("eps") = 1e-6,
     "(y = x @ w^T, rms_norm(y + residual) * norm_w, y + residual, the counter) with the norm in the last block.");
  lm.def("fused_swiglu", [](const Array& gu) { return llm::fused::swiglu(gu); }, nb::arg("gu"),
         "silu(gate) * up of gu [rows, 2 I] (gate then up).");
  lm.def("fused_rope_append", [](const Array& q, const Array& k, const Array& v, const Array& k_cache,
                                 const Array& v_cache, const Array& positions, const Array& block_table,
                                 double theta, std::optional<int> rotary_dim, bool interleaved) {
    llm::fused::Rope r;
    r.theta = theta;
    r.rotary_dim = rotary_dim;
    r.interleaved = interleaved;
    llm::fused::rope_append(q, k, v, k_cache, v_cache, positions, block_table, r);
  }, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("positions"),
     nb::arg("block_table"), nb::arg("theta") = 10000.0, nb::arg("rotary_dim") = nb::none(),
     nb::arg("interleaved") = false,
     "q rotated in place; k rotated and stored with v at positions[t] of sequence t's pages.");
  lm.def("fused_project_qkv_rope", [](const Array& x, const Array& w, std::optional<Array> bias, int64_t hq,
                                     const Array& k_cache, const Array& v_cache, const Array& positions,
                                     const Array& block_table, double theta, std::optional<int> rotary_dim,
                                     bool interleaved) {
    llm::fused::Rope r;
    r.theta = theta;
    r.rotary_dim = rotary_dim;
    r.interleaved = interleaved;
    return llm::fused::project_qkv_rope(x, w, bias ? *bias : Array(), hq, k_cache, v_cache, positions, block_table, r);
  }, nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::arg("hq"), nb::arg("k_cache"),
     nb::arg("v_cache"), nb::arg("positions"), nb::arg("block_table"), nb::arg("theta") = 10000.0,
     nb::arg("rotary_dim") = nb::none(), nb::arg("interleaved") = false,
     "q/k/v projection + RoPE + KV append in one launch; returns q [M, hq, D].");
  lm.def("fused_attention_rope", [](const Array& qkv, int64_t hq, const Array& k_cache, const Array& v_cache,
                                    const Array& positions, const Array& block_table, double theta,
                                    std::optional<int> rotary_dim, bool interleaved, int chunk, int trigger,
                                    bool cluster, bool mma, bool push, int wide, bool with_merge) -> nb::object {
    if (wide != -1 && wide != 0 && wide != 2 && wide != 4)
      throw ValueError(cat("fused_attention_rope: wide -1, 0, 2 or 4, got ", wide));
    llm::fused::AttnMmaScope mma_scope(mma, 0, push);
    llm::fused::AttnWideScope wide_scope(wide);
    llm::fused::Rope r;
    r.theta = theta;
    r.rotary_dim = rotary_dim;
    r.interleaved = interleaved;
    Array ctr = full({std::max<int64_t>(1, qkv.shape(0) * k_cache.shape(2))}, Scalar::of_int(0), DType::i32,
                     qkv.device());
    int merge = 0;
    Array out = llm::fused::attention_rope(qkv, hq, k_cache, v_cache, positions, block_table, r, ctr, nullptr, chunk,
                                              trigger, {}, cluster, &merge);
    return with_merge ? nb::object(nb::make_tuple(out, ctr, merge)) : nb::object(nb::make_tuple(out, ctr));
  }, nb::arg("qkv"), nb::arg("hq"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("positions"),
     nb::arg("block_table"), nb::arg("theta") = 10000.0, nb::arg("rotary_dim") = nb::none(),
     nb::arg("interleaved") = false, nb::arg("chunk") = 128, nb::arg("trigger") = 0, nb::arg("cluster") = false,
     nb::arg("mma") = false, nb::arg("push") = false, nb::arg("wide") = 0, nb::arg("with_merge") = false,
     "(wide: EngineOptions::fused_attention_wide, -1 by the grid) (with_merge: also the merge code, 1 pull 2 push, "
     "+ 4 where the wide kernels ran, + 8 with 4 times the warps) (push: the cluster merge by st.async into chunk 0 + mbarrier, with cluster and mma) (mma: the tensor-core score pass and the 16-byte P V pass) (attention output [B, hq, D] with RoPE and the KV append of the new tokens, the counters (left zero)).");
  lm.def("fused_add_rms_norm", [](const Array& x, const Array& residual, const Array& w, double eps) {
    return llm::fused::add_rms_norm(x, residual, w, eps);
  }, nb::arg("x"), nb::arg("residual"), nb::arg("w"), nb::arg("eps") = 1e-6,
     "(rms_norm(x + residual) * w, x + residual)");
  lm.def("fused_add_rms_norm_prep", [](const Array& x, const Array& residual, const Array& w, double eps) {
    llm::fused::AddNormPrep r = llm::fused::add_rms_norm_prep(x, residual, w, eps);
    return nb::make_tuple(r.h, r.res, r.xh.defined() ? nb::cast(r.xh) : nb::none(),
                          r.xinv.defined() ? nb::cast(r.xinv) : nb::none());
  }, nb::arg("x"), nb::arg("residual"), nb::arg("w"), nb::arg("eps") = 1e-6,
     "(rms_norm(x + residual) * w, x + residual, the fp8 / int8 GEMV's scaled fp16 copy of the first or None, "
     "its 2^-c per row or None) (EngineOptions::quantized_x_prep)");
  lm.def("set_pdl", [](std::optional<bool> on) { llm::fused::set_pdl(on ? int(*on) : -1); }, nb::arg("on"),
         "Programmatic dependent launch of the engine's kernels: True, False, or None for GPUKIT_PDL's default.");
  lm.def("pdl_enabled", [](nb::handle device) { return llm::fused::pdl_enabled(to_device(device)); },
         nb::arg("device"), "Whether the engine's kernels launch with programmatic dependent launch on device.");
}

}  // namespace gkpy
