// Quantized decode GEMV (formats in ops/quant_args.h): fp8, int8, int4, NVF4 and Q4_K
// run the 16-byte chunk kernel family of common/gemv.cuh with their format functors;
// the GGUF blocks that are only 2-byte aligned (Q8_0 34 B, Q4_0 18 B, Q4_1 20 B, Q6_K
// 210 B) run the kernels of quant_gguf.cu.
#include "common/gemv.cuh"
#include "common/gemv_gguf.cuh"
#include "common/gemv_mma.cuh"
#include "core/cuda_util.h"
#include "ops/backend.h"
#include "ops/quant_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("gemv_fp8", "gemv_int8", "gemv_int4", "gemv_nvf4", "gemv_q8_0", "gemv_q4_0", "gemv_q4_1",
                     "gemv_q4_k", "gemv_q6_k");

namespace {

using namespace gemv_detail;


KArgs kargs(const QGemvArgs& a);
template <class F, class T>
void launch_chunks(const QGemvArgs& a, cudaStream_t st) {
  launch_family<F, T>(kargs(a), a.split, st);
}

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
  return p;
}

// 4-bit formats run on the tensor cores when K % 128 == 0 (gemv_mma.cuh).
bool use_mma(QFormat f, int64_t k) { return (f == QFormat::int4 || f == QFormat::nvf4) && k % 128 == 0; }

template <class T>
void launch_int4(const QGemvArgs& a, cudaStream_t st) {
  const KArgs p = kargs(a);
  if (!use_mma(a.fmt, a.k)) return launch_family<FInt4, T>(p, a.split, st);
  if (a.group == 128) return launch_mma<MInt4<T>, T, 1>(p, a.split, st);
  if (a.group == 64) return launch_mma<MInt4<T>, T, 2>(p, a.split, st);
  return launch_mma<MInt4<T>, T, 4>(p, a.split, st);
}

template <class T>
void launch_nvf4(const QGemvArgs& a, cudaStream_t st) {
  const KArgs p = kargs(a);
  if (!use_mma(a.fmt, a.k)) return launch_family<FNvf4, T>(p, a.split, st);
  return launch_mma<MNvf4<T>, T, 1>(p, a.split, st);
}

template <class T>
void by_format(const QGemvArgs& p, cudaStream_t st) {
  switch (p.fmt) {
    case QFormat::fp8: return launch_chunks<FFp8, T>(p, st);
    case QFormat::int8: return launch_chunks<FInt8, T>(p, st);
    case QFormat::int4: return launch_int4<T>(p, st);
    case QFormat::nvf4: return launch_nvf4<T>(p, st);
    case QFormat::q4_k: return launch_chunks<FQ4K, T>(p, st);
    case QFormat::q8_0:
    case QFormat::q4_0:
    case QFormat::q4_1:
    case QFormat::q6_k: return launch_gguf<T>(p, st);
  }
  throw ValueError("gemv: unknown quantized format");
}

}  // namespace

int qgemv_split(int64_t n, int64_t k, QFormat f) {
  switch (f) {
    case QFormat::fp8: return split_for(n, chunks_per_row<FFp8>(k));
    case QFormat::int8: return split_for(n, chunks_per_row<FInt8>(k));
    case QFormat::int4: return use_mma(f, k) ? split_mma(n, k) : split_for(n, chunks_per_row<FInt4>(k));
    case QFormat::nvf4: return use_mma(f, k) ? split_mma(n, k) : split_for(n, chunks_per_row<FNvf4>(k));
    case QFormat::q4_k: return split_for(n, chunks_per_row<FQ4K>(k));
    default: return gguf_split(n, k, f);
  }
}

void qgemv(const QGemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.m > 8) throw ValueError("gemv: the kernel takes at most 8 rows of x");
  auto s = static_cast<cudaStream_t>(stream);
  if (a.x_dtype == DType::bf16) return by_format<bf16>(a, s);
  if (a.x_dtype == DType::f16) return by_format<f16>(a, s);
  throw TypeError(cat("gemv: unsupported activation dtype ", dtype_name(a.x_dtype)));
}

}  // namespace gk::cuda
