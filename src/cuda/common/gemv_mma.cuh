// Decode GEMV of the 4-bit formats on the tensor cores (int4 with group scales and zero
// points, NVF4): decoding 4-bit codes into fp32 on the CUDA cores costs more instructions
// than the H200 can issue at its memory bandwidth, so the codes are turned into exact
// bf16/fp16 values (the activation type) two at a time with a few bit operations, and
// mma.sync.m16n8k16 (fp32 accumulation) multiplies them with up to 8 rows of x.
//
// A warp owns 16 weight rows (lane 4g + t holds rows g and g + 8) and walks k in tiles of
// 4 chunks of 16 bytes per row (128 weights): thread t of the quad loads chunk t of the
// tile of both its rows (streaming 16-byte loads, U tiles ahead), and the 16-byte x piece
// of x row g (m = g < M, else zeros) matching each 8 weights it decodes. In the mma the
// quad's logical k 2t, 2t+1, 2t+8, 2t+9 of k-step (h, s) are weights 8h + 4s + 0..3 of
// thread t's chunk, for A (weights) and B (x) alike. Exactness: the decoded values
// ((q - z) for int4, e2m1 * block scale for NVF4) are exact in bf16/fp16; the group scale
// of int4 is applied to the fp32 tile sums per group (a tile holds 128 / G groups: each
// gets its own accumulator, B masked to its threads); NVF4's tensor scale at the end.
// The kWarpsM warps of a CTA share the 16 rows and interleave tiles; their sums are
// added in warp order. Split-K as in gemv.cuh. Needs K % (4 E) == 0 (E weights per
// 16-byte chunk: 32 for 4-bit codes; 8 for bf16/fp16 weights, MDense, whose words are
// the mma operands as loaded).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemv.cuh"

namespace gk::cuda::gemv_detail {

constexpr int kWarpsM = 4;

template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <class T>
__device__ __forceinline__ uint32_t hsub2u(uint32_t a, uint32_t b) {
  if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat162 r = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
  } else {
    __half2 r = __hsub2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
  }
}
template <class T>
__device__ __forceinline__ uint32_t hmul2u(uint32_t a, uint32_t b) {
  if constexpr (std::is_same_v<T, bf16>) {
    __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
  } else {
    __half2 r = __hmul2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
  }
}
// A float as the 16-bit pattern of T, twice.
template <class T>
__device__ __forceinline__ uint32_t splat(float v) {
  uint16_t h;
  if constexpr (std::is_same_v<T, bf16>) h = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else h = __half_as_ushort(__float2half_rn(v));
  return uint32_t(h) | (uint32_t(h) << 16);
}

// The two 4-bit codes of byte i of u as 16-bit halves [lo nibble, hi nibble] (0..15 each):
// L = u & 0x0f0f0f0f, H = (u >> 4) & 0x0f0f0f0f; selector nibbles 0x8 | i give 0x00 bytes.
__device__ __forceinline__ uint32_t nib_pair(uint32_t L, uint32_t H, int i) {
  return __byte_perm(L, H, uint32_t(i) | ((0x8u | i) << 4) | ((4u + i) << 8) | ((0x8u | i) << 12));
}

// bf16 / fp16 weights (the type of x): the pairs are the loaded words.
template <class T>
struct MDense {
  static constexpr int E = 8;
  struct Side {};
  __device__ static Side side(const KArgs&, int64_t, int64_t) { return {}; }
  __device__ static void pairs(const uint4& raw, const Side&, int, uint32_t (&pr)[4]) {
    pr[0] = raw.x;
    pr[1] = raw.y;
    pr[2] = raw.z;
    pr[3] = raw.w;
  }
  __device__ static float group_scale(const KArgs&, int64_t, int64_t) { return 1.0f; }
  __device__ static float row_scale(const KArgs&, int64_t) { return 1.0f; }
};

