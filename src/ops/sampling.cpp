// Front end of the sampling ops: validation (errors name the argument), output
// and scratch allocation, and the choice of backend. Nothing here reads device
// memory, so the CUDA path never synchronizes the host.
#include "gpukit/sampling.h"

#include <cmath>
#include <functional>
#include <vector>

#include "gpukit/ops.h"
#include "ops/common.h"
#include "ops/sampling_args.h"

namespace gk::sampling {

namespace {

struct Logits {
  Array a;  // [B, V], last stride 1
  int64_t B = 0, V = 0;
};

Logits prep_logits(const Array& in, const Stream& s) {
  detail::require_defined(in, "logits");
  DType t = in.dtype();
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16)
    throw TypeError(cat("logits: dtype must be float32, bfloat16 or float16, got ", dtype_name(t)));
  if (in.ndim() != 1 && in.ndim() != 2)
    throw ValueError(cat("logits: expected shape [B, V] or [V], got ", shape_str(in.shape())));
  Array a = in.ndim() == 1 ? in.unsqueeze(0) : in;
  if (a.shape(1) == 0) throw ValueError(cat("logits: the vocabulary dimension is empty (shape ", shape_str(in.shape()), ")"));
  if (a.shape(1) > INT32_MAX) throw ValueError("logits: vocabulary larger than 2^31-1 is not supported");
  if (a.stride(1) != 1 || a.stride(0) < 0) a = a.contiguous(&s);
  return {a, a.shape(0), a.shape(1)};
}

// A [n] (or [B, n] when per_row) integer/float array converted to `t`, contiguous,
// on device d.
Array as_vec(const Array& x, DType t, int64_t B, const char* arg, Device d, const Stream& s) {
  if (x.device() != d)
    throw ValueError(cat(arg, ": is on ", x.device().str(), " but logits are on ", d.str()));
  if (x.ndim() != 1 || x.shape(0) != B)
    throw ValueError(cat(arg, ": expected shape (", B, ",), got ", shape_str(x.shape())));
  if (is_floating(t) && x.dtype() == DType::b8) throw TypeError(cat(arg, ": boolean values are not accepted"));
  if (!is_floating(t) && is_floating(x.dtype()))
    throw TypeError(cat(arg, ": expected an integer array, got ", dtype_name(x.dtype())));
  Array y = x.dtype() == t ? x : x.astype(t, &s);
  return y.contiguous(&s);
}

Array as_ids(const Array& x, const char* arg, Device d, const Stream& s, int max_ndim = 2) {
  detail::require_defined(x, arg);
  if (x.device() != d) throw ValueError(cat(arg, ": is on ", x.device().str(), " but logits are on ", d.str()));
  if (!is_integral(x.dtype())) throw TypeError(cat(arg, ": expected integer token ids, got ", dtype_name(x.dtype())));
  if (x.ndim() < 1 || x.ndim() > max_ndim)
    throw ValueError(cat(arg, ": expected ", max_ndim == 1 ? "1" : "1 or 2", " dimensions, got shape ", shape_str(x.shape())));
  Array y = x.dtype() == DType::i32 ? x : x.astype(DType::i32, &s);
  return y.contiguous(&s);
}

struct Run {
  SampleArgs a;
  std::vector<Array> inputs;  // kept alive and marked used on the stream
  Device d;
  Stream s;
};

void execute(Run& r) {
  SampleArgs& a = r.a;
  if (a.B == 0) return;
  if (r.d.is_cpu()) return cpu::sample_rows(a);
#if GPUKIT_WITH_CUDA
  // scratch from the stream's caching allocator: the same sizes every call, so a
  // captured graph replays with the buffers it captured
  Array work, ws;
  if (a.mode != SampleMode::Process && !cuda::fused_sample_ok(a)) {
    a.work_stride = cuda::sample_work_stride(a.V);
    work = Array::empty({a.B, a.work_stride}, DType::f32, r.d, &r.s);
    a.work = work.data_as<float>();
    ws = Array::empty({cuda::sample_workspace_bytes(a)}, DType::u8, r.d, &r.s);
    a.ws = ws.data();
  }
  for (auto& x : r.inputs) detail::mark_used(x, r.s);
  cuda::sample_rows(a, r.s.handle());
#else
  detail::no_cuda_backend();
#endif
}

Run start(const Array& logits_in, const Stream* sp) {
  Device d = detail::common_device({{"logits", &logits_in}});
  Run r;
  r.d = d;
  r.s = resolve_stream(sp, d);
  Logits L = prep_logits(logits_in, r.s);
  r.inputs.push_back(L.a);
  r.a.logits = L.a.data();
  r.a.dtype = L.a.dtype();
  r.a.B = L.B;
  r.a.V = L.V;
  r.a.row_stride = L.a.stride(0);
  return r;
}

Array logits_out(Run& r, const Array& logits_in) {
  Array out = Array::empty({r.a.B, r.a.V}, DType::f32, r.d, &r.s);
  r.a.out = out.data_as<float>();
  return logits_in.ndim() == 1 ? out.reshape({r.a.V}) : out;
}

// Runs r in mode (Process or Filter) into fresh float32 logits shaped like logits_in.
Array run_logits(Run& r, const Array& logits_in, SampleMode mode) {
  r.a.mode = mode;
  Array out = logits_out(r, logits_in);
  execute(r);
  return out;
}

void check_p(double p, const char* arg) {
  if (!(p > 0 && p <= 1)) throw ValueError(cat(arg, ": must be in (0, 1], got ", p));
}
void check_k(int64_t k, int64_t V, const char* arg) {
  if (k <= 0 || k > V) throw ValueError(cat(arg, ": must be in [1, ", V, "] (the vocabulary size), got ", k));
}

// History + lengths into the args (shape checks; values are never trusted).
void set_history(Run& r, const Array& history, const Array& lengths) {
  Array h = as_ids(history, "history", r.d, r.s, 2);
  if (h.ndim() != 2 || h.shape(0) != r.a.B)
    throw ValueError(cat("history: expected shape (", r.a.B, ", Hmax), got ", shape_str(history.shape())));
  detail::require_defined(lengths, "history_lengths");
  Array l = as_vec(lengths, DType::i32, r.a.B, "history_lengths", r.d, r.s);
  r.inputs.insert(r.inputs.end(), {h, l});
  r.a.history = h.data_as<int32_t>();
  r.a.hist_stride = h.shape(1);
  r.a.hist_max = h.shape(1);
  r.a.hist_len.ptr = l.data_as<int32_t>();
}

void set_bias(Run& r, const Array& bias) {
  detail::require_defined(bias, "logit_bias");
  if (bias.device() != r.d) throw ValueError(cat("logit_bias: is on ", bias.device().str(), " but logits are on ", r.d.str()));
  if (!is_floating(bias.dtype())) throw TypeError("logit_bias: expected a float array");
  bool per_row = bias.ndim() == 2;
  if (!((bias.ndim() == 1 && bias.shape(0) == r.a.V) || (per_row && bias.shape(0) == r.a.B && bias.shape(1) == r.a.V)))
    throw ValueError(cat("logit_bias: expected shape (", r.a.V, ",) or (", r.a.B, ", ", r.a.V, "), got ",
                         shape_str(bias.shape())));
  Array b = (bias.dtype() == DType::f32 ? bias : bias.astype(DType::f32, &r.s)).contiguous(&r.s);
  r.inputs.push_back(b);
  r.a.bias = b.data_as<float>();
  r.a.bias_row_stride = per_row ? r.a.V : 0;
}

void set_banned(Run& r, const Array& ids) {
  Array b = as_ids(ids, "banned", r.d, r.s, 2);
  if (b.ndim() == 2 && b.shape(0) != r.a.B)
    throw ValueError(cat("banned: a 2-d list must have one row per logits row (", r.a.B, "), got ", shape_str(ids.shape())));
  r.inputs.push_back(b);
  r.a.banned = b.data_as<int32_t>();
  r.a.n_banned = b.shape(-1);
  r.a.banned_row_stride = b.ndim() == 2 ? b.shape(1) : 0;
}

void set_eos(Run& r, const Array& eos, const Array& generated) {
  Array e = as_ids(eos, "eos_ids", r.d, r.s, 1);
  detail::require_defined(generated, "generated");
  Array g = as_vec(generated, DType::i32, r.a.B, "generated", r.d, r.s);
  r.inputs.insert(r.inputs.end(), {e, g});
  r.a.eos = e.data_as<int32_t>();
  r.a.n_eos = e.shape(0);
  r.a.generated.ptr = g.data_as<int32_t>();
}

template <class T>
void set_param(Run& r, RowParam<T>& p, const Array& x, const char* arg) {
  if (!x.defined()) return;
  constexpr DType t = dtype_of<T>::value;
  Array y = as_vec(x, t, r.a.B, arg, r.d, r.s);
  r.inputs.push_back(y);
  p.ptr = y.data_as<T>();
}

// Strict checks of per-row values, possible only when they live on the host.
void validate_cpu_params(const SampleArgs& a) {
  for (int64_t i = 0; i < a.B; ++i) {
    auto bad = [&](const char* arg, double v, const char* rule) {
      throw ValueError(cat("params.", arg, "[", i, "]: ", rule, ", got ", v));
    };
    float t = a.temperature.at(i);
    if (t != t) bad("temperature", t, "must not be NaN (<= 0 means greedy)");
    int64_t k = a.top_k.at(i);
    if (k > a.V) bad("top_k", double(k), "must be <= the vocabulary size (<= 0 means off)");
    float p = a.top_p.at(i);
    if (!(p > 0 && p <= 1)) bad("top_p", p, "must be in (0, 1]");
    float mp = a.min_p.at(i);
    if (!(mp >= 0 && mp <= 1)) bad("min_p", mp, "must be in [0, 1]");
    float tp = a.typical_p.at(i);
    if (!(tp > 0 && tp <= 1)) bad("typical_p", tp, "must be in (0, 1]");
    float rp = a.repetition.at(i);
    if (!(rp > 0 && std::isfinite(rp))) bad("repetition_penalty", rp, "must be finite and > 0");
    if (!std::isfinite(a.presence.at(i))) bad("presence_penalty", a.presence.at(i), "must be finite");
    if (!std::isfinite(a.frequency.at(i))) bad("frequency_penalty", a.frequency.at(i), "must be finite");
  }
}

}  // namespace

