// The staged tensor-core decode GEMV (common/gemv_w8.cuh): bf16/fp16 weights, fp8-e4m3
// and int8 weights with row scales; the bf16 -> scaled fp16 x preparation of the 8-bit
// formats; the launch plan (warps per CTA, split-K) and the benchmarking knob
// GPUKIT_GEMV_W8="KB,D,WT[,RT[,XS[,XP[,SP[,PF[,PD[,FR[,WS]]]]]]]]]" (64-byte blocks per stage, ring
// depth, target warps per SM, row tiles, x handling, x loaded a stage ahead, CTA spreading,
// stages prefetched into L2 before the wait, L2 prefetch distance in the loop, full ring, the
// cap of warps per SM (0: none; session 13); see W8Cfg); the full ring also from
// gemv_w8_set_full_ring (EngineOptions::quantized_full_ring).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "common/gemv_w8.cuh"
#include "core/cuda_util.h"
#include "ops/gemv_args.h"
#include "ops/quant_args.h"

namespace gk::cuda {

namespace gemv_detail {
namespace {

// x [m, k] bf16 -> xh [m, k] fp16 = x * 2^c_m, xinv[m] = 2^-c_m, with c_m such that the
// row's largest |x| lands in [2^14, 2^15) (c_m = 0 for a zero, inf or NaN maximum). One
// CTA per row; k % 8 == 0, 16-byte aligned rows.
__global__ void __launch_bounds__(512) k_w8_xprep(const bf16* __restrict__ x, int64_t x_rs, int64_t k,
                                                  f16* __restrict__ xh, float* __restrict__ xinv) {
  constexpr int NT = 512, NR = 4;  // threads; 16-byte pieces kept in registers per thread (k <= 16384)
  pdl_trigger();
  pdl_wait();
  const int64_t m = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + m * x_rs);
  uint4* out = reinterpret_cast<uint4*>(xh + m * k);
  const int64_t nv = k / 8;
  uint32_t mx = 0;
  uint4 keep[NR];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const int64_t i = threadIdx.x + int64_t(r) * NT;
    keep[r] = i < nv ? xr[i] : make_uint4(0, 0, 0, 0);
  }
  auto vmax = [&](const uint4& v) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t u = word(v, w);
      mx = max(mx, max(u & 0x7fffu, (u >> 16) & 0x7fffu));  // |bf16| orders as its bits
    }
  };
#pragma unroll
  for (int r = 0; r < NR; ++r) vmax(keep[r]);
  for (int64_t i = threadIdx.x + int64_t(NR) * NT; i < nv; i += NT) vmax(xr[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  __shared__ uint32_t wm[NT / 32];
  if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = wm[0];
  for (int i = 1; i < NT / 32; ++i) mx = max(mx, wm[i]);
  const int c = w8_exponent(mx);
  const float sc = __uint_as_float(uint32_t(c + 127) << 23);
  if (threadIdx.x == 0) xinv[m] = __uint_as_float(uint32_t(127 - c) << 23);
  auto conv = [&](const uint4& v) {
    return make_uint4(w8_scale_h2(v.x, sc), w8_scale_h2(v.y, sc), w8_scale_h2(v.z, sc), w8_scale_h2(v.w, sc));
  };
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const int64_t i = threadIdx.x + int64_t(r) * NT;
    if (i < nv) out[i] = conv(keep[r]);
  }
  for (int64_t i = threadIdx.x + int64_t(NR) * NT; i < nv; i += NT) out[i] = conv(xr[i]);
}

// bf16 x with 8-bit weights (the knob's XS): 0 the x kernel (H200 session 4, checkpoint B: fp8
// 74 / 77 / 98% of copy against 61 / 61 / 97% with the CTAs' own copy and 73 / 70 / 88% with
// per-warp rings), -1 the CTAs' own copy when it fits, 1 always, 2 per-warp rings (other bits),
// 3 the weights decoded to exact bf16 and bf16 x used as it is (no x kernel, no workspace; the
// default of 8-bit weights, w8_default; the bits of 0).
constexpr int kW8XsDefault = 0;