// int4: pairs (q - z) exactly; the group scale is applied outside the mma.
template <class T>
struct MInt4 {
  static constexpr int E = 32;
  struct Side {
    uint32_t z2;  // (magic + z) twice
  };
  static constexpr uint32_t kMagic = std::is_same_v<T, bf16> ? 0x4300u : 0x6400u;  // 128.0 bf16, 1024.0 fp16
  __device__ static Side side(const KArgs& p, int64_t row, int64_t chunk) {
    const int64_t g = row * (p.k / p.group) + (chunk * 32) / p.group;
    const uint32_t z = kMagic | uint32_t(__ldg(p.aux + g));
    return {z | (z << 16)};
  }
  // pairs[i] = weights (8h + 2i, 8h + 2i + 1) of the chunk
  __device__ static void pairs(const uint4& raw, const Side& sd, int h, uint32_t (&pr)[4]) {
    const uint32_t u = word(raw, h), L = u & 0x0f0f0f0fu, H = (u >> 4) & 0x0f0f0f0fu;
#pragma unroll
    for (int i = 0; i < 4; ++i) pr[i] = hsub2u<T>(nib_pair(L, H, i) | (kMagic | (kMagic << 16)), sd.z2);
  }
  __device__ static float group_scale(const KArgs& p, int64_t row, int64_t g) {
    return __ldg(p.scales + row * (p.k / p.group) + g);
  }
  __device__ static float row_scale(const KArgs&, int64_t) { return 1.0f; }
};

// NVF4: pairs e2m1 * block scale exactly (both have few significant bits).
template <class T>
struct MNvf4 {
  static constexpr int E = 32;
  struct Side {
    uint32_t s0, s1;  // the chunk's two block scales, twice each, as T
  };
  __device__ static Side side(const KArgs& p, int64_t row, int64_t chunk) {
    const uint8_t* b = p.aux + row * (p.k / 16) + chunk * 2;
    return {splat<T>(FNvf4::e4m3(__ldg(b))), splat<T>(FNvf4::e4m3(__ldg(b + 1)))};
  }
  __device__ static void pairs(const uint4& raw, const Side& sd, int h, uint32_t (&pr)[4]) {
    const uint32_t u = word(raw, h), L = u & 0x0f0f0f0fu, H = (u >> 4) & 0x0f0f0f0fu;
    const uint32_t bs = h < 2 ? sd.s0 : sd.s1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = nib_pair(L, H, i);  // [c0, c1] as 16-bit halves
      uint32_t v;
      if constexpr (std::is_same_v<T, bf16>) {
        // sign << 15 | (e1 e0 m) << 6: e2m1 * 2^-126 (a bf16 subnormal for code 1), times 2^126
        v = ((w & 0x00070007u) << 6) | ((w & 0x00080008u) << 12);
        v = hmul2u<T>(v, 0x7E807E80u);
      } else {
        // sign << 15 | (e1 e0 m) << 9: e2m1 * 2^-14 (a fp16 subnormal for code 1), times 2^14
        v = ((w & 0x00070007u) << 9) | ((w & 0x00080008u) << 12);
        v = hmul2u<T>(v, 0x74007400u);
      }
      pr[i] = hmul2u<T>(v, bs);
    }
  }
  __device__ static float group_scale(const KArgs&, int64_t, int64_t) { return 1.0f; }
  __device__ static float row_scale(const KArgs& p, int64_t) { return __ldg(p.gscale); }
};

