"""The gate/up GEMV of quantized decode with the SwiGLU in its epilogue (EngineOptions::quantized_swiglu_epi,
session 10, "sge") against today's pair: at the 8B gate/up shape (K 4096, N 2 x 14336, M 1) per format
(fp8, int8, int4 g128; fp8_xp / int8_xp: quantized_x_prep's fp16 x), the median us per call and the weight
bytes' TB/s of
  gemv   the GEMV alone (gk.gemv_<fmt>, bf16 output),
  +sw    the GEMV then the engine's SwiGLU kernel (gk._C.llm.fused_swiglu): today's pair,
  sge    one launch: gk._C.llm.gemv_quantized_swiglu ("(not fused)" if the fused kernel did not run).
Each timing is a CUDA graph of 2 x `copies` calls over `copies` weight copies (separate memory, the same values;
> 200 MB in all, so L2 holds none of them between calls). The sge output is checked bit for bit against +sw first.
Usage: python bench/sge.py [--only fp8,int8,int4,fp8_xp] [--k 4096] [--i 14336] [--rounds 30] [--variant V]"""
import math
import sys
import time

import numpy as np

from common import gk, median, parse_args, require_cuda

from gpukit import _C

FORMATS = ["fp8", "int8", "int4", "fp8_xp", "int8_xp"]
L2_DEFEAT = 200 << 20


def time_graph(calls, rounds):
    """Median-ready list of ms per call of `calls` (thunks) captured in one gk.Graph, replayed `rounds` times."""
    for c in calls:
        c()
    gk.cuda.synchronize()
    g = gk.Graph()
    with g:
        for c in calls:
            c()
    g.replay()
    gk.cuda.synchronize()
    st = g.stream  # replays run on the graph's stream: the events are recorded there
    out = []
    for _ in range(rounds):
        a, b = gk.Event(), gk.Event()
        a.record(st)
        g.replay(st)
        b.record(st)
        b.synchronize()
        out.append(a.elapsed_time(b) / len(calls))
    return out


def weights(fmt, n, k, copies, rng):
    """`copies` copies (separate memory, the same values) of a random [n, k] weight quantized to fmt."""
    w = gk.asarray(rng.standard_normal((n, k), dtype=np.float32) / np.float32(math.sqrt(k))).to("cuda")
    if fmt == "int4":
        q, s, z = gk.quantize_int4(w, group=128)
    else:
        q, s = getattr(gk, f"quantize_{fmt}")(w)
        z = None
    del w
    out = [(q, s, z)]
    for _ in range(copies - 1):
        out.append((q.copy(), s.copy(), None if z is None else z.copy()))
    return out


def nbytes(fmt, n, k):
    if fmt == "int4":
        return n * k // 2 + n * (k // 128) * 5  # codes, f32 scales and u8 zero points per group
    return n * k + 4 * n


def main():
    args = parse_args(__doc__, lambda p: (p.add_argument("--only", default="fp8,int8,int4,fp8_xp"),
                                          p.add_argument("--k", type=int, default=4096),
                                          p.add_argument("--i", type=int, default=14336),
                                          p.add_argument("--variant", type=int, default=0,
                                                         help="gk._C._gemv_set_variant for the run (int4: 62)")))
    if not require_cuda():
        return 0
    t0 = time.time()
    rounds = max(5, args.rounds // 3)
    k, n = args.k, 2 * args.i
    rng = np.random.default_rng(7)
    x = gk.asarray(rng.standard_normal((1, k)).astype(np.float32)).astype("bfloat16").to("cuda")
    print(f"sge: gate/up GEMV + SwiGLU, K {k}, N 2 x {args.i}, M 1, variant {args.variant} "
          f"({gk.cuda.get_device_properties('cuda:0')['name']})")
    print(f"{'format':8s} {'gemv us':>9s} {'TB/s':>6s} {'+sw us':>9s} {'TB/s':>6s} {'sge us':>9s} {'TB/s':>6s} "
          f"{'sge/+sw':>8s}")
    _C._gemv_set_variant(args.variant)
    try:
        for f in [f for f in FORMATS if f in set(args.only.split(","))]:
            fmt = f.split("_")[0]
            xh = xinv = None
            if f.endswith("_xp"):
                nw = gk.asarray(np.ones(k, np.float32)).astype("bfloat16").to("cuda")
                zero = gk.asarray(np.zeros((1, k), np.float32)).astype("bfloat16").to("cuda")
                h, _, xh, xinv = _C.llm.fused_add_rms_norm_prep(x, zero, nw, 1e-6)
                if xh is None:
                    print(f"{f:8s} (the norm wrote no fp16 copy: skipped)")
                    continue
                xx = h
            else:
                xx = x
            b = nbytes(fmt, n, k)
            copies = max(1, math.ceil(L2_DEFEAT / b))
            ws = weights(fmt, n, k, copies, rng)

            def gemv(q, s, z):
                if xh is not None:
                    return _C._gemv_quantized_prepared(fmt, q, s, xx, xh, xinv, "bfloat16")
                if fmt == "int4":
                    return gk.gemv_int4(xx, q, s, z, group=128, out_dtype="bfloat16")
                return getattr(gk, f"gemv_{fmt}")(xx, q, s, out_dtype="bfloat16")

            def pair(q, s, z):
                return _C.llm.fused_swiglu(gemv(q, s, z))

            def sge(q, s, z):
                return _C.llm.gemv_quantized_swiglu(xx, fmt, q, s, z, 128, "bfloat16", xh, xinv)

            q0, s0, z0 = ws[0]
            calls0 = _C.llm._swiglu_epi_calls()
            a, c = pair(q0, s0, z0), sge(q0, s0, z0)
            fusedk = _C.llm._swiglu_epi_calls() > calls0
            same = np.asarray(gk.to_numpy(a)).tobytes() == np.asarray(gk.to_numpy(c)).tobytes()
            res = []
            for fn in (gemv, pair, sge):
                calls = [(lambda w=w, fn=fn: fn(*w)) for w in ws * 2]
                res.append(median(time_graph(calls, rounds)) * 1e3)
            tb = [b / (us * 1e-6) / 1e12 for us in res]
            tag = "" if fusedk else " (not fused)"
            if not same:
                tag += " BITS DIFFER"
            print(f"{f:8s} {res[0]:9.2f} {tb[0]:6.2f} {res[1]:9.2f} {tb[1]:6.2f} {res[2]:9.2f} {tb[2]:6.2f} "
                  f"{res[2] / res[1]:8.3f}{tag}", flush=True)
            del ws
    finally:
        _C._gemv_set_variant(0)
    print(f"sge: {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
