// Decode GEMV of the 4-bit formats on the tensor cores (int4 with group scales and zero
// points, NVF4): decoding 4-bit codes into fp32 on the CUDA cores costs more instructions
// than the H200 can issue at its memory bandwidth, so the codes are turned into exact
// bf16/fp16 values (the activation type) two at a time with a few bit operations, and
// mma.sync.m16n8k16 (fp32 accumulation) multiplies them with up to 8 rows of x.
//
// A warp owns 16 weight rows (lane 4g + t holds rows g and g + 8) and walks k in tiles of
// 4 chunks of 16 bytes per row (128 weights): thread t of the quad copies chunk t of the
// tile of both its rows (cp.async into its own ring of F::kStages stages in shared memory,
// kStages - 1 tiles ahead, with the tile's scales / block header), and the 16-byte x piece
// of x row g (m = g < M, else zeros) matching each 8 weights it decodes. In the mma the
// quad's logical k 2t, 2t+1, 2t+8, 2t+9 of k-step (h, s) are weights 8h + 4s + 0..3 of
// thread t's chunk, for A (weights) and B (x) alike. Exactness: the decoded values
// ((q - z) for int4, e2m1 * block scale for NVF4) are exact in bf16/fp16; the group scale
// of int4 is applied to the fp32 tile sums per group (a tile holds 128 / G groups: each
// gets its own accumulator, B masked to its threads); NVF4's tensor scale at the end.
// The warps of a CTA (warps_for: 1..kWarpsM) share the 16 rows and interleave tiles; their sums are
// added in warp order. Split-K as in gemv.cuh. Needs K % (4 E) == 0 (E weights per
// 16-byte chunk: 32 for 4-bit codes; 8 for bf16/fp16 weights, MDense, whose words are
// the mma operands as loaded).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemv.cuh"
#include "ops/gguf_blocks.h"

