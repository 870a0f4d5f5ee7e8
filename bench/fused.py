"""Benchmarks of the fused inference ops against torch's fastest form, in one run.

    python bench/fused.py --out bench/results/fused.json [--rounds 30]

Times each op with CUDA events (gpukit events on gpukit's stream, torch events on
torch's), warm-up first, the median of --rounds rounds of --iters launches each;
inputs rotate between several copies so that they do not sit in the 60 MB L2.
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


def time_gk(gk, fn, args_list, rounds, iters):
    for i in range(3):
        fn(*args_list[i % len(args_list)])
    gk.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = gk.Event(), gk.Event()
        a.record()
        for i in range(iters):
            fn(*args_list[i % len(args_list)])
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)  # us
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results/fused.json")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--only", default="", help="comma-separated names to run")
    a = p.parse_args(argv)
    gk, torch, why = _setup()
    if why:
        print(f"bench/fused.py: skipped ({why})")
        return 0
    only = {s for s in a.only.split(",") if s}
    recs = []
    import itertools
    for name, shape, dt, nbytes, gfn, gargs, peer, tfn, targs in itertools.chain(
            cases(gk, torch), rope_cases(gk, torch)):
        if only and name not in only:
            continue
        g = time_gk(gk, gfn, gargs, a.rounds, a.iters)
        t = time_torch(torch, tfn, targs, a.rounds, a.iters)
        tb = [nbytes / (us * 1e-6) / 1e12 for us in g]
        peer_tb = nbytes / (statistics.median(t) * 1e-6) / 1e12
        rec = {"name": name, "shape": shape, "dtype": dt, "metric": "TB/s", "gpukit": statistics.median(tb),
               "peer": peer, "peer_value": peer_tb, "rounds": tb}
        recs.append(rec)
        print(f"{name:20s} {shape:26s} {dt:9s} gpukit {rec['gpukit']:.2f} TB/s ({statistics.median(g):.1f} us)"
              f"  {peer}: {peer_tb:.2f} TB/s ({statistics.median(t):.1f} us)  x{rec['gpukit'] / peer_tb:.2f}")
    import common  # bench/common.py: one results writer for every benchmark
    for r in recs:
        r["dtype"] = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(r["dtype"], r["dtype"])
    common.write_results(a.out, recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
