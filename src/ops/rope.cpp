// Front end of rope (with its frequency scalings), ALiBi and sinusoidal
// positions: the inverse-frequency table is computed here in float64 and rounded
// to fp32 once, so both backends rotate by the same angles.
#include <algorithm>
#include <cmath>

#include "gpukit/nn.h"
#include "ops/common.h"
#include "ops/nn_args.h"

namespace gk::nn {

namespace {
constexpr double kPi = 3.14159265358979323846;

void require_pos(double v, const char* arg) {
  if (!std::isfinite(v) || v <= 0) throw ValueError(cat(arg, ": must be finite and > 0, got ", v));
}

template <class F>
void dispatch_backend(Device d, const Stream& s, F&& cpu_fn, auto&& cuda_fn) {
  if (d.is_cpu()) return cpu_fn();
#if GPUKIT_WITH_CUDA
  cuda_fn(s.handle());
#else
  (void)s;
  (void)cuda_fn;
  detail::no_cuda_backend();
#endif
}

// Validates an int32/int64 position vector of length T; checks values >= 0 when on the host.
void check_positions(const Array& p, int64_t T) {
  if (p.dtype() != DType::i32 && p.dtype() != DType::i64)
    throw TypeError(cat("positions: dtype ", dtype_name(p.dtype()), " is not supported (int32 or int64)"));
  if (p.ndim() != 1 || p.shape(0) != T)
    throw ValueError(cat("positions: shape ", shape_str(p.shape()), " must be (", T, ",), one per token"));
  if (p.device().is_cpu()) {
    for (int64_t t = 0; t < T; ++t) {
      int64_t v = p.dtype() == DType::i32 ? int64_t(p.data_as<int32_t>()[t * p.stride(0)])
                                          : p.data_as<int64_t>()[t * p.stride(0)];
      if (v < 0) throw ValueError(cat("positions: negative position ", v, " at token ", t));
    }
  }
}
}  // namespace

std::vector<double> rope_inv_freq(double theta, int rd, const RopeScaling& sc, double* mscale_out) {
  require_pos(theta, "theta");
  if (rd < 2 || rd % 2 || rd / 2 > kMaxRopeFreqs)
    throw ValueError(cat("rotary_dim: must be even, >= 2 and <= ", 2 * kMaxRopeFreqs, ", got ", rd));
  const int n = rd / 2;
  double base = theta, mscale = 1.0;
  if (sc.kind != RopeScalingKind::None) require_pos(sc.factor, "scaling.factor");
  if (sc.kind == RopeScalingKind::NTK) {
    double alpha = sc.alpha > 0 ? sc.alpha : sc.factor;
    require_pos(alpha, "scaling.alpha");
    if (rd <= 2) throw ValueError("rotary_dim: NTK scaling needs rotary_dim > 2");
    base = theta * std::pow(alpha, double(rd) / double(rd - 2));
  }
  std::vector<double> f(n);
  for (int i = 0; i < n; ++i) f[i] = 1.0 / std::pow(base, double(2 * i) / double(rd));
  switch (sc.kind) {
    case RopeScalingKind::None:
    case RopeScalingKind::NTK: break;
    case RopeScalingKind::Linear:
      for (auto& v : f) v /= sc.factor;
      break;
    case RopeScalingKind::YaRN: {
      require_pos(sc.original_max_position, "scaling.original_max_position");
      if (!std::isfinite(sc.beta_fast) || !std::isfinite(sc.beta_slow) || sc.beta_fast <= 0 || sc.beta_slow <= 0)
        throw ValueError("scaling.beta_fast, scaling.beta_slow: must be finite and > 0");
      auto corr = [&](double rot) {
        return double(rd) * std::log(sc.original_max_position / (rot * 2 * kPi)) / (2 * std::log(theta));
      };
      double lo = std::max(0.0, std::floor(corr(sc.beta_fast)));
      double hi = std::min(double(rd - 1), std::ceil(corr(sc.beta_slow)));
      if (hi == lo) hi += 0.001;
      for (int i = 0; i < n; ++i) {
        double ramp = std::clamp((double(i) - lo) / (hi - lo), 0.0, 1.0);
        double extrap = 1.0 - ramp;  // weight of the unscaled frequency
        f[i] = f[i] / sc.factor * (1.0 - extrap) + f[i] * extrap;
      }
      mscale = sc.mscale ? *sc.mscale : (sc.factor > 1 ? 0.1 * std::log(sc.factor) + 1.0 : 1.0);
      if (!std::isfinite(mscale)) throw ValueError("scaling.mscale: must be finite");
      break;
    }
    case RopeScalingKind::Llama3: {
      require_pos(sc.original_max_position, "scaling.original_max_position");
      require_pos(sc.low_freq_factor, "scaling.low_freq_factor");
      require_pos(sc.high_freq_factor, "scaling.high_freq_factor");
      if (sc.high_freq_factor <= sc.low_freq_factor)
        throw ValueError("scaling.high_freq_factor: must be greater than low_freq_factor");
      double low_wl = sc.original_max_position / sc.low_freq_factor;
      double high_wl = sc.original_max_position / sc.high_freq_factor;
      for (auto& v : f) {
        double wl = 2 * kPi / v;
        if (wl < high_wl) continue;
        if (wl > low_wl) {
          v /= sc.factor;
        } else {
          double smooth = (sc.original_max_position / wl - sc.low_freq_factor) /
                          (sc.high_freq_factor - sc.low_freq_factor);
          v = (1 - smooth) * v / sc.factor + smooth * v;
        }
      }
      break;
    }
  }
  if (mscale_out) *mscale_out = mscale;
  return f;
}

std::pair<Array, Array> rope(const Array& q, const Array& k, const Array& positions, double theta,
                             std::optional<int> rotary_dim, bool interleaved, const RopeScaling& scaling,
                             bool inplace, const Stream* sp) {
  bool has_k = k.defined();
  Device d = has_k ? detail::common_device({{"q", &q}, {"k", &k}, {"positions", &positions}})
                   : detail::common_device({{"q", &q}, {"positions", &positions}});
  detail::require_half_or_float(q, "q");
  if (q.ndim() != 3) throw ValueError(cat("q: shape ", shape_str(q.shape()), " must be [tokens, heads, head_dim]"));
  const int64_t T = q.shape(0), D = q.shape(2);
  if (has_k) {
    detail::require_same_dtype(k, "k", q, "q");
    if (k.ndim() != 3 || k.shape(0) != T || k.shape(2) != D)
      throw ValueError(cat("k: shape ", shape_str(k.shape()), " must be [", T, ", heads, ", D, "] to match q ",
                           shape_str(q.shape())));
  }
  int rd = rotary_dim ? *rotary_dim : int(std::min<int64_t>(D, 1 << 20));
  if (rd > D) throw ValueError(cat("rotary_dim: ", rd, " exceeds head_dim ", D));
  double mscale = 1;
  std::vector<double> f = rope_inv_freq(theta, rd, scaling, &mscale);
  check_positions(positions, T);
  Stream s = resolve_stream(sp, d);
  auto prep = [&](const Array& x, const char* arg) -> std::pair<Array, Array> {
    if (inplace) {
      if (D > 1 && x.stride(2) != 1)
        throw ValueError(cat(arg, ": in-place rope needs a dense last dimension (stride 1)"));
      return {x, x};
    }
    Array in = (D > 1 && x.stride(2) != 1) ? x.contiguous(&s) : x;
    return {in, Array::empty(x.shape(), x.dtype(), d, &s)};
  };
  auto [qi, qo] = prep(q, "q");
  Array ki, ko;
  if (has_k) std::tie(ki, ko) = prep(k, "k");
  Array pos = positions.stride(0) == 1 || T <= 1 ? positions : positions.contiguous(&s);
  RopeArgs a;
  a.q = qi.data();
  a.q_out = qo.data();
  a.q_ts = qi.stride(0), a.q_hs = qi.stride(1), a.qo_ts = qo.stride(0), a.qo_hs = qo.stride(1);
  a.hq = int(q.shape(1));
  if (has_k) {
    a.k = ki.data();
    a.k_out = ko.data();
    a.k_ts = ki.stride(0), a.k_hs = ki.stride(1), a.ko_ts = ko.stride(0), a.ko_hs = ko.stride(1);
    a.hk = int(k.shape(1));
  }
  a.T = T;
  a.D = int(D);
  a.rd = rd;
  a.interleaved = interleaved;
  a.copy_tail = !inplace && rd < D;
  a.pos = pos.data();
  a.pos64 = pos.dtype() == DType::i64;
  a.mscale = float(mscale);
  a.dtype = q.dtype();
  for (size_t i = 0; i < f.size(); ++i) a.inv_freq[i] = float(f[i]);
  if (T > 0 && (a.hq > 0 || a.hk > 0)) {
    for (const Array* x : {&qi, &ki, &pos})
      if (x->defined()) detail::mark_used(*x, s);
    dispatch_backend(d, s, [&] { cpu::rope(a); }, [&](void* h) { cuda::rope(a, h); });
  }
  return {qo, ko};
}

Array alibi_slopes(int n, Device device, const Stream* sp) {
  if (n <= 0 || n > (1 << 20)) throw ValueError(cat("n_heads: must be in [1, 2^20], got ", n));
  int p = 1;
  while (p * 2 <= n) p *= 2;
  Array h = Array::empty({n}, DType::f32, Device::cpu());
  float* v = h.data_as<float>();
  double b = std::pow(2.0, -8.0 / p);
  for (int i = 0; i < p; ++i) v[i] = float(std::pow(b, i + 1));
  double b2 = std::pow(2.0, -4.0 / p);
  for (int j = 0; j < n - p; ++j) v[p + j] = float(std::pow(b2, 2 * j + 1));
  return device.is_cpu() ? h : h.to(device, sp);
}

Array alibi_bias(const Array& slopes, int64_t q_len, int64_t k_len, DType dtype, const Stream* sp) {
  Device d = detail::common_device({{"slopes", &slopes}});
  if (slopes.dtype() != DType::f32) throw TypeError("slopes: must be float32");
  if (slopes.ndim() != 1) throw ValueError(cat("slopes: shape ", shape_str(slopes.shape()), " must be [heads]"));
  if (q_len < 0 || k_len < 0) throw ValueError("q_len, k_len: must be >= 0");
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw TypeError(cat("dtype: ", dtype_name(dtype), " is not supported (float32, float16 or bfloat16)"));
  Stream s = resolve_stream(sp, d);
  Array sl = slopes.contiguous(&s);
  Array out = Array::empty({slopes.shape(0), q_len, k_len}, dtype, d, &s);
  AlibiArgs a;
  a.slopes = sl.data_as<float>();
  a.out = out.data();
  a.H = int(slopes.shape(0));
  a.Lq = q_len;
  a.Lk = k_len;
  a.dtype = dtype;
  if (out.numel() == 0) return out;
  detail::mark_used(sl, s);
  dispatch_backend(d, s, [&] { cpu::alibi_bias(a); }, [&](void* h) { cuda::alibi_bias(a, h); });
  return out;
}

Array sinusoidal_positions(const Array& positions, int dim, DType dtype, const Stream* sp) {
  Device d = detail::common_device({{"positions", &positions}});
  if (dim < 2 || dim % 2 || dim / 2 > kMaxRopeFreqs)
    throw ValueError(cat("dim: must be even, >= 2 and <= ", 2 * kMaxRopeFreqs, ", got ", dim));
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    throw TypeError(cat("dtype: ", dtype_name(dtype), " is not supported (float32, float16 or bfloat16)"));
  if (positions.ndim() != 1) throw ValueError("positions: must be 1-D [tokens]");
  int64_t T = positions.shape(0);
  check_positions(positions, T);
  std::vector<double> f = rope_inv_freq(10000.0, dim, {});
  Stream s = resolve_stream(sp, d);
  Array pos = positions.contiguous(&s);
  Array out = Array::empty({T, dim}, dtype, d, &s);
  SinusoidArgs a;
  a.pos = pos.data();
  a.pos64 = pos.dtype() == DType::i64;
  a.out = out.data();
  a.T = T;
  a.dim = dim;
  a.dtype = dtype;
  for (size_t i = 0; i < f.size(); ++i) a.inv_freq[i] = float(f[i]);
  if (T == 0) return out;
  detail::mark_used(pos, s);
  dispatch_backend(d, s, [&] { cpu::sinusoidal(a); }, [&](void* h) { cuda::sinusoidal(a, h); });
  return out;
}

}  // namespace gk::nn