namespace gk::cuda::gemv_detail {

constexpr int kWarpsM = 8;  // at most this many warps share a CTA's 16 rows (k interleaved)

// Warps per CTA of the 16-row tensor-core kernels: about 16 warps per SM over the whole GPU
// (132 SMs) so that each warp streams a long run of tiles through its ring; at most
// kWarpsM and at most the tiles of a slice. A function of (N, K, split) only, never of M.
inline int warps_for(int64_t n, int64_t tiles_per_slice) {
  const int64_t rb = (n + 15) / 16;
  int64_t w = (132 * 16 + rb / 2) / rb;
  w = std::min<int64_t>(std::max<int64_t>(w, 1), kWarpsM);
  w = std::min<int64_t>(w, std::max<int64_t>(tiles_per_slice, 1));
  return int(w);
}

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
// L = u & 0x0f0f0f0f, H = (u >> 4) & 0x0f0f0f0f; bytes L_i, H_i moved to bytes 0 and 2,
// the other bytes masked off (__byte_perm uses only the low 3 bits of each selector).
__device__ __forceinline__ uint32_t nib_pair(uint32_t L, uint32_t H, int i) {
  return __byte_perm(L, H, uint32_t(i) | ((4u + i) << 8)) & 0x000f000fu;
}

// Functor interface of k_mma_gemv. E: weights per 16-byte chunk; tiles of 4 chunks per row;
// chunk_byte / x_elem: where thread t's chunk of tile tt and its piece h of x lie; side():
// what decoding a chunk needs; pairs(): the exact operand pairs of piece h; kNG
// accumulators per tile, group_of(t, h) the one a piece goes to (possible(j, h): whether
// accumulator j can receive piece h at all); tile_scales(): each accumulator's scale (and
// min, kMin: minus min * sum of x over the group) for a row; row_scale: the final factor.
template <int E_>
struct MSimple {
  static constexpr int E = E_, kNG = 1;
  static constexpr bool kMin = false, kScaled = false;
  static constexpr bool kExtra = false;  // a third 16-byte shared slot per row (extra())
  static constexpr int kStages = 8;      // ring depth (variant 0)
  struct Pre {};                         // side data loaded when a tile is issued (loads only)
  __device__ static Pre pre(const KArgs&, int64_t, int64_t, int) { return {}; }
  __device__ static void extra(const KArgs&, int64_t, int64_t, uint32_t) {}
  __host__ __device__ static int64_t ntile(int64_t k) { return k / (4 * E); }
  __device__ static int64_t chunk_byte(int64_t tt, int t) { return (4 * tt + t) * 16; }
  __device__ static int64_t x_elem(int64_t tt, int t, int h) { return (4 * tt + t) * E + 8 * h; }
  __device__ static int group_of(int, int) { return 0; }
  __host__ __device__ static constexpr bool possible(int, int) { return true; }
  template <int NG>
  __device__ static void tile_scales(int64_t, uint32_t, float (&d)[NG], float (&m)[NG]) {
#pragma unroll
    for (int j = 0; j < NG; ++j) d[j] = 1.0f, m[j] = 0.0f;
  }
};

// bf16 / fp16 weights (the type of x): the pairs are the loaded words.
template <class T>
struct MDense : MSimple<8> {
  struct Side {};
  __device__ static Side side(const Pre&) { return {}; }
  __device__ static void pairs(const uint4& raw, const Side&, int, uint32_t (&pr)[4]) {
    pr[0] = raw.x;
    pr[1] = raw.y;
    pr[2] = raw.z;
    pr[3] = raw.w;
  }
  __device__ static float row_scale(const KArgs&, int64_t) { return 1.0f; }
};

// fp16 pairs of e4m3 / int8 values as T: for bf16, the fp16 bits shifted into bf16's
// exponent and mantissa fields (value * 2^-112; the values have at most 4 / 7 significant
// bits and no fp16 subnormals) times 2^112: exact.
template <class T>
__device__ __forceinline__ uint32_t from_h2(uint32_t h) {
  if constexpr (std::is_same_v<T, f16>) {
    return h;
  } else {
    const uint32_t v = ((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u);
    return hmul2u<T>(v, 0x77807780u);
  }
}

// fp8 e4m3 weights with a scale per row (W8A16 on the tensor cores): pair i of piece h =
// bytes 8h + 2i, 8h + 2i + 1 of the chunk.
template <class T>
struct MFp8 : MSimple<16> {
  struct Side {};
  __device__ static Side side(const Pre&) { return {}; }
  __device__ static void pairs(const uint4& raw, const Side&, int h, uint32_t (&pr)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t u = word(raw, 2 * h + i / 2) >> (16 * (i % 2));
      __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(u & 0xffffu), __NV_E4M3);
      pr[i] = from_h2<T>(uint32_t(r.x) | (uint32_t(r.y) << 16));
    }
  }
  __device__ static float row_scale(const KArgs& p, int64_t row) { return __ldg(p.scales + row); }
};

// int8 weights with a scale per row: (1024 + 128 + b) - 1152 in fp16, exact.
template <class T>
struct MInt8 : MSimple<16> {
  struct Side {};
  __device__ static Side side(const Pre&) { return {}; }
  __device__ static void pairs(const uint4& raw, const Side&, int h, uint32_t (&pr)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t u = word(raw, 2 * h + i / 2) ^ 0x80808080u;
      const uint32_t sel = (i % 2) ? 0x4342u : 0x4140u;  // bytes (0, 1) or (2, 3) under the 0x64 magic
      const uint32_t hb = hsub2u<f16>(__byte_perm(u, 0x64646464u, sel), 0x64806480u);
      pr[i] = from_h2<T>(hb);
    }
  }
  __device__ static float row_scale(const KArgs& p, int64_t row) { return __ldg(p.scales + row); }
};

template <class T>
constexpr uint32_t kMagic4 = std::is_same_v<T, bf16> ? 0x4300u : 0x6400u;  // 128.0 bf16, 1024.0 fp16: + q exact

