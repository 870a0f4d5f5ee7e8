// CUDA attention_decode, head-group form: one CTA per (chunk, group of kv heads,
// sequence), one warp per (kv head, group of up to GB query heads).
//
// The cache layout [.., Hkv, D] puts the heads of one token side by side, so a
// CTA that covers a group of HPC kv heads reads HPC * D contiguous elements per
// token (2 KB for 8 bf16 heads of 128) instead of one 256-byte row per token:
// long contiguous bursts for the memory system. The per-head arithmetic is the
// one of attention_decode.cu's kernel with the token groups of a warp in place
// of the token groups of a CTA: logits of the chunk (LPT = D/16 lanes per row,
// 16 elements each), softmax statistics, p * v, all in a fixed order; the chunk
// boundaries are the same function of the sequence length, and how many heads a
// CTA covers never changes a head's arithmetic, so results stay bitwise
// reproducible and batch independent. Chunk partials go to the workspace merged
// by launch_decode_merge (attention_decode.cu).
#include <algorithm>
#include <cfloat>

#include "cuda/common/attention.cuh"
#include "cuda/common/rows.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

namespace {
constexpr int kMaxWarps = 8;
constexpr int kStagesHG = 4;
constexpr int kStageBytesHG = 16384;

template <class C, int D>
struct HgLayout {
  static constexpr int SZ = int(sizeof(C));
  static constexpr int N = 16 / SZ;     // elements per 16-byte vector
  static constexpr int ROWB = D * SZ;   // bytes of one head row
  static constexpr int NV = ROWB / 16;  // vectors per row
  static constexpr int LPT = D / 16;    // lanes per row
  static constexpr int VPL = NV / LPT;  // vectors per lane
  static constexpr int TPW = 32 / LPT;  // rows per warp step
  static constexpr bool ROT = LPT < 8 && VPL > 1;
};

// Rows per tile for hpc heads per token: a multiple of TPW filling at most one stage.
template <class C, int D>
__host__ __device__ inline int hg_tile_rows(int hpc) {
  using Lt = HgLayout<C, D>;
  int tk = kStageBytesHG / (hpc * Lt::ROWB);
  tk = tk / Lt::TPW * Lt::TPW;
  return tk < Lt::TPW ? Lt::TPW : (tk > 64 ? 64 : tk);
}

template <class T, class C, int D, int GB>
__global__ void __launch_bounds__(32 * kMaxWarps) k_decode_hg(const __grid_constant__ DecodeArgs a, int hpc) {
  using Lt = HgLayout<C, D>;
  constexpr int SZ = Lt::SZ, N = Lt::N, ROWB = Lt::ROWB, NV = Lt::NV, LPT = Lt::LPT, VPL = Lt::VPL, TPW = Lt::TPW;
  constexpr int S = kStagesHG;
  extern __shared__ __align__(16) unsigned char smem[];

  const int G = a.hq / a.hkv, ngb = (G + GB - 1) / GB;
  const int nthr = blockDim.x, nw = nthr / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.z, split = blockIdx.x;
  const int kh0 = blockIdx.y * hpc, nkh = min(hpc, a.hkv - kh0);  // kv heads [kh0, kh0 + nkh)
  const int wkh = warp / ngb, gb = warp % ngb;                    // this warp: kv head kh0 + wkh, q group gb
  const bool active = wkh < nkh;
  const int kvh = kh0 + (active ? wkh : 0);
  const int h0 = kvh * G + gb * GB, nh = active ? min(GB, G - gb * GB) : 0;
  int64_t L, start;
  decode_span(a, b, L, start);
  const int64_t n = L - start;
  const int64_t chunk = decode_chunk(n, a.chunk_min, a.chunk_max, a.target_splits);
  const int64_t nsp = n > 0 ? (n + chunk - 1) / chunk : 0;
  if (split >= nsp) return;
  const int64_t j0 = start + int64_t(split) * chunk;
  const int len = int(min(chunk, L - j0));
  const int TK = hg_tile_rows<C, D>(hpc);
  const int ntile = (len + TK - 1) / TK;

  unsigned char* stage = smem;
  float* sc = reinterpret_cast<float*>(smem + S * kStageBytesHG) + warp * GB * a.chunk_max;  // this warp's logits
  int* rows = reinterpret_cast<int*>(reinterpret_cast<float*>(smem + S * kStageBytesHG) + nw * GB * a.chunk_max);
  const int ld = lane % LPT, tg = lane / LPT;
  const int rot = Lt::ROT ? tg % VPL : 0;
  const C* kc = static_cast<const C*>(a.kc);
  const C* vc = static_cast<const C*>(a.vc);

  for (int t = tid; t < len; t += nthr) rows[t] = int(decode_row(a, b, j0 + t));
  __syncthreads();

  // Tile i < ntile: K of chunk rows [i*TK, i*TK + TK), heads [kh0, kh0 + nkh); then V likewise.
  // Smem tile layout [TK][hpc][D]: one token's heads are contiguous, as in global memory.
  const int nvt = nkh * NV;  // vectors per token
  auto issue = [&](int i) {
    if (i < 2 * ntile) {
      const bool isv = i >= ntile;
      const int r0 = (isv ? i - ntile : i) * TK;
      const C* base = isv ? vc : kc;
      unsigned char* dst = stage + (i % S) * kStageBytesHG;
      for (int c = tid; c < TK * nvt; c += nthr) {
        const int r = c / nvt, v = c - r * nvt;
        const int row = r0 + r < len ? rows[r0 + r] : -1;
        const C* src = row >= 0 ? base + (int64_t(row) * a.hkv + kh0) * D + v * N : base;
        cp_async16(dst + r * hpc * ROWB + v * 16, src, row >= 0);
      }
    }
    cp_async_commit();
  };
  auto voff = [&](int u) { return (((u + rot) % VPL) * LPT + ld) * 16; };

#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(i);

  const float ksc = a.k_scale ? a.k_scale[kvh] : 1.f, vsc = a.v_scale ? a.v_scale[kvh] : 1.f;
  float acc[GB][16];
  {
    float qf[GB][16];
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      const T* q = static_cast<const T*>(a.q) + int64_t(b) * a.q_bs + int64_t(h0 + (g < nh ? g : 0)) * a.q_hs;
#pragma unroll
      for (int u = 0; u < VPL; ++u)
#pragma unroll
        for (int j = 0; j < N; ++j) qf[g][u * N + j] = g < nh ? float(q[voff(u) / SZ + j]) * a.scale * ksc : 0.f;
    }
    for (int i = 0; i < ntile; ++i) {
      cp_async_wait<S - 2>();
      __syncthreads();
      issue(i + S - 1);
      if (!active) continue;
      const unsigned char* buf = stage + (i % S) * kStageBytesHG + wkh * ROWB;
      for (int s0 = 0; s0 < TK; s0 += TPW) {
        const int r = s0 + tg;
        float kf[16];
#pragma unroll
        for (int u = 0; u < VPL; ++u) vec16_to_float<C>(buf + r * hpc * ROWB + voff(u), kf + u * N);
        float dot[GB];
#pragma unroll
        for (int g = 0; g < GB; ++g) {
          float s0_ = 0.f, s1_ = 0.f;
#pragma unroll
          for (int e = 0; e < 16; e += 2) {
            s0_ = fmaf(qf[g][e], kf[e], s0_);
            s1_ = fmaf(qf[g][e + 1], kf[e + 1], s1_);
          }
          float s = s0_ + s1_;
#pragma unroll
          for (int o = LPT / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          dot[g] = s;
        }
        const int t = i * TK + r;
        if (ld == 0 && t < len) {
          const bool ok = rows[t] >= 0;
#pragma unroll
          for (int g = 0; g < GB; ++g) {
            float s = dot[g];
            if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
            if (g < nh) sc[g * a.chunk_max + t] = ok ? s : -INFINITY;
          }
        }
      }
    }
  }
  __syncwarp();
  // Softmax statistics of this warp's heads over the chunk.
  float mh[GB], lh[GB];
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    mh[g] = -INFINITY;
    lh[g] = 0.f;
    if (g >= nh) continue;
    float* s = sc + g * a.chunk_max;
    float m = -INFINITY;
    for (int t = lane; t < len; t += 32) m = fmaxf(m, s[t]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0.f;
    for (int t = lane; t < len; t += 32) {
      const float p = m == -INFINITY ? 0.f : expf(s[t] - m);
      s[t] = p;
      l += p;
    }
    mh[g] = m;
    lh[g] = warp_sum(l);
  }
  __syncwarp();
#pragma unroll
  for (int g = 0; g < GB; ++g)
#pragma unroll
    for (int e = 0; e < 16; ++e) acc[g][e] = 0.f;
  for (int i = ntile; i < 2 * ntile; ++i) {
    cp_async_wait<S - 2>();
    __syncthreads();
    issue(i + S - 1);
    if (!active) continue;
    const unsigned char* buf = stage + (i % S) * kStageBytesHG + wkh * ROWB;
    for (int s0 = 0; s0 < TK; s0 += TPW) {
      const int r = s0 + tg, t = (i - ntile) * TK + r;
      float p[GB];
#pragma unroll
      for (int g = 0; g < GB; ++g) p[g] = g < nh && t < len ? sc[g * a.chunk_max + t] : 0.f;
      float vf[16];
#pragma unroll
      for (int u = 0; u < VPL; ++u) vec16_to_float<C>(buf + r * hpc * ROWB + voff(u), vf + u * N);
#pragma unroll
      for (int g = 0; g < GB; ++g)
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[g][e] = fmaf(p[g], vf[e], acc[g][e]);
    }
  }
  cp_async_wait<0>();
  if (!active) return;
  if constexpr (Lt::ROT) {  // slot u of this lane holds vector (u + rot) % VPL: back to the order of rot = 0
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      float t[16];
#pragma unroll
      for (int cu = 0; cu < VPL; ++cu)
#pragma unroll
        for (int j = 0; j < N; ++j) {
          float x = 0.f;
#pragma unroll
          for (int u = 0; u < VPL; ++u) x = (u + rot) % VPL == cu ? acc[g][u * N + j] : x;
          t[cu * N + j] = x;
        }
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[g][e] = t[e];
    }
  }
#pragma unroll
  for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
    for (int g = 0; g < GB; ++g)
#pragma unroll
      for (int e = 0; e < 16; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
  if (lane >= LPT) return;
  const bool single = nsp == 1;
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    if (g >= nh) continue;
    const int64_t hrow = int64_t(b) * a.hq + h0 + g;
#pragma unroll
    for (int u = 0; u < VPL; ++u)
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const int d = (u * LPT + ld) * N + j;
        const float o = acc[g][u * N + j] * vsc;
        if (single) static_cast<T*>(a.out)[hrow * D + d] = convert<T>(lh[g] > 0.f ? o / lh[g] : 0.f);
        else a.ws_o[(hrow * a.nsplit + split) * D + d] = o;
      }
    if (!single && ld == 0) {
      float* ml = a.ws_ml + (hrow * a.nsplit + split) * 2;
      ml[0] = mh[g];
      ml[1] = lh[g];
    }
  }
}