struct W8Cfg {
  int kb = 4, d = 3, wt = 16, rt = 1;  // blocks per stage, ring depth, target warps per SM, row tiles
  int xs = kW8XsDefault;
  int xp = 0;  // 1: the B operands loaded one stage ahead (KB 4, D 2..4, one row tile)
  int sp = 1;  // 1: shared memory sized so that the CTAs spread over the SMs (launch_kd); 0: not
  int pf = 0;  // stages per row prefetched into L2 before waiting for the previous kernel
  int pd = 0;  // in the loop: each stage's copy also prefetches the stage pd ahead into L2 (0: off)
  int fr = 0;  // full ring (w8_full_depth): bit 1 for N > K, bit 2 for N <= K (0: as the caller asks)
  int ws = 0;  // at most this many warps per SM when the row tiles are resident at once (0: no cap; the default's)
};

W8Cfg parse_w8(const char* e, const char* name = "GPUKIT_GEMV_W8") {
  W8Cfg c;
  int kb = 0, d = 0, wt = 0, rt = 1, xs = kW8XsDefault, xp = 0, sp = 1, pf = 0, pd = 0, fr = 0, ws = 0;
  const int got =
      std::sscanf(e, "%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", &kb, &d, &wt, &rt, &xs, &xp, &sp, &pf, &pd, &fr, &ws);
  if (got < 3)
    throw ValueError(cat(name, ": expected KB,D,WT[,RT[,XS[,XP[,SP[,PF[,PD[,FR[,WS]]]]]]]]], got '", e, "'"));
  if (fr < 0 || fr > 3) throw ValueError(cat(name, ": FR is a mask 0..3, got '", e, "'"));
  if (ws < 0 || ws > 64) throw ValueError(cat(name, ": WS is 0 (no cap) .. 64 warps per SM, got '", e, "'"));
  const bool ok = rt == 1 ? (kb == 2 && (d == 4 || d == 6)) || (kb == 4 && (d == 2 || d == 3 || d == 4)) ||
                                (kb == 8 && d == 2)
                          : rt == 2 && ((kb == 4 && d == 3) || (kb == 2 && d == 4));
  if (!ok) throw ValueError(cat(name, ": unsupported stage / depth / row tiles ", kb, ",", d, ",", rt));
  c.kb = kb;
  c.d = d;
  c.wt = wt < 1 ? 1 : (wt > 64 ? 64 : wt);
  c.rt = rt;
  c.xs = xs < -1 ? -1 : (xs > 3 ? 3 : xs);
  if (xp != 0 && !(rt == 1 && kb == 4 && d >= 2 && d <= 4))
    throw ValueError(cat(name, ": XP needs KB 4, D 2, 3 or 4 and one row tile, got '", e, "'"));
  c.xp = xp != 0;
  c.sp = sp != 0;
  c.pd = pd < 0 ? 0 : (pd > 64 ? 64 : pd);  // < 256: p.group packs both
  // the prologue's prefetch reaches the loop's first one unless PF says otherwise
  c.pf = pf > 0 ? (pf > 64 ? 64 : pf) : std::max(c.pd - (d - 1), 0);
  c.fr = fr;
  c.ws = ws;
  return c;
}

