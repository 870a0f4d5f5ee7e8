// Front ends of weight quantization and the quantized decode GEMV: validation
// (formats, shapes, dtypes, group sizes, CUDA alignment) before any launch.
#include <atomic>

#include "gpukit/gemm.h"
#include "gpukit/quant.h"
#include "ops/common.h"
#include "ops/gguf_blocks.h"
#include "ops/gemv_args.h"
#include "ops/quant_args.h"

namespace gk {

namespace {

bool is_gguf(QFormat f) { return gguf_block_bytes(f) != 0; }
int64_t block_bytes(QFormat f) { return gguf_block_bytes(f); }

QFormat parse_format(const std::string& f) {
  static const std::pair<const char*, QFormat> kNames[] = {
      {"fp8", QFormat::fp8},   {"int8", QFormat::int8}, {"int4", QFormat::int4}, {"nvf4", QFormat::nvf4},
      {"q8_0", QFormat::q8_0}, {"q4_0", QFormat::q4_0}, {"q4_1", QFormat::q4_1}, {"q4_k", QFormat::q4_k},
      {"q6_k", QFormat::q6_k}};
  for (auto& [name, fmt] : kNames)
    if (f == name) return fmt;
  throw ValueError(cat("format: expected one of fp8, int8, int4, nvf4, q8_0, q4_0, q4_1, q4_k, q6_k; got \"", f,
                       "\""));
}

void check_group(int64_t k, int64_t group) {
  if (group != 32 && group != 64 && group != 128)
    throw ValueError(cat("group: int4 groups are 32, 64 or 128 weights, got ", group));
  if (k % group != 0)
    throw ValueError(cat("w: K = ", k, " is not divisible by the group size ", group));
}

// Checks a QuantizedWeight; returns (n, k).
std::pair<int64_t, int64_t> check_qw(const QuantizedWeight& qw, QFormat f) {
  const Array& q = qw.q;
  if (!q.defined()) throw ValueError("q: the quantized weight has no data");
  if (is_gguf(f)) {
    if (q.ndim() != 2) throw ValueError(cat("q: expected 2-d blocks [N, K/32 * bytes], got shape ", shape_str(q.shape())));
    if (q.dtype() != DType::u8) throw TypeError(cat("q: GGUF blocks are uint8 bytes, got ", dtype_name(q.dtype())));
    const int64_t bb = block_bytes(f);
    if (q.shape(1) % bb != 0)
      throw ValueError(cat("q: a row of ", qw.format, " blocks is a multiple of ", bb, " bytes, got ", q.shape(1)));
    return {q.shape(0), q.shape(1) / bb * gguf_block_weights(f)};
  }
  if (f == QFormat::nvf4) {
    if (q.ndim() != 2) throw ValueError(cat("q: expected a 2-d array [N, K/2], got shape ", shape_str(q.shape())));
    if (q.dtype() != DType::u8) throw TypeError(cat("q: nvf4 codes are uint8 (two per byte), got ", dtype_name(q.dtype())));
    const int64_t n = q.shape(0), k = q.shape(1) * 2;
    if (k % 16 != 0) throw ValueError(cat("q: nvf4 needs K divisible by the block size 16, got K = ", k));
    if (!qw.scales.defined()) throw ValueError("scales: missing (nvf4 needs e4m3 block scales [N, K/16])");
    if (qw.scales.dtype() != DType::f8e4m3 && qw.scales.dtype() != DType::u8)
      throw TypeError(cat("scales: nvf4 block scales are float8_e4m3fn, got ", dtype_name(qw.scales.dtype())));
    Shape bs{n, k / 16};
    if (qw.scales.shape() != bs)
      throw ValueError(cat("scales: expected shape ", shape_str(bs), ", got ", shape_str(qw.scales.shape())));
    if (!qw.tensor_scale.defined()) throw ValueError("tensor_scale: missing (nvf4 needs a float32 tensor scale)");
    if (qw.tensor_scale.dtype() != DType::f32 || qw.tensor_scale.numel() != 1)
      throw TypeError(cat("tensor_scale: expected one float32 value, got ", dtype_name(qw.tensor_scale.dtype()),
                          " of shape ", shape_str(qw.tensor_scale.shape())));
    return {n, k};
  }
  if (!qw.scales.defined()) throw ValueError("scales: missing (every format needs scales)");
  if (q.ndim() != 2) throw ValueError(cat("q: expected a 2-d array, got shape ", shape_str(q.shape())));
  DType want = f == QFormat::fp8 ? DType::f8e4m3 : (f == QFormat::int8 ? DType::i8 : DType::u8);
  if (q.dtype() != want)
    throw TypeError(cat("q: ", qw.format, " weights are ", dtype_name(want), ", got ", dtype_name(q.dtype())));
  if (qw.scales.dtype() != DType::f32) throw TypeError(cat("scales: expected float32, got ", dtype_name(qw.scales.dtype())));
  const int64_t n = q.shape(0), k = f == QFormat::int4 ? q.shape(1) * 2 : q.shape(1);
  if (f == QFormat::int4) {
    check_group(k, qw.group);
    if (!qw.zeros.defined()) throw ValueError("zeros: int4 weights need zero points");
    if (qw.zeros.dtype() != DType::u8) throw TypeError(cat("zeros: expected uint8, got ", dtype_name(qw.zeros.dtype())));
    Shape gs{n, k / qw.group};
    if (qw.scales.shape() != gs) throw ValueError(cat("scales: expected shape ", shape_str(gs), ", got ", shape_str(qw.scales.shape())));
    if (qw.zeros.shape() != gs) throw ValueError(cat("zeros: expected shape ", shape_str(gs), ", got ", shape_str(qw.zeros.shape())));
  } else if (qw.scales.shape() != Shape{n}) {
    throw ValueError(cat("scales: expected shape (", n, ",), got ", shape_str(qw.scales.shape())));
  }
  return {n, k};
}

}  // namespace

QuantizedWeight quantize_weight(const Array& w, const std::string& format, int64_t group) {
  QFormat f = parse_format(format);
  if (!is_floating(w.dtype()) || is_fp8(w.dtype()))
    throw TypeError(cat("w: quantize takes float32, float16, bfloat16 or float64 weights, got ", dtype_name(w.dtype())));
  if (w.ndim() != 2) throw ValueError(cat("w: expected a 2-d weight [N, K], got shape ", shape_str(w.shape())));
  const int64_t n = w.shape(0), k = w.shape(1);
  if (f == QFormat::int4) check_group(k, group);
  if (is_gguf(f) && k % gguf_block_weights(f) != 0)
    throw ValueError(cat("w: K = ", k, " is not divisible by the ", format, " block size ", gguf_block_weights(f)));
  if (f == QFormat::nvf4 && k % 16 != 0)
    throw ValueError(cat("w: K = ", k, " is not divisible by the nvf4 block size 16"));
#if GPUKIT_WITH_CUDA
  if (w.device().is_cuda() && (f == QFormat::fp8 || f == QFormat::int8 || f == QFormat::int4)) {
    // on the device (large weights at load time), bit-identical to the CPU rules
    Device d = w.device();
    Stream s = resolve_stream(nullptr, d);
    Array wd = w.astype(DType::f32, &s).contiguous(&s);
    QuantizedWeight qw;
    qw.format = format;
    qw.group = f == QFormat::int4 ? group : 0;
    QuantArgs a;
    a.w = wd.data_as<float>();
    a.n = n;
    a.k = k;
    a.group = qw.group;
    a.fmt = f;
    if (f == QFormat::int4) {
      qw.q = Array::empty({n, k / 2}, DType::u8, d, &s);
      qw.scales = Array::empty({n, k / group}, DType::f32, d, &s);
      qw.zeros = Array::empty({n, k / group}, DType::u8, d, &s);
      a.zeros = qw.zeros.data_as<uint8_t>();
    } else {
      qw.q = Array::empty({n, k}, f == QFormat::fp8 ? DType::f8e4m3 : DType::i8, d, &s);
      qw.scales = Array::empty({n}, DType::f32, d, &s);
    }
    a.q = qw.q.data();
    a.scales = qw.scales.data_as<float>();
    detail::mark_used(wd, s);
    cuda::quantize(a, s.handle());
    return qw;
  }
#endif
  Array wc = w.to(Device::cpu()).astype(DType::f32).contiguous();
  Device cpu = Device::cpu();
  QuantizedWeight qw;
  qw.format = format;
  qw.group = f == QFormat::int4 ? group : 0;
  QuantArgs a;
  a.w = wc.data_as<float>();
  a.n = n;
  a.k = k;
  a.group = qw.group;
  a.fmt = f;
  if (is_gguf(f)) {
    qw.q = Array::empty({n, k / gguf_block_weights(f) * block_bytes(f)}, DType::u8, cpu);
  } else if (f == QFormat::nvf4) {
    qw.q = Array::empty({n, k / 2}, DType::u8, cpu);
    qw.scales = Array::empty({n, k / 16}, DType::f8e4m3, cpu);
    qw.tensor_scale = Array::empty({1}, DType::f32, cpu);
    a.zeros = static_cast<uint8_t*>(qw.scales.data());
    a.tensor_scale = qw.tensor_scale.data_as<float>();
  } else if (f == QFormat::int4) {
    qw.q = Array::empty({n, k / 2}, DType::u8, cpu);
    qw.scales = Array::empty({n, k / group}, DType::f32, cpu);
    qw.zeros = Array::empty({n, k / group}, DType::u8, cpu);
    a.zeros = qw.zeros.data_as<uint8_t>();
  } else {
    qw.q = Array::empty({n, k}, f == QFormat::fp8 ? DType::f8e4m3 : DType::i8, cpu);
    qw.scales = Array::empty({n}, DType::f32, cpu);
  }
  a.q = qw.q.data();
  a.scales = qw.scales.defined() && f != QFormat::nvf4 ? qw.scales.data_as<float>() : nullptr;
  cpu::quantize(a);
  if (w.device().is_cuda()) {
    qw.q = qw.q.to(w.device());
    if (qw.scales.defined()) qw.scales = qw.scales.to(w.device());
    if (qw.zeros.defined()) qw.zeros = qw.zeros.to(w.device());
    if (qw.tensor_scale.defined()) qw.tensor_scale = qw.tensor_scale.to(w.device());
  }
  return qw;
}

Array dequantize_weight(const QuantizedWeight& qw) {
  QFormat f = parse_format(qw.format);
  auto [n, k] = check_qw(qw, f);
  Device d = qw.q.device();
  QuantArgs a;
#if GPUKIT_WITH_CUDA
  if (d.is_cuda() && !is_gguf(f) && k % 2 == 0) {  // on the device (the same values as the CPU's)
    const Array& q0 = qw.q;
    detail::common_device({{"q", &q0}, {"scales", &qw.scales}, {"zeros", qw.zeros.defined() ? &qw.zeros : &q0},
                           {"tensor_scale", qw.tensor_scale.defined() ? &qw.tensor_scale : &q0}});
    Stream st = resolve_stream(nullptr, d);
    Array q = qw.q.contiguous(&st), sc = qw.scales.contiguous(&st), z, ts;
    if (f == QFormat::int4) z = qw.zeros.contiguous(&st);
    if (f == QFormat::nvf4) ts = qw.tensor_scale.contiguous(&st);
    Array w = Array::empty({n, k}, DType::f32, d, &st);
    a.w = w.data_as<float>();
    a.q = q.data();
    if (f == QFormat::nvf4) {
      a.zeros = static_cast<uint8_t*>(sc.data());
      a.tensor_scale = ts.data_as<float>();
    } else {
      a.scales = sc.data_as<float>();
      a.zeros = z.defined() ? z.data_as<uint8_t>() : nullptr;
    }
    a.n = n;
    a.k = k;
    a.group = qw.group;
    a.fmt = f;
    const Array* used[] = {&q, &sc, &z, &ts};
    for (const Array* t : used)
      if (t->defined()) detail::mark_used(*t, st);
    cuda::dequantize(a, st.handle());
    return w;
  }
#endif
  Array q = qw.q.to(Device::cpu()).contiguous(), s, z, ts;
  if (qw.scales.defined()) s = qw.scales.to(Device::cpu()).contiguous();
  if (f == QFormat::int4) z = qw.zeros.to(Device::cpu()).contiguous();
  if (f == QFormat::nvf4) ts = qw.tensor_scale.to(Device::cpu()).contiguous();
  Array w = Array::empty({n, k}, DType::f32, Device::cpu());
  a.w = w.data_as<float>();
  a.q = q.data();
  if (f == QFormat::nvf4) {
    a.zeros = static_cast<uint8_t*>(s.data());
    a.tensor_scale = ts.data_as<float>();
  } else {
    a.scales = s.defined() ? s.data_as<float>() : nullptr;
    a.zeros = z.defined() ? z.data_as<uint8_t>() : nullptr;
  }
  a.n = n;
  a.k = k;
  a.group = qw.group;
  a.fmt = f;
  cpu::dequantize(a);
  return d.is_cuda() ? w.to(d) : w;
}

namespace {
std::atomic<int64_t> g_prepared_calls{0};
Array gemv_quantized_impl(const Array& x_in, const QuantizedWeight& qw, std::optional<DType> out_dtype,
                          const Stream* sp, const Array* xprep_inv, bool swiglu = false);
}  // namespace

Array gemv_quantized(const Array& x_in, const QuantizedWeight& qw, std::optional<DType> out_dtype, const Stream* sp) {
  return gemv_quantized_impl(x_in, qw, out_dtype, sp, nullptr);
}

Array gemv_quantized_prepared(const Array& x, const Array& xh, const Array& xinv, const QuantizedWeight& qw,
                              std::optional<DType> out_dtype, const Stream* sp) {
  const QFormat f = parse_format(qw.format);
  const int64_t k = qw.q.defined() && qw.q.ndim() == 2 ? qw.q.shape(1) : -1;
  const int64_t n = qw.q.defined() && qw.q.ndim() == 2 ? qw.q.shape(0) : -1;
  const bool ok = xh.defined() && xinv.defined() && x.device().is_cuda() && xh.device() == x.device() &&
                  xinv.device() == x.device() && (f == QFormat::fp8 || f == QFormat::int8) &&
                  x.dtype() == DType::bf16 && x.ndim() == 2 && x.shape(0) >= 1 && x.shape(0) <= 8 &&
                  x.shape(1) == k && xh.dtype() == DType::f16 && xh.shape() == x.shape() &&
                  xinv.dtype() == DType::f32 && xinv.ndim() == 1 && xinv.shape(0) == x.shape(0) &&
                  gemv_dense_path() != 1 && gemv_w8_quant_enabled(n, k);
  if (!ok) return gemv_quantized_impl(x, qw, out_dtype, sp, nullptr);
  Array y = gemv_quantized_impl(xh, qw, out_dtype.value_or(DType::bf16), sp, &xinv);
  g_prepared_calls.fetch_add(1, std::memory_order_relaxed);
  return y;
}

int64_t gemv_quantized_prepared_calls() { return g_prepared_calls.load(std::memory_order_relaxed); }

Array gemv_quantized_swiglu(const Array& x, const QuantizedWeight& qw, std::optional<DType> out_dtype,
                            const Stream* sp) {
  return gemv_quantized_impl(x, qw, out_dtype, sp, nullptr, true);
}

namespace {
Array gemv_quantized_impl(const Array& x_in, const QuantizedWeight& qw, std::optional<DType> out_dtype,
                          const Stream* sp, const Array* xprep_inv, bool swiglu) {
  QFormat f = parse_format(qw.format);
  auto [n, k] = check_qw(qw, f);
  const Array& q0 = qw.q;
  Device d = detail::common_device({{"x", &x_in}, {"q", &q0}, {"scales", qw.scales.defined() ? &qw.scales : &q0},
                                    {"zeros", qw.zeros.defined() ? &qw.zeros : &q0},
                                    {"tensor_scale", qw.tensor_scale.defined() ? &qw.tensor_scale : &q0}});
  Stream s = resolve_stream(sp, d);
  DType xt = x_in.dtype();
  if (xt != DType::f32 && xt != DType::f16 && xt != DType::bf16)
    throw TypeError(cat("x: gemv takes float32, float16 or bfloat16 activations, got ", dtype_name(xt)));
  if (x_in.ndim() != 1 && x_in.ndim() != 2)
    throw ValueError(cat("x: gemv needs [K] or [M, K], got shape ", shape_str(x_in.shape())));
  if (x_in.shape(-1) != k)
    throw ValueError(cat("gemv: x has ", x_in.shape(-1), " features (shape ", shape_str(x_in.shape()),
                         ") but the quantized weight has K = ", k));
  DType act = xt == DType::f16 ? DType::f16 : DType::bf16;
  DType out = out_dtype.value_or(xt == DType::f32 ? DType::f32 : act);
  if (out != DType::f32 && out != DType::f16 && out != DType::bf16)
    throw TypeError(cat("out_dtype: gemv produces float32, float16 or bfloat16, not ", dtype_name(out)));
  const bool one = x_in.ndim() == 1;
  const int64_t m = one ? 1 : x_in.shape(0);
  if (swiglu && m > 8) return Array();  // gemv_quantized_swiglu: M <= 8 only
  if (m > 8) {
    Array w = dequantize_weight(qw);
    return linear(x_in.astype(act, &s), w, nullptr, Activation::none, nullptr, out, &s);  // fp32 weights: exact
  }
  if (qw.q.stride(1) != 1) throw ValueError("q: rows must be contiguous (stride 1 along K)");
  const bool cuda = d.is_cuda();
  auto al = [](const void* p, int b) { return reinterpret_cast<uintptr_t>(p) % uintptr_t(b) == 0; };
  // CUDA layout requirements, checked before anything is allocated or launched
  const bool family = !is_gguf(f) || f == QFormat::q4_k;  // 16-byte chunk kernels
  if (cuda && k > 0) {
    if (family) {
      const int64_t e = f == QFormat::fp8 || f == QFormat::int8 ? 16 : 32;
      if (f != QFormat::q4_k && k % e != 0)
        throw ValueError(cat("q: the CUDA ", qw.format, " GEMV needs K divisible by ", e, ", got K = ", k));
      if (!al(qw.q.data(), 16) || qw.q.stride(0) % 16 != 0)
        throw ValueError(cat("q: the CUDA ", qw.format, " GEMV needs 16-byte aligned rows (row stride ", qw.q.stride(0),
                             " bytes, address offset ", reinterpret_cast<uintptr_t>(qw.q.data()) % 16, ")"));
    } else if (!al(qw.q.data(), 2) || qw.q.stride(0) % 2 != 0) {
      throw ValueError("q: the CUDA GGUF GEMV needs 2-byte aligned block rows");
    }
  }
  Array x = one ? x_in.unsqueeze(0) : x_in;
  x = x.dtype() == act ? x.contiguous(&s) : x.astype(act, &s);
  Array sc = qw.scales.defined() ? qw.scales.contiguous(&s) : Array();
  Array zr = qw.zeros.defined() ? qw.zeros.contiguous(&s) : Array();
  Array ts = qw.tensor_scale.defined() ? qw.tensor_scale.contiguous(&s) : Array();
  // swiglu (gemv_quantized_swiglu): CUDA only, where the kernel takes it (checked below, before y is allocated)
  if (swiglu && (!d.is_cuda() || m < 1 || n < 2 || n % 2 != 0 || k < 1)) return Array();
  Array y;
  if (!swiglu) {
    y = Array::empty({m, n}, out, d, &s);
    if (y.numel() == 0) return one ? y.reshape({n}) : y;
  }
  QGemvArgs a;
  a.x = x.data();
  a.q = qw.q.data();
  if (f == QFormat::nvf4) {
    a.zeros = static_cast<const uint8_t*>(sc.data());
    a.tensor_scale = ts.data_as<float>();
  } else {
    a.scales = sc.defined() ? sc.data_as<float>() : nullptr;
    a.zeros = zr.defined() ? zr.data_as<uint8_t>() : nullptr;
  }
  a.y = swiglu ? nullptr : y.data();
  a.m = m;
  a.n = n;
  a.k = k;
  a.x_rs = k;
  a.q_rs = qw.q.stride(0);  // bytes: every format's element is one byte
  a.group = qw.group;
  a.x_dtype = act;
  a.out_dtype = out;
  a.fmt = f;
  if (!cuda) {
    cpu::qgemv(a);
  } else {
#if GPUKIT_WITH_CUDA
    if (!al(a.x, 16)) x = x.copy(&s), a.x = x.data();
    // fp8 / int8: the CUDA-core kernel by default (faster at M = 1 on the H200); the
    // tensor-core kernel with gemv_set_dense_path(1) (K % 64 == 0)
    a.mma = (f == QFormat::fp8 || f == QFormat::int8) && k % 64 == 0 && gemv_dense_path() == 1;
    a.w8 = (f == QFormat::fp8 || f == QFormat::int8) && !a.mma && gemv_w8_quant_enabled(n, k);
    a.split = a.w8 ? cuda::gemv_w8_split(n, k, 1) : cuda::qgemv_split(n, k, f, a.mma);
    a.w8_full = a.w8 ? gemv_w8_full_ring() : 0;  // EngineOptions::quantized_full_ring (the same bits)
    a.variant = gemv_variant();
    if (swiglu) {  // y [m, n / 2]: silu(g) * u in the int4 kernel's epilogue
      if (xprep_inv || !cuda::gemv_w4i_swiglu_applies(a)) return Array();
      y = Array::empty({m, n / 2}, out, d, &s);
      a.y = y.data();
      a.swiglu = true;
    }
    Array xh, xinv;  // the staged kernel's scaled fp16 copy of bf16 x (src/cuda/gemv_w8.cu)
    if (a.w8 && act == DType::bf16 && cuda::gemv_w8_x_workspace(m, n, k)) {
      xh = Array::empty({m, k}, DType::f16, d, &s);
      xinv = Array::empty({m}, DType::f32, d, &s);
      a.xh = xh.data();
      a.xinv = xinv.data_as<float>();
    }
    // the GGUF staged kernel's, for Q8_0 with bf16 x through an fp16 copy (variant 12; src/cuda/quant_gguf_st.cu)
    if (f == QFormat::q8_0 && act == DType::bf16 && k % 256 == 0 && gemv_variant() == 12) {
      xh = Array::empty({m, k}, DType::f16, d, &s);
      xinv = Array::empty({m}, DType::f32, d, &s);
      a.xh = xh.data();
      a.xinv = xinv.data_as<float>();
    }
    Array w4x;  // the integer tensor-core GEMVs at M > 1: x converted once (gemv_w4i.cuh, quant_gguf_imma.cu)
    if (const int64_t wb = cuda::gemv_w4i_workspace(a) + cuda::gguf_imma_workspace(a); wb > 0) {
      w4x = Array::empty({wb}, DType::u8, d, &s);
      a.w4x = w4x.data();
    }
    Array part;
    if (a.split > 1) {
      part = Array::empty({int64_t(a.split), m, n}, DType::f32, d, &s);
      a.part = part.data_as<float>();
    }
    Array xpi;  // gemv_quantized_prepared: x is the scaled fp16 copy (the staged kernel only)
    if (xprep_inv) {
      if (!a.w8 || act != DType::f16) throw ValueError("gemv: a prepared x needs the fp8 / int8 staged kernel");
      xpi = xprep_inv->contiguous(&s);
      a.xprep_inv = xpi.data_as<float>();
    }
    const Array* used[] = {&x, &qw.q, &sc, &zr, &ts, &xpi};
    for (const Array* t : used)
      if (t->defined()) detail::mark_used(*t, s);
    cuda::qgemv(a, s.handle());
#else
    (void)xprep_inv;
    detail::no_cuda_backend();
#endif
  }
  return one ? y.reshape({y.shape(1)}) : y;
}
}  // namespace

}  // namespace gk