template <class T, class C, int D, int GB>
void launch_hg(const DecodeArgs& a, cudaStream_t st) {
  const int G = a.hq / a.hkv, ngb = (G + GB - 1) / GB;
  const int hpc = std::max(1, std::min(a.hkv, kMaxWarps / ngb));
  const int nhg = (a.hkv + hpc - 1) / hpc, warps = hpc * ngb;
  if (a.B > 65535) throw ValueError("q: more than 65535 sequences in one decode call");
  if (nhg > 65535) throw ValueError("k_cache: too many kv heads");
  if (a.nb * a.bs > int64_t(INT32_MAX)) throw ValueError("k_cache: more than 2^31 - 1 cache rows");
  auto kern = k_decode_hg<T, C, D, GB>;
  const size_t smem = size_t(kStagesHG) * kStageBytesHG + size_t(warps) * GB * a.chunk_max * sizeof(float) +
                      size_t(a.chunk_max) * sizeof(int);
  if (smem > 48 * 1024) GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid{unsigned(a.nsplit), unsigned(nhg), unsigned(a.B)};
  kern<<<grid, unsigned(32 * warps), smem, st>>>(a, hpc);
  GK_LAUNCH_CHECK("attention_decode_hg");
  launch_decode_merge(a, st);
}
}  // namespace

// The head-group kernel for any supported shape with at most kMaxWarps query-head groups per kv head;
// false (nothing launched) otherwise.
bool attention_decode_hg(const DecodeArgs& a, cudaStream_t st) {
  const int G = a.hq / a.hkv, GB = G == 1 ? 1 : (G == 2 ? 2 : 4);
  if ((G + GB - 1) / GB > kMaxWarps) return false;
  dispatch_float(a.dtype, [&](auto t) {
    using T = decltype(t);
    auto go = [&](auto c) {
      using C = decltype(c);
      auto gd = [&](auto dd) {
        constexpr int D = decltype(dd)::value;
        if (GB == 1) return launch_hg<T, C, D, 1>(a, st);
        if (GB == 2) return launch_hg<T, C, D, 2>(a, st);
        return launch_hg<T, C, D, 4>(a, st);
      };
      switch (a.D) {
        case 64: return gd(std::integral_constant<int, 64>{});
        case 128: return gd(std::integral_constant<int, 128>{});
        default: return gd(std::integral_constant<int, 256>{});
      }
    };
    if (a.cache_dtype == DType::f8e4m3) go(f8e4m3{});
    else go(T{});
  });
  return true;
}

}  // namespace gk::cuda
