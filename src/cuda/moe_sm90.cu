// Grouped GEMM of the mixture-of-experts layer on Hopper (sm_90a): y[r] = x[r] w[e(r)]^T for
// rows sorted by expert (offsets[e] .. offsets[e+1] are expert e's rows), bf16 / fp16 inputs,
// fp32 accumulation, fp32 / bf16 / fp16 output, all experts in one launch.
//
// Persistent, warp-specialized: one CTA per multiprocessor, three warpgroups. Each CTA
// first reads the offsets and builds, in shared memory, the prefix over experts of their
// 128-row m-tile counts; a tile index t then decodes to (expert, m-tile, n-tile) on the
// device (nothing is read back to the host, so the launch can be captured in a CUDA graph).
// Tiles are numbered expert by expert, n-tile major and m-tile minor, so that the CTAs
// running at the same time share weight tiles through L2; CTA b takes tiles b, b + G, ...
// Warpgroup 0 is the producer: one thread issues TMA loads of 128 x 64 tiles of x (rows
// offsets[e] + 128 m ..) and BN x 64 tiles of w[e] into an ST-stage ring of 128-byte-swizzled
// buffers that complete on mbarriers, waiting on "empty" barriers before reusing a stage.
// Warpgroups 1 and 2 each own 64 rows of the tile and issue wgmma m64nBNk16 (both operands
// from shared memory, K-major), keeping one k-block in flight, and write their fp32
// accumulators straight to y (rows of other experts and columns past N masked; TMA reads
// zeros past R, N and K). Rows from offsets[E] to R are written as zeros.
//
// Determinism: every output element is computed by one CTA, as a chain of k16 tensor-core
// steps in increasing k; nothing is split or reduced across CTAs. Its value depends only on
// its row of x and its column of w[e], not on the tile shape, the grid or the other rows.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/cuda_util.h"
#include "cuda/common/tma.cuh"
#include "cuda/common/tma_cluster.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/common/wgmma_gemm.cuh"
#include "gpukit/numeric.h"
#include "ops/moe_args.h"

namespace gk::cuda {

#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
namespace {
using namespace sm90;

constexpr int kBM = 128, kBK = 64, kThreads = 384, kMaxE = 1024;

template <int BN>
struct Cfg {
  static constexpr int ST = BN == 256 ? 4 : BN == 128 ? 6 : 8;  // pipeline stages: 192 KB each way
  static constexpr int A_BYTES = kBM * kBK * 2, B_BYTES = BN * kBK * 2, STAGE = A_BYTES + B_BYTES;
  static constexpr int SMEM = ST * STAGE + 1024;  // + alignment slack (1024-byte swizzle atoms)
};

struct Params {
  const int32_t* offsets;  // [e + 1]
  void* y;                 // [r, n]
  int r, n, e, kd;         // n: columns of y
  int half;                // SWIGLU: the row of w[e] where the up projection starts (= n)
  int out_kind;            // 0: float32, 1: bfloat16, 2: float16
  int prefetch;            // > 0: the producer also asks L2 for the w box this many k-blocks ahead,
  int pgroup;              // in groups: every pgroup k-blocks, the boxes of pgroup k-blocks back to back
};

template <class O>
__device__ __forceinline__ void store_pair(void* y, int64_t idx, float a, float b) {
  if constexpr (std::is_same_v<O, float>) {
    *reinterpret_cast<float2*>(static_cast<float*>(y) + idx) = make_float2(a, b);
  } else {
    const uint32_t v = uint32_t(O(a).bits) | (uint32_t(O(b).bits) << 16);
    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(y) + idx) = v;
  }
}

// SWIGLU (moe_mlp's gate-up product): w[e] is [2 half, K] (gate rows, then up rows); a tile
// loads BN / 2 gate rows and the BN / 2 up rows of the same columns, so a thread holds the gate
// and up accumulators of its columns, and writes silu(gate) * up (the formula of the unfused
// epilogue in src/cuda/matmul.cu, same bits) to y [R, half].
//
// CL = 2: clusters of two CTAs take m-tiles 2u and 2u + 1 of an expert at the same n-tile
// (one unit u); each loads its own x tile and half of the w tile, multicast to both, so the
// pair reads w from L2 once. A stage is refilled only after both CTAs' consumers released it
// (each consumer warp arrives on its own and on the peer's empty barrier). A CTA whose m-tile
// lies past its expert still loads and releases, and issues no products.
template <bool BF16, int BN, bool SWIGLU, int CL>
__global__ void __launch_bounds__(kThreads, 1)
    k_grouped_sm90(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap tx,
                   const __grid_constant__ CUtensorMap tw) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<BN>;
  constexpr int ST = C::ST;
  extern __shared__ char smem_raw[];
  __shared__ int32_t s_off[kMaxE + 1];
  __shared__ int32_t s_mp[kMaxE + 1];  // m-tile units of the experts before e
  __shared__ __align__(8) uint64_t bars[2 * ST];  // full[ST], empty[ST]
  const uint32_t sbase = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  auto sA = [&](int s) { return sbase + uint32_t(s) * C::STAGE; };
  auto sB = [&](int s) { return sbase + uint32_t(s) * C::STAGE + C::A_BYTES; };
  const uint32_t b0 = uint32_t(__cvta_generic_to_shared(bars));
  auto full = [&](int s) { return b0 + 8u * s; };
  auto empty = [&](int s) { return b0 + 8u * (ST + s); };

