// GEMV over the GGUF blocks that are only 2-byte aligned: Q8_0 (34 B), Q4_0 (18 B),
// Q4_1 (20 B), Q6_K (210 B) (layouts: ops/gguf_blocks.h), fp32 sums.
//
// k_span_gemv (rows of 16-byte aligned bytes, the usual case): a warp owns R rows and
// walks them in steps of 32 blocks; each step's bytes (32 * BB per row, a multiple of
// 16) are read with coalesced 16-byte streaming loads into registers one step ahead,
// stored to shared memory, and lane l decodes block l of the step from there with 2-byte
// reads. k_block_gemv (any 2-byte aligned rows): lane l reads block l with 2-byte global
// loads. Both sum lane partials with the fixed xor-butterfly and split k the same way
// (slices of 32-block steps, summed in slice order by the second pass of gemv.cu).
#include "common/gemv.cuh"
#include "common/gemv_gguf.cuh"
#include "core/cuda_util.h"

namespace gk::cuda {

namespace {

using namespace gemv_detail;

template <int F>
struct GB;
template <>
struct GB<int(QFormat::q8_0)> {
  static constexpr int BB = gguf::kQ8_0Bytes, QK = 32, R = 2, W = 8;
};
template <>
struct GB<int(QFormat::q4_0)> {
  static constexpr int BB = gguf::kQ4_0Bytes, QK = 32, R = 4, W = 8;
};
template <>
struct GB<int(QFormat::q4_1)> {
  static constexpr int BB = gguf::kQ4_1Bytes, QK = 32, R = 4, W = 8;
};
template <>
struct GB<int(QFormat::q6_k)> {
  static constexpr int BB = gguf::kQ6_KBytes, QK = 256, R = 1, W = 4;
};

// 16-bit reads of a 2-byte aligned block, from global memory (streaming) or shared memory.
template <bool kGlobal>
__device__ __forceinline__ uint16_t rd16(const uint8_t* p) {
  if constexpr (kGlobal) return __ldcs(reinterpret_cast<const uint16_t*>(p));
  else return *reinterpret_cast<const uint16_t*>(p);
}
template <bool kGlobal>
__device__ __forceinline__ uint32_t rd32(const uint8_t* p) {  // 2-byte aligned: two 16-bit reads
  return __byte_perm(rd16<kGlobal>(p), rd16<kGlobal>(p + 2), 0x5410u);
}
__device__ __forceinline__ float f16bits(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Byte e of u as the exact float (byte - bias): the byte in the low bits of 2^23, minus
// (2^23 + bias). Cheaper than the quarter-rate int-to-float conversion.
__device__ __forceinline__ float byte_f(uint32_t u, int e, float magic_bias) {
  return __uint_as_float(__byte_perm(u, 0x4B00u, 0x5440u + e)) - magic_bias;
}

template <class T, int N>
__device__ __forceinline__ float dot_x(const T* x, const float* w, float a) {
#pragma unroll
  for (int hh = 0; hh < N / 8; ++hh) {
    float xf[8];
    to_float8<T>(__ldg(reinterpret_cast<const uint4*>(x) + hh), xf);
#pragma unroll
    for (int e = 0; e < 8; ++e) a = fmaf(xf[e], w[8 * hh + e], a);
  }
  return a;
}
template <class T, int N>
__device__ __forceinline__ float sum_x(const T* x) {
  float a = 0.0f;
#pragma unroll
  for (int hh = 0; hh < N / 8; ++hh) {
    float xf[8];
    to_float8<T>(__ldg(reinterpret_cast<const uint4*>(x) + hh), xf);
#pragma unroll
    for (int e = 0; e < 8; ++e) a += xf[e];
  }
  return a;
}

// The 32 codes of a Q8_0 / Q4_0 / Q4_1 block as exact floats (Q4_0: q - 8), its scale d
// and (Q4_1) its min m: weight j = d * c[j] (+ m).
template <int F, bool kGlobal>
__device__ __forceinline__ void codes32(const uint8_t* bp, float (&c)[32], float& d, float& mn) {
  d = f16bits(rd16<kGlobal>(bp));
  mn = 0.0f;
  if constexpr (F == int(QFormat::q8_0)) {
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const uint32_t u = rd32<kGlobal>(bp + 2 + 4 * w) ^ 0x80808080u;  // int8 + 128
#pragma unroll
      for (int e = 0; e < 4; ++e) c[4 * w + e] = byte_f(u, e, 8388736.0f);  // 2^23 + 128
    }
  } else {
    constexpr bool kQ41 = F == int(QFormat::q4_1);
    if constexpr (kQ41) mn = f16bits(rd16<kGlobal>(bp + 2));
    const uint8_t* qs = bp + (kQ41 ? 4 : 2);
    const float mb = kQ41 ? 8388608.0f : 8388616.0f;  // 2^23 (+ 8 for Q4_0's offset)
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t u = rd32<kGlobal>(qs + 4 * w);
      const uint32_t lo = u & 0x0f0f0f0fu, hi = (u >> 4) & 0x0f0f0f0fu;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        c[4 * w + e] = byte_f(lo, e, mb);
        c[16 + 4 * w + e] = byte_f(hi, e, mb);
      }
    }
  }
}