Array argmax(const Array& logits, const Stream* sp) {
  Run r = start(logits, sp);
  Array out = Array::empty({r.a.B}, DType::i32, r.d, &r.s);
  if (r.a.B == 0) return logits.ndim() == 1 ? out.reshape({}) : out;
  if (r.d.is_cpu()) {
    cpu::topk_rows(r.a.logits, r.a.dtype, r.a.B, r.a.V, r.a.row_stride, 1, nullptr, out.data_as<int32_t>());
  } else {
#if GPUKIT_WITH_CUDA
    detail::mark_used(r.inputs[0], r.s);
    Array ws = Array::empty({cuda::argmax_workspace_bytes(r.a.B, r.a.V)}, DType::u8, r.d, &r.s);
    cuda::argmax_rows(r.a.logits, r.a.dtype, r.a.B, r.a.V, r.a.row_stride, out.data_as<int32_t>(), ws.data(),
                      r.s.handle());
#endif
  }
  return logits.ndim() == 1 ? out.reshape({}) : out;
}

std::pair<Array, Array> topk(const Array& logits, int64_t k, const Stream* sp) {
  Run r = start(logits, sp);
  check_k(k, r.a.V, "k");
  Array vals = Array::empty({r.a.B, k}, DType::f32, r.d, &r.s);
  Array idx = Array::empty({r.a.B, k}, DType::i32, r.d, &r.s);
  if (r.a.B > 0) {
    if (r.d.is_cpu()) {
      cpu::topk_rows(r.a.logits, r.a.dtype, r.a.B, r.a.V, r.a.row_stride, k, vals.data_as<float>(), idx.data_as<int32_t>());
    } else {
#if GPUKIT_WITH_CUDA
      if (k > 1024) throw ValueError(cat("k: at most 1024 on CUDA, got ", k));
      detail::mark_used(r.inputs[0], r.s);
      cuda::topk_rows(r.a.logits, r.a.dtype, r.a.B, r.a.V, r.a.row_stride, k, vals.data_as<float>(),
                      idx.data_as<int32_t>(), r.s.handle());
#endif
    }
  }
  if (logits.ndim() == 1) return {vals.reshape({k}), idx.reshape({k})};
  return {vals, idx};
}

