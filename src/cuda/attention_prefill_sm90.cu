// attention_prefill on Hopper tensor cores (wgmma, sm_90a), bf16 / fp16: the
// dispatch (attention_prefill_sm90, called by the CUDA prefill front end) and the
// simpler of the two kernels; the default is the warp-specialized TMA kernel of
// attention_prefill_sm90_ws.cu, this one runs where tensor maps are refused.
//
// One CTA per (query head, query tile of BM = 64 * kWG rows of one sequence);
// kWG warpgroups, each owning 64 query rows. All threads copy Q once and then
// K / V tiles of BN keys (cp.async, 16-byte chunks, zero-filled past the
// sequence) into 128-byte-swizzled shared memory, two stages deep. Per key tile,
// each warpgroup computes S = Q K^T with wgmma (fp32 accumulators in registers),
// masks it (causal / window / sequence end) only on the tiles that need it,
// runs the online softmax in registers with exp2 (fp32), converts P to the
// storage type in registers and accumulates O += P V with wgmma (A from
// registers, V read N-major from shared memory). The key tiles of a query tile
// are visited in increasing order and each output row is written by one thread
// of one CTA: results are bitwise reproducible and a sequence's output does not
// depend on the rest of the batch.
//
// Tiles are numbered so that blockIdx.y = 0 is a sequence's last (longest,
// under causal masking) query tile: the longest work is scheduled first.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/cuda_util.h"
#include "cuda/common/wgmma.cuh"
#include "cuda/common/wgmma_attn.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
namespace {
using namespace sm90;

constexpr int kWG = 2;  // consumer warpgroups per CTA

template <int D>
struct Cfg {
  static constexpr int BM = 64 * kWG;
  static constexpr int BN = D == 256 ? 64 : 128;
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int KV_BYTES = BN * D * 2;
  static constexpr int SMEM = Q_BYTES + 4 * KV_BYTES + 1024;  // K, V x 2 stages; + alignment slack
  static constexpr int THREADS = 128 * kWG;
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Copies rows [0, valid) of an R x D tile (row stride `ld` elements) into the
// swizzled layout at `dst`; rows >= valid are zero-filled (no global read).
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(uint32_t dst, const uint16_t* src, int64_t ld, int valid,
                                          const uint16_t* safe, int tid) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  static_assert((R * CPR) % NT == 0, "tile must split evenly over the threads");
#pragma unroll
  for (int u = 0; u < R * CPR / NT; ++u) {
    const int i = u * NT + tid, r = i / CPR, c = i % CPR;
    const uint32_t s = dst + (c / 8) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    const bool ok = r < valid;
    cp_async16(s, ok ? static_cast<const void*>(src + r * ld + c * 8) : static_cast<const void*>(safe), ok ? 16 : 0);
  }
}

template <bool BF16, int D>
__global__ void __launch_bounds__(Cfg<D>::THREADS, 1) k_prefill_sm90(const __grid_constant__ PrefillArgs a) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Cfg<D>;
  constexpr int BM = C::BM, BN = C::BN, NT = C::THREADS;
  extern __shared__ char smem_raw[];
  __shared__ int sh_find[2];
  const uint32_t sbase = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t sQ = sbase;
  auto sK = [&](int s) { return sbase + C::Q_BYTES + s * C::KV_BYTES; };
  auto sV = [&](int s) { return sbase + C::Q_BYTES + (2 + s) * C::KV_BYTES; };

  const int h = blockIdx.x, tid = threadIdx.x;
  SeqTile t;
  if (!find_tile<BM>(a, int(blockIdx.y), t, sh_find)) return;
  const int kvh = h / (a.hq / a.hkv);
  const int wg = tid / 128, wt = tid % 128, warp = wt / 32, lane = tid & 31;

  // Key range of the tile: rows m0 .. mlast (sequence-relative query rows).
  const RowRange rr{t.Lk - t.Lq, t.Lk, a.window, a.causal};
  const int64_t mlast = min(int64_t(t.m0) + BM, t.Lq) - 1;
  const int kv_lo = rr.lo(t.m0), kv_hi = rr.hi(mlast);
  const int hi_first = rr.hi(t.m0), lo_last = rr.lo(mlast);
  const int n_begin = kv_hi > kv_lo ? kv_lo / BN : 0;
  const int n_end = kv_hi > kv_lo ? (kv_hi + BN - 1) / BN : 0;

