// attention_prefill on Hopper, warp-specialized (FlashAttention-3 style), bf16 / fp16: the host
// side (tensor maps, persistent grid, the kernel choice per dtype / head_dim / stages) and the
// entry point called by the dispatch of attention_prefill_sm90.cu. The kernel and a description
// of its pipeline: src/cuda/common/prefill_ws.cuh.
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <type_traits>

#include "core/cuda_util.h"
#include "cuda/common/prefill_ws.cuh"
#include "ops/nn_args.h"

namespace gk::cuda {

#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
namespace {
using namespace sm90;

// Heads per section of the persistent order: hs > 0 as given; 0: all heads (one
// section); -1: as many heads as keep their K and V within kL2Budget bytes.
int heads_per_section(const PrefillArgs& a, int hs) {
  constexpr double kL2Budget = 24.0 * (1 << 20);
  if (hs == 0) return a.hq;
  if (hs < 0) {
    const double per_head = double(a.Tk) * a.D * 2 * 2 / double(a.hq / a.hkv);  // K + V bytes per q head
    hs = int(std::max(1.0, kL2Budget / std::max(per_head, 1.0)));
  }
  return std::min(hs, a.hq);
}

// kOptProf: waits for the kernel and prints its cycle profile (stderr; bench / diagnosis only).
void print_prof(cudaStream_t st) {
  unsigned long long h[kProfSlots];
  GK_CUDA_CHECK(cudaStreamSynchronize(st));
  GK_CUDA_CHECK(cudaMemcpyFromSymbol(h, g_prof, sizeof(h)));
  static const char* names[7] = {"wait K/V", "wait turn", "issue", "wait S", "softmax", "wait PV", "rescale+cvt"};
  for (int w = 0; w < 2; ++w) {
    const double n = double(std::max(h[10 * w + 8], 1ull));
    double sum = 0;
    std::fprintf(stderr, "prefill prof wg%d: %llu steps, %llu items; cycles per step:", w, h[10 * w + 8], h[10 * w + 9]);
    for (int i = 0; i < 7; ++i) {
      std::fprintf(stderr, " %s %.0f;", names[i], double(h[10 * w + i]) / n);
      sum += double(h[10 * w + i]);
    }
    std::fprintf(stderr, " step %.0f; outside steps per item %.0f\n", sum / n,
                 (double(h[10 * w + 7]) - sum) / double(std::max(h[10 * w + 9], 1ull)));
  }
  std::fprintf(stderr, "prefill prof: SM clock while running %.0f MHz (clock64 / globaltimer over the CTAs)\n",
               double(h[20]) * 1e3 / double(std::max(h[21], 1ull)));
}

// The OPT bits of the kernels that run, per dtype, head dim and stage count (the cycle-profile
// build adds kOptProf to the persistent bf16 head_dim 128 2-stage one).
constexpr int default_opt(bool bf16, int D, int ST) {
  (void)bf16;
  return D == 128 && ST == 2 ? kOptSpec | kOptStale | kOptDoubleP : 0;
}

template <bool BF16, int D, int ST>
bool launch_ws(const PrefillArgs& a, unsigned ny, bool pp, bool persist, const WsTuning& tu, cudaStream_t st) {
  using C = CfgWS<D, ST>;
  using Kern = void (*)(PrefillArgs, CUtensorMap, CUtensorMap, CUtensorMap, PersistOrder);
  dim3 grid{unsigned(a.hq), ny, 1u};
  PersistOrder po{a.hq};
  bool prof = false;
  constexpr int DO = default_opt(BF16, D, ST);
  Kern kern = pp ? k_prefill_ws<BF16, D, true, ST, false, DO> : k_prefill_ws<BF16, D, false, ST, false, DO>;
  if constexpr (D <= 128) {  // (head_dim 256 would spill registers)
    if (persist && !a.cu_q) {  // one CTA per multiprocessor walks the (tile, head) items
      int dev = 0, sms = 0;
      GK_CUDA_CHECK(cudaGetDevice(&dev));
      GK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      const int64_t items = (a.Tq + C::BM - 1) / C::BM * a.hq;
      if (items > INT32_MAX / 2) return false;
      kern = k_prefill_ws<BF16, D, true, ST, true, DO>;
      if constexpr (BF16 && D == 128 && ST == 2) {  // the cycle-profile build (GPUKIT_PREFILL_SM90_PROF)
        if (tu.prof) {
          void* base = nullptr;
          GK_CUDA_CHECK(cudaGetSymbolAddress(&base, g_prof));
          GK_CUDA_CHECK(cudaMemsetAsync(base, 0, sizeof(unsigned long long) * kProfSlots, st));
          kern = k_prefill_ws<BF16, D, true, ST, true, DO | kOptProf>;
          prof = true;
        }
      }
      grid = dim3{unsigned(std::min<int64_t>(items, std::max(sms, 1))), 1u, 1u};
      po.hs = heads_per_section(a, tu.hs);
    }
  }
  CUtensorMap mq, mk, mv;
  const uint64_t e = 2;  // bytes per element
  if (!make_tmap_3d(&mq, a.q, BF16, D, uint64_t(a.hq), uint64_t(a.Tq), a.q_hs * e, a.q_ts * e, 64, 1, C::BM) ||
      !make_tmap_3d(&mk, a.k, BF16, D, uint64_t(a.hkv), uint64_t(a.Tk), a.k_hs * e, a.k_ts * e, 64, 1, C::BN) ||
      !make_tmap_3d(&mv, a.v, BF16, D, uint64_t(a.hkv), uint64_t(a.Tk), a.v_hs * e, a.v_ts * e, 64, 1, C::BN))
    return false;
  const int smem = C::Q_BYTES + 2 * ST * C::KV_BYTES + 1024;  // Q, K and V x ST stages; + alignment slack
  GK_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kern<<<grid, C::THREADS, smem, st>>>(a, mq, mk, mv, po);
  GK_LAUNCH_CHECK("attention_prefill_sm90_ws");
  if (prof) print_prof(st);
  return true;
}
}  // namespace
#endif

// The warp-specialized TMA kernel (pingpong: the consumer warpgroups take turns
// on the tensor cores; stages: 2 or 3 K/V buffers, 3 only for head_dim <= 128);
// the caller has checked the device (sm_90),
// dtype, head_dim and 16-byte alignment. false: not applicable (tensor maps
// rejected, e.g. zero-size or over-large dims), the caller falls back.
bool attention_prefill_sm90_ws(const PrefillArgs& a, bool pingpong, int stages, bool persist, const sm90::WsTuning& tu,
                               void* stream) {
#if defined(GPUKIT_SM90A) && GPUKIT_SM90A
  constexpr int BM = 64 * kCons;
  if (a.Tq <= 0 || a.Tk <= 0 || a.Tq > INT32_MAX || a.Tk > INT32_MAX) return false;
  if (a.q_ts <= 0 || a.q_hs <= 0 || a.k_ts <= 0 || a.k_hs <= 0 || a.v_ts <= 0 || a.v_hs <= 0) return false;
  const int64_t ny = (a.Tq + BM - 1) / BM + (a.cu_q ? a.B : 0);
  if (ny > 65535 || a.hq > 65535) return false;
  auto st = static_cast<cudaStream_t>(stream);
  const bool bf = a.dtype == DType::bf16;
  const unsigned y = unsigned(ny);
  auto go = [&](auto bf16, auto d) {
    constexpr bool B = decltype(bf16)::value;
    constexpr int DD = decltype(d)::value;
    if constexpr (DD <= 128)  // 3 stages fit in shared memory for head_dim 64 and 128
      if (stages == 3) return launch_ws<B, DD, 3>(a, y, pingpong, persist, tu, st);
    return launch_ws<B, DD, 2>(a, y, pingpong, persist, tu, st);
  };
  using T = std::true_type;
  using F = std::false_type;
  switch (a.D) {
    case 64: return bf ? go(T{}, std::integral_constant<int, 64>{}) : go(F{}, std::integral_constant<int, 64>{});
    case 128: return bf ? go(T{}, std::integral_constant<int, 128>{}) : go(F{}, std::integral_constant<int, 128>{});
    case 256: return bf ? go(T{}, std::integral_constant<int, 256>{}) : go(F{}, std::integral_constant<int, 256>{});
    default: return false;
  }
#else
  (void)a;
  (void)pingpong;
  (void)stages;
  (void)persist;
  (void)tu;
  (void)stream;
  return false;
#endif
}

}  // namespace gk::cuda