// NG: accumulators per tile (int4: 128 / G; NVF4: 1).
template <class F, class T, int NG, int U>
__global__ void __launch_bounds__(kWarpsM * 32) k_mma_gemv(const KArgs p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t ra = row0 + g < p.n ? row0 + g : p.n - 1, rb = row0 + g + 8 < p.n ? row0 + g + 8 : p.n - 1;
  const uint8_t* qa = p.q + ra * p.q_rs;
  const uint8_t* qb = p.q + rb * p.q_rs;
  constexpr int E = F::E, P = E / 8;  // weights per chunk, pieces of 8 per chunk
  const int64_t ntile = p.k / (4 * E);
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t tps = (ntile + S - 1) / S;
  const int64_t t0 = int64_t(s) * tps, t1 = std::min(ntile, t0 + tps);
  const bool xrow = g < p.m;
  const T* xr = static_cast<const T*>(p.x) + (xrow ? g : 0) * p.x_rs;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  constexpr int CPG = 4 / NG;  // chunks (threads of the quad) per group

  for (int64_t T0 = t0 + warp; T0 < t1; T0 += int64_t(kWarpsM) * U) {
    uint4 wa[U], wb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t tt = T0 + int64_t(u) * kWarpsM;
      if (tt < t1) {
        wa[u] = ld_stream(qa + (4 * tt + t) * 16);
        wb[u] = ld_stream(qb + (4 * tt + t) * 16);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t tt = T0 + int64_t(u) * kWarpsM;
      if (tt >= t1) continue;
      const int64_t chunk = 4 * tt + t;
      const typename F::Side sa = F::side(p, ra, chunk), sb = F::side(p, rb, chunk);
      float c[NG][4];
#pragma unroll
      for (int j = 0; j < NG; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
#pragma unroll
      for (int h = 0; h < P; ++h) {
        uint4 xv = make_uint4(0, 0, 0, 0);
        if (xrow) xv = __ldg(reinterpret_cast<const uint4*>(xr + chunk * E + 8 * h));
        uint32_t pa[4], pb[4];
        F::pairs(wa[u], sa, h, pa);
        F::pairs(wb[u], sb, h, pb);
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          const uint32_t a[4] = {pa[2 * st], pb[2 * st], pa[2 * st + 1], pb[2 * st + 1]};
          const uint32_t b0 = word(xv, 2 * st), b1 = word(xv, 2 * st + 1);
#pragma unroll
          for (int j = 0; j < NG; ++j) {
            const bool mine = NG == 1 || t / CPG == j;
            mma16816<T>(c[j], a, mine ? b0 : 0u, mine ? b1 : 0u);
          }
        }
      }
      if constexpr (NG == 1 && !std::is_same_v<F, MInt4<T>>) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] += c[0][e];
      } else {
#pragma unroll
        for (int j = 0; j < NG; ++j) {
          const int64_t grp = tt * NG + j;  // group index along the row (G = 128 / NG)
          const float s_a = F::group_scale(p, ra, grp), s_b = F::group_scale(p, rb, grp);
          acc[0] = fmaf(s_a, c[j][0], acc[0]);
          acc[1] = fmaf(s_a, c[j][1], acc[1]);
          acc[2] = fmaf(s_b, c[j][2], acc[2]);
          acc[3] = fmaf(s_b, c[j][3], acc[3]);
        }
      }
    }
  }
  // acc: (row g, m = 2t), (row g, m = 2t + 1), (row g + 8, m = 2t), (row g + 8, m = 2t + 1)
  __shared__ float red[kWarpsM][32][4];
#pragma unroll
  for (int e = 0; e < 4; ++e) red[warp][lane][e] = acc[e];
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = red[0][lane][e];
#pragma unroll
      for (int w = 1; w < kWarpsM; ++w) v += red[w][lane][e];
      const int m = 2 * t + (e & 1);
      const int64_t row = row0 + g + (e >= 2 ? 8 : 0);
      if (m < p.m && row < p.n) {
        v *= F::row_scale(p, row);
        if (S == 1) store_out(p.y, p.out, m * p.n + row, v);
        else p.part[(int64_t(s) * p.m + m) * p.n + row] = v;
      }
    }
  }
}

// Split for the tensor-core kernel: CTAs of 16 rows; enough CTAs for 8 per SM, at least
// 2 tiles per warp per slice. A function of (N, K, weights per chunk) only.
inline int split_mma(int64_t n, int64_t k, int e = 32) {
  const int64_t ctas = (n + 15) / 16, target = 132 * 8, tiles = k / (4 * e);
  if (ctas >= target) return 1;
  int64_t sp = (target + ctas - 1) / ctas;
  sp = std::min<int64_t>({sp, 16, std::max<int64_t>(tiles / (2 * kWarpsM), 1)});
  return int(std::max<int64_t>(sp, 1));
}

template <class F, class T, int NG>
void launch_mma(const KArgs& p, int split, cudaStream_t st) {
  constexpr int U = 2;
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, split)));
  k_mma_gemv<F, T, NG, U><<<grid, kWarpsM * 32, 0, st>>>(p);
  GK_LAUNCH_CHECK("gemv_mma");
  if (split > 1) launch_sum(p, split, st);
}

}  // namespace gk::cuda::gemv_detail
