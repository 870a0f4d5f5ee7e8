"""Decode-GEMV throughput of every weight format, with torch in the same run.

y = x @ W^T for x [M, K], W [N, K] at (K, N) = (4096, 14336), (14336, 4096), (4096, 128256):
bf16 and fp16 (M = 1; bf16 also M = 4 and 8), fp8, int8, int4 (group 128), nvf4, and the GGUF
blocks q8_0, q4_0, q4_1, q4_k, q6_k (M = 1). Figure: TB/s of the weight bytes read (for the
quantized formats their compressed bytes: codes + scales + zero points / GGUF blocks), and
that figure as a share of a copy ceiling measured in the same run (bytes read + written by
a 1 GiB device-to-device copy). Peer: torch.matmul(x, W.T) on the bf16 weight (its own bytes).

Method: the weights are random (a CPU-quantized tile of 512 rows repeated on the GPU to N
rows: the kernels read every byte, the values do not change the time), several copies are
rotated so that one call never finds its weight in the 50 MB L2, and 2 x copies calls are
captured in one CUDA graph whose replays are timed with events (median of --rounds), so
host launch overhead is not counted - for torch too. Every format is checked on its first
rows against float64 products with its exact dequantization before it is timed.

bf16_tc / bf16_m8_tc / fp8_tc / int8_tc: bf16, fp8 or int8 weights through the tensor-core kernel
instead of the default CUDA-core one (gk._C._gemv_set_dense_path(1)); *_cc forces the CUDA cores;
*_st the staged tensor-core kernel (src/cuda/gemv_w8.cu, path 2; the default where it applies);
fp8_h_st / int8_h_st: the same with float16 x (no scaled fp16 copy of x needed). fp8_xp_st / int8_xp_st /
fp8_m8_xp_st: bf16 x with its scaled fp16 copy made beforehand (gemv_quantized_prepared: the GEMV of
EngineOptions::quantized_x_prep, whose norm writes the copy; the bits of fp8_st). --w8 KB,D,WT[/KB,D,WT...]: time
the *_st formats again with each GPUKIT_GEMV_W8 setting (printed only; the fields
KB,D,WT[,RT[,XS[,XP[,SP[,PF[,PD]]]]]] are described in docs/gemm.md; XS 3 = 8-bit weights
decoded to bf16, the default for fp8 / int8 with bf16 x; a 10th field FR, a mask: the full ring, every
weight byte requested before the PDL wait where each warp's k range fits the ring with all CTAs resident,
bit 1 for N > K, bit 2 for N <= K: --shapes 3,4 (8B's q/k/v 6144 x 4096 and o 4096 x 4096) take it).
--ms 1,4,8: also time every other format with M = 4 and 8 rows of x (records FMT_m4, FMT_m8).
q8_0_h / q4_0_h: the GGUF kernels with float16 x (Q8_0's codes then decode in fp16 without the fp32
detour of bf16). --gguf D,WT[,UX[,WMIN[,PF[,MINB[,R[,SP[,V]]]]]]][/...]: time the GGUF formats again
with each GPUKIT_GEMV_GGUF setting (the staged GGUF kernel's ring depth, target warps per SM, 0 for
half the blocks per stage, warps per CTA at least, PF 0 and MINB 2 only (session 6), 1 for the rolled
loop, 0 for no CTA spreading (2: room for one CTA more per SM), a session-6 variant 30..35 or the
copies alone 7 / 36, or (session 7) 37 / 38 the copies alone in 128-byte-line-aligned windows of
256 / 512 bytes per row on the same plan (not checked), 41 Q8_0 / Q4_0 / Q4_1 / Q4_K
with the shipped math through k_ggst_aw2 (the aligned windows at low per-unit cost; checked), 42 its
copies alone (not checked), 43 / 44 the same with the run-time wait, 45 / 46 as 43 / 44 with Q6_K through
k_ggst_aw6 too, 47 as 43 with the magic bytes opaque to ptxas (session 8 prep; checked); 39 / 40 were
removed; printed only). An entry aw=V sets
GPUKIT_GGUF_AW=V instead (the switch that runs the shipped defaults through k_ggst_aw2: 1, d, o (d with
V 47's opaque magic), 0 or format names; unset, the compiled default: Q8_0 through V 43 on every shape,
Q6_K through V 45 on the lm-head). An entry la=V sets GPUKIT_GGUF_LA=V (session 8, gguf10): la=1 the
default's k_ggst launches with line-aligned copy lanes (the same bits; checked), la=p variant 7's copies alone
with line-aligned copy lanes (its ceiling; not checked). An entry im=V sets GPUKIT_GGUF_IMMA=V (session 17: 1 runs
Q4_0 / Q4_1 / Q8_0 with bf16 x on the integer tensor cores, src/cuda/quant_gguf_imma.cu, x as 16-bit fixed point per
128-element block; 0 the staged kernel; or format names; checked).
The default launches use programmatic dependent launch (each call copies its first weights
while the previous call finishes, as in a decode step's chain of GEMVs); "variant 2" lines: the
same kernels without it. "variant 1": a 2-stage cp.async ring instead of the default depth
(int4 and the GGUF formats: older kernels). --variants picks the variants timed beside the
default (default 1,2); 3-10 are for the 4-bit / GGUF kernels (VARIANT_NAMES).

Usage: python bench/gemv.py [--out F] [--rounds N] [--only bf16,fp8,...] [--shapes 0,1,2] [--ms 1,8]
       [--variants 1,2,3,...] [--gguf D,WT/...]
Exits 0 without CUDA.
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

from common import gk, median, parse_args, print_table, record, require_cuda, write_results

SHAPES = [(4096, 14336), (14336, 4096), (4096, 128256), (4096, 6144), (4096, 4096)]  # 3, 4: 8B's q/k/v and o
TILE = 512           # rows quantized on the CPU, repeated on the GPU
L2_DEFEAT = 256e6    # bytes of rotated weights per measurement (>= 5x the H200's L2)
FORMATS = ("bf16", "fp16", "bf16_m4", "bf16_m8", "bf16_tc", "bf16_m8_tc", "fp8", "int8", "fp8_tc", "int8_tc",
           "bf16_st", "bf16_m2_st", "bf16_m4_st", "bf16_m8_st", "fp8_st", "int8_st", "fp8_m8_st", "int8_m8_st",
           "bf16_cc", "bf16_m8_cc", "fp8_cc", "int8_cc", "fp8_h_st", "int8_h_st", "fp8_m2_st", "fp8_m4_st",
           "fp8_xp_st", "int8_xp_st", "fp8_m8_xp_st",
           "int4", "int4_g64", "int4_g32", "nvf4", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "q8_0_h", "q4_0_h")
VARIANT_FMTS = ("bf16", "bf16_m8", "fp8", "int8", "int4", "nvf4", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k")
VARIANT_NAMES = {1: "2-stage ring; int4 and GGUF: the previous kernels", 2: "without PDL",
                 3: "int4: the per-lane kernel (quant_int4_lane.cu); others: the previous default kernel",
                 4: "2 m-tiles per warp; GGUF: a 2-stage ring", 5: "int4/nvf4: 4 stages; GGUF: 4 stages",
                 6: "int4: 2 m-tiles, 3 stages",
                 7: "probe (int4; GGUF: the staged kernel): the same copies without decode (wrong results: the access pattern's ceiling)",
                 8: "int4 / nvf4: shifts as mul.hi (FMA pipe)", 9: "int4: shifts as mul.hi, 2 m-tiles per warp",
                 10: "int4: 24 warps per SM", 12: "Q8_0, bf16 x: through a scaled fp16 copy of x (an x kernel)",
                 13: "Q8_0, bf16 x: codes to bf16 by byte operations (no fp32)"}
VARIANT_NAMES[21] = "GGUF: the stage and unit loops not unrolled (less code)"
VARIANT_NAMES[22] = "GGUF Q4_K / Q6_K: block scales once per quad, shared through shared memory"
VARIANT_NAMES[29] = "GGUF: the session-5 default kernel"
VARIANT_NAMES[30] = "GGUF s6: permutes with immediate selectors (Q8_0 bf16: variant 13's decode; default bits)"
VARIANT_NAMES[31] = "GGUF s6: 30 + variant 22's quad scales (Q4_K / Q6_K; default bits)"
VARIANT_NAMES[32] = "GGUF s6: 30 + Q4_1 / Q4_K codes as 128 + q, fold in the min term (bf16 x; other bits)"
VARIANT_NAMES[33] = "GGUF s6: 31 + 32 (Q4_1 / Q4_K / Q6_K)"
VARIANT_NAMES[34] = "GGUF s6: 30 + each ring slot refilled after its decode (one more stage in flight; default bits)"
VARIANT_NAMES[35] = "GGUF s6: 33 + the late refill of 34"
VARIANT_NAMES[36] = "GGUF s6: the copies alone (as 7) with the late refill (wrong results)"
GGUF_ONLY_VARIANTS = (21, 22, 29, 30, 31, 32, 33, 34, 35, 36)  # --variants: the GGUF formats only (GGUF_VARIANT_FMTS)
# the GGUF formats a variant changes (others: skipped; not listed: all five)
GGUF_VARIANT_FMTS = {22: ("q4_k", "q6_k"), 31: ("q4_k", "q6_k"), 32: ("q4_1", "q4_k"), 33: ("q4_1", "q4_k", "q6_k"),
                     35: ("q4_1", "q4_k", "q6_k")}
INT4_ONLY_VARIANTS = (6, 9, 10, 11, 14, 16, 17, 19, 20, 27, 37, 38, 39, 48, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64,
                      65, 66)  # --variants: int4 / nvf4 only (8: int4 and nvf4; 7: int4 and GGUF; 12 / 13: int4 / nvf4 and Q8_0)
NEW_KERNEL_VARIANTS = (3, 4, 5, 7)  # int4, nvf4 and the GGUF formats only
GGUF_FMTS = ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k")


def tbs(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e12


# int4 / nvf4: what the variants run there (src/cuda/quant.cu, src/cuda/gemv_w4_staged.cu)
W4_VARIANT_NAMES = {1: "the per-lane-chunk kernel of gemv_mma.cuh", 2: "without PDL",
                    3: "int4: the session-3 staged-tile kernel; nvf4: the per-lane kernel (the default of sessions 4-5)",
                    6: "staged: MODE 0, a ring of 3, without the CTA spreading",
                    7: "staged probe: the same copies without decode (wrong results: the access pattern's ceiling)",
                    8: "nvf4: the per-lane kernel with mul.hi shifts (int4: the default)",
                    9: "staged: MODE 0, a ring of 2, registers for 24 warps per SM",
                    10: "the staged kernel's default configuration (as 0)",
                    11: "staged, lean copies (MODE 3), a ring of 3",
                    13: "staged, MODE 0, a ring of 3 (session 5's default)",
                    14: "staged, lean copies + x of a stage's first block loaded during the previous stage",
                    16: "staged probe without x loads (x from registers; wrong results: the decode's ceiling)",
                    17: "staged, x through a ring of 3 at M = 1 (M > 1: x from global memory, the same plan)",
                    19: "staged, x through a ring of 2 at M = 1 (the default since session 6; int4 g128, bf16 x: until session 7)",
                    20: "staged, MODE 0 with a ring of 2 at every M (x from global memory)",
                    27: "staged, 19 with the loop over the ring's stages not unrolled (less code; the default's bits)",
                    37: "int4 g128: the per-shape plan (variant 20 where N >= 2 K, else 19; the bf16 default in session 7 until its final run)",
                    38: "int4 g128: the default on codes in the mma nibble order (no x byte permutes)",
                    39: "int4 g128: 37 on codes in the mma nibble order",
                    48: "int4 g128: 19 with x paired in the ring once per stage (MODE 11; 19's bits; the bf16 default since session 7's final run)",
                    51: "int4 g128: 19 with x copied through L1 (MODE 12; 19's bits)",
                    52: "x paired in the ring once per stage (MODE 11) for every format (int4 g128: 48; others: the default's bits)",
                    53: "MODE 11 with a ring of 3, wt 12 (two stages in flight per warp; other bits, tested)",
                    54: "MODE 11 with a ring of 2, wt 8 (half the warps per SM, twice the stages per warp; other bits)",
                    55: "MODE 11 with a ring of 3, wt 8 (other bits, tested)",
                    56: "staged probe with a ring of 2: the copies alone with one stage in flight per warp (48's warps; wrong results)",
                    57: "52 without the CTA spreading (52's bits; the next call's CTAs may start early under PDL)",
                    58: "53 with the first stage waiting for its own codes and x only (MODE 13; 53's bits)",
                    59: "int4 g128: stages of 2 blocks, a ring of 4 (MODE 13) on 48's plan and split (48's bits; 1.5x the bytes in flight)",
                    60: "int4 g128: stages of 2 blocks, a ring of 3 (MODE 13) on 48's plan and split (48's bits; 48's bytes in flight)",
                    61: "int4 g128, bf16 x, M = 1: x as fp16 x 2^e per stage, codes decoded as fp16 (MODE 14; NEW NUMERICS, "
                        "48's plan; M > 1: 48)",
                    62: "int4 g128, bf16 x, M = 1: 48 with the next stage's copies issued before the wait (two stages in flight "
                        "while waiting) and lean copies (MODE 15; 48's bits; M > 1: 48)",
                    63: "int4 g128, bf16 x, M = 1: k_w4i, the codes as u8 into int8 mma, x as 16-bit fixed point per block "
                        "(NEW NUMERICS; 48's plan, a ring of 2; M <= 8: a row's bits independent of M)",
                    64: "63 with 24 target warps per SM and registers for 3 CTAs of 256 threads (NEW NUMERICS)",
                    65: "63 with a ring of 3 (NEW NUMERICS)",
                    66: "63 with one stage per warp allowed (more warps on the short shapes; NEW NUMERICS)"}
W4_ORDER_VARIANTS = (38, 39)  # int4 g128: timed and checked on codes reordered by mma_order (other formats: the default)


def mma_order(q):
    """int4 codes (weight 2j in byte j's low nibble) with each 32-bit word's nibble p = weight 2p and
    nibble p + 4 = weight 2p + 1 (k_w4's ORD layout; tests/python/test_gemv_w4_s7_cuda.py has the same)."""
    q = np.ascontiguousarray(q, dtype=np.uint8)
    b = q.reshape(q.shape[:-1] + (q.shape[-1] // 4, 4))
    w = np.empty(b.shape[:-1] + (8,), dtype=np.uint8)
    w[..., 0::2], w[..., 1::2] = b & 0xF, b >> 4
    out = np.stack([w[..., 0] | (w[..., 2] << 4), w[..., 4] | (w[..., 6] << 4),
                    w[..., 1] | (w[..., 3] << 4), w[..., 5] | (w[..., 7] << 4)], axis=-1).astype(np.uint8)
    return out.reshape(q.shape)


def repeat_rows(tile, n, copies):
    """A CUDA array of copies * n rows made of `tile` repeated (rows of the tile cycle)."""
    t = tile.to("cuda")
    rows = tile.shape[0]
    big = gk.empty((n * copies,) + tuple(tile.shape[1:]), dtype=tile.dtype, device="cuda")
    for r0 in range(0, n * copies, rows):
        r1 = min(r0 + rows, n * copies)
        gk.copy_into(big[r0:r1], t[: r1 - r0])
    return big


def weights(fmt, k, n, copies, rng):
    """(list of per-copy argument tuples for the gemv call, callable(x, *args), bytes per copy, check)."""
    w_tile = (rng.standard_normal((TILE, k), dtype=np.float32) / math.sqrt(k)).astype(np.float32)
    wt = gk.asarray(w_tile)
    if fmt.startswith(("bf16", "fp16")):
        dt = "float16" if fmt == "fp16" else "bfloat16"
        tile = wt.astype(dt)
        big = repeat_rows(tile, n, copies)
        args = [(big[c * n:(c + 1) * n],) for c in range(copies)]
        deq = tile.astype("float32").numpy().astype(np.float64)
        return args, (lambda x, w: gk.gemv(x, w)), n * k * 2, deq
    if fmt in ("fp8", "int8"):
        q, s = getattr(gk, f"quantize_{fmt}")(wt)
        deq = gk.to_numpy(getattr(gk, f"dequantize_{fmt}")(q, s)).astype(np.float64)
        qb, sb = repeat_rows(q, n, copies), repeat_rows(s, n, copies)
        args = [(qb[c * n:(c + 1) * n], sb[c * n:(c + 1) * n]) for c in range(copies)]
        fn = getattr(gk, f"gemv_{fmt}")
        return args, (lambda x, q_, s_: fn(x, q_, s_)), n * k + n * 4, deq
    if fmt.startswith("int4"):
        g = int(fmt[6:]) if fmt.startswith("int4_g") else 128
        q, s, z = gk.quantize_int4(wt, group=g)
        deq = gk.to_numpy(gk.dequantize_int4(q, s, z, group=g)).astype(np.float64)
        qb, sb, zb = (repeat_rows(a, n, copies) for a in (q, s, z))
        args = [(qb[c * n:(c + 1) * n], sb[c * n:(c + 1) * n], zb[c * n:(c + 1) * n]) for c in range(copies)]
        nbytes = n * k // 2 + n * (k // g) * 5

        def fn4(x, q_, s_, z_):
            return gk.gemv_int4(x, q_, s_, z_, group=g)

        def mma_args():  # the same weights with the codes in the mma nibble order (variants 38 / 39)
            qo = repeat_rows(gk.asarray(mma_order(gk.to_numpy(q))), n, copies)
            return [(qo[c * n:(c + 1) * n], sb[c * n:(c + 1) * n], zb[c * n:(c + 1) * n]) for c in range(copies)]
        fn4.mma_args = mma_args
        return args, fn4, nbytes, deq
    if fmt == "nvf4":
        q, bs, ts = gk.quantize_nvf4(wt)
        deq = gk.to_numpy(gk.dequantize_nvf4(q, bs, ts)).astype(np.float64)
        qb, bb = repeat_rows(q, n, copies), repeat_rows(bs, n, copies)
        tsc = ts.to("cuda")
        args = [(qb[c * n:(c + 1) * n], bb[c * n:(c + 1) * n], tsc) for c in range(copies)]
        nbytes = n * k // 2 + n * (k // 16) + 4
        return args, (lambda x, q_, b_, t_: gk.gemv_nvf4(x, q_, b_, t_)), nbytes, deq
    q = getattr(gk, f"quantize_{fmt}")(wt)
    deq = gk.to_numpy(getattr(gk, f"dequantize_{fmt}")(q)).astype(np.float64)
    qb = repeat_rows(q, n, copies)
    args = [(qb[c * n:(c + 1) * n],) for c in range(copies)]
    fn = getattr(gk, f"gemv_{fmt}")
    return args, (lambda x, q_: fn(x, q_)), n * q.shape[1], deq


def x_prep(x):
    """bf16 x [m, k] on the GPU -> (its scaled fp16 copy, 2^-c per row): the rule of the norm's
    copy (EngineOptions::quantized_x_prep) and of gemv_w8.cu's x kernel."""
    xs = gk.to_numpy(x.astype("float32")).astype(np.float64)
    xh = np.zeros(xs.shape, np.float16)
    xinv = np.ones(xs.shape[0], np.float32)
    for r in range(xs.shape[0]):
        mx = np.max(np.abs(xs[r]))
        c = 0 if mx == 0 or not np.isfinite(mx) else max(-126, min(126, 14 - int(np.floor(np.log2(mx)))))
        xh[r] = (xs[r] * 2.0**c).astype(np.float32).astype(np.float16)
        xinv[r] = np.float32(2.0**-c)
    return gk.asarray(xh).to("cuda"), gk.asarray(xinv).to("cuda")


def time_graph(calls, rounds):
    """Median ms per call of `calls` (a list of thunks) captured in one gk.Graph."""
    for c in calls:
        c()
    gk.synchronize()
    g = gk.Graph()
    try:
        with g:
            for c in calls:
                c()
        run = g.replay
        run(g.stream)
    except Exception as e:  # noqa: BLE001 - fall back to plain launches on the graph's stream
        print(f"  (graph capture failed: {e}; timing plain launches)")

        def run(st):
            with st:
                for c in calls:
                    c()
    gk.synchronize()
    st = g.stream  # replays run on the graph's stream: the events must be recorded there
    out = []
    for _ in range(rounds):
        a, b = gk.Event(), gk.Event()
        a.record(st)
        run(st)
        b.record(st)
        b.synchronize()
        out.append(a.elapsed_time(b) / len(calls))
    return out


def time_torch_graph(torch, calls, rounds):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / len(calls))
    return out


def copy_ceiling(rounds):
    n = 1 << 28  # 1 GiB of float32, read + written
    src = gk.full((n,), 1.0, dtype="float32", device="cuda")
    dst = gk.empty((n,), dtype="float32", device="cuda")
    ms = time_graph([lambda: gk.copy_into(dst, src)], rounds)
    return tbs(2 * 4 * n, median(ms))


def check(fmt, y, x, deq):
    """The first rows of y against float64 products with the exact dequantized weight."""
    xs = gk.to_numpy(x.astype("float32")).astype(np.float64)
    ref = xs @ deq.T
    got = gk.to_numpy(y.astype("float32")).astype(np.float64)[:, : deq.shape[0]]
    bound = np.abs(xs) @ np.abs(deq).T
    err = np.abs(got - ref)
    tol = 2.0**-7 * np.abs(ref) + 1e-5 * bound + 1e-6
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        raise AssertionError(f"{fmt}: y{list(i)} = {got[i]!r}, reference {ref[i]!r} (bound {bound[i]:.3g})")


def main():
    args = parse_args(__doc__, lambda p: (p.add_argument("--only", default=",".join(FORMATS)),
                                          p.add_argument("--shapes", default="0,1,2"),
                                          p.add_argument("--ms", default="1"),
                                          p.add_argument("--w8", default=""),
                                          p.add_argument("--gguf", default=""),
                                          p.add_argument("--no-variants", action="store_true",
                                                         help="skip the alternative kernel variants"),
                                          p.add_argument("--variants", default="1,2",
                                                         help="variants timed beside the default (3-6: int4 only)")))
    if not require_cuda():
        return 0
    t0 = time.time()
    try:
        import torch
        have_torch = not args.no_peer and torch.cuda.is_available()
    except ImportError:
        torch, have_torch = None, False
    rounds = max(5, args.rounds // 3)
    only = [f for f in FORMATS if f in set(args.only.split(","))]
    extra_ms = [int(v) for v in args.ms.split(",") if int(v) > 1]
    only = only + [f"{f}_m{mm}" for mm in extra_ms for f in only if "_m" not in f
                   and not f.endswith(("_tc", "_cc", "_st", "_h")) and f not in ("bf16", "fp16")]
    ceiling = copy_ceiling(rounds)
    print(f"copy ceiling {ceiling:.3f} TB/s (1 GiB device-to-device, read + written)")
    if not 1.0 < ceiling < 6.0:
        print("WARNING: the copy ceiling is implausible for an H200: the timing is broken")
    rng = np.random.default_rng(11)
    records = []
    for si in (int(s) for s in args.shapes.split(",")):
        k, n = SHAPES[si]
        shape = f"K{k}_N{n}"
        peer, pv = "", None
        if have_torch:
            copies = max(1, math.ceil(L2_DEFEAT / (n * k * 2)))
            tw = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            tx = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            calls = [(lambda w=w: torch.matmul(tx, w.t())) for w in tw * 2]
            pv = tbs(n * k * 2, median(time_torch_graph(torch, calls, rounds)))
            peer = "torch.matmul bf16 (M=1)"
            del tw, calls
            torch.cuda.empty_cache()
        for fmt in only:
            m = int(fmt.rsplit("_m", 1)[1].split("_")[0]) if "_m" in fmt else 1
            base = fmt
            if not fmt.startswith(("bf16", "fp16")):
                base = (fmt.removesuffix("_tc").removesuffix("_cc").removesuffix("_st").removesuffix("_xp")
                        .removesuffix("_h").split("_m")[0])
            if fmt.startswith("int4_g"):
                base = fmt.split("_m")[0]
            gk._C._gemv_set_dense_path({"_tc": 1, "_cc": 0, "_st": 2}.get(fmt[-3:], -1))
            xdt = "float16" if fmt == "fp16" or "_h_" in fmt or fmt.endswith("_h") else "bfloat16"
            x = gk.asarray(rng.standard_normal((m, k), dtype=np.float32)).to("cuda").astype(xdt)
            probe_bytes = n * k * (2 if fmt.startswith(("bf16", "fp16")) else 1)
            copies = max(1, math.ceil(L2_DEFEAT / probe_bytes))
            try:
                wargs, fn, nbytes, deq = weights(base, k, n, copies, rng)
                if fmt.endswith("_xp_st"):  # x's scaled fp16 copy made beforehand (quantized_x_prep)
                    xh, xinv = x_prep(x)
                    fn = (lambda x_, q_, s_, f_=base, xh_=xh, xi_=xinv:
                          gk._C._gemv_quantized_prepared(f_, q_, s_, x_, xh_, xi_))
                copies = max(1, min(copies, math.ceil(L2_DEFEAT / nbytes)))
                check(fmt, fn(x, *wargs[0]), x, deq)
                calls = [(lambda a=a: fn(x, *a)) for a in wargs[:copies] * 2]
                ms = time_graph(calls, rounds)
            except Exception as e:  # noqa: BLE001 - report and go on with the other formats
                print(f"gemv {fmt} {shape}: FAILED: {type(e).__name__}: {e}")
                continue
            v = tbs(nbytes, median(ms))
            notes, r_var = [], {}
            if not args.no_variants:  # the alternative kernel variants, printed only
                for var in (int(a_) for a_ in args.variants.split(",") if a_):
                    if var == 1 and fmt not in VARIANT_FMTS and base not in VARIANT_FMTS:
                        continue
                    if var in INT4_ONLY_VARIANTS and not base.startswith(("int4", "nvf4")):
                        continue
                    if var in NEW_KERNEL_VARIANTS and not base.startswith(("int4", "q", "nvf4")):
                        continue
                    if var == 8 and not base.startswith(("int4", "nvf4")):
                        continue
                    if var in (12, 13) and not base.startswith(("int4", "nvf4")) and fmt not in ("q8_0", "q8_0_m4", "q8_0_m8"):
                        continue
                    if var in GGUF_ONLY_VARIANTS and (base not in GGUF_FMTS or base not in GGUF_VARIANT_FMTS.get(var, GGUF_FMTS)):
                        continue
                    try:
                        vargs, vcalls = wargs, calls
                        if var in W4_ORDER_VARIANTS and base == "int4":  # g128: the codes in the mma nibble order
                            vargs = fn.mma_args()
                            vcalls = [(lambda a=a: fn(x, *a)) for a in vargs[:copies] * 2]
                        gk._C._gemv_set_variant(var)
                        if var not in (7, 16, 36, 56):  # the probes compute nothing (16 / 56: int4 / nvf4; 36: GGUF)
                            check(fmt, fn(x, *vargs[0]), x, deq)
                        v1 = tbs(nbytes, median(time_graph(vcalls, rounds)))
                        vname = (W4_VARIANT_NAMES if base.startswith(("int4", "nvf4")) else VARIANT_NAMES)[var]
                        notes.append(f"  variant {var} ({vname}): {v1:.3f} TB/s = {v1 / ceiling:.0%} of copy")
                        r_var[var] = v1
                    except Exception as e:  # noqa: BLE001
                        notes.append(f"  variant {var} FAILED: {type(e).__name__}: {e}")
                    finally:
                        gk._C._gemv_set_variant(0)
            if fmt.endswith("_st") and args.w8:  # the staged kernel's stage / depth / warp knob
                for cfg in args.w8.split("/"):
                    os.environ["GPUKIT_GEMV_W8"] = cfg
                    try:
                        check(fmt, fn(x, *wargs[0]), x, deq)
                        v1 = tbs(nbytes, median(time_graph(calls, rounds)))
                        notes.append(f"  w8 {cfg}: {v1:.3f} TB/s = {v1 / ceiling:.0%} of copy")
                        r_var[f"w8_{cfg.replace(',', '_')}"] = v1
                    except Exception as e:  # noqa: BLE001
                        notes.append(f"  w8 {cfg} FAILED: {type(e).__name__}: {e}")
                    finally:
                        del os.environ["GPUKIT_GEMV_W8"]
            if base in GGUF_FMTS and args.gguf:  # the staged GGUF kernel's depth / warps knob
                for cfg in args.gguf.split("/"):
                    env = ("GPUKIT_GGUF_AW" if cfg.startswith("aw=") else
                           "GPUKIT_GGUF_LA" if cfg.startswith("la=") else
                           "GPUKIT_GGUF_IMMA" if cfg.startswith("im=") else "GPUKIT_GEMV_GGUF")
                    os.environ[env] = cfg[3:] if cfg[:3] in ("aw=", "la=", "im=") else cfg
                    try:
                        # V 7 / 36 / 37 / 38 / 42 / 44 / 46: the copies alone, wrong results (Q6_K: 42 / 44 =
                        # 41 / 43, its default math)
                        v9 = cfg.split(",")[8:9]
                        if cfg != "la=p" and (v9 not in (["7"], ["36"], ["37"], ["38"], ["42"], ["44"], ["46"]) or (
                                v9 in (["42"], ["44"]) and base == "q6_k")):
                            check(fmt, fn(x, *wargs[0]), x, deq)
                        v1 = tbs(nbytes, median(time_graph(calls, rounds)))
                        notes.append(f"  gguf {cfg}: {v1:.3f} TB/s = {v1 / ceiling:.0%} of copy")
                        r_var[f"gguf_{cfg.replace(',', '_')}"] = v1
                    except Exception as e:  # noqa: BLE001
                        notes.append(f"  gguf {cfg} FAILED: {type(e).__name__}: {e}")
                    finally:
                        del os.environ[env]
            if fmt == "bf16":  # cross-check: plain launches timed on the current stream (host overhead included)
                a, b = gk.Event(), gk.Event()
                a.record()
                for c in calls:
                    c()
                b.record()
                b.synchronize()
                notes.append(f"  (bf16 without a graph: {a.elapsed_time(b) / len(calls) * 1e3:.1f} us per call)")
            r = record("gemv", shape, fmt, "TB/s", v, peer, pv, [tbs(nbytes, t) for t in ms])
            r["copy_ceiling"] = round(ceiling, 4)
            r["us"] = round(median(ms) * 1e3, 2)
            for var, vv in r_var.items():
                r[f"variant{var}_tbs" if isinstance(var, int) else var] = round(vv, 4)
            records.append(r)
            print(f"gemv {fmt:<8} {shape:<14} M={m}: {median(ms) * 1e3:8.1f} us  {v:6.3f} TB/s = "
                  f"{v / ceiling:4.0%} of copy" + (f"  (torch bf16 M=1: {pv:.3f} TB/s)" if pv else ""))
            for line in notes:
                print(line)
            wargs = fn = calls = None
    gk._C._gemv_set_dense_path(-1)
    print_table(records)
    write_results(args.out, records)
    print(f"bench/gemv.py took {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