// The default configuration for rows of k weights of eb bytes, n rows (a function of the
// shape only, never of M: the warps and split-K fix the bits).
// bf16 / fp16 weights: 4 blocks per stage, 3 stages, about 16 warps per SM, CTAs spread (H200,
// session 5, checkpoint A: 94 / 97 / 101% of the copy bandwidth at M = 1, 91 / 95 / 98% at M = 8;
// without the spreading 90 / 96 / 102%). 8-bit weights: the weights decoded to exact bf16 (bf16
// x as it is: no x kernel), 2 stages, no spreading (checkpoint A, int8 at M = 1: 87 / 86 / 100%
// against 78 / 77 / 97% for the x kernel with 3 stages; M = 8: 84 / 82 / 98% against 75 / 71 /
// 94%; fp16 x: 89 / 88 / 101%).
// 8-bit weights also cap the warps per SM at 16 (session 12): their kernels take 102-113
// registers, so each scheduler partition holds 4 of their warps (16384 registers), 16 per SM;
// the 8B q/k/v (384 row tiles, 3 CTAs per SM) had 6-warp CTAs of which only 2 fit per SM: two
// waves (session 11's stamps); with 5-warp CTAs one (H200, session 12: q/k/v 10.0 -> 6.8 us from
// the first wait to the last store; 8B fp8 b1 decode 393.4 -> 399.8 tok/s in checkpoint B, int8
// 382.6 -> 396.3 in checkpoint A). The 16-bit kernels (80-84 registers) fit 24 warps per SM: no cap.
W8Cfg w8_default(int64_t n, int64_t k, int eb) {
  (void)n, (void)k;
  W8Cfg c;
  if (eb == 1) {
    c.d = 2;
    c.xs = 3;
    c.sp = 0;
    c.ws = 16;
  }
  return c;
}

// A knob's value, parsed again only when the variable changes.
template <int Which>
const W8Cfg& w8_knob(const char* e, const char* name) {
  thread_local std::string last;
  thread_local W8Cfg cfg;
  if (last != e) {
    cfg = parse_w8(e, name);
    last = e;
  }
  return cfg;
}

// Weight bytes up to which GPUKIT_GEMV_W8_SMALL applies: the 8B model's o (16 MiB) and q/k/v
// (24 MiB) projections in 8 bits, not its gate/up, down or lm head; GPUKIT_GEMV_W8_O (session 11):
// up to 16 MiB (the 8B o projection, not its q/k/v), before GPUKIT_GEMV_W8_SMALL.
constexpr int64_t kW8SmallBytes = int64_t(32) << 20;
constexpr int64_t kW8OBytes = int64_t(16) << 20;

// The knob (GPUKIT_GEMV_W8, a benchmarking switch: every shape), else GPUKIT_GEMV_W8_SMALL (the
// same fields, for shapes of at most kW8SmallBytes of weights only: a benchmarking switch for
// the engine's short projections, session 10), else the default.
W8Cfg w8_config(int64_t n, int64_t k, int eb) {
  if (const char* e = std::getenv("GPUKIT_GEMV_W8"); e && *e) return w8_knob<0>(e, "GPUKIT_GEMV_W8");
  if (n * k * eb <= kW8OBytes)
    if (const char* e = std::getenv("GPUKIT_GEMV_W8_O"); e && *e) return w8_knob<2>(e, "GPUKIT_GEMV_W8_O");
  if (n * k * eb <= kW8SmallBytes)
    if (const char* e = std::getenv("GPUKIT_GEMV_W8_SMALL"); e && *e) return w8_knob<1>(e, "GPUKIT_GEMV_W8_SMALL");
  return w8_default(n, k, eb);
}

constexpr int kW8SmemMax = 200 * 1024;    // dynamic shared memory of one CTA at most
constexpr int kW8SmemPerSm = 220 * 1024;  // what the CTAs of one SM may use together
constexpr int64_t kSmSmem = 228 * 1024;   // shared memory of one H100 / H200 SM

struct W8Plan {
  int nw = 1, split = 1;
};