// int4 with G = 128 / NG: pairs (q - z) exactly; the group scales are applied to the tile's
// accumulators (thread t's chunk is in group t / (4 / NG) of the tile).
template <class T, int NG>
struct MInt4 : MSimple<32> {
  static constexpr int kNG = NG;
  static constexpr bool kScaled = true;
  struct Side {
    uint32_t z2;  // (magic + z) twice
  };
  static constexpr uint32_t kMagic = kMagic4<T>;
  static constexpr bool kExtra = true;  // the tile's NG group scales of the row
  static constexpr int kStages = 4;
  __device__ static int group_of(int t, int) { return t / (4 / NG); }
  struct Pre {
    uint32_t z;  // the chunk's zero point
  };
  __device__ static Pre pre(const KArgs& p, int64_t row, int64_t tt, int t) {
    const int64_t chunk = 4 * tt + t;
    return {uint32_t(__ldg(p.aux + row * (p.k / p.group) + (chunk * 32) / p.group))};
  }
  __device__ static void extra(const KArgs& p, int64_t row, int64_t tt, uint32_t dst) {
#pragma unroll
    for (int j = 0; j < NG; ++j) cp_async4(dst + 4 * j, p.scales + row * (p.k / p.group) + tt * NG + j);
  }
  __device__ static Side side(const Pre& pr) {
    const uint32_t z = kMagic | pr.z;
    return {z | (z << 16)};
  }
  // pairs[i] = weights (8h + 2i, 8h + 2i + 1) of the chunk
  __device__ static void pairs(const uint4& raw, const Side& sd, int h, uint32_t (&pr)[4]) {
    const uint32_t u = word(raw, h), L = u & 0x0f0f0f0fu, H = (u >> 4) & 0x0f0f0f0fu;
#pragma unroll
    for (int i = 0; i < 4; ++i) pr[i] = hsub2u<T>(nib_pair(L, H, i) | (kMagic | (kMagic << 16)), sd.z2);
  }
  __device__ static void tile_scales(int64_t, uint32_t ex, float (&d)[NG], float (&m)[NG]) {
#pragma unroll
    for (int j = 0; j < NG; ++j) {
      d[j] = lds_f32(ex + 4 * j);
      m[j] = 0.0f;
    }
  }
  __device__ static float row_scale(const KArgs&, int64_t) { return 1.0f; }
};

// NVF4: pairs e2m1 * block scale exactly (both have few significant bits); the e2m1 codes
// are looked up 4 at a time with byte permutes.
template <class T>
struct MNvf4 : MSimple<32> {
  static constexpr int kStages = 2;  // faster than 8 on the H200 (checkpoint B: fewer registers)
  struct Side {
    uint32_t s0, s1;  // the chunk's two block scales, twice each, as T
  };
  struct Pre {
    uint32_t b0, b1;  // the chunk's two e4m3 block scale bytes
  };
  __device__ static Pre pre(const KArgs& p, int64_t row, int64_t tt, int t) {
    const uint8_t* b = p.aux + row * (p.k / 16) + (4 * tt + t) * 2;
    return {uint32_t(__ldg(b)), uint32_t(__ldg(b + 1))};
  }
  __device__ static Side side(const Pre& pr) { return {splat<T>(FNvf4::e4m3(pr.b0)), splat<T>(FNvf4::e4m3(pr.b1))}; }
  // e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as T bits, split in low / high byte tables
  // (byte j of the 8-byte table {t1:t0} is entry j; __byte_perm looks 4 codes up at once)
  static constexpr uint32_t kLo0 = std::is_same_v<T, bf16> ? 0xC0800000u : 0u;
  static constexpr uint32_t kLo1 = std::is_same_v<T, bf16> ? 0xC0804000u : 0u;
  static constexpr uint32_t kHi0 = std::is_same_v<T, bf16> ? 0x3F3F3F00u : 0x3E3C3800u;
  static constexpr uint32_t kHi1 = std::is_same_v<T, bf16> ? 0x40404040u : 0x46444240u;
  __device__ static void pairs(const uint4& raw, const Side& sd, int h, uint32_t (&pr)[4]) {
    // pair i = codes 2i (low nibble of byte i) and 2i + 1 (high nibble)
    const uint32_t u = word(raw, h), u4 = u << 4, mags = u & 0x77777777u;  // 3-bit selectors
    const uint32_t bs = h < 2 ? sd.s0 : sd.s1;
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // codes 4 half .. 4 half + 3
      const uint32_t sel = half ? (mags >> 16) : mags;
      const uint32_t lo = __byte_perm(kLo0, kLo1, sel), hi = __byte_perm(kHi0, kHi1, sel);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int i = 2 * half + j;
        // [lo, hi] of code 2i, then of code 2i + 1
        const uint32_t mag = __byte_perm(lo, hi, j ? 0x7362u : 0x5140u);
        // the sign bits: bit 7 of byte i of u << 4 (code 2i) -> bit 15, of u (code 2i + 1) -> bit 31
        const uint32_t sg = __byte_perm(u4, u, uint32_t(i) | (uint32_t(i) << 4) | (uint32_t(i) << 8) |
                                                   (uint32_t(4 + i) << 12));
        pr[i] = hmul2u<T>(mag | (sg & 0x80008000u), bs);
      }
    }
  }
  __device__ static float row_scale(const KArgs& p, int64_t) { return __ldg(p.gscale); }
};

