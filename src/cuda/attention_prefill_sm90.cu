// attention_prefill on Hopper tensor cores (wgmma, sm_90a), bf16 / fp16.
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>

#include "core/cuda_util.h"
#include "cuda/common/wgmma.cuh"
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
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

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

template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
  }
}

struct SeqTile {
  int64_t q0, k0;  // token offsets of the sequence in q / k
  int64_t Lq, Lk;
  int m0;          // first query row of the tile (sequence-relative)
  bool kv_ok;      // the key range is valid (else the rows get zeros)
};

// Finds the (sequence, query tile) of tile index y (in sequence order, each
// sequence's tiles last-first). Warp 0 scans cu_seqlens_q; false: no tile.
template <int BM>
__device__ bool find_tile(const PrefillArgs& a, int y, SeqTile& t, int* sh) {
  if (!a.cu_q) {
    const int nblk = int((a.Tq + BM - 1) / BM);
    if (y >= nblk) return false;
    t = SeqTile{0, 0, a.Tq, a.Tk, (nblk - 1 - y) * BM, true};
    return true;
  }
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid < 32) {
    int found_b = -1, found_local = 0;
    int64_t run = 0;
    for (int base = 0; base < a.B; base += 32) {
      const int b = base + lane;
      int64_t cnt = 0;
      if (b < a.B) {
        const int64_t q0 = a.cu_q[b], q1 = a.cu_q[b + 1];
        if (q0 >= 0 && q1 >= q0 && q1 <= a.Tq) cnt = (q1 - q0 + BM - 1) / BM;
      }
      int64_t incl = cnt;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const int64_t lo = run + incl - cnt, hi = run + incl;
      const unsigned hit = __ballot_sync(0xffffffffu, y >= lo && y < hi);
      if (hit) {
        const int src = __ffs(hit) - 1;
        found_b = base + src;
        found_local = int(y - __shfl_sync(0xffffffffu, lo, src));
        break;
      }
      run += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
      sh[0] = found_b;
      sh[1] = found_local;
    }
  }
  __syncthreads();
  const int b = sh[0], local = sh[1];
  if (b < 0) return false;
  const int64_t q0 = a.cu_q[b], q1 = a.cu_q[b + 1], k0 = a.cu_k[b], k1 = a.cu_k[b + 1];
  const int nblk = int((q1 - q0 + BM - 1) / BM);
  t.q0 = q0;
  t.Lq = q1 - q0;
  t.kv_ok = k0 >= 0 && k1 >= k0 && k1 <= a.Tk;
  t.k0 = t.kv_ok ? k0 : 0;
  t.Lk = t.kv_ok ? k1 - k0 : 0;
  t.m0 = (nblk - 1 - local) * BM;
  return true;
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
  const int64_t off = t.Lk - t.Lq;  // query i sits at key position i + off
  const int64_t mlast = min(int64_t(t.m0) + BM, t.Lq) - 1;
  auto row_hi = [&](int64_t i) { return a.causal ? min(i + off + 1, t.Lk) : t.Lk; };
  auto row_lo = [&](int64_t i) { return a.window > 0 ? max(i + off - a.window + 1, int64_t(0)) : int64_t(0); };
  const int64_t kv_lo = row_lo(t.m0), kv_hi = row_hi(mlast);
  const int64_t hi_first = row_hi(t.m0), lo_last = row_lo(mlast);
  const int n_begin = kv_hi > kv_lo ? int(kv_lo / BN) : 0;
  const int n_end = kv_hi > kv_lo ? int((kv_hi + BN - 1) / BN) : 0;

  const uint16_t* qg = static_cast<const uint16_t*>(a.q) + (t.q0 + t.m0) * a.q_ts + int64_t(h) * a.q_hs;
  const uint16_t* kg = static_cast<const uint16_t*>(a.k) + t.k0 * a.k_ts + int64_t(kvh) * a.k_hs;
  const uint16_t* vg = static_cast<const uint16_t*>(a.v) + t.k0 * a.v_ts + int64_t(kvh) * a.v_hs;
  const uint16_t* safe = static_cast<const uint16_t*>(a.k);

  load_tile<BM, D, NT>(sQ, qg, a.q_ts, int(mlast - t.m0 + 1), safe, tid);
  auto load_kv = [&](int n, int s) {
    const int64_t j0 = int64_t(n) * BN;
    const int valid = int(min(int64_t(BN), t.Lk - j0));
    load_tile<BN, D, NT>(sK(s), kg + j0 * a.k_ts, a.k_ts, valid, safe, tid);
    load_tile<BN, D, NT>(sV(s), vg + j0 * a.v_ts, a.v_ts, valid, safe, tid);
  };
  if (n_begin < n_end) load_kv(n_begin, 0);
  cp_commit();

  // This thread's two rows (sequence-relative) and its column offset in a tile.
  const int64_t r0 = t.m0 + wg * 64 + warp * 16 + lane / 4, r1 = r0 + 8;
  const int cq = 2 * (lane & 3);
  const int64_t lo0 = row_lo(r0), lo1 = row_lo(r1), hi0 = row_hi(r0), hi1 = row_hi(r1);
  const bool cap = a.softcap > 0.f;
  const float l2e = 1.4426950408889634f;
  const float sc = cap ? a.scale / a.softcap : a.scale * l2e;
  const float cap_l2e = a.softcap * l2e;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m_0 = -INFINITY, m_1 = -INFINITY, l_0 = 0.f, l_1 = 0.f;

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

    // Scale (log2 units), cap, mask.
    const int64_t j0 = int64_t(n) * BN;
    const bool need_mask = j0 + BN > hi_first || j0 < lo_last;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      float x = p[i];
      x = cap ? cap_l2e * tanhf(x * sc) : x * sc;
      if (need_mask) {
        const int64_t j = j0 + 8 * (i / 4) + cq + (i & 1);
        const bool second = (i & 2) != 0;
        const int64_t lo = second ? lo1 : lo0, hi = second ? hi1 : hi0;
        if (j < lo || j >= hi) x = -INFINITY;
      }
      p[i] = x;
    }
    // Online softmax over the two rows.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 4) {
      mx0 = fmaxf(mx0, fmaxf(p[i], p[i + 1]));
      mx1 = fmaxf(mx1, fmaxf(p[i + 2], p[i + 3]));
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    const float mn0 = fmaxf(m_0, mx0), mn1 = fmaxf(m_1, mx1);
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    const float al0 = ex2(m_0 - mu0), al1 = ex2(m_1 - mu1);
    m_0 = mn0;
    m_1 = mn1;
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 4) {
      p[i] = ex2(p[i] - mu0);
      p[i + 1] = ex2(p[i + 1] - mu0);
      p[i + 2] = ex2(p[i + 2] - mu1);
      p[i + 3] = ex2(p[i + 3] - mu1);
      s0 += p[i] + p[i + 1];
      s1 += p[i + 2] + p[i + 3];
    }
    l_0 = l_0 * al0 + s0;
    l_1 = l_1 * al1 + s1;