  const uint16_t* qg = static_cast<const uint16_t*>(a.q) + (t.q0 + t.m0) * a.q_ts + int64_t(h) * a.q_hs;
  const uint16_t* kg = static_cast<const uint16_t*>(a.k) + t.k0 * a.k_ts + int64_t(kvh) * a.k_hs;
  const uint16_t* vg = static_cast<const uint16_t*>(a.v) + t.k0 * a.v_ts + int64_t(kvh) * a.v_hs;
  const uint16_t* safe = static_cast<const uint16_t*>(a.k);

  load_tile<BM, D, NT>(sQ, qg, a.q_ts, int(mlast - t.m0 + 1), safe, tid);
  auto load_kv = [&](int n, int s) {
    const int j0 = n * BN;
    const int valid = int(min(int64_t(BN), t.Lk - j0));
    load_tile<BN, D, NT>(sK(s), kg + j0 * a.k_ts, a.k_ts, valid, safe, tid);
    load_tile<BN, D, NT>(sV(s), vg + j0 * a.v_ts, a.v_ts, valid, safe, tid);
  };
  if (n_begin < n_end) load_kv(n_begin, 0);
  cp_commit();

  // This thread's two rows (sequence-relative) and its column offset in a tile.
  const int64_t r0 = t.m0 + wg * 64 + warp * 16 + lane / 4, r1 = r0 + 8;
  const int cq = 2 * (lane & 3);
  const int lo0 = rr.lo(r0), lo1 = rr.lo(r1), hi0 = rr.hi(r0), hi1 = rr.hi(r1);
  const SoftmaxParams sp(a);

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  RowState st;

  for (int n = n_begin, it = 0; n < n_end; ++n, ++it) {
    const int s = it & 1;
    cp_wait_all();
    fence_async_smem();
    __syncthreads();  // tile n landed for everyone; everyone is done with stage s^1
    if (n + 1 < n_end) load_kv(n + 1, s ^ 1);
    cp_commit();

    float p[BN / 2];
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t dq = smem_desc(sQ + (kk / 4) * (BM * 128) + wg * (64 * 128) + (kk % 4) * 32, 16, 1024);
      const uint64_t dk = smem_desc(sK(s) + (kk / 4) * (BN * 128) + (kk % 4) * 32, 16, 1024);
      mma_ss<BN, BF16>(p, dq, dk, kk > 0);
    }
    wg_commit();
    wg_wait<0>();
    fence_regs(p);

    const int j0 = n * BN;
    float al0, al1;
    softmax_step<BN>(p, st, sp, j0 + BN > hi_first || j0 < lo_last, j0, cq, lo0, hi0, lo1, hi1, al0, al1);
    rescale(o, al0, al1);
    // O += P V, one k16 step per 16 keys.
    uint32_t pa[BN / 16][4];
    to_a_frags<BN, BF16>(p, pa);
    wg_fence();
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      const uint64_t dv = smem_desc(sV(s) + j * (16 * 128), BN * 128, 1024);
      mma_rs_mn<D, BF16>(o, pa[j], dv, 1);
    }
    wg_commit();
    wg_wait<0>();
    fence_regs(o);
  }
  cp_wait_all();  // no copy may still target shared memory at exit

  // Epilogue: O / l, rows past the sequence end are not written.
  uint16_t* og = static_cast<uint16_t*>(a.out) + (t.q0 * a.hq + h) * int64_t(D);
  store_rows<D, BF16>(o, st, og, int64_t(a.hq) * D, r0, t.Lq, cq);
#else
  __trap();  // launched only when sm_90a code was built (GPUKIT_SM90A)
#endif
}