// Q4_K: tiles are the two halves of a block's 8 data chunks (the header chunk is read
// as side data); thread t's chunk j = 4 half + t holds sub-blocks 2c (low nibbles,
// pieces 0-1) and 2c + 1 (high, pieces 2-3), c = j / 2: accumulator 2 (t / 2) + (h >= 2)
// is sub-block 4 half + that. Pairs are the codes q (0..15) exactly; per sub-block the
// sum is d1 * sum(q x) - m1 * sum(x), the sum of x by a second mma with ones.
template <class T>
struct MQ4K : MSimple<32> {
  static constexpr int kNG = 4;
  static constexpr bool kMin = true, kScaled = true;
  static constexpr bool kExtra = true;  // the block's first 16 bytes (d, dmin, scales)
  static constexpr int kStages = 4;
  struct Side {};
  __device__ static void extra(const KArgs& p, int64_t row, int64_t tt, uint32_t dst) {
    cp_async16(dst, p.q + row * p.q_rs + (tt / 2) * 144);
  }
  __host__ __device__ static int64_t ntile(int64_t k) { return k / 256 * 2; }
  __device__ static int64_t chunk_byte(int64_t tt, int t) { return (tt / 2) * 144 + 16 + (4 * (tt % 2) + t) * 16; }
  __device__ static int64_t x_elem(int64_t tt, int t, int h) {
    const int j = int(4 * (tt % 2) + t);  // data chunk of the block: qs bytes 16j .. 16j + 15
    return (tt / 2) * 256 + 64 * (j / 2) + 16 * (j % 2) + (h < 2 ? 8 * h : 32 + 8 * (h - 2));
  }
  __device__ static int group_of(int t, int h) { return 2 * (t / 2) + (h >= 2 ? 1 : 0); }
  __host__ __device__ static constexpr bool possible(int j, int h) { return (j & 1) == (h >= 2 ? 1 : 0); }
  __device__ static Side side(const Pre&) { return {}; }
  __device__ static void pairs(const uint4& raw, const Side&, int h, uint32_t (&pr)[4]) {
    // piece h: bytes 8 (h % 2) .. + 7 of the chunk, low (h < 2) or high nibbles; pair i =
    // bytes 2i, 2i + 1 of the piece
    const int sh = h < 2 ? 0 : 4;
    const uint32_t k2 = kMagic4<T> | (kMagic4<T> << 16);
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const uint32_t u = (word(raw, 2 * (h & 1) + w) >> sh) & 0x0f0f0f0fu;  // 4 codes, one per byte
      pr[2 * w] = hsub2u<T>(__byte_perm(u, 0, 0x5150u) | k2, k2);      // bytes 0, 1
      pr[2 * w + 1] = hsub2u<T>(__byte_perm(u, 0, 0x5352u) | k2, k2);  // bytes 2, 3
    }
  }
  template <int NG>
  __device__ static void tile_scales(int64_t tt, uint32_t ex, float (&d)[NG], float (&m)[NG]) {
    const uint4 hv = lds16(ex);
    const float dd = __half2float(__ushort_as_half(uint16_t(hv.x & 0xffffu)));
    const float dm = __half2float(__ushort_as_half(uint16_t(hv.x >> 16)));
    struct Bytes {
      uint4 v;
      __device__ uint32_t operator[](int i) const { return (word(v, (i + 4) >> 2) >> (8 * ((i + 4) & 3))) & 0xffu; }
    } sb{hv};
#pragma unroll
    for (int j = 0; j < NG; ++j) {
      int sc, mn;
      gguf::k_scale_min(sb, int(4 * (tt % 2)) + j, &sc, &mn);
      d[j] = dd * float(sc);
      m[j] = dm * float(mn);
    }
  }
  __device__ static float row_scale(const KArgs&, int64_t) { return 1.0f; }
};