Array apply_temperature(const Array& logits, double temperature, const Stream* sp) {
  if (!(temperature > 0) || !std::isfinite(temperature))
    throw ValueError(cat("temperature: must be finite and > 0 (use argmax for greedy), got ", temperature));
  Run r = start(logits, sp);
  r.a.temperature.value = float(temperature);
  return run_logits(r, logits, SampleMode::Process);
}

Array apply_penalties(const Array& logits, const Array& history, const Array& lengths, double repetition,
                      double presence, double frequency, const Stream* sp) {
  if (!(repetition > 0) || !std::isfinite(repetition))
    throw ValueError(cat("repetition: must be finite and > 0, got ", repetition));
  if (!std::isfinite(presence)) throw ValueError(cat("presence: must be finite, got ", presence));
  if (!std::isfinite(frequency)) throw ValueError(cat("frequency: must be finite, got ", frequency));
  Run r = start(logits, sp);
  set_history(r, history, lengths);
  r.a.repetition.value = float(repetition);
  r.a.presence.value = float(presence);
  r.a.frequency.value = float(frequency);
  return run_logits(r, logits, SampleMode::Process);
}

Array apply_logit_bias(const Array& logits, const Array& bias, const Stream* sp) {
  Run r = start(logits, sp);
  set_bias(r, bias);
  return run_logits(r, logits, SampleMode::Process);
}

