// Mixture of experts: gk.moe_topk_gating, moe_permute, moe_unpermute, moe_grouped_gemm,
// moe_mlp (see include/gpukit/moe.h).
#include <nanobind/stl/tuple.h>

#include "bind.h"
#include "gpukit/errors.h"
#include "gpukit/moe.h"

namespace gkpy {
using namespace gk;

GK_BINDING(27, moe) {
  m.def("moe_topk_gating", [](nb::handle logits, int64_t k, bool renormalize, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    MoeRouting r = moe_topk_gating(to_array(logits, "logits"), k, renormalize, sp);
    return nb::make_tuple(r.expert_ids, r.weights);
  }, nb::arg("logits"), nb::arg("k"), nb::arg("renormalize") = true, nb::arg("stream") = nb::none(),
     "moe_topk_gating(logits, k, renormalize=True, stream=None) -> (expert_ids int32 [T, k], weights float32 [T, k])\n\n"
     "Top-k experts of each row of router logits [T, E] by logit (ties: the lower expert), with their\n"
     "softmax probabilities (fp32), divided by their sum when renormalize (Mixtral).");
  m.def("moe_permute", [](nb::handle x, nb::handle expert_ids, int64_t num_experts, nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    Array xa = to_array(x, "x");
    MoePermutation p = moe_permute(xa, to_array(expert_ids, "expert_ids", &xa), num_experts, sp);
    return nb::make_tuple(p.x_sorted, p.offsets, p.slot_pos, p.sorted_token);
  }, nb::arg("x"), nb::arg("expert_ids"), nb::arg("num_experts"), nb::arg("stream") = nb::none(),
     "moe_permute(x, expert_ids, num_experts, stream=None) -> (x_sorted, offsets, slot_pos, sorted_token)\n\n"
     "Rows of x [T, H] copied once per choice into expert order (stable: token order inside an\n"
     "expert); offsets int32 [E+1]; slot_pos int32 [T, k]: the row of each (token, choice).");
  m.def("moe_unpermute", [](nb::handle y_sorted, nb::handle slot_pos, nb::handle weights, nb::handle out_dtype,
                            nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    Array ya = to_array(y_sorted, "y_sorted");
    return moe_unpermute(ya, to_array(slot_pos, "slot_pos", &ya), to_array(weights, "weights", &ya),
                         to_dtype_opt(out_dtype, "out_dtype"), sp);
  }, nb::arg("y_sorted"), nb::arg("slot_pos"), nb::arg("weights"), nb::arg("out_dtype") = nb::none(),
     nb::arg("stream") = nb::none(),
     "moe_unpermute(y_sorted, slot_pos, weights, out_dtype=None, stream=None) -> y [T, H]\n\n"
     "y[t] = sum over j (in order) of weights[t, j] * y_sorted[slot_pos[t, j]], fp32, rounded once.");
  m.def("moe_grouped_gemm", [](nb::handle x, nb::handle w, nb::handle offsets, nb::handle out_dtype,
                               nb::handle stream, bool validate) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    Array xa = to_array(x, "x");
    return moe_grouped_gemm(xa, to_array(w, "w", &xa), to_array(offsets, "offsets", &xa),
                            to_dtype_opt(out_dtype, "out_dtype"), sp, validate);
  }, nb::arg("x"), nb::arg("w"), nb::arg("offsets"), nb::arg("out_dtype") = nb::none(), nb::arg("stream") = nb::none(),
     nb::arg("validate") = true,
     "moe_grouped_gemm(x, w, offsets, out_dtype=None, stream=None, validate=True) -> y [R, N]\n\n"
     "All experts in one launch: y[r] = x[r] @ w[e].T for offsets[e] <= r < offsets[e+1]; x [R, K],\n"
     "w [E, N, K] (bfloat16, float16 or float32), offsets int32 [E+1]. fp32 accumulation in\n"
     "increasing k, rounded once; the same bits on every run. validate=False skips the host check\n"
     "of the offsets (no sync: capturable in a CUDA graph; bad offsets give wrong rows, never\n"
     "out-of-bounds accesses).");
  m.def("moe_mlp", [](nb::handle x, nb::handle gate_w, nb::handle w13, nb::handle w2, int64_t top_k,
                      nb::handle stream) {
    Stream st;
    const Stream* sp = to_stream(stream, st);
    Array xa = to_array(x, "x");
    return moe_mlp(xa, to_array(gate_w, "gate_w", &xa), to_array(w13, "w13", &xa), to_array(w2, "w2", &xa), top_k, sp);
  }, nb::arg("x"), nb::arg("gate_w"), nb::arg("w13"), nb::arg("w2"), nb::arg("top_k"), nb::arg("stream") = nb::none(),
     "moe_mlp(x, gate_w, w13, w2, top_k, stream=None): the Mixtral sparse MLP of x [T, H] with router\n"
     "gate_w [E, H], w13 [E, 2I, H] (w1 rows then w3 rows per expert) and w2 [E, H, I].");
}

}  // namespace gkpy