// NG: accumulators per tile (int4: 128 / G; NVF4: 1). D: stages of the thread's cp.async
// ring (its chunk of rows a and b, and F::extra's bytes), D - 1 tiles ahead.
template <class F, class T, int D>
__global__ void __launch_bounds__(kWarpsM * 32, 2) k_mma_gemv(const KArgs p) {
  constexpr int NG = F::kNG, P = F::E / 8;  // accumulators per tile, pieces of 8 per chunk
  constexpr int NS = F::kExtra ? 4 : 2;     // 16-byte slots per stage
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.x) * 16;
  const int64_t ra = row0 + g < p.n ? row0 + g : p.n - 1, rb = row0 + g + 8 < p.n ? row0 + g + 8 : p.n - 1;
  const uint8_t* qa = p.q + ra * p.q_rs;
  const uint8_t* qb = p.q + rb * p.q_rs;
  const int64_t ntile = F::ntile(p.k);
  const int S = gridDim.y, s = blockIdx.y;
  const int64_t tps = (ntile + S - 1) / S;
  const int64_t t0 = int64_t(s) * tps, t1 = std::min(ntile, t0 + tps);
  const bool xrow = g < p.m;
  const T* xr = static_cast<const T*>(p.x) + (xrow ? g : 0) * p.x_rs;
  const uint32_t ones[4] = {splat<T>(1.0f), splat<T>(1.0f), splat<T>(1.0f), splat<T>(1.0f)};
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  extern __shared__ uint4 ring[];
  const uint32_t base = smem_addr(ring) + uint32_t(threadIdx.x) * 16u;
  auto slot = [&](int st, int i) { return base + uint32_t((st * NS + i) * nw * 32) * 16u; };
  typename F::Pre pra[D], prb[D];
  const int64_t tb = t0 + warp;  // the warp's tiles: tb, tb + nw, ...
  auto issue = [&](int st, int64_t j) {
    const int64_t tt = tb + j * nw;
    if (tt < t1) {
      const int64_t cb = F::chunk_byte(tt, t);
      cp_async16(slot(st, 0), qa + cb);
      cp_async16(slot(st, 1), qb + cb);
      if constexpr (F::kExtra) {
        F::extra(p, ra, tt, slot(st, 2));
        F::extra(p, rb, tt, slot(st, 3));
      }
      pra[st] = F::pre(p, ra, tt, t);
      prb[st] = F::pre(p, rb, tt, t);
    }
    cp_commit();
  };
  auto consume = [&](int st, int64_t tt) {
    const uint4 wa = lds16(slot(st, 0)), wb = lds16(slot(st, 1));
    const typename F::Side sa = F::side(pra[st]), sb = F::side(prb[st]);
    float c[NG][4], xs[F::kMin ? NG : 1][4];
#pragma unroll
    for (int j = 0; j < NG; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < (F::kMin ? NG : 1); ++j) xs[j][0] = xs[j][1] = xs[j][2] = xs[j][3] = 0.0f;
#pragma unroll
    for (int h = 0; h < P; ++h) {
      uint4 xv = make_uint4(0, 0, 0, 0);
      if (xrow) xv = __ldg(reinterpret_cast<const uint4*>(xr + F::x_elem(tt, t, h)));
      uint32_t pa[4], pb[4];
      F::pairs(wa, sa, h, pa);
      F::pairs(wb, sb, h, pb);
      const int mygrp = F::group_of(t, h);
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2) {
        const uint32_t a[4] = {pa[2 * k2], pb[2 * k2], pa[2 * k2 + 1], pb[2 * k2 + 1]};
        const uint32_t b0 = word(xv, 2 * k2), b1 = word(xv, 2 * k2 + 1);
#pragma unroll
        for (int j = 0; j < NG; ++j) {
          if (!F::possible(j, h)) continue;
          const bool mine = NG == 1 || mygrp == j;
          mma16816<T>(c[j], a, mine ? b0 : 0u, mine ? b1 : 0u);
          if constexpr (F::kMin) mma16816<T>(xs[j], ones, mine ? b0 : 0u, mine ? b1 : 0u);
        }
      }
    }
    if constexpr (!F::kScaled) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] += c[0][e];
    } else {
      float da[NG], ma[NG], db[NG], mb[NG];
      F::tile_scales(tt, slot(st, 2), da, ma);
      F::tile_scales(tt, slot(st, 3), db, mb);
#pragma unroll
      for (int j = 0; j < NG; ++j) {
        acc[0] = fmaf(da[j], c[j][0], acc[0]);
        acc[1] = fmaf(da[j], c[j][1], acc[1]);
        acc[2] = fmaf(db[j], c[j][2], acc[2]);
        acc[3] = fmaf(db[j], c[j][3], acc[3]);
        if constexpr (F::kMin) {
          acc[0] = fmaf(-ma[j], xs[j][0], acc[0]);
          acc[1] = fmaf(-ma[j], xs[j][1], acc[1]);
          acc[2] = fmaf(-mb[j], xs[j][2], acc[2]);
          acc[3] = fmaf(-mb[j], xs[j][3], acc[3]);
        }
      }
    }
  };
  pdl_trigger();