Array ban_tokens(const Array& logits, const Array& ids, const Stream* sp) {
  Run r = start(logits, sp);
  set_banned(r, ids);
  return run_logits(r, logits, SampleMode::Process);
}

Array apply_min_tokens(const Array& logits, const Array& eos_ids, const Array& generated, int64_t min_tokens,
                       const Stream* sp) {
  if (min_tokens < 0 || min_tokens > INT32_MAX) throw ValueError(cat("min_tokens: must be in [0, 2^31), got ", min_tokens));
  Run r = start(logits, sp);
  set_eos(r, eos_ids, generated);
  r.a.min_tokens.value = int32_t(min_tokens);
  return run_logits(r, logits, SampleMode::Process);
}

namespace {
Array filter(const Array& logits, const Stream* sp, const std::function<void(SampleArgs&)>& set) {
  Run r = start(logits, sp);
  set(r.a);
  return run_logits(r, logits, SampleMode::Filter);
}
}  // namespace

Array top_k_filter(const Array& logits, int64_t k, const Stream* sp) {
  int64_t V = logits.defined() ? logits.shape(-1) : 0;
  if (logits.defined() && logits.ndim() >= 1) check_k(k, V, "k");
  return filter(logits, sp, [&](SampleArgs& a) { a.top_k.value = int32_t(k); });
}
Array top_p_filter(const Array& logits, double p, const Stream* sp) {
  check_p(p, "p");
  return filter(logits, sp, [&](SampleArgs& a) { a.top_p.value = float(p); });
}
Array min_p_filter(const Array& logits, double min_p, const Stream* sp) {
  if (!(min_p >= 0 && min_p <= 1)) throw ValueError(cat("min_p: must be in [0, 1], got ", min_p));
  return filter(logits, sp, [&](SampleArgs& a) { a.min_p.value = float(min_p); });
}
Array typical_p_filter(const Array& logits, double p, const Stream* sp) {
  check_p(p, "p");
  return filter(logits, sp, [&](SampleArgs& a) { a.typical_p.value = float(p); });
}