// Warps per CTA and split-K for rows of k * eb bytes: about wt warps per SM over the
// GPU (132 SMs), 1..8 warps per 16 rows, at least two stages per warp, and few enough
// that all CTAs fit on the GPU at once when there are at most a few per SM; split-K only
// when the row tiles alone leave the GPU half empty. A function of (N, K, eb) and the knob.
W8Plan w8_plan(int64_t n, int64_t k, int eb, const W8Cfg& c) {
  W8Plan p;
  const int64_t nblk = k * eb / 64, rb = (n + 16 * c.rt - 1) / (16 * c.rt), want = int64_t(132) * c.wt;
  int64_t w = (want + rb / 2) / rb;
  w = std::min<int64_t>(std::max<int64_t>(w, 1), 8);
  w = std::min<int64_t>(w, std::max<int64_t>(nblk / (2 * c.kb), 1));
  const int64_t ring = int64_t(c.d) * w8_stage_bytes(c.kb, c.rt);  // per warp
  w = std::min<int64_t>(w, kW8SmemMax / ring);
  // all row tiles resident at once when they can be: ceil(rb / 132) CTAs per SM must fit
  const int64_t per_sm = (rb + 131) / 132;
  w = std::max<int64_t>(std::min<int64_t>(w, kW8SmemPerSm / (per_sm * (ring + 256))), 1);
  if (c.ws > 0) w = std::max<int64_t>(std::min<int64_t>(w, c.ws / per_sm), 1);  // the register file
  p.nw = int(w);
  if (rb * w * 2 < want) {
    int64_t sp = (want + rb * w - 1) / (rb * w);
    sp = std::min<int64_t>({sp, 16, std::max<int64_t>(nblk / (w * 2 * c.kb), 1)});
    p.split = int(std::max<int64_t>(sp, 1));
  }
  return p;
}

template <class F, int KB, int D, int RT = 1, int XM = 0, bool XP = false, bool FR = false, bool ST = false>
void launch_kd(const KArgs& p, int nw, int split, int xbytes, cudaStream_t st, bool spread) {
  constexpr int SB = w8_stage_bytes(KB, RT);
  smem_limit<k_w8<F, KB, D, RT, XM, XP, FR, ST>>(kW8SmemMax);
  const int64_t blocks = (p.n + 16 * RT - 1) / (16 * RT);
  if (blocks > int64_t(INT32_MAX)) throw ValueError("gemv: n is too large");
  int smem = nw * D * SB + xbytes;
  if (smem > kW8SmemMax) throw ValueError("gemv: the staged kernel's shared memory does not fit");
  // When all CTAs fit on the GPU at once, ask for enough shared memory that at most
  // ceil(CTAs / 132) of them fit on one SM: the block scheduler then spreads them evenly
  // (H200, checkpoint B: with room for more per SM, 896 CTAs of N = 14336 filled fewer SMs
  // and bf16 fell from 98% to 88% of the copy bandwidth).
  const int64_t per_sm = (blocks * split + 131) / 132;
  if (spread && per_sm >= 1 && per_sm <= 16) {
    const int64_t cap = kSmSmem / (per_sm + 1) - 1024 - 512 + 256;  // just too much for per_sm + 1 CTAs
    if (per_sm * (cap + 1024 + 512) <= kSmSmem && cap > smem) smem = int(std::min<int64_t>(cap, kW8SmemMax));
  }
  launch_ex(k_w8<F, KB, D, RT, XM, XP, FR, ST>, dim3(unsigned(blocks), unsigned(split)), nw * 32, smem, st,
            p.variant != 2, p);
  GK_LAUNCH_CHECK("gemv_w8");
}

// xs: the CTAs copy bf16 x themselves (p.x bf16, 8-bit weights only)
// The x copy of an 8-bit launch with bf16 x: 0 the x kernel (k_w8_xprep); D > 0 the CTAs'
// own copy with a ring of D stages (the bits are those of the x kernel either way: the
// same warps and split, only the ring depth may differ). Auto: when all CTAs fit on the
// GPU at once with the copy (D = the knob's depth, else 2) and there are few enough of them
// that reading all of x per CTA for its maximum stays small. XS kernels: KB 4, one row tile.
int w8_xs_depth(int64_t m, int64_t n, int64_t k, int split) {
  const W8Cfg c = w8_config(n, k, 1);
  if (c.xs == 0 || c.xs == 3 || c.rt != 1 || c.kb != 4) return 0;
  if (c.xs == 2) return -1;  // XR
  const W8Plan pl = w8_plan(n, k, 1, c);
  const int64_t nblk = k / 64, cblk = (nblk + split - 1) / split + 1;
  const int64_t xbytes = m * (cblk * 128 + 16), ctas = (n + 15) / 16 * split, per_sm = (ctas + 131) / 132;
  for (int d : {c.d >= 3 ? 3 : 2, 2}) {
    const int64_t ring = int64_t(pl.nw) * d * w8_stage_bytes(4, 1);
    if (xbytes + ring > kW8SmemMax) continue;
    if (c.xs == 1 || (ctas <= 132 * 8 && per_sm * (xbytes + ring + 1024) <= 227 * 1024)) return d;
  }
  return 0;
}

