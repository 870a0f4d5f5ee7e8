// Quantized decode GEMV (formats in ops/quant_args.h) and the device quantization of
// fp8/int8/int4 weights. fp8 and int8 run the 16-byte chunk kernel family of
// common/gemv.cuh (CUDA cores); int4 and NVF4 (K % 128 == 0) and Q4_K run the tensor-core
// kernel of common/gemv_mma.cuh (int4/NVF4 with other K: the chunk family); the GGUF blocks
// that are only 2-byte aligned (Q8_0 34 B, Q4_0 18 B, Q4_1 20 B, Q6_K 210 B) run the
// kernels of quant_gguf.cu.
#include "common/gemv.cuh"
#include "common/gemv_gguf.cuh"
#include "common/gemv_mma.cuh"
#include "common/gemv_w4_launch.cuh"
#include "core/cuda_util.h"
#include "ops/backend.h"
#include "ops/gemv_args.h"
#include "ops/quant_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("gemv_fp8", "gemv_int8", "gemv_int4", "gemv_nvf4", "gemv_q8_0", "gemv_q4_0", "gemv_q4_1",
                     "gemv_q4_k", "gemv_q6_k");

namespace {

using namespace gemv_detail;

KArgs kargs(const QGemvArgs& a) {
  KArgs p;
  p.x = a.x;
  p.x_rs = a.x_rs;
  p.q = static_cast<const uint8_t*>(a.q);
  p.q_rs = a.q_rs;
  p.scales = a.scales;
  p.aux = a.zeros;
  p.gscale = a.tensor_scale;
  p.y = a.y;
  p.part = a.part;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.group = a.group;
  p.out = a.out_dtype;
  p.variant = a.variant;
  return p;
}

template <class F, class T>
void launch_chunks(const QGemvArgs& a, cudaStream_t st) {
  launch_family<F, T>(kargs(a), a.split, st);
}

// 4-bit formats run on the tensor cores when K % 128 == 0 (gemv_mma.cuh).
bool use_mma(QFormat f, int64_t k) { return (f == QFormat::int4 || f == QFormat::nvf4) && k % 128 == 0; }

// int4 / NVF4 and the variants (gk._C._gemv_set_variant): 1 the per-lane-chunk kernel of
// gemv_mma.cuh; int4 3 the session-3 staged-tile kernel of quant_int4_mma.cu (the previous
// default), every other variant the staged kernel of gemv_w4_staged.cu (its own variants);
// NVF4 3 the per-lane kernel of quant_nvf4_lane.cu (the default of sessions 4-5), 8 it with
// mul.hi shifts, every other variant the staged kernel (0 / 2 / 10: its default configuration;
// the default since session 6: H200 checkpoint A, M = 1, 51 / 59 / 76% of copy against 50 / 52 /
// 68% for the per-lane kernel, M = 8 45 / 45 / 62 against 44 / 44 / 50); the per-lane kernel
// also where the staged one does not apply.
template <class T>
void launch_int4(const QGemvArgs& a, cudaStream_t st) {
  // Default: the staged kernel of gemv_w4_staged.cu (K % 128 == 0, aligned rows; H200 session
  // 5 checkpoint A, g128: 53 / 51 / 77% of copy against 46 / 49 / 59% for quant_int4_mma.cu).
  if (a.variant != 1 && a.variant != 3 && w4_staged_applies(a)) return launch_w4_staged<T>(a, st);
  if (a.variant != 1 && int4_mma_applies(a)) return launch_int4_mma<T>(a, st);
  const KArgs p = kargs(a);
  if (!use_mma(a.fmt, a.k)) return launch_family<FInt4, T>(p, a.split, st);
  if (a.group == 128) return launch_mma<MInt4<T, 1>, T>(p, a.split, st);
  if (a.group == 64) return launch_mma<MInt4<T, 2>, T>(p, a.split, st);
  return launch_mma<MInt4<T, 4>, T>(p, a.split, st);
}

template <class T>
void launch_nvf4(const QGemvArgs& a, cudaStream_t st) {
  const bool lane = a.variant == 1 || a.variant == 3 || a.variant == 8;
  if (!lane && w4_staged_applies(a)) {
    QGemvArgs b = a;
    if (b.variant == 10) b.variant = 0;  // the staged kernel's default configuration
    return launch_w4_staged<T>(b, st);
  }
  if (a.variant != 1 && nvf4_lane_applies(a)) {
    QGemvArgs b = a;
    if (b.variant != 8 && b.variant != 2) b.variant = 0;  // its default (4 stages), mul.hi shifts, no PDL
    return launch_nvf4_lane<T>(b, st);
  }
  const KArgs p = kargs(a);
  if (!use_mma(a.fmt, a.k)) return launch_family<FNvf4, T>(p, a.split, st);
  return launch_mma<MNvf4<T>, T>(p, a.split, st);
}

// The GGUF formats. Default (and variants 2, 4, 5, 7, 12): the staged kernel of quant_gguf_st.cu
// (16-byte aligned rows; K % 256 == 0, Q6_K K % 2048 == 0); variant 3 and where the staged one
// does not apply: Q4_K / Q6_K the session-4 kernels of quant_gguf_k.cu (Q6_K: 4-byte aligned
// rows, K % 512 == 0), else the CUDA-core kernels of quant_gguf.cu (variant 1; Q4_K: the chunk
// kernel of gemv_mma.cuh). The session-4 kernels of Q4_0 / Q4_1 / Q8_0 (quant_gguf32.cu) were
// removed in session 5: slower than the staged one at every shape measured (H200 checkpoint A).
// Every kernel here takes any split.
template <class T>
void launch_gguf_any(const QGemvArgs& p, cudaStream_t st) {
  if constexpr (std::is_same_v<T, bf16>)
    if (gguf_imma_runs(p)) return launch_gguf_imma(p, st);  // GPUKIT_GGUF_IMMA (session 17)
  if (p.variant != 1 && p.variant != 3 && gguf_st_applies(p)) return launch_gguf_st<T>(p, st);
  if (p.variant != 1 && gguf_k_applies(p)) return launch_gguf_k<T>(p, st);
  if (p.fmt == QFormat::q4_k) return launch_mma<MQ4K<T>, T>(kargs(p), p.split, st);
  return launch_gguf<T>(p, st);
}

template <class T>
void by_format(const QGemvArgs& p, cudaStream_t st) {
  switch (p.fmt) {
    case QFormat::fp8:
      if (p.mma) return launch_mma<MFp8<T>, T>(kargs(p), p.split, st);
      return launch_chunks<FFp8, T>(p, st);
    case QFormat::int8:
      if (p.mma) return launch_mma<MInt8<T>, T>(kargs(p), p.split, st);
      return launch_chunks<FInt8, T>(p, st);
    case QFormat::int4: return launch_int4<T>(p, st);
    case QFormat::nvf4: return launch_nvf4<T>(p, st);
    case QFormat::q4_k:
    case QFormat::q8_0:
    case QFormat::q4_0:
    case QFormat::q4_1:
    case QFormat::q6_k: return launch_gguf_any<T>(p, st);
  }
  throw ValueError("gemv: unknown quantized format");
}

// ---- quantization (the rules of src/cpu/quant.cpp, the same float32 operations) ----

// fp8 / int8: one CTA per row; the row maximum (exact in any order), then the codes.
template <bool kFp8>
__global__ void __launch_bounds__(256) k_quantize_row(QuantArgs a) {
  const int64_t j = blockIdx.x;
  const float* w = a.w + j * a.k;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < a.k; i += 256) amax = fmaxf(amax, fabsf(w[i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float wmax[8];
  if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = wmax[0];
  for (int i = 1; i < 8; ++i) amax = fmaxf(amax, wmax[i]);
  float s = __fdiv_rn(amax, kFp8 ? 448.0f : 127.0f);
  if (!(s > 0.0f) || !isfinite(s)) s = 1.0f;
  if (threadIdx.x == 0) a.scales[j] = s;
  uint8_t* q = static_cast<uint8_t*>(a.q) + j * a.k;
  for (int64_t i = threadIdx.x; i < a.k; i += 256) {
    const float v = __fdiv_rn(w[i], s);
    if constexpr (kFp8) q[i] = f8e4m3(v).bits;
    else q[i] = uint8_t(int8_t(fminf(fmaxf(rintf(v), -127.0f), 127.0f)));
  }
}

// int4: one thread per group.
__global__ void __launch_bounds__(256) k_quantize_int4(QuantArgs a) {
  const int64_t ng = a.k / a.group, total = a.n * ng;
  for (int64_t gi = int64_t(blockIdx.x) * 256 + threadIdx.x; gi < total; gi += int64_t(gridDim.x) * 256) {
    const int64_t j = gi / ng, g = gi % ng;
    const float* wg = a.w + j * a.k + g * a.group;
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < a.group; ++i) {
      lo = fminf(lo, wg[i]);
      hi = fmaxf(hi, wg[i]);
    }
    float s = __fdiv_rn(__fsub_rn(hi, lo), 15.0f);
    if (!(s > 0.0f) || !isfinite(s)) s = 1.0f;
    const float z = fminf(fmaxf(rintf(__fdiv_rn(-lo, s)), 0.0f), 15.0f);
    a.scales[gi] = s;
    a.zeros[gi] = uint8_t(z);
    uint8_t* q = static_cast<uint8_t*>(a.q) + j * (a.k / 2) + g * a.group / 2;
    for (int64_t i = 0; i < a.group; i += 2) {
      const int q0 = int(fminf(fmaxf(__fadd_rn(rintf(__fdiv_rn(wg[i], s)), z), 0.0f), 15.0f));
      const int q1 = int(fminf(fmaxf(__fadd_rn(rintf(__fdiv_rn(wg[i + 1], s)), z), 0.0f), 15.0f));
      q[i / 2] = uint8_t(q0 | (q1 << 4));
    }
  }
}

// Exact dequantization, one thread per pair of weights (the products of src/cpu/quant.cpp).
__global__ void __launch_bounds__(256) k_dequantize(QuantArgs a) {
  const int64_t half = a.k / 2, total = a.n * half;
  const uint8_t* q8 = static_cast<const uint8_t*>(a.q);
  for (int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x; i < total; i += int64_t(gridDim.x) * 256) {
    const int64_t j = i / half, k0 = (i % half) * 2;
    float v[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t kk = k0 + e;
      switch (a.fmt) {
        case QFormat::fp8: v[e] = __fmul_rn(float(f8e4m3::from_bits(q8[j * a.k + kk])), a.scales[j]); break;
        case QFormat::int8: v[e] = __fmul_rn(float(int8_t(q8[j * a.k + kk])), a.scales[j]); break;
        case QFormat::int4: {
          const uint8_t b = q8[j * half + kk / 2];
          const int qv = (kk & 1) ? (b >> 4) : (b & 0xf);
          const int64_t g = j * (a.k / a.group) + kk / a.group;
          v[e] = __fmul_rn(float(qv - int(a.zeros[g])), a.scales[g]);
          break;
        }
        default: {  // nvf4
          const uint8_t b = q8[j * half + kk / 2];
          const int c = (kk & 1) ? (b >> 4) : (b & 0xf);
          const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
          const float e2 = (c & 8) ? -mag[c & 7] : mag[c & 7];
          const float bs = float(f8e4m3::from_bits(a.zeros[j * (a.k / 16) + kk / 16]));
          v[e] = __fmul_rn(__fmul_rn(e2, bs), a.tensor_scale[0]);
        }
      }
    }
    a.w[j * a.k + k0] = v[0];
    a.w[j * a.k + k0 + 1] = v[1];
  }
}

}  // namespace

void dequantize(const QuantArgs& a, void* stream) {
  if (a.n <= 0 || a.k <= 0) return;
  if (a.fmt != QFormat::fp8 && a.fmt != QFormat::int8 && a.fmt != QFormat::int4 && a.fmt != QFormat::nvf4)
    throw ValueError("dequantize: the CUDA path takes fp8, int8, int4 and nvf4");
  if (a.k % 2 != 0) throw ValueError("dequantize: K must be even");
  const int64_t pairs = a.n * (a.k / 2);
  k_dequantize<<<unsigned(std::min<int64_t>((pairs + 255) / 256, 132 * 32)), 256, 0, static_cast<cudaStream_t>(stream)>>>(a);
  GK_LAUNCH_CHECK("dequantize");
}

void quantize(const QuantArgs& a, void* stream) {
  if (a.n <= 0 || a.k <= 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  if (a.n > int64_t(INT32_MAX)) throw ValueError("quantize: too many rows");
  switch (a.fmt) {
    case QFormat::fp8: k_quantize_row<true><<<unsigned(a.n), 256, 0, st>>>(a); break;
    case QFormat::int8: k_quantize_row<false><<<unsigned(a.n), 256, 0, st>>>(a); break;
    case QFormat::int4: {
      const int64_t groups = a.n * (a.k / a.group);
      k_quantize_int4<<<unsigned(std::min<int64_t>((groups + 255) / 256, 132 * 16)), 256, 0, st>>>(a);
      break;
    }
    default: throw ValueError("quantize: the CUDA path takes fp8, int8 and int4");
  }
  GK_LAUNCH_CHECK("quantize");
}

int qgemv_split(int64_t n, int64_t k, QFormat f, bool mma) {
  if (mma && (f == QFormat::fp8 || f == QFormat::int8)) return split_mma(n, k / 64);
  // int4 / NVF4 with K % 128 == 0: the staged kernel's split (every 4-bit kernel takes any split)
  if ((f == QFormat::int4 || f == QFormat::nvf4) && k % 128 == 0) return w4_staged_split(n, k);
  switch (f) {
    case QFormat::fp8: return split_for(n, chunks_per_row<FFp8>(k));
    case QFormat::int8: return split_for(n, chunks_per_row<FInt8>(k));
    case QFormat::int4:  // K % 128 == 0: above
      return split_for(n, chunks_per_row<FInt4>(k));
    case QFormat::nvf4: return use_mma(f, k) ? split_mma(n, k / 128) : split_for(n, chunks_per_row<FNvf4>(k));
    case QFormat::q4_k:
    case QFormat::q8_0:
    case QFormat::q4_0:
    case QFormat::q4_1:
    case QFormat::q6_k:  // every GGUF kernel takes any split: the staged kernel's where its shape applies
      if (gguf_st_shape(k, f)) return gguf_st_split(n, k, f);
      return gguf_split(n, k, f);
    default: return gguf_split(n, k, f);
  }
}

void qgemv(const QGemvArgs& a, void* stream) {
  if (a.w8) return gemv_w8_quant(a, stream);  // src/cuda/gemv_w8.cu
  if (a.m <= 0 || a.n <= 0) return;
  if (a.m > 8) throw ValueError("gemv: the kernel takes at most 8 rows of x");
  if (a.mma && (a.k % 64 != 0 || (a.fmt != QFormat::fp8 && a.fmt != QFormat::int8)))
    throw ValueError("gemv: the fp8 / int8 tensor-core path needs K % 64 == 0");
  auto s = static_cast<cudaStream_t>(stream);
  if (a.x_dtype == DType::bf16) return by_format<bf16>(a, s);
  if (a.x_dtype == DType::f16) return by_format<f16>(a, s);
  throw TypeError(cat("gemv: unsupported activation dtype ", dtype_name(a.x_dtype)));
}

}  // namespace gk::cuda