  const int tid = threadIdx.x, wg = tid / 128, lane = tid & 31;
  const int E = p.e, R = p.r, N = p.n;
  const int rank = CL == 2 ? int(cluster_ctarank()) : 0;
  for (int i = tid; i <= E; i += kThreads) s_off[i] = min(max(p.offsets[i], 0), R);  // clamped
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), 8 * CL);  // one arrival per consumer warp (of each CTA of the cluster)
    }
    mbar_fence_init();
  }
  if constexpr (CL == 2) cluster_sync();  // the peer's barriers are initialized before any use
  else __syncthreads();
  // units of CL m-tiles per expert
  auto mtiles = [&](int e) { return (max(s_off[e + 1] - s_off[e], 0) + kBM * CL - 1) / (kBM * CL); };
  if (tid < 32) {  // exclusive prefix of the m-tile counts: a chunk of experts per lane, then a warp scan
    const int chunk = (E + 31) / 32, lo = min(E, lane * chunk), hi = min(E, lo + chunk);
    int sum = 0;
    for (int e = lo; e < hi; ++e) sum += mtiles(e);
    int incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    int run = incl - sum;
    for (int e = lo; e < hi; ++e) {
      s_mp[e] = run;
      run += mtiles(e);
    }
    if (lane == 31) s_mp[E] = incl;
  }
  __syncthreads();
  constexpr int WN = SWIGLU ? BN / 2 : BN;  // columns of y per tile
  const int ntn = (N + WN - 1) / WN, nkb = (p.kd + kBK - 1) / kBK;
  const int total = s_mp[E] * ntn;  // the host bounds (R / 128 + E) * ntn below 2^31
  struct Tile {
    int e, row0, rend, col0;
  };
  auto decode = [&](int t) {
    const int q = t / ntn;  // expert: the last with s_mp[e] * ntn <= t, i.e. s_mp[e] <= q
    int lo = 0, hi = E - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s_mp[mid] <= q) lo = mid;
      else hi = mid - 1;
    }
    const int local = t - s_mp[lo] * ntn, mte = s_mp[lo + 1] - s_mp[lo];
    const int mt = (local % mte) * CL + rank, nt = local / mte;
    return Tile{lo, s_off[lo] + mt * kBM, s_off[lo + 1], nt * WN};
  };

  if (wg == 0) {  // ---- producer ----
    setmaxnreg_dec<40>();
    if (tid == 0) {
      int g = 0;  // k-blocks loaded so far; stage g % ST, its (g / ST)-th use
      for (int t = int(blockIdx.x) / CL; t < total; t += int(gridDim.x) / CL) {
        const Tile tl = decode(t);
        for (int kb = 0; kb < nkb; ++kb, ++g) {
          const int s = g % ST;
          if (g >= ST) mbar_wait(empty(s), uint32_t(g / ST - 1) & 1u);
          mbar_expect_tx(full(s), C::STAGE);  // this CTA's x tile and both halves of the w tile
          tma_load_3d(sA(s), &tx, full(s), kb * kBK, tl.row0, 0);
          // L2 prefetch of this CTA's w rows, p.prefetch k-blocks ahead (adjacent k-blocks of a
          // group back to back: longer runs of each row for the DRAM pages)
          auto prefetch = [&](int wrow) {
            if (p.prefetch <= 0 || kb % p.pgroup != 0) return;
            for (int j = 0; j < p.pgroup && kb + p.prefetch + j < nkb; ++j)
              tma_prefetch_3d(&tw, (kb + p.prefetch + j) * kBK, wrow, tl.e);
          };
          if constexpr (CL == 2) {  // w rows: gate / up halves (SWIGLU) or the two halves of the tile
            const int wrow = SWIGLU ? (rank ? p.half : 0) + tl.col0 : tl.col0 + rank * (BN / 2);
            tma_load_3d_multicast(sB(s) + rank * (BN / 2) * 128, &tw, full(s), kb * kBK, wrow, tl.e, 3);
            prefetch(wrow);
          } else {
            tma_load_3d(sB(s), &tw, full(s), kb * kBK, tl.col0, tl.e);
            prefetch(tl.col0);
            if constexpr (SWIGLU) {
              tma_load_3d(sB(s) + WN * 128, &tw, full(s), kb * kBK, p.half + tl.col0, tl.e);
              prefetch(p.half + tl.col0);
            }
          }
        }
      }
      if constexpr (CL == 2)  // stay until both CTAs released every stage: no arrival targets an exited CTA
        for (int i = 0; i < ST; ++i, ++g)
          if (g >= ST) mbar_wait(empty(g % ST), uint32_t(g / ST - 1) & 1u);
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<232>();
  const int cw = wg - 1, warp = (tid % 128) / 32;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(empty(s));
      if constexpr (CL == 2) mbar_arrive_cluster(empty(s), uint32_t(rank ^ 1));
    }
  };
  int g = 0;
  for (int t = int(blockIdx.x) / CL; t < total; t += int(gridDim.x) / CL) {
    const Tile tl = decode(t);
    // A warpgroup whose 64 rows all lie past the expert's end (the last m-tile of an expert
    // with 64 or fewer rows left) issues no products: the other one gets the tensor cores.
    const bool active = tl.row0 + cw * 64 < tl.rend;  // uniform over the warpgroup
    for (int kb = 0; kb < nkb; ++kb, ++g) {
      const int s = g % ST;
      mbar_wait(full(s), uint32_t(g / ST) & 1u);
      if (active) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const uint64_t da = smem_desc(sA(s) + cw * (64 * 128) + kk * 32, 16, 1024);
          const uint64_t db = smem_desc(sB(s) + kk * 32, 16, 1024);
          mma_ss<BN, BF16>(acc, da, db, (kb | kk) != 0);
        }
        wg_commit();
        wg_wait<1>();  // the previous k-block's products are done: its stage can be refilled
      }
      if (kb > 0) release((g - 1) % ST);
    }
    wg_wait<0>();
    fence_regs(acc);
    release((g - 1) % ST);
    // accumulator of thread (warp, lane): acc[4i + 2h + c] is row 16 warp + lane / 4 + 8 h,
    // column 8 i + 2 (lane % 4) + c of this warpgroup's 64 x BN block
    if (!active) continue;
    const int rb = tl.row0 + cw * 64 + warp * 16 + lane / 4, cb = tl.col0 + 2 * (lane & 3);
    // the two values of fragment i, row half h (SwiGLU applied): columns 8 i + 2 (lane % 4) + {0, 1}
    auto value = [&](int i, int h, float& v0, float& v1) {
      v0 = acc[4 * i + 2 * h];
      v1 = acc[4 * i + 2 * h + 1];
      if constexpr (SWIGLU) {  // the up accumulators sit WN / 8 fragments later
        const float u0 = acc[4 * (i + WN / 8) + 2 * h], u1 = acc[4 * (i + WN / 8) + 2 * h + 1];
        v0 = v0 / (1.0f + expf(-v0)) * u0;
        v1 = v1 / (1.0f + expf(-v1)) * u1;
      }
    };
    auto store = [&](auto tag) {
      using O = decltype(tag);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int gr = rb + 8 * h;
        if (gr >= tl.rend) continue;
        const int64_t rowi = int64_t(gr) * N;
#pragma unroll
        for (int i = 0; i < WN / 8; ++i) {
          const int gc = cb + 8 * i;
          if (gc >= N) continue;  // N is even: both columns or none
          float v0, v1;
          value(i, h, v0, v1);
          store_pair<O>(p.y, rowi + gc, v0, v1);
        }
      }
    };
    // 16-bit output with N % 8 == 0: the four lanes of a quad swap their packed pairs of four
    // fragments (a 4 x 4 transpose by shuffles), so that each lane writes 8 consecutive
    // columns with one 16-byte store instead of four 4-byte ones.
    auto store16 = [&](auto tag) {
      using O = decltype(tag);
      const int q = lane & 3;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int gr = rb + 8 * h;
        const bool row_ok = gr < tl.rend;  // the shuffles need every lane: only the store is skipped
        uint16_t* yrow = static_cast<uint16_t*>(p.y) + int64_t(gr) * N;
#pragma unroll
        for (int i0 = 0; i0 < WN / 8; i0 += 4) {
          uint32_t w[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float v0, v1;
            value(i0 + j, h, v0, v1);
            w[j] = uint32_t(O(v0).bits) | (uint32_t(O(v1).bits) << 16);
          }
          uint32_t o[4] = {0, 0, 0, 0};
#pragma unroll
          for (int r = 0; r < 4; ++r) {  // lane q gets from lane q ^ r its pair of fragment i0 + q
            const int src = q ^ r;
            const uint32_t send = src == 0 ? w[0] : src == 1 ? w[1] : src == 2 ? w[2] : w[3];
            const uint32_t v = r == 0 ? send : __shfl_xor_sync(0xffffffffu, send, r);
#pragma unroll
            for (int t = 0; t < 4; ++t)
              if (t == src) o[t] = v;
          }
          const int gc = tl.col0 + 8 * (i0 + q);
          if (row_ok && gc < N) *reinterpret_cast<uint4*>(yrow + gc) = make_uint4(o[0], o[1], o[2], o[3]);
        }
      }
    };
    const bool vec = N % 8 == 0;
    if (p.out_kind == 0) store(float{});
    else if (p.out_kind == 1) vec ? store16(bf16{}) : store(bf16{});
    else vec ? store16(f16{}) : store(f16{});
  }
  // rows past the last expert's end are zeros
  const int end = s_off[E];
  const int64_t tail = int64_t(R - end) * N, step = int64_t(gridDim.x) * 256;
  for (int64_t i = int64_t(blockIdx.x) * 256 + (tid - 128); i < tail; i += step) {
    const int64_t idx = int64_t(end) * N + i;
    if (p.out_kind == 0) static_cast<float*>(p.y)[idx] = 0.f;
    else static_cast<uint16_t*>(p.y)[idx] = 0;
  }