// One block's contribution to one row, acc[i] += x[i] . w. The layouts are those of
// ops/gguf_blocks.h; the codes are decoded four per 32-bit word into exact floats, the
// block's scale d multiplies the sum of code * x (Q4_1: plus m * sum of x; Q6_K: d * sc per
// 16 weights): the same products as the exact weights, summed in another order.
template <class T, int F, int MT, bool kGlobal>
__device__ __forceinline__ void block_dot(const QGemvArgs& p, const uint8_t* bp, const T* x, float (&acc)[MT]) {
  if constexpr (F == int(QFormat::q6_k)) {
    const float d = f16bits(rd16<kGlobal>(bp + 208));
    for (int i16 = 0; i16 < 16; ++i16) {
      const int h = i16 / 8, r0 = 16 * (i16 % 8);
      const uint8_t* ql = bp + 64 * h + r0 % 64;
      const uint8_t* qh = bp + 128 + 32 * h + r0 % 32;
      const int sl = 4 * (r0 / 64), sh = 2 * (r0 / 32);
      const float ds = d * float(int8_t(kGlobal ? __ldcs(bp + 192 + i16) : bp[192 + i16]));
      float c[16];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t codes = ((rd32<kGlobal>(ql + 4 * w) >> sl) & 0x0f0f0f0fu) |
                               (((rd32<kGlobal>(qh + 4 * w) >> sh) & 0x03030303u) << 4);  // q + 32
#pragma unroll
        for (int e = 0; e < 4; ++e) c[4 * w + e] = byte_f(codes, e, 8388640.0f);  // 2^23 + 32
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
        if (i < p.m) acc[i] = fmaf(ds, dot_x<T, 16>(x + i * p.x_rs + 16 * i16, c, 0.0f), acc[i]);
    }
  } else {
    float c[32], d, mn;
    codes32<F, kGlobal>(bp, c, d, mn);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i < p.m) {
        const T* xi = x + i * p.x_rs;
        acc[i] = fmaf(d, dot_x<T, 32>(xi, c, 0.0f), acc[i]);
        if constexpr (F == int(QFormat::q4_1)) acc[i] = fmaf(mn, sum_x<T, 32>(xi), acc[i]);
      }
    }
  }
}

template <int MT, int R>
__device__ __forceinline__ void finish(const QGemvArgs& p, int lane, int64_t row0, int s, int S, float (&acc)[R][MT]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      float v = acc[r][i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][i] = v;
    }
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r;
    if (row >= p.n) break;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (i >= p.m) break;
      if (S == 1) store_out(p.y, p.out_dtype, i * p.n + row, acc[r][i]);
      else p.part[(int64_t(s) * p.m + i) * p.n + row] = acc[r][i];
    }
  }
}

