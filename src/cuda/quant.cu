// Quantized decode GEMV (formats in ops/quant_args.h): fp8, int8, int4, NVF4 and Q4_K
// run the 16-byte chunk kernel family of common/gemv.cuh with their format functors;
// the GGUF blocks that are only 2-byte aligned (Q8_0 34 B, Q4_0 18 B, Q4_1 20 B, Q6_K
// 210 B) run k_block_gemv: one block per lane per step, decoded with the shared block
// definitions of ops/gguf_blocks.h into the exact float32 weights the CPU reference
// uses, fp32 sums, the same fixed xor-butterfly and split-K scheme.
#include "common/gemv.cuh"
#include "core/cuda_util.h"
#include "ops/backend.h"
#include "ops/quant_args.h"

namespace gk::cuda {

GK_REGISTER_CUDA_OPS("gemv_fp8", "gemv_int8", "gemv_int4", "gemv_nvf4", "gemv_q8_0", "gemv_q4_0", "gemv_q4_1",
                     "gemv_q4_k", "gemv_q6_k");

namespace {

using namespace gemv_detail;

constexpr int kBRows = 2;  // block kernel: rows per warp

// A 32-weight GGUF block of BB bytes (2-byte aligned) copied to registers as 16-bit words
// and decoded by the shared definition.
template <int F>
__device__ __forceinline__ void block32(const uint8_t* gp, float (&w)[32]) {
  constexpr int BB = F == int(QFormat::q8_0) ? gguf::kQ8_0Bytes : (F == int(QFormat::q4_0) ? gguf::kQ4_0Bytes : gguf::kQ4_1Bytes);
  uint16_t raw[BB / 2];
  const uint16_t* g16 = reinterpret_cast<const uint16_t*>(gp);
#pragma unroll
  for (int h = 0; h < BB / 2; ++h) raw[h] = __ldcs(g16 + h);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(raw);
  if constexpr (F == int(QFormat::q8_0)) gguf::q8_0(b, w);
  else if constexpr (F == int(QFormat::q4_0)) gguf::q4_0(b, w);
  else gguf::q4_1(b, w);
}

template <class T, int F, int MT>
__global__ void __launch_bounds__(kThreads) k_block_gemv(QGemvArgs p) {
  constexpr bool kK = F == int(QFormat::q6_k);
  constexpr int QK = kK ? gguf::kBlockK : gguf::kBlock;
  constexpr int BB = kK ? gguf::kQ6_KBytes
                        : (F == int(QFormat::q8_0) ? gguf::kQ8_0Bytes
                                                   : (F == int(QFormat::q4_0) ? gguf::kQ4_0Bytes : gguf::kQ4_1Bytes));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * kBRows;
  if (row0 >= p.n) return;  // a whole warp leaves; no block barrier below
  const int s = blockIdx.y, S = gridDim.y;
  const int64_t rows[kBRows] = {row0, row0 + 1 < p.n ? row0 + 1 : row0};
  const T* x = static_cast<const T*>(p.x);
  float acc[MT][kBRows];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < kBRows; ++r) acc[i][r] = 0.0f;
  const int64_t nb = p.k / QK;
  const int64_t nch = (nb + 31) / 32;
  const int64_t cps = (nch + S - 1) / S;
  const int64_t c0 = int64_t(s) * cps, c1 = std::min(nch, c0 + cps);
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t blk = c * 32 + lane;
    if (blk >= nb) continue;
#pragma unroll
    for (int r = 0; r < kBRows; ++r) {
      const uint8_t* gb = static_cast<const uint8_t*>(p.q) + rows[r] * p.q_rs + blk * BB;
      if constexpr (kK) {
        for (int i16 = 0; i16 < 16; ++i16) {
          float w[16];
          gguf::q6_k16(gb, i16, w);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            if (i < p.m) {
              const uint4* xv = reinterpret_cast<const uint4*>(x + i * p.x_rs + blk * QK + 16 * i16);
              float a = acc[i][r], xf[8];
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                to_float8<T>(__ldg(xv + hh), xf);
#pragma unroll
                for (int e = 0; e < 8; ++e) a = fmaf(xf[e], w[8 * hh + e], a);
              }
              acc[i][r] = a;
            }
          }
        }
      } else {
        float w[32];
        block32<F>(gb, w);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          if (i < p.m) {
            const uint4* xv = reinterpret_cast<const uint4*>(x + i * p.x_rs + blk * QK);
            float a = acc[i][r], xf[8];
#pragma unroll
            for (int hh = 0; hh < 4; ++hh) {
              to_float8<T>(__ldg(xv + hh), xf);
#pragma unroll
              for (int e = 0; e < 8; ++e) a = fmaf(xf[e], w[8 * hh + e], a);
            }
            acc[i][r] = a;
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < kBRows; ++r) {
      float v = acc[i][r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[i][r] = v;
    }
  if (lane != 0) return;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (i >= p.m) break;
#pragma unroll
    for (int r = 0; r < kBRows; ++r) {
      const int64_t row = row0 + r;
      if (row >= p.n) break;
      if (S == 1) store_out(p.y, p.out_dtype, i * p.n + row, acc[i][r]);
      else p.part[(int64_t(s) * p.m + i) * p.n + row] = acc[i][r];
    }
  }
}

template <class T, int F>
void launch_block(const QGemvArgs& p, cudaStream_t st) {
  const int64_t blocks = (p.n + kWarps * kBRows - 1) / (kWarps * kBRows);
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, p.split)));
  if (p.m <= 1) k_block_gemv<T, F, 1><<<grid, kThreads, 0, st>>>(p);
  else if (p.m <= 2) k_block_gemv<T, F, 2><<<grid, kThreads, 0, st>>>(p);
  else if (p.m <= 4) k_block_gemv<T, F, 4><<<grid, kThreads, 0, st>>>(p);
  else k_block_gemv<T, F, 8><<<grid, kThreads, 0, st>>>(p);
  GK_LAUNCH_CHECK("qgemv_block");
  if (p.split > 1) {
    KArgs k;
    k.part = p.part;
    k.y = p.y;
    k.m = p.m;
    k.n = p.n;
    k.out = p.out_dtype;
    launch_sum(k, p.split, st);
  }
}