// CTAs of nw warps (D stages of dynamic shared memory each) resident per SM of device dev,
// from the occupancy calculator (asked once per device, depth and warps).
template <class F, int D>
int w8_full_occupancy(int dev, int nw) {
  static std::atomic<int> known[8][9] = {};  // devices 0..7 (others: asked every time), 1..8 warps; nb + 1
  std::atomic<int>* slot = dev >= 0 && dev < 8 && nw >= 1 && nw <= 8 ? &known[dev][nw] : nullptr;
  if (slot && slot->load(std::memory_order_relaxed) > 0) return slot->load(std::memory_order_relaxed) - 1;
  smem_limit<k_w8<F, 4, D, 1, 0, false, true>>(kW8SmemMax);
  int nb = 0;
  GK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_w8<F, 4, D, 1, 0, false, true>, nw * 32,
                                                             size_t(nw) * D * w8_stage_bytes(4, 1)));
  if (slot) slot->store(nb + 1, std::memory_order_relaxed);
  return nb;
}
// The full ring (k_w8's FR; 8-bit weights decoded to bf16 only): when `mask` takes this shape
// (bit 1: N > K, e.g. Llama's q/k/v projection; bit 2: N <= K, e.g. the output projection) and
// the plan is the default one's kind (4 blocks per stage, one row tile, no XP), the ring depth
// that holds every warp's whole k range (2..4 stages), provided all CTAs of the grid can be
// resident at once with it (the occupancy calculator: registers, shared memory, threads):
// then every weight byte is requested before the PDL wait. 0: not applicable (the usual ring).
// The plan (warps, split) is the caller's, so the bits are those of the usual ring.
template <class F>
int w8_full_depth(const KArgs& p, const W8Plan& pl, int split, const W8Cfg& c, int mask) {
  if constexpr (F::EB != 1 || !std::is_same_v<typename F::TB, bf16>) {
    return 0;
  } else {
    if ((mask & (p.n > p.k ? 1 : 2)) == 0 || c.kb != 4 || c.rt != 1 || c.xp) return 0;
    const int64_t nblk = p.k / 64, parts = int64_t(split) * pl.nw;
    const int64_t maxb = (nblk + parts - 1) / parts, d = std::max<int64_t>((maxb + 3) / 4, 2);
    if (d > 4) return 0;
    if (int64_t(pl.nw) * d * w8_stage_bytes(4, 1) > kW8SmemMax) return 0;
    int dev = 0, sms = 0;
    GK_CUDA_CHECK(cudaGetDevice(&dev));
    GK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t ctas = (p.n + 15) / 16 * split, per_sm = (ctas + sms - 1) / std::max(sms, 1);
    const int nb = d == 2   ? w8_full_occupancy<F, 2>(dev, pl.nw)
                   : d == 3 ? w8_full_occupancy<F, 3>(dev, pl.nw)
                            : w8_full_occupancy<F, 4>(dev, pl.nw);
    return nb >= per_sm ? int(d) : 0;
  }
}

