"""Benchmarks of the fused inference ops against torch's fastest form, in one run.

    python bench/fused.py [--out bench/results/h200.json] [--rounds 30] [--only softmax,rope_qk] [--no-sweep]

Times each op with CUDA events (gpukit events on gpukit's stream, torch events on
torch's), warm-up first, the median of --rounds rounds of --iters launches each;
inputs rotate between several copies so that they do not sit in the 60 MB L2.
Beside each op it measures torch's copy_ of the same number of bytes (half read,
half written) and prints the op's TB/s as a share of that copy and of the 512 MiB
copy ceiling. Unless --no-sweep, it also times the launch shapes the kernels can
take (GPUKIT_TUNE, see src/cuda/common/vec.cuh), one line each, to pick defaults.
Records: {"name", "shape", "dtype", "metric", "gpukit", "peer", "peer_value", "rounds"}
(metric TB/s of minimum bytes moved). Exits 0 with a message without CUDA or torch.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np


def _setup():
    try:
        import torch
    except ImportError:
        return None, None, "torch is not installed"
    import gpukit as gk
    if not gk.cuda.is_available() or not torch.cuda.is_available():
        return None, None, "no CUDA device"
    return gk, torch, None


HOST_US = {}  # last time_gk: median host microseconds per call (launch-rate check)


def time_gk(gk, fn, args_list, rounds, iters):
    import time
    for i in range(3):
        fn(*args_list[i % len(args_list)])
    gk.cuda.synchronize()
    out, host = [], []
    for _ in range(rounds):
        a, b = gk.Event(), gk.Event()
        a.record()
        h0 = time.perf_counter()
        for i in range(iters):
            fn(*args_list[i % len(args_list)])
        host.append((time.perf_counter() - h0) * 1e6 / iters)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)  # us
    HOST_US["last"] = statistics.median(host)
    return out


def time_torch(torch, fn, args_list, rounds, iters):
    for i in range(3):
        fn(*args_list[i % len(args_list)])
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(iters):
            fn(*args_list[i % len(args_list)])
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)
    return out


def gk_rand(gk, shape, dtype, seed):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return gk.asarray(a).astype(dtype).to("cuda")


def cases(gk, torch):
    """(name, shape label, dtype, bytes, gk fn, gk args list, peer name, torch fn, torch args list)."""
    F = torch.nn.functional
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    ncopy = 4
    for dt in ("float32", "bfloat16"):
        R = H = 4096
        es = 4 if dt == "float32" else 2
        # rms_norm + residual: read x, r, write y, r'
        gx = [(gk_rand(gk, (R, H), dt, i), gk_rand(gk, (R, H), dt, 10 + i), gk_rand(gk, (H,), dt, 99))
              for i in range(ncopy)]
        tx = [(torch.randn(R, H, device="cuda", dtype=tdt[dt]), torch.randn(R, H, device="cuda", dtype=tdt[dt]),
               torch.randn(H, device="cuda", dtype=tdt[dt])) for _ in range(ncopy)]

        def t_rms_res(x, r, w):
            r2 = x + r
            return F.rms_norm(r2, (H,), w, 1e-6), r2
        yield ("rms_norm_residual", "4096x4096", dt, 4 * R * H * es,
               lambda x, r, w: gk.nn.rms_norm(x, w, 1e-6, residual=r), gx, "torch F.rms_norm(x + r)", t_rms_res, tx)
        yield ("layer_norm", "4096x4096", dt, 2 * R * H * es,
               lambda x, r, w: gk.nn.layer_norm(x, w, w, 1e-5), gx, "torch F.layer_norm",
               lambda x, r, w: F.layer_norm(x, (H,), w, w, 1e-5), tx)
        # swiglu on [4096, 2*4096] -> [4096, 4096]: read 2, write 1
        gs = [(gk_rand(gk, (R, 2 * H), dt, 20 + i),) for i in range(ncopy)]
        ts = [(torch.randn(R, 2 * H, device="cuda", dtype=tdt[dt]),) for _ in range(ncopy)]
        yield ("swiglu", "4096x4096", dt, 3 * R * H * es, lambda x: gk.nn.swiglu(x), gs,
               "torch F.silu(g) * u", lambda x: F.silu(x[:, :H]) * x[:, H:], ts)
        del gs, ts
        gm = [(gk_rand(gk, (R, H), dt, 30 + i),) for i in range(ncopy)]
        tm = [(torch.randn(R, H, device="cuda", dtype=tdt[dt]),) for _ in range(ncopy)]
        yield ("softmax", "4096x4096", dt, 2 * R * H * es, lambda x: gk.softmax(x), gm,
               "torch.softmax", lambda x: torch.softmax(x, -1), tm)


def rope_cases(gk, torch, ncopy=2):
    T, Hq, Hkv, D = 8192, 32, 8, 128
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    for dt in ("float32", "bfloat16"):
        es = 4 if dt == "float32" else 2
        nbytes = 2 * T * (Hq + Hkv) * D * es + T * 8
        pos = gk.asarray(np.arange(T, dtype=np.int64)).to("cuda")
        ga = [(gk_rand(gk, (T, Hq, D), dt, i), gk_rand(gk, (T, Hkv, D), dt, 5 + i)) for i in range(ncopy)]
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float64) / D))
        tpos = torch.arange(T, device="cuda")
        ang = (tpos.double()[:, None] * inv[None]).float()
        emb = torch.cat([ang, ang], -1)
        cos, sin = emb.cos().to(tdt[dt])[:, None, :], emb.sin().to(tdt[dt])[:, None, :]
        ta = [(torch.randn(T, Hq, D, device="cuda", dtype=tdt[dt]), torch.randn(T, Hkv, D, device="cuda",
                                                                              dtype=tdt[dt])) for _ in range(ncopy)]

        def rot(x):
            x1, x2 = x[..., : D // 2], x[..., D // 2:]
            return torch.cat((-x2, x1), -1)

        def t_rope(q, k):
            return q * cos + rot(q) * sin, k * cos + rot(k) * sin
        yield ("rope_qk", f"T{T}_Hq{Hq}_Hkv{Hkv}_D{D}", dt, nbytes, lambda q, k: gk.nn.rope(q, k, pos), ga,
               "torch eager NeoX (cached cos/sin)", t_rope, ta)


NORM_PERSIST = ["norm.persist=1", "norm.persist=1,norm.waves=2", "norm.persist=1,norm.tpr=64",
                "norm.persist=1,norm.tpr=256", "norm.persist=1,norm.tpr=32,norm.rows=4", "norm.prew=1",
                "norm.prew=1,norm.tpr=64,norm.rows=2", "norm.prew=1,norm.persist=1", "norm.prew=1,norm.tpr=256"]
# Launch shapes to compare with --sweep: op name -> GPUKIT_TUNE strings ("" = the default).
SWEEP = {
    "rms_norm_residual": ["norm.tpr=32", "norm.tpr=64", "norm.tpr=128", "norm.tpr=256", "norm.tpr=512",
                          "norm.tpr=128,norm.rows=2", "norm.tpr=64,norm.rows=4", *NORM_PERSIST],
    "layer_norm": ["norm.tpr=32", "norm.tpr=64", "norm.tpr=128", "norm.tpr=256", "norm.tpr=512",
                   "norm.tpr=128,norm.rows=2", "norm.tpr=64,norm.rows=4", *NORM_PERSIST],
    "softmax": ["softmax.tpr=32", "softmax.tpr=64", "softmax.tpr=128", "softmax.tpr=256", "softmax.tpr=512",
                "softmax.tpr=128,softmax.rows=2", "softmax.tpr=64,softmax.rows=2", "softmax.persist=1",
                "softmax.persist=1,softmax.tpr=64", "softmax.persist=1,softmax.tpr=256"],
    "swiglu": ["gated.unroll=2", "gated.unroll=4", "gated.unroll=8", "gated.bpsm=8", "gated.bpsm=16",
               "gated.unroll=2,gated.bpsm=16"],
    "rope_qk": ["rope.k=1", "rope.k=2", "rope.k=4", "rope.k=8"],
}


def copy_time(torch, nbytes, rounds, iters, cache):
    """Median us of torch's copy_ moving nbytes (nbytes/2 read, nbytes/2 written), rotating buffers."""
    if nbytes not in cache:
        n = nbytes // 2 // 4
        nbuf = max(2, min(8, int(256e6 // max(1, nbytes))))
        src = [torch.randn(n, device="cuda") for _ in range(nbuf)]
        dst = [torch.empty_like(src[0]) for _ in range(nbuf)]
        t = time_torch(torch, lambda s, d: d.copy_(s), list(zip(src, dst)), rounds, iters)
        cache[nbytes] = statistics.median(t)
        del src, dst
    return cache[nbytes]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results/h200.json")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--only", default="", help="comma-separated names to run")
    p.add_argument("--sweep", action="store_true", default=True,
                   help="also time the launch shapes in SWEEP (the default; a few seconds)")
    p.add_argument("--no-sweep", dest="sweep", action="store_false")
    a = p.parse_args(argv)
    gk, torch, why = _setup()
    if why:
        print(f"bench/fused.py: skipped ({why})")
        return 0
    import os
    only = {s for s in a.only.split(",") if s}
    want = lambda name: not only or name in only  # noqa: E731
    os.environ.pop("GPUKIT_TUNE", None)
    copies = {}
    big = 512 * 2**20
    ceiling = big / (copy_time(torch, big, a.rounds, 5, copies) * 1e-6) / 1e12
    print(f"copy ceiling (torch copy_, 256 MiB read + 256 MiB written): {ceiling:.2f} TB/s")
    recs = []
    import itertools
    gens = [cases(gk, torch)] if want("rms_norm_residual") or want("layer_norm") or want("swiglu") or \
        want("softmax") else []
    if want("rope_qk"):
        gens.append(rope_cases(gk, torch))
    for name, shape, dt, nbytes, gfn, gargs, peer, tfn, targs in itertools.chain(*gens):
        if not want(name):
            continue
        g = time_gk(gk, gfn, gargs, a.rounds, a.iters)
        t = time_torch(torch, tfn, targs, a.rounds, a.iters)
        tb = [nbytes / (us * 1e-6) / 1e12 for us in g]
        peer_tb = nbytes / (statistics.median(t) * 1e-6) / 1e12
        rec = {"name": name, "shape": shape, "dtype": dt, "metric": "TB/s", "gpukit": statistics.median(tb),
               "peer": peer, "peer_value": peer_tb, "rounds": tb}
        recs.append(rec)
        cp = nbytes / (copy_time(torch, nbytes, a.rounds, a.iters, copies) * 1e-6) / 1e12
        ok = "OK" if rec["gpukit"] >= 0.85 * cp and rec["gpukit"] > peer_tb else "BELOW TARGET"
        if HOST_US["last"] > 0.8 * statistics.median(g):
            ok += f" (host {HOST_US['last']:.1f} us per call: launch-bound?)"
        print(f"{name:20s} {shape:22s} {dt:9s} gpukit {rec['gpukit']:.2f} TB/s ({statistics.median(g):.1f} us)"
              f" = {rec['gpukit'] / cp:.0%} of copy@same bytes {cp:.2f}, {rec['gpukit'] / ceiling:.0%} of ceiling"
              f" | {peer}: {peer_tb:.2f} TB/s ({statistics.median(t):.1f} us) x{rec['gpukit'] / peer_tb:.2f} {ok}",
              flush=True)
        if a.sweep:
            for tune in SWEEP.get(name, []):
                os.environ["GPUKIT_TUNE"] = tune
                gv = time_gk(gk, gfn, gargs, max(10, a.rounds // 2), a.iters)
                v = nbytes / (statistics.median(gv) * 1e-6) / 1e12
                print(f"    sweep {name} {dt} {tune:28s} {v:.2f} TB/s ({statistics.median(gv):.1f} us) "
                      f"{v / cp:.0%} of copy", flush=True)
            os.environ.pop("GPUKIT_TUNE", None)
    import common  # bench/common.py: one results writer for every benchmark
    for r in recs:
        r["dtype"] = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(r["dtype"], r["dtype"])
    common.write_results(a.out, recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