// The slice [c0, c1) of the 32-block steps of a row for slice s of S.
__device__ __forceinline__ void slice(int64_t nb, int s, int S, int64_t& c0, int64_t& c1) {
  const int64_t nst = (nb + 31) / 32, cps = (nst + S - 1) / S;
  c0 = int64_t(s) * cps;
  c1 = std::min(nst, c0 + cps);
}

template <class T, int F, int MT>
__global__ void __launch_bounds__(GB<F>::W * 32) k_span_gemv(QGemvArgs p) {
  using B = GB<F>;
  constexpr int BB = B::BB, QK = B::QK, R = B::R, W = B::W;
  constexpr int NCH = BB * 32 / 16;    // 16-byte chunks of a step of one row
  constexpr int NL = (NCH + 31) / 32;  // of them per lane
  __shared__ uint4 stage[W][R][NCH];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (int64_t(blockIdx.x) * W + warp) * R;
  if (row0 >= p.n) return;  // a whole warp leaves; the kernel syncs warps only
  const int s = blockIdx.y, S = gridDim.y;
  const uint8_t* rp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rp[r] = static_cast<const uint8_t*>(p.q) + (row0 + r < p.n ? row0 + r : row0) * p.q_rs;
  const int64_t nb = p.k / QK, rowch = nb * BB / 16;
  int64_t c0, c1;
  slice(nb, s, S, c0, c1);
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MT; ++i) acc[r][i] = 0.0f;
  uint4 buf[R][NL];
  auto load = [&](int64_t c) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NL; ++t) {
        const int idx = t * 32 + lane;
        const int64_t g = c * NCH + idx;
        if (idx < NCH && g < rowch) buf[r][t] = ld_stream(rp[r] + g * 16);
      }
  };
  if (c0 < c1) load(c0);
  const T* x = static_cast<const T*>(p.x);
  for (int64_t c = c0; c < c1; ++c) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NL; ++t) {
        const int idx = t * 32 + lane;
        if (idx < NCH && c * NCH + idx < rowch) stage[warp][r][idx] = buf[r][t];
      }
    __syncwarp();
    if (c + 1 < c1) load(c + 1);
    const int64_t blk = c * 32 + lane;
    if (blk < nb) {
      if constexpr (MT == 1 && QK == 32) {  // one row of x: its 32 values serve the R rows
        float xf[32], xsum = 0.0f;
#pragma unroll
        for (int hh = 0; hh < 4; ++hh) {
          float t8[8];
          to_float8<T>(__ldg(reinterpret_cast<const uint4*>(x + blk * QK) + hh), t8);
#pragma unroll
          for (int e = 0; e < 8; ++e) xf[8 * hh + e] = t8[e];
        }
        if constexpr (F == int(QFormat::q4_1)) {
#pragma unroll
          for (int e = 0; e < 32; ++e) xsum += xf[e];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float cf[32], d, mn;
          codes32<F, false>(reinterpret_cast<const uint8_t*>(stage[warp][r]) + lane * BB, cf, d, mn);
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < 32; ++e) dot = fmaf(xf[e], cf[e], dot);
          acc[r][0] = fmaf(d, dot, acc[r][0]);
          if constexpr (F == int(QFormat::q4_1)) acc[r][0] = fmaf(mn, xsum, acc[r][0]);
        }
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r)
          block_dot<T, F, MT, false>(p, reinterpret_cast<const uint8_t*>(stage[warp][r]) + lane * BB, x + blk * QK,
                                     acc[r]);
      }
    }
    __syncwarp();
  }
  finish<MT, R>(p, lane, row0, s, S, acc);
}