#pragma unroll
    for (int i = 0; i < D / 2; i += 4) {
      o[i] *= al0;
      o[i + 1] *= al0;
      o[i + 2] *= al1;
      o[i + 3] *= al1;
    }
    // O += P V, one k16 step per 16 keys.
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      pa[j][0] = pack2<BF16>(p[8 * j + 0], p[8 * j + 1]);
      pa[j][1] = pack2<BF16>(p[8 * j + 2], p[8 * j + 3]);
      pa[j][2] = pack2<BF16>(p[8 * j + 4], p[8 * j + 5]);
      pa[j][3] = pack2<BF16>(p[8 * j + 6], p[8 * j + 7]);
    }
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
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l_0 += __shfl_xor_sync(0xffffffffu, l_0, o2);
    l_1 += __shfl_xor_sync(0xffffffffu, l_1, o2);
  }
  const float inv0 = l_0 > 0.f ? 1.f / l_0 : 0.f, inv1 = l_1 > 0.f ? 1.f / l_1 : 0.f;
  uint16_t* og = static_cast<uint16_t*>(a.out) + (t.q0 * a.hq + h) * int64_t(D);
  const int64_t ors = int64_t(a.hq) * D;
#pragma unroll
  for (int i = 0; i < D / 2; i += 4) {
    const int col = 8 * (i / 4) + cq;
    if (r0 < t.Lq) *reinterpret_cast<uint32_t*>(og + r0 * ors + col) = pack2<BF16>(o[i] * inv0, o[i + 1] * inv0);
    if (r1 < t.Lq) *reinterpret_cast<uint32_t*>(og + r1 * ors + col) = pack2<BF16>(o[i + 2] * inv1, o[i + 3] * inv1);
  }
#else
  __trap();  // launched only when sm_90a code was built (GPUKIT_SM90A)
#endif
}

template <bool BF16, int D>
void launch(const PrefillArgs& a, unsigned ny, cudaStream_t st) {
  using C = Cfg<D>;
  static const bool attr_set = [] {
    GK_CUDA_CHECK(cudaFuncSetAttribute(k_prefill_sm90<BF16, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
    return true;
  }();
  (void)attr_set;
  dim3 grid{unsigned(a.hq), ny, 1u};
  k_prefill_sm90<BF16, D><<<grid, C::THREADS, C::SMEM, st>>>(a);
  GK_LAUNCH_CHECK("attention_prefill_sm90");
}

bool disabled_by_env() {
  static const bool off = [] {
    const char* e = std::getenv("GPUKIT_PREFILL_SM90");
    return e && std::strcmp(e, "0") == 0;
  }();
  return off;
}
}  // namespace
#endif

// Runs the wgmma kernel when it applies (sm_90 device, sm_90a code built,
// bf16/fp16, head_dim 64/128/256, 16-byte aligned rows); false: the caller
// runs the generic kernel. GPUKIT_PREFILL_SM90=0 in the environment disables it.
bool attention_prefill_sm90(const PrefillArgs& a, void* stream) {
#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
  if (a.dtype != DType::bf16 && a.dtype != DType::f16) return false;
  if (a.D != 64 && a.D != 128 && a.D != 256) return false;
  if (disabled_by_env()) return false;
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