// Per-CTA stamps of k_w8 (session 11, a diagnostic, off): while on, the launches of the default kinds
// (fp8 / int8 codes decoded to bf16 with bf16 x, one row tile, no XP / full ring, KB 4 with a ring of 2 or 3,
// or KB 8) run k_w8's ST form, each into the next of kStampSlots slots of a device buffer (round robin);
// gemv_w8_stamps_read returns each slot's launch (sequence number, n, k, CTAs, split, warps) and stamps.
constexpr int kStampSlots = 512;
struct StampState {
  std::mutex mu;
  std::atomic<bool> on{false};  // read without the lock on the launch path
  uint64_t* buf = nullptr;  // [kStampSlots][kW8StampCtas][8]
  int64_t seq = 0;          // launches stamped so far
  std::vector<std::array<int64_t, 6>> meta = std::vector<std::array<int64_t, 6>>(kStampSlots);
};
StampState& stamps() {
  static StampState s;
  return s;
}
// The slot of the next stamped launch (meta recorded), or nullptr when stamps are off.
uint8_t* stamp_slot(int64_t n, int64_t k, int64_t ctas, int split, int nw) {
  StampState& s = stamps();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.on || !s.buf) return nullptr;
  const int slot = int(s.seq % kStampSlots);
  s.meta[slot] = {s.seq, n, k, ctas, split, nw};
  ++s.seq;
  return reinterpret_cast<uint8_t*>(s.buf + int64_t(slot) * kW8StampCtas * 8);
}

template <class F>
void launch_w8(const KArgs& p_in, int split, cudaStream_t st, int xs_depth = 0, int full_mask = 0) {
  const W8Cfg c = w8_config(p_in.n, p_in.k, F::EB);
  KArgs p = p_in;
  p.group = c.pf + 256 * c.pd;  // k_w8: L2 prefetch before the wait (stages) and distance in the loop
  const W8Plan pl = w8_plan(p.n, p.k, F::EB, c);
  if (const int fd = xs_depth == 0 ? w8_full_depth<F>(p, pl, split, c, full_mask | c.fr) : 0; fd > 0) {
    p.group = 0;  // nothing left to prefetch into L2: every byte is in flight before the wait
    if (fd == 2) launch_kd<F, 4, 2, 1, 0, false, true>(p, pl.nw, split, 0, st, c.sp);
    else if (fd == 3) launch_kd<F, 4, 3, 1, 0, false, true>(p, pl.nw, split, 0, st, c.sp);
    else launch_kd<F, 4, 4, 1, 0, false, true>(p, pl.nw, split, 0, st, c.sp);
    if (split > 1) launch_sum(p, split, st);
    return;
  }
  if constexpr (F::EB == 1) {
    if (xs_depth > 0) {
      const int64_t nblk = p.k / 64, cblk = (nblk + split - 1) / split + 1;
      const int xbytes = int(p.m * (cblk * 128 + 16));
      if (xs_depth == 3) launch_kd<F, 4, 3, 1, 1>(p, pl.nw, split, xbytes, st, c.sp);
      else launch_kd<F, 4, 2, 1, 1>(p, pl.nw, split, xbytes, st, c.sp);
      if (split > 1) launch_sum(p, split, st);
      return;
    }
    if (xs_depth < 0) {  // XR: each warp's ring of converted x
      const int d = c.d >= 3 ? 3 : 2;
      const int xbytes = int(pl.nw * d * p.m * w8_xring_pitch(4));
      if (d == 3) launch_kd<F, 4, 3, 1, 2>(p, pl.nw, split, xbytes, st, c.sp);
      else launch_kd<F, 4, 2, 1, 2>(p, pl.nw, split, xbytes, st, c.sp);
      if (split > 1) launch_sum(p, split, st);
      return;
    }
  }
  if constexpr (std::is_same_v<F, SFp8B> || std::is_same_v<F, SInt8B>) {
    if (!c.xp && c.rt == 1 && (c.kb == 8 || (c.kb == 4 && (c.d == 2 || c.d == 3))) && stamps().on) {
      if (uint8_t* sp = stamp_slot(p.n, p.k, (p.n + 15) / 16, split, pl.nw)) {
        p.aux = sp;
        if (c.kb == 8) launch_kd<F, 8, 2, 1, 0, false, false, true>(p, pl.nw, split, 0, st, c.sp);
        else if (c.d == 2) launch_kd<F, 4, 2, 1, 0, false, false, true>(p, pl.nw, split, 0, st, c.sp);
        else launch_kd<F, 4, 3, 1, 0, false, false, true>(p, pl.nw, split, 0, st, c.sp);
        if (split > 1) launch_sum(p, split, st);
        return;
      }
    }
  }
  if (c.xp && c.d == 2) launch_kd<F, 4, 2, 1, 0, true>(p, pl.nw, split, 0, st, c.sp);
  else if (c.xp && c.d == 4) launch_kd<F, 4, 4, 1, 0, true>(p, pl.nw, split, 0, st, c.sp);
  else if (c.xp) launch_kd<F, 4, 3, 1, 0, true>(p, pl.nw, split, 0, st, c.sp);
  else if (c.rt == 2 && c.kb == 2) launch_kd<F, 2, 4, 2>(p, pl.nw, split, 0, st, c.sp);
  else if (c.rt == 2) launch_kd<F, 4, 3, 2>(p, pl.nw, split, 0, st, c.sp);
  else if (c.kb == 2 && c.d == 6) launch_kd<F, 2, 6>(p, pl.nw, split, 0, st, c.sp);
  else if (c.kb == 2) launch_kd<F, 2, 4>(p, pl.nw, split, 0, st, c.sp);
  else if (c.kb == 8) launch_kd<F, 8, 2>(p, pl.nw, split, 0, st, c.sp);
  else if (c.d == 2) launch_kd<F, 4, 2>(p, pl.nw, split, 0, st, c.sp);
  else if (c.d == 4) launch_kd<F, 4, 4>(p, pl.nw, split, 0, st, c.sp);
  else launch_kd<F, 4, 3>(p, pl.nw, split, 0, st, c.sp);
  if (split > 1) launch_sum(p, split, st);
}

}  // namespace
}  // namespace gemv_detail