template <class T, int F, int MT>
__global__ void __launch_bounds__(kThreads) k_block_gemv(QGemvArgs p) {
  constexpr int BB = GB<F>::BB, QK = GB<F>::QK, R = 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * R;
  if (row0 >= p.n) return;
  const int s = blockIdx.y, S = gridDim.y;
  const int64_t nb = p.k / QK;
  int64_t c0, c1;
  slice(nb, s, S, c0, c1);
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < MT; ++i) acc[r][i] = 0.0f;
  const T* x = static_cast<const T*>(p.x);
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t blk = c * 32 + lane;
    if (blk >= nb) continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = row0 + r < p.n ? row0 + r : row0;
      block_dot<T, F, MT, true>(p, static_cast<const uint8_t*>(p.q) + row * p.q_rs + blk * BB, x + blk * QK, acc[r]);
    }
  }
  finish<MT, R>(p, lane, row0, s, S, acc);
}

template <class T, int F>
void launch(const QGemvArgs& p, cudaStream_t st) {
  using B = GB<F>;
  auto al16 = [](const void* a) { return reinterpret_cast<uintptr_t>(a) % 16 == 0; };
  const bool span = al16(p.q) && p.q_rs % 16 == 0 && (p.k / B::QK) * B::BB % 16 == 0;
  const int64_t rows = span ? int64_t(B::W) * B::R : int64_t(kWarps) * 2;
  const int64_t blocks = (p.n + rows - 1) / rows;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, p.split)));
  if (span) {
    const int th = B::W * 32;
    if (p.m <= 1) k_span_gemv<T, F, 1><<<grid, th, 0, st>>>(p);
    else if (p.m <= 2) k_span_gemv<T, F, 2><<<grid, th, 0, st>>>(p);
    else if (p.m <= 4) k_span_gemv<T, F, 4><<<grid, th, 0, st>>>(p);
    else k_span_gemv<T, F, 8><<<grid, th, 0, st>>>(p);
  } else {
    if (p.m <= 1) k_block_gemv<T, F, 1><<<grid, kThreads, 0, st>>>(p);
    else if (p.m <= 2) k_block_gemv<T, F, 2><<<grid, kThreads, 0, st>>>(p);
    else if (p.m <= 4) k_block_gemv<T, F, 4><<<grid, kThreads, 0, st>>>(p);
    else k_block_gemv<T, F, 8><<<grid, kThreads, 0, st>>>(p);
  }
  GK_LAUNCH_CHECK("qgemv_gguf");
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

}  // namespace

template <class T>
void launch_gguf(const QGemvArgs& p, cudaStream_t st) {
  switch (p.fmt) {
    case QFormat::q8_0: return launch<T, int(QFormat::q8_0)>(p, st);
    case QFormat::q4_0: return launch<T, int(QFormat::q4_0)>(p, st);
    case QFormat::q4_1: return launch<T, int(QFormat::q4_1)>(p, st);
    case QFormat::q6_k: return launch<T, int(QFormat::q6_k)>(p, st);
    default: throw ValueError("gemv: not a 2-byte aligned GGUF format");
  }
}
template void launch_gguf<bf16>(const QGemvArgs&, cudaStream_t);
template void launch_gguf<f16>(const QGemvArgs&, cudaStream_t);

int gguf_split(int64_t n, int64_t k, QFormat f) {
  // warps of R rows, 32 blocks per step; enough warps to fill the GPU
  const int64_t rpw = f == QFormat::q6_k ? 1 : (f == QFormat::q8_0 ? 2 : 4);  // rows per warp (staged kernel)
  const int64_t warps = (n + rpw - 1) / rpw, target = 132 * 12;
  const int64_t steps = (k / gguf_block_weights(f) + 31) / 32;
  int64_t sp = warps >= target ? 1 : target / std::max<int64_t>(warps, 1);
  sp = std::min<int64_t>({sp, 16, std::max<int64_t>(steps / 2, 1)});
  return int(std::max<int64_t>(sp, 1));
}

}  // namespace gk::cuda