template <class F, class T>
void launch_chunks(const QGemvArgs& a, cudaStream_t st) {
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
  launch_family<F, T>(p, a.split, st);
}

template <class T>
void by_format(const QGemvArgs& p, cudaStream_t st) {
  switch (p.fmt) {
    case QFormat::fp8: return launch_chunks<FFp8, T>(p, st);
    case QFormat::int8: return launch_chunks<FInt8, T>(p, st);
    case QFormat::int4: return launch_chunks<FInt4, T>(p, st);
    case QFormat::nvf4: return launch_chunks<FNvf4, T>(p, st);
    case QFormat::q4_k: return launch_chunks<FQ4K, T>(p, st);
    case QFormat::q8_0: return launch_block<T, int(QFormat::q8_0)>(p, st);
    case QFormat::q4_0: return launch_block<T, int(QFormat::q4_0)>(p, st);
    case QFormat::q4_1: return launch_block<T, int(QFormat::q4_1)>(p, st);
    case QFormat::q6_k: return launch_block<T, int(QFormat::q6_k)>(p, st);
  }
  throw ValueError("gemv: unknown quantized format");
}

}  // namespace

int qgemv_split(int64_t n, int64_t k, QFormat f) {
  switch (f) {
    case QFormat::fp8: return split_for(n, chunks_per_row<FFp8>(k));
    case QFormat::int8: return split_for(n, chunks_per_row<FInt8>(k));
    case QFormat::int4: return split_for(n, chunks_per_row<FInt4>(k));
    case QFormat::nvf4: return split_for(n, chunks_per_row<FNvf4>(k));
    case QFormat::q4_k: return split_for(n, chunks_per_row<FQ4K>(k));
    default: {  // block kernel: warps of 2 rows, 32 blocks per lane step
      const int64_t warps = (n + kBRows - 1) / kBRows, target = 132 * 32;
      const int64_t qk = gguf_block_weights(f), steps = (k / qk + 31) / 32;
      int64_t sp = warps >= target ? 1 : target / std::max<int64_t>(warps, 1);
      sp = std::min<int64_t>({sp, 16, std::max<int64_t>(steps / 2, 1)});
      return int(std::max<int64_t>(sp, 1));
    }
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