using namespace gemv_detail;

int gemv_w8_split(int64_t n, int64_t k, int ebytes) { return w8_plan(n, k, ebytes, w8_config(n, k, ebytes)).split; }

int gemv_w8_full_depth(int64_t n, int64_t k, int mask) {
  if (n <= 0 || k <= 0 || k % 64 != 0) return 0;
  const W8Cfg c = w8_config(n, k, 1);
  if (c.xs != 3) return 0;  // the full ring is for the bf16-decoding kernels (bf16 x as it is)
  const W8Plan pl = w8_plan(n, k, 1, c);
  KArgs p;
  p.n = n;
  p.k = k;
  return w8_full_depth<SFp8B>(p, pl, pl.split, c, mask | c.fr);
}

void gemv_w8_stamps_start() {
  StampState& s = stamps();
  std::lock_guard<std::mutex> lk(s.mu);
  const size_t bytes = size_t(kStampSlots) * kW8StampCtas * 8 * sizeof(uint64_t);
  if (!s.buf) GK_CUDA_CHECK(cudaMalloc(&s.buf, bytes));
  GK_CUDA_CHECK(cudaMemset(s.buf, 0, bytes));
  for (auto& m : s.meta) m = {-1, 0, 0, 0, 0, 0};
  s.seq = 0;
  s.on = true;
}
void gemv_w8_stamps_stop() {
  StampState& s = stamps();
  std::lock_guard<std::mutex> lk(s.mu);
  s.on = false;
}
std::vector<int64_t> gemv_w8_stamps_read(std::vector<uint64_t>& out) {
  StampState& s = stamps();
  std::lock_guard<std::mutex> lk(s.mu);
  out.assign(size_t(kStampSlots) * kW8StampCtas * 8, 0);
  if (s.buf) {
    GK_CUDA_CHECK(cudaDeviceSynchronize());
    GK_CUDA_CHECK(cudaMemcpy(out.data(), s.buf, out.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  }
  std::vector<int64_t> meta;
  for (const auto& m : s.meta) meta.insert(meta.end(), m.begin(), m.end());
  return meta;
}

// Whether 8-bit weights with bf16 x go through the x kernel (so need its workspaces).
bool gemv_w8_x_workspace(int64_t m, int64_t n, int64_t k) {
  (void)m;
  return w8_config(n, k, 1).xs != 3;
}

void gemv_w8_dense(const GemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.m > 8) throw ValueError("gemv: the kernel takes at most 8 rows of x");
  if (!a.vec || a.k % 32 != 0) throw ValueError("gemv: the staged tensor-core path needs K % 32 == 0 and aligned rows");
  KArgs p;
  p.x = a.x;
  p.x_rs = a.x_rs;
  p.q = static_cast<const uint8_t*>(a.w);
  p.q_rs = a.w_rs * 2;
  p.y = a.y;
  p.part = a.part;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.out = a.out_dtype;
  p.variant = a.variant;
  auto st = static_cast<cudaStream_t>(stream);
  if (a.dtype == DType::bf16) return launch_w8<SDense<bf16>>(p, a.split, st);
  if (a.dtype == DType::f16) return launch_w8<SDense<f16>>(p, a.split, st);
  throw TypeError(cat("gemv: unsupported weight dtype ", dtype_name(a.dtype)));
}

void gemv_w8_quant(const QGemvArgs& a, void* stream) {
  if (a.m <= 0 || a.n <= 0) return;
  if (a.m > 8) throw ValueError("gemv: the kernel takes at most 8 rows of x");
  if (a.k % 64 != 0) throw ValueError("gemv: the staged fp8 / int8 path needs K % 64 == 0");
  if (a.fmt != QFormat::fp8 && a.fmt != QFormat::int8) throw ValueError("gemv: the staged path takes fp8 and int8");
  auto st = static_cast<cudaStream_t>(stream);
  KArgs p;
  p.x = a.x;
  p.x_rs = a.x_rs;
  p.q = static_cast<const uint8_t*>(a.q);
  p.q_rs = a.q_rs;
  p.scales = a.scales;
  p.y = a.y;
  p.part = a.part;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.out = a.out_dtype;
  p.variant = a.variant;
  if (a.x_dtype == DType::bf16 && w8_config(a.n, a.k, 1).xs == 3) {  // exact bf16 weights, x as it is
    if (a.fmt == QFormat::fp8) return launch_w8<SFp8B>(p, a.split, st, 0, a.w8_full);
    return launch_w8<SInt8B>(p, a.split, st, 0, a.w8_full);
  }
  const int xs = a.x_dtype == DType::bf16 ? w8_xs_depth(a.m, a.n, a.k, a.split) : 0;
  if (xs != 0) {
    if (a.fmt == QFormat::fp8) return launch_w8<SFp8>(p, a.split, st, xs);
    return launch_w8<SInt8>(p, a.split, st, xs);
  }
  if (a.x_dtype == DType::bf16) {
    if (!a.xh || !a.xinv) throw ValueError("gemv: the staged fp8 / int8 path needs its x workspace for bf16 x");
    launch_ex(k_w8_xprep, dim3(unsigned(a.m)), 512, 0, st, a.variant != 2, static_cast<const bf16*>(a.x), a.x_rs, a.k,
              static_cast<f16*>(a.xh), a.xinv);
    GK_LAUNCH_CHECK("gemv_w8_xprep");
    p.x = a.xh;
    p.x_rs = a.k;
    p.gscale = a.xinv;
  } else if (a.x_dtype != DType::f16) {
    throw TypeError(cat("gemv: unsupported activation dtype ", dtype_name(a.x_dtype)));
  } else {
    p.gscale = a.xprep_inv;  // gemv_quantized_prepared: x is bf16 x's scaled fp16 copy (nullptr: plain fp16 x)
  }
  if (a.fmt == QFormat::fp8) return launch_w8<SFp8>(p, a.split, st);
  return launch_w8<SInt8>(p, a.split, st);
}

}  // namespace gk::cuda