#else
  __trap();  // launched only when sm_90a code was built (GPUKIT_SM90A)
#endif
}

int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

template <bool BF16, int BN, bool SWIGLU, int CL>
bool launch(const MoeGemmArgs& a, int sms, cudaStream_t st) {
  using C = Cfg<BN>;
  constexpr int WN = SWIGLU ? BN / 2 : BN;
  CUtensorMap mx, mw;
  const uint64_t K = uint64_t(a.kdim), row = K * 2;
  if (!make_tmap_3d(&mx, a.x, BF16, K, uint64_t(a.r), 1, row, row * uint64_t(a.r), kBK, kBM, 1) ||
      !make_tmap_3d(&mw, a.w, BF16, K, uint64_t(a.n), uint64_t(a.e), row, row * uint64_t(a.n), kBK,
                    CL == 2 ? BN / 2 : WN, 1))
    return false;  // the driver refused the shape: the caller falls back
  const int ycols = int(SWIGLU ? a.n / 2 : a.n);
  Params p{a.offsets, a.y, int(a.r), ycols, int(a.e), int(a.kdim), int(a.n / 2),
           a.out_dtype == DType::f32 ? 0 : a.out_dtype == DType::bf16 ? 1 : 2,
           std::clamp(env_int("GPUKIT_MOE_SM90_PREFETCH", 0), 0, 64),
           std::clamp(env_int("GPUKIT_MOE_SM90_PREFETCH_GROUP", 1), 1, 16)};
  // units of CL m-tiles: at most R / (128 CL) + E in all (each expert adds at most one partial unit)
  const int64_t units = (a.r + kBM * CL - 1) / (kBM * CL) + std::min<int64_t>(a.e, a.r);
  const int64_t tiles = units * ((ycols + WN - 1) / WN);
  auto kern = k_grouped_sm90<BF16, BN, SWIGLU, CL>;
  GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
  unsigned grid = unsigned(std::max<int64_t>(1, std::min<int64_t>(tiles, sms)));
  if constexpr (CL == 1) {
    kern<<<grid, kThreads, C::SMEM, st>>>(p, mx, mw);
  } else {
    cudaLaunchConfig_t cfg{};
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = C::SMEM;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = CL;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    // Persistent: no more clusters than can be resident at once (the GPCs may not split into
    // pairs evenly); a cluster that waits for a free pair would run its whole share afterwards.
    static const int resident = [&] {
      cfg.gridDim = dim3(unsigned(CL * (sms / CL)), 1, 1);
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
      }
      return n > 0 ? n : sms / CL;
    }();
    grid = unsigned(CL * std::max<int64_t>(1, std::min<int64_t>(tiles, resident)));
    cfg.gridDim = dim3(grid, 1, 1);
    GK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, p, mx, mw));
  }
  GK_LAUNCH_CHECK("moe_grouped_gemm (sm90 wgmma)");
  if (std::getenv("GPUKIT_MOE_LOG"))
    std::fprintf(stderr,
                 "moe_grouped_gemm: sm90 wgmma kernel%s, BN=%d cluster=%d stages=%d prefetch=%d/%d grid=%u R=%lld "
                 "N=%lld K=%lld E=%lld\n",
                 SWIGLU ? " (swiglu)" : "", BN, CL, C::ST, p.prefetch, p.pgroup, grid, static_cast<long long>(a.r),
                 static_cast<long long>(a.n), static_cast<long long>(a.kdim), static_cast<long long>(a.e));
  return true;
}
}  // namespace
#endif

