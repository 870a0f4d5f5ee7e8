// gpukit.sampling: token selection ops (thin wrappers; see include/gpukit/sampling.h).
#include <nanobind/stl/pair.h>

#include "bind.h"
#include "gpukit/sampling.h"
#include "ops/philox.h"

namespace gkpy {
using namespace gk;

namespace {
Array opt_array(nb::handle h, const char* arg, const Array& like) {
  if (h.is_none()) return Array();
  return to_array(h, arg, &like);
}
}  // namespace

GK_BINDING(36, sampling) {
  nb::module_ sm = m.def_submodule("_sampling", "Sampling kernels (re-exported as gpukit.sampling).");
  sm.def("argmax", [](const Array& x, nb::handle stream) {
    Stream st;
    return sampling::argmax(x, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("stream") = nb::none(), "int32 argmax of each row (ties -> lowest index).");
  sm.def("topk", [](const Array& x, int64_t k, nb::handle stream) {
    Stream st;
    return sampling::topk(x, k, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("k"), nb::arg("stream") = nb::none(),
     "(values float32, indices int32) [B, k], sorted descending, ties -> lowest index.");
  sm.def("apply_temperature", [](const Array& x, double t, nb::handle stream) {
    Stream st;
    return sampling::apply_temperature(x, t, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("temperature"), nb::arg("stream") = nb::none());
  sm.def("apply_penalties", [](const Array& x, nb::handle h, nb::handle l, double rep, double pres, double freq,
                               nb::handle stream) {
    Stream st;
    return sampling::apply_penalties(x, to_array(h, "history", &x), to_array(l, "history_lengths", &x), rep, pres,
                                     freq, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("history"), nb::arg("history_lengths"), nb::arg("repetition") = 1.0,
     nb::arg("presence") = 0.0, nb::arg("frequency") = 0.0, nb::arg("stream") = nb::none());
  sm.def("apply_logit_bias", [](const Array& x, nb::handle b, nb::handle stream) {
    Stream st;
    return sampling::apply_logit_bias(x, to_array(b, "logit_bias", &x), to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("bias"), nb::arg("stream") = nb::none());
  sm.def("ban_tokens", [](const Array& x, nb::handle ids, nb::handle stream) {
    Stream st;
    return sampling::ban_tokens(x, to_array(ids, "banned", &x), to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("ids"), nb::arg("stream") = nb::none());
  sm.def("apply_min_tokens", [](const Array& x, nb::handle eos, nb::handle gen, int64_t n, nb::handle stream) {
    Stream st;
    return sampling::apply_min_tokens(x, to_array(eos, "eos_ids", &x), to_array(gen, "generated", &x), n,
                                      to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("eos_ids"), nb::arg("generated"), nb::arg("min_tokens"),
     nb::arg("stream") = nb::none());
  sm.def("top_k_filter", [](const Array& x, int64_t k, nb::handle stream) {
    Stream st;
    return sampling::top_k_filter(x, k, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("k"), nb::arg("stream") = nb::none());
  sm.def("top_p_filter", [](const Array& x, double p, nb::handle stream) {
    Stream st;
    return sampling::top_p_filter(x, p, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("p"), nb::arg("stream") = nb::none());
  sm.def("min_p_filter", [](const Array& x, double p, nb::handle stream) {
    Stream st;
    return sampling::min_p_filter(x, p, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("min_p"), nb::arg("stream") = nb::none());
  sm.def("typical_p_filter", [](const Array& x, double p, nb::handle stream) {
    Stream st;
    return sampling::typical_p_filter(x, p, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("p"), nb::arg("stream") = nb::none());
  sm.def("sample", [](const Array& x, double temperature, std::optional<int64_t> top_k, double top_p, double min_p,
                      double typical_p, uint64_t seed, int64_t position, nb::handle stream) {
    Stream st;
    sampling::SampleOptions o;
    o.temperature = temperature;
    o.top_k = top_k;
    o.top_p = top_p;
    o.min_p = min_p;
    o.typical_p = typical_p;
    return sampling::sample(x, o, seed, position, to_stream(stream, st));
  }, nb::arg("logits"), nb::arg("temperature") = 1.0, nb::arg("top_k") = nb::none(), nb::arg("top_p") = 1.0,
     nb::arg("min_p") = 0.0, nb::arg("typical_p") = 1.0, nb::arg("seed") = 0, nb::arg("position") = 0,
     nb::arg("stream") = nb::none());
  sm.def("decode_step", [](const Array& x, nb::handle seeds, nb::handle positions, nb::handle temperature,
                           nb::handle top_k, nb::handle top_p, nb::handle min_p, nb::handle typical_p,
                           nb::handle rep, nb::handle pres, nb::handle freq, nb::handle min_tokens,
                           nb::handle history, nb::handle history_lengths, nb::handle bias, nb::handle banned,
                           nb::handle eos_ids, nb::handle generated, bool return_logprobs, int top_logprobs,
                           nb::handle stream) {
    Stream st;
    sampling::Params p;
    p.temperature = opt_array(temperature, "temperature", x);
    p.top_k = opt_array(top_k, "top_k", x);
    p.top_p = opt_array(top_p, "top_p", x);
    p.min_p = opt_array(min_p, "min_p", x);
    p.typical_p = opt_array(typical_p, "typical_p", x);
    p.repetition_penalty = opt_array(rep, "repetition_penalty", x);
    p.presence_penalty = opt_array(pres, "presence_penalty", x);
    p.frequency_penalty = opt_array(freq, "frequency_penalty", x);
    p.min_tokens = opt_array(min_tokens, "min_tokens", x);
    sampling::Processors q;
    q.history = opt_array(history, "history", x);
    q.history_lengths = opt_array(history_lengths, "history_lengths", x);
    q.logit_bias = opt_array(bias, "logit_bias", x);
    q.banned = opt_array(banned, "banned", x);
    q.eos_ids = opt_array(eos_ids, "eos_ids", x);
    q.generated = opt_array(generated, "generated", x);
    auto r = sampling::decode_step(x, p, to_array(seeds, "seeds", &x), to_array(positions, "positions", &x), q,
                                   return_logprobs, top_logprobs, to_stream(stream, st));
    auto opt = [](const Array& a) { return a.defined() ? nb::cast(a) : nb::none(); };
    return nb::make_tuple(r.tokens, opt(r.logprobs), opt(r.top_ids), opt(r.top_logprobs));
  }, nb::arg("logits"), nb::arg("seeds"), nb::arg("positions"), nb::arg("temperature") = nb::none(),
     nb::arg("top_k") = nb::none(), nb::arg("top_p") = nb::none(), nb::arg("min_p") = nb::none(),
     nb::arg("typical_p") = nb::none(), nb::arg("repetition_penalty") = nb::none(),
     nb::arg("presence_penalty") = nb::none(), nb::arg("frequency_penalty") = nb::none(),
     nb::arg("min_tokens") = nb::none(), nb::arg("history") = nb::none(), nb::arg("history_lengths") = nb::none(),
     nb::arg("logit_bias") = nb::none(), nb::arg("banned") = nb::none(), nb::arg("eos_ids") = nb::none(),
     nb::arg("generated") = nb::none(), nb::arg("return_logprobs") = false, nb::arg("top_logprobs") = 0,
     nb::arg("stream") = nb::none());
  sm.def("_philox", [](uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
    philox::U4 r = philox::philox4x32_10({{c0, c1, c2, c3}}, k0, k1);
    return nb::make_tuple(r.v[0], r.v[1], r.v[2], r.v[3]);
  }, "Philox4x32-10 of one counter (for tests).");
}

}  // namespace gkpy