template <bool BF16, int D>
void launch(const PrefillArgs& a, unsigned ny, cudaStream_t st) {
  using C = Cfg<D>;
  // Per call: the attribute belongs to the current device's context.
  GK_CUDA_CHECK(cudaFuncSetAttribute(k_prefill_sm90<BF16, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
  dim3 grid{unsigned(a.hq), ny, 1u};
  k_prefill_sm90<BF16, D><<<grid, C::THREADS, C::SMEM, st>>>(a);
  GK_LAUNCH_CHECK("attention_prefill_sm90");
}

// GPUKIT_PREFILL_SM90 in the environment (read per call, so tests and benchmarks
// can compare): "0" turns the wgmma kernels off (generic kernel), "1" selects
// this cp.async kernel, "2" the warp-specialized TMA kernel, "3" the same with
// ping-pong scheduling of its consumer warpgroups, "4" ping-pong with three K/V
// stages, "5" ping-pong in a persistent grid (one sequence only; with
// cu_seqlens it runs as "3"), "6" persistent with three stages. Default: "5"
// (H200, 2026-11-30 checkpoint B, causal bf16 H=32 D=128, timed one call after the
// other: 245 / 516 / 554 TFLOP/s at S = 1K / 4K / 16K against 228 / 505 / 556 for "3";
// interleaved with torch SDPA: 316 / 544 / 590 against its best form's 249 / 469 / 546).
int variant_from_env() {
  const char* e = std::getenv("GPUKIT_PREFILL_SM90");
  if (e && e[0] >= '0' && e[0] <= '6' && e[1] == 0) return e[0] - '0';
  return 5;
}
// GPUKIT_PREFILL_SM90_HS: heads per section of the persistent order (0: all heads, the default;
// "-1" / "l2": sized for L2); GPUKIT_PREFILL_SM90_PROF set (not "0"): the persistent bf16
// head_dim 128 kernel runs its cycle-profile build and prints the profile (stderr; it waits for
// the kernel: bench / diagnosis only).
sm90::WsTuning tuning_from_env() {
  sm90::WsTuning tu;
  if (const char* e = std::getenv("GPUKIT_PREFILL_SM90_HS")) tu.hs = std::strcmp(e, "l2") == 0 ? -1 : std::atoi(e);
  if (const char* e = std::getenv("GPUKIT_PREFILL_SM90_PROF")) tu.prof = e[0] != 0 && std::strcmp(e, "0") != 0;
  return tu;
}
// GPUKIT_PREFILL_SM90_LOG set: one stderr line per call naming the kernel that ran.
void log_choice(const PrefillArgs& a, const char* kernel) {
  if (!std::getenv("GPUKIT_PREFILL_SM90_LOG")) return;
  std::fprintf(stderr, "attention_prefill: %s kernel, D=%d Tq=%lld Tk=%lld hq=%d hkv=%d B=%d\n", kernel, a.D,
               static_cast<long long>(a.Tq), static_cast<long long>(a.Tk), a.hq, a.hkv, a.B);
}
}  // namespace
#endif

// attention_prefill_sm90_ws.cu
bool attention_prefill_sm90_ws(const PrefillArgs& a, bool pingpong, int stages, bool persist, const sm90::WsTuning& tu,
                               void* stream);

// Runs a wgmma kernel when one applies (sm_90 device, sm_90a code built,
// bf16/fp16, head_dim 64/128/256, 16-byte aligned rows): the warp-specialized
// TMA kernel, else this one; false: the caller runs the generic kernel.
bool attention_prefill_sm90(const PrefillArgs& a, void* stream) {
#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
  if (a.dtype != DType::bf16 && a.dtype != DType::f16) return false;
  if (a.D != 64 && a.D != 128 && a.D != 256) return false;
  const int variant = variant_from_env();
  if (variant == 0) return false;
  int dev = 0, major = 0, minor = 0;
  GK_CUDA_CHECK(cudaGetDevice(&dev));
  GK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  GK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) return false;
  for (const void* p : {a.q, a.k, a.v, static_cast<const void*>(a.out)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  for (int64_t s : {a.q_ts, a.q_hs, a.k_ts, a.k_hs, a.v_ts, a.v_hs})
    if (s % 8 != 0) return false;
  constexpr int BM = 64 * kWG;
  const int64_t ny = (a.Tq + BM - 1) / BM + (a.cu_q ? a.B : 0);
  if (ny > 65535 || a.hq > 65535 || ny <= 0) return false;
  if (a.Tq > INT32_MAX - 1024 || a.Tk > INT32_MAX - 1024) return false;  // 32-bit key indices in the kernels
  const int stages = variant == 4 || variant == 6 ? 3 : 2;
  if (variant >= 2 && attention_prefill_sm90_ws(a, variant >= 3, stages, variant >= 5, tuning_from_env(), stream)) {
    static const char* names[] = {"", "", "sm90 warp-specialized", "sm90 warp-specialized ping-pong",
                                  "sm90 warp-specialized ping-pong 3-stage",
                                  "sm90 warp-specialized ping-pong persistent",
                                  "sm90 warp-specialized ping-pong persistent 3-stage"};
    log_choice(a, names[variant]);
    return true;
  }
  log_choice(a, "sm90 cp.async");
  auto st = static_cast<cudaStream_t>(stream);
  const bool bf = a.dtype == DType::bf16;
  switch (a.D) {
    case 64: bf ? launch<true, 64>(a, unsigned(ny), st) : launch<false, 64>(a, unsigned(ny), st); break;
    case 128: bf ? launch<true, 128>(a, unsigned(ny), st) : launch<false, 128>(a, unsigned(ny), st); break;
    default: bf ? launch<true, 256>(a, unsigned(ny), st) : launch<false, 256>(a, unsigned(ny), st); break;
  }
  return true;
#else
  (void)a;
  (void)stream;
  return false;
#endif
}

}  // namespace gk::cuda