// Runs the wgmma kernel when it applies: sm_90 device with sm_90a code built, bf16 / fp16,
// K a positive multiple of 8 and N even (TMA strides, paired stores; N / 2 even with
// a.swiglu), 16-byte aligned x and w, and not turned off by GPUKIT_MOE_SM90=0. false: the
// caller runs the mma.sync kernel (or, for a.swiglu, the unfused product and epilogue).
// GPUKIT_MOE_SM90_BN=64|128|256 forces the tile width, GPUKIT_MOE_SM90_CLUSTER=1|2 the cluster
// size (defaults: chosen from the shape).
bool moe_grouped_gemm_sm90(const MoeGemmArgs& a, void* stream) {
#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
  if (a.dtype != DType::bf16 && a.dtype != DType::f16) return false;
  if (a.out_dtype != DType::f32 && a.out_dtype != DType::bf16 && a.out_dtype != DType::f16) return false;
  if (env_int("GPUKIT_MOE_SM90", 1) == 0) return false;
  if (a.kdim <= 0 || a.kdim % 8 != 0 || a.n % 2 != 0 || a.r <= 0 || a.n <= 0) return false;
  if (a.swiglu && a.n % 4 != 0) return false;
  if (a.kdim > INT32_MAX - kBK || a.n > INT32_MAX - 1024 || a.r > INT32_MAX - 1024 || a.e < 1 || a.e > kMaxE)
    return false;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0) return false;
  int dev = 0, major = 0, minor = 0, sms = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  GK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  GK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) return false;
  GK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  sms = std::max(sms, 1);
  // m-tiles: at most R / 128 + E in all (each expert adds at most one partial tile)
  const int64_t mt_bound = (a.r + kBM - 1) / kBM + std::min<int64_t>(a.e, a.r);
  if (mt_bound * ((a.n + 127) / 128) > INT32_MAX) return false;
  // Tile width: the cost of a width is its waves of tiles times a tile's time (a 128 x 128
  // tile takes about 0.55 / 0.9 of a 128 x 256 one); 256 whenever its tiles fit in one wave
  // (few rows: fewer CTAs, each with more bytes in flight, read w faster). The m-tile count
  // is estimated from R and E (the offsets stay on the device). H200, Mixtral shapes: this
  // picks the faster width of 128 / 256 at 1, 32, 512 and 4096 tokens (bench/gemm.py).
  int bn = env_int("GPUKIT_MOE_SM90_BN", 0);
  if (bn != 64 && bn != 128 && bn != 256) {
    const int64_t mt_est = (a.r + kBM - 1) / kBM + std::min<int64_t>(a.e, a.r) / 2;
    auto waves = [&](int64_t w) { return double((mt_est * ((a.n + w - 1) / w) + sms - 1) / sms); };
    bn = waves(256) <= 1 || waves(256) * 0.9 <= waves(128) * 0.55 ? 256 : 128;
  }
  // Clusters of two (w read once per pair of m-tiles) where experts have several m-tiles each;
  // with one or two per expert, a pair's second CTA would idle too often. Off: on the H200
  // (checkpoint B, Mixtral shapes) cluster 2 ran at 0.35-0.65x of cluster 1 at every size.
  constexpr bool kAutoCluster = false;
  int cl = env_int("GPUKIT_MOE_SM90_CLUSTER", 0);
  if (cl != 1 && cl != 2) cl = kAutoCluster && a.r / std::min<int64_t>(a.e, a.r) >= 4 * kBM ? 2 : 1;
  if (sms < 2) cl = 1;
  auto st = static_cast<cudaStream_t>(stream);
  auto go = [&](auto bnt, auto swt) {
    constexpr int B = decltype(bnt)::value;
    constexpr bool S = decltype(swt)::value;
    if (a.dtype == DType::bf16)
      return cl == 2 ? launch<true, B, S, 2>(a, sms, st) : launch<true, B, S, 1>(a, sms, st);
    return cl == 2 ? launch<false, B, S, 2>(a, sms, st) : launch<false, B, S, 1>(a, sms, st);
  };
  using W256 = std::integral_constant<int, 256>;
  using W128 = std::integral_constant<int, 128>;
  using W64 = std::integral_constant<int, 64>;  // only when asked for (GPUKIT_MOE_SM90_BN=64)
  if (a.swiglu)
    return bn == 256 ? go(W256{}, std::true_type{}) : bn == 128 ? go(W128{}, std::true_type{}) : go(W64{}, std::true_type{});
  return bn == 256 ? go(W256{}, std::false_type{}) : bn == 128 ? go(W128{}, std::false_type{}) : go(W64{}, std::false_type{});
#else
  (void)a;
  (void)stream;
  return false;
#endif
}

}  // namespace gk::cuda