Array sample(const Array& logits, const SampleOptions& o, uint64_t seed, int64_t position, const Stream* sp) {
  if (std::isnan(o.temperature) || std::isinf(o.temperature))
    throw ValueError(cat("temperature: must be finite (<= 0 means greedy), got ", o.temperature));
  check_p(o.top_p, "top_p");
  check_p(o.typical_p, "typical_p");
  if (!(o.min_p >= 0 && o.min_p <= 1)) throw ValueError(cat("min_p: must be in [0, 1], got ", o.min_p));
  Run r = start(logits, sp);
  if (o.top_k) check_k(*o.top_k, r.a.V, "top_k");
  SampleArgs& a = r.a;
  a.temperature.value = float(o.temperature);
  a.top_k.value = o.top_k ? int32_t(*o.top_k) : 0;
  a.top_p.value = float(o.top_p);
  a.min_p.value = float(o.min_p);
  a.typical_p.value = float(o.typical_p);
  a.seed.value = int64_t(seed);
  a.position.value = position;
  a.row_tag_is_index = true;
  Array tok = Array::empty({a.B}, DType::i32, r.d, &r.s);
  a.tokens = tok.data_as<int32_t>();
  execute(r);
  return logits.ndim() == 1 ? tok.reshape({}) : tok;
}

DecodeResult decode_step(const Array& logits, const Params& p, const Array& seeds, const Array& positions,
                         const Processors& proc, bool return_logprobs, int top_logprobs, const Stream* sp) {
  Run r = start(logits, sp);
  if (logits.ndim() != 2) throw ValueError(cat("logits: decode_step expects shape [B, V], got ", shape_str(logits.shape())));
  SampleArgs& a = r.a;
  if (top_logprobs < 0 || top_logprobs > 64 || top_logprobs > a.V)
    throw ValueError(cat("top_logprobs: must be in [0, min(64, V)], got ", top_logprobs));
  detail::require_defined(seeds, "seeds");
  detail::require_defined(positions, "positions");
  set_param(r, a.seed, seeds, "seeds");
  if (positions.defined() && positions.dtype() == DType::i32) {  // no conversion launch (the engine's lengths)
    Array y = as_vec(positions, DType::i32, a.B, "positions", r.d, r.s);
    r.inputs.push_back(y);
    a.position.ptr32 = y.data_as<int32_t>();
  } else {
    Array y = as_vec(positions, DType::i64, a.B, "positions", r.d, r.s);
    r.inputs.push_back(y);
    a.position.ptr = y.data_as<int64_t>();
  }
  set_param(r, a.temperature, p.temperature, "params.temperature");
  set_param(r, a.top_k, p.top_k, "params.top_k");
  set_param(r, a.top_p, p.top_p, "params.top_p");
  set_param(r, a.min_p, p.min_p, "params.min_p");
  set_param(r, a.typical_p, p.typical_p, "params.typical_p");
  set_param(r, a.repetition, p.repetition_penalty, "params.repetition_penalty");
  set_param(r, a.presence, p.presence_penalty, "params.presence_penalty");
  set_param(r, a.frequency, p.frequency_penalty, "params.frequency_penalty");
  set_param(r, a.min_tokens, p.min_tokens, "params.min_tokens");
  if (proc.history.defined() || proc.history_lengths.defined()) set_history(r, proc.history, proc.history_lengths);
  if (proc.logit_bias.defined()) set_bias(r, proc.logit_bias);
  if (proc.banned.defined()) set_banned(r, proc.banned);
  if (proc.eos_ids.defined() || proc.generated.defined()) {
    if (!proc.eos_ids.defined()) throw ValueError("eos_ids: required when generated is given");
    set_eos(r, proc.eos_ids, proc.generated);
  }
  if (p.min_tokens.defined() && !proc.eos_ids.defined())
    throw ValueError("params.min_tokens: needs eos_ids and generated");
  if (r.d.is_cpu()) validate_cpu_params(a);
  DecodeResult res;
  res.tokens = Array::empty({a.B}, DType::i32, r.d, &r.s);
  a.tokens = res.tokens.data_as<int32_t>();
  if (return_logprobs) {
    res.logprobs = Array::empty({a.B}, DType::f32, r.d, &r.s);
    a.logprobs = res.logprobs.data_as<float>();
  }
  if (top_logprobs > 0) {
    res.top_ids = Array::empty({a.B, top_logprobs}, DType::i32, r.d, &r.s);
    res.top_logprobs = Array::empty({a.B, top_logprobs}, DType::f32, r.d, &r.s);
    a.top_n = top_logprobs;
    a.top_ids = res.top_ids.data_as<int32_t>();
    a.top_logprobs = res.top_logprobs.data_as<float>();
  }
  execute(r);
  return res;
}

}  // namespace gk::sampling