#pragma unroll
  for (int st = 0; st < D - 1; ++st) issue(st, st);
  pdl_wait();
  for (int64_t j0 = 0; tb + j0 * nw < t1; j0 += D) {
#pragma unroll
    for (int st = 0; st < D; ++st) {
      issue((st + D - 1) % D, j0 + st + D - 1);
      cp_wait<D - 1>();
      const int64_t tt = tb + (j0 + st) * nw;
      if (tt < t1) consume(st, tt);
    }
  }
  cp_wait<0>();
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
      for (int w = 1; w < nw; ++w) v += red[w][lane][e];
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

// Split for the tensor-core kernel: CTAs of 16 rows and kWarpsM warps; a second pass only
// when there are fewer CTAs than SMs (N < 2112), then about 2 CTAs per SM, at least 2
// tiles per warp per slice. A function of (N, K) only.
inline int split_mma(int64_t n, int64_t tiles) {
  const int64_t ctas = (n + 15) / 16, target = 132 * 2;
  if (ctas >= 132) return 1;
  int64_t sp = (target + ctas - 1) / ctas;
  sp = std::min<int64_t>({sp, 16, std::max<int64_t>(tiles / (2 * kWarpsM), 1)});
  return int(std::max<int64_t>(sp, 1));
}

template <class F, class T, int D>
void launch_mma_d(const KArgs& p, dim3 grid, cudaStream_t st) {
  const int nw = warps_for(p.n, (F::ntile(p.k) + grid.y - 1) / grid.y);
  constexpr int smem_max = D * (F::kExtra ? 4 : 2) * kWarpsM * 32 * 16;
  smem_limit<k_mma_gemv<F, T, D>>(smem_max);
  launch_ex(k_mma_gemv<F, T, D>, grid, nw * 32, D * (F::kExtra ? 4 : 2) * nw * 32 * 16, st, p.variant != 2, p);
}

// variant 0: F::kStages stages per thread; 1: two. Programmatic dependent launch unless
// variant 2.

template <class F, class T>
void launch_mma(const KArgs& p, int split, cudaStream_t st) {
  const int64_t blocks = (p.n + 15) / 16;
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  dim3 grid(unsigned(blocks), unsigned(std::max(1, split)));
  if (p.variant == 1) launch_mma_d<F, T, 2>(p, grid, st);
  else launch_mma_d<F, T, F::kStages>(p, grid, st);
  GK_LAUNCH_CHECK("gemv_mma");
  if (split > 1) launch_sum(p, split, st);
}

}  // namespace gk::cuda::gemv_detail
