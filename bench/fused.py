"""Benchmarks of the fused inference ops against torch's fastest form and against a
copy of the same number of bytes, in one run.

    python bench/fused.py [--out bench/results/h200.json] [--rounds 30] [--only softmax,rope_qk] [--no-sweep]

Timing rule, the same for every kernel timed here (gpukit op, torch op, both copies):
  - launches back to back on the library's stream, --iters per round, CUDA events
    around each round (gpukit events for gpukit, torch events for torch), median of
    --rounds rounds after a warm-up; the host time per call is printed too, and a
    line is flagged when the host, not the GPU, sets the pace;
  - L2 (50 MB on the H200): consecutive launches never touch the same memory. Each
    launch takes the next of k input sets and writes a fresh output (the last k
    outputs are kept alive, so the allocator hands out k + 1 rotating blocks), with
    k such that k launches touch at least ROT_BYTES = 256 MiB, five times the L2.
    So no launch finds its input in L2 from an earlier one, and every launch's
    writes are written back to DRAM while later launches run (as in a real
    stream of work), not left dirty in L2 at the end of a timed single launch.
The ceiling of each op is a copy of the same number of bytes as the op's minimum
traffic (half read, half written: e.g. 32 MiB in + 32 MiB out for a bf16 4096x4096
layer_norm), timed by the same rule with gpukit's own copy kernel (gk.copy_into,
16-byte vectors) and with torch's copy_; the faster of the two is the op's ceiling.
Target (issue 5): op >= 85% of that ceiling, and faster than torch's op.
Unless --no-sweep, the launch shapes the kernels can take (GPUKIT_TUNE, see
src/cuda/common/vec.cuh and src/cuda/rows_pipe.cu) are timed too, one line each.
Records: {"name", "shape", "dtype", "metric", "gpukit", "peer", "peer_value", "rounds",
"copy_same_bytes", "of_copy"} (metric TB/s of minimum bytes moved). Exits 0 with a
message without CUDA or torch.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

ROT_BYTES = 256 * 2**20
HOST_US = {}  # last timing: median host microseconds per call


def _setup():
    try:
        import torch
    except ImportError:
        return None, None, "torch is not installed"
    import gpukit as gk
    if not gk.cuda.is_available() or not torch.cuda.is_available():
        return None, None, "no CUDA device"
    return gk, torch, None


def nsets(bytes_per_launch):
    """Input sets (and kept outputs) so that k launches touch >= ROT_BYTES."""
    return max(2, min(16, math.ceil(ROT_BYTES / max(1, bytes_per_launch))))


def _time(lib, fn, args_list, rounds, iters):
    """Per-round microseconds per launch; lib is the gpukit or the torch module (events, sync)."""
    event = lib.Event if lib.__name__ == "gpukit" else (lambda: lib.cuda.Event(enable_timing=True))
    keep, n = [], len(args_list)
    k = [0]

    def step():
        out = fn(*args_list[k[0] % n])
        k[0] += 1
        keep.append(out)
        if len(keep) > n:
            keep.pop(0)
    for _ in range(n + 3):
        step()
    lib.cuda.synchronize()
    out, host = [], []
    for _ in range(rounds):
        a, b = event(), event()
        a.record()
        h0 = time.perf_counter()
        for _ in range(iters):
            step()
        host.append((time.perf_counter() - h0) * 1e6 / iters)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)
    del keep
    HOST_US["last"] = statistics.median(host)
    return out


def tbs(nbytes, us):
    return nbytes / (us * 1e-6) / 1e12


class Copies:
    """Same-bytes copy ceilings (gpukit copy kernel and torch copy_), cached by size."""

    def __init__(self, gk, torch, rounds, iters):
        self.gk, self.torch, self.rounds, self.iters, self.cache = gk, torch, rounds, iters, {}

    def __call__(self, nbytes):
        if nbytes not in self.cache:
            gk, torch = self.gk, self.torch
            n = nbytes // 2 // 4
            k = nsets(nbytes)
            src = [torch.randn(n, device="cuda") for _ in range(k)]
            dst = [torch.empty_like(src[0]) for _ in range(k)]
            torch.cuda.synchronize()
            gsrc = [gk.from_dlpack(s) for s in src]
            gdst = [gk.from_dlpack(d) for d in dst]
            tg = statistics.median(_time(gk, lambda s, d: gk.copy_into(d, s), list(zip(gsrc, gdst)), self.rounds,
                                         self.iters))
            gk.cuda.synchronize()
            tt = statistics.median(_time(torch, lambda s, d: d.copy_(s), list(zip(src, dst)), self.rounds, self.iters))
            torch.cuda.synchronize()
            self.cache[nbytes] = (tbs(nbytes, tg), tbs(nbytes, tt))
            del src, dst, gsrc, gdst
        return self.cache[nbytes]


def _pair(gk, torch, shape, dt, k):
    """k input sets as (gpukit arrays, torch tensors) sharing memory (random normal)."""
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dt]
    ts = [torch.randn(*shape, device="cuda", dtype=tdt) for _ in range(k)]
    torch.cuda.synchronize()
    return [gk.from_dlpack(t) for t in ts], ts


def cases(gk, torch, want):
    """(name, shape label, dtype, bytes, gk fn, gk args list, peer name, torch fn, torch args list)."""
    F = torch.nn.functional
    R = H = 4096
    for dt in ("float32", "bfloat16"):
        es = 4 if dt == "float32" else 2
        tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dt]
        w = torch.randn(H, device="cuda", dtype=tdt)
        b = torch.randn(H, device="cuda", dtype=tdt)
        gw, gb = gk.from_dlpack(w), gk.from_dlpack(b)
        if want("rms_norm_residual"):  # read x, r; write y, r'
            nb = 4 * R * H * es
            k = nsets(nb)
            gx, tx = _pair(gk, torch, (R, H), dt, k)
            gr, tr = _pair(gk, torch, (R, H), dt, k)

            def t_rms_res(x, r):
                r2 = x + r
                return F.rms_norm(r2, (H,), w, 1e-6), r2
            yield ("rms_norm_residual", "4096x4096", dt, nb, lambda x, r: gk.nn.rms_norm(x, gw, 1e-6, residual=r),
                   list(zip(gx, gr)), "torch F.rms_norm(x + r)", t_rms_res, list(zip(tx, tr)))
            del gx, tx, gr, tr
        if want("layer_norm") or want("softmax"):
            nb = 2 * R * H * es
            gx, tx = _pair(gk, torch, (R, H), dt, nsets(nb))
            if want("layer_norm"):
                yield ("layer_norm", "4096x4096", dt, nb, lambda x: gk.nn.layer_norm(x, gw, gb, 1e-5),
                       [(x,) for x in gx], "torch F.layer_norm", lambda x: F.layer_norm(x, (H,), w, b, 1e-5),
                       [(x,) for x in tx])
            if want("softmax"):
                yield ("softmax", "4096x4096", dt, nb, lambda x: gk.softmax(x), [(x,) for x in gx],
                       "torch.softmax", lambda x: torch.softmax(x, -1), [(x,) for x in tx])
            del gx, tx
        if want("swiglu"):  # [4096, 2*4096] -> [4096, 4096]: read 2, write 1
            nb = 3 * R * H * es
            gs, ts = _pair(gk, torch, (R, 2 * H), dt, nsets(nb))
            yield ("swiglu", "4096x4096", dt, nb, lambda x: gk.nn.swiglu(x), [(x,) for x in gs],
                   "torch F.silu(g) * u", lambda x: F.silu(x[:, :H]) * x[:, H:], [(x,) for x in ts])
            del gs, ts


def rope_cases(gk, torch):
    import numpy as np
    T, Hq, Hkv, D = 8192, 32, 8, 128
    for dt in ("float32", "bfloat16"):
        es = 4 if dt == "float32" else 2
        tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dt]
        nbytes = 2 * T * (Hq + Hkv) * D * es + T * 8
        k = nsets(nbytes)
        pos = gk.asarray(np.arange(T, dtype=np.int64)).to("cuda")
        gq, tq = _pair(gk, torch, (T, Hq, D), dt, k)
        gkk, tk = _pair(gk, torch, (T, Hkv, D), dt, k)
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float64) / D))
        ang = (torch.arange(T, device="cuda").double()[:, None] * inv[None]).float()
        emb = torch.cat([ang, ang], -1)
        cos, sin = emb.cos().to(tdt)[:, None, :], emb.sin().to(tdt)[:, None, :]

        def rot(x):
            x1, x2 = x[..., : D // 2], x[..., D // 2:]
            return torch.cat((-x2, x1), -1)

        def t_rope(q, kk):
            return q * cos + rot(q) * sin, kk * cos + rot(kk) * sin
        yield ("rope_qk", f"T{T}_Hq{Hq}_Hkv{Hkv}_D{D}", dt, nbytes, lambda q, kk: gk.nn.rope(q, kk, pos),
               list(zip(gq, gkk)), "torch eager NeoX (cached cos/sin)", t_rope, list(zip(tq, tk)))
        del gq, tq, gkk, tk


# Launch shapes to compare (--sweep): op name -> GPUKIT_TUNE strings. Default (session 4): the warp-row
# form of src/cuda/rows_warp.cu (rows.on=0: the older register forms of norm.cu / reduce.cu, the staged
# form of rows_pipe.cu with norm.pipe / softmax.pipe): warps per row rows.wpr (bf16 4096: 4 by default = 4
# vectors per lane; f32: 8), rows per block rows.rpc (default 4 warps per block), cache hints rows.hint
# (1: loads L1::no_allocate, 2: + L2 evict_first, 4: stores .cs; default 7 from 8 MiB moved), persistent
# rows.pers (default for 16-bit layer_norm).
SWEEP = {
    "rms_norm_residual": ["rows.on=0", "rows.hint=0", "rows.wpr=8", "rows.wpr=16", "rows.rpc=2", "rows.pers=1"],
    "layer_norm": ["rows.on=0", "rows.on=0,norm.pipe=1,pipe.w=11,pipe.ef=1", "rows.hint=0", "rows.pers=0",
                   "rows.pers=1", "rows.pers=1,rows.rpc=2", "rows.pers=0,rows.rpc=2", "rows.wpr=8",
                   "rows.pers=1,rows.hint=3", "rows.pers=0,rows.hint=0"],
    "softmax": ["rows.on=0", "rows.on=0,softmax.pipe=1,pipe.w=11", "rows.hint=0", "rows.rpc=2", "rows.wpr=8",
                "rows.pers=1", "rows.hint=3", "rows.hint=4"],
    "swiglu": ["gated.unroll=2", "gated.unroll=4", "gated.bpsm=16"],
    "rope_qk": ["rope.k=2", "rope.k=4"],
}


def _time_graph(gk, fn, args_list, rounds, iters):
    """Per-round microseconds per call of `iters` calls captured in one gpukit graph
    (GPU time without the host's launch overhead), inputs rotating."""
    s, n = gk.Stream("cuda"), len(args_list)
    with s:
        for i in range(3):
            fn(*args_list[i % n])
    s.synchronize()
    g, keep = gk.Graph(s), []
    with g:
        for i in range(iters):
            keep.append(fn(*args_list[i % n]))
    g.replay(s)
    s.synchronize()
    out = []
    for _ in range(rounds):
        a, b = gk.Event(), gk.Event()
        a.record(s)
        g.replay(s)
        b.record(s)
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)
    return out


def latency(gk, torch, rounds, iters):
    """Few-row (decode-like) GPU times of the row ops, the older forms (rows.on=0) against the
    default warp-row form (src/cuda/rows_warp.cu), H = 4096, bf16, each in a graph of --iters
    calls (inputs rotate over 8 sets)."""
    H = 4096
    w = gk.from_dlpack(torch.randn(H, device="cuda", dtype=torch.bfloat16))
    b = gk.from_dlpack(torch.randn(H, device="cuda", dtype=torch.bfloat16))
    ops = {"rms_norm_residual": (lambda x, r: gk.nn.rms_norm(x, w, 1e-6, residual=r), "rows.on"),
           "layer_norm": (lambda x, r: gk.nn.layer_norm(x, w, b, 1e-5), "rows.on"),
           "softmax": (lambda x, r: gk.softmax(x), "rows.on")}
    for rows in (1, 8, 64, 512):
        gx, _ = _pair(gk, torch, (rows, H), "bfloat16", 8)
        gr, _ = _pair(gk, torch, (rows, H), "bfloat16", 8)
        line = []
        for name, (fn, knob) in ops.items():
            v = []
            for on in (0, 1):
                os.environ["GPUKIT_TUNE"] = f"{knob}={on}"
                v.append(statistics.median(_time_graph(gk, fn, list(zip(gx, gr)), rounds, iters)))
            line.append(f"{name} {v[0]:.1f} / {v[1]:.1f} us")
        os.environ.pop("GPUKIT_TUNE", None)
        print(f"latency bf16 rows={rows:4d} H={H} (older form / warp-row form): " + "; ".join(line), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="bench/results/h200.json")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--only", default="", help="comma-separated names to run")
    p.add_argument("--sweep", action="store_true", default=True,
                   help="also time the launch shapes in SWEEP (the default; a few seconds)")
    p.add_argument("--no-sweep", dest="sweep", action="store_false")
    p.add_argument("--latency", action="store_true", help="only the few-row times of the row ops (no records)")
    a = p.parse_args(argv)
    gk, torch, why = _setup()
    if why:
        print(f"bench/fused.py: skipped ({why})")
        return 0
    if a.latency:
        latency(gk, torch, a.rounds, a.iters)
        return 0
    only = {s for s in a.only.split(",") if s}
    want = lambda name: not only or name in only  # noqa: E731
    os.environ.pop("GPUKIT_TUNE", None)
    copies = Copies(gk, torch, a.rounds, a.iters)
    big = 512 * 2**20
    cg, ct = copies(big)
    print(f"copy 256 MiB read + 256 MiB written: gpukit copy_into {cg:.2f} TB/s, torch copy_ {ct:.2f} TB/s "
          f"(L2 rule: inputs rotate over >= {ROT_BYTES >> 20} MiB, outputs kept alive)", flush=True)
    import itertools
    gens = [cases(gk, torch, want)]
    if want("rope_qk"):
        gens.append(rope_cases(gk, torch))
    recs = []
    for name, shape, dt, nbytes, gfn, gargs, peer, tfn, targs in itertools.chain(*gens):
        g = _time(gk, gfn, gargs, a.rounds, a.iters)
        host = HOST_US["last"]
        gk.cuda.synchronize()
        t = _time(torch, tfn, targs, a.rounds, a.iters)
        torch.cuda.synchronize()
        cg, ct = copies(nbytes)
        ceil_ = max(cg, ct)
        tb = [tbs(nbytes, us) for us in g]
        gv, tv = statistics.median(tb), tbs(nbytes, statistics.median(t))
        ok = "OK" if gv >= 0.85 * ceil_ and gv > tv else "BELOW TARGET"
        if host > 0.8 * statistics.median(g):
            ok += f" (host {host:.1f} us per call: launch-bound?)"
        print(f"{name:18s} {shape:21s} {dt:8s} gpukit {gv:.2f} TB/s ({statistics.median(g):.1f} us, "
              f"{min(tb):.2f}-{max(tb):.2f}) = {gv / ceil_:.0%} of same-bytes copy {ceil_:.2f} "
              f"[gk {cg:.2f} / torch {ct:.2f}] | {peer}: {tv:.2f} TB/s ({statistics.median(t):.1f} us) "
              f"x{gv / tv:.2f} {ok}", flush=True)
        recs.append({"name": name, "shape": shape, "dtype": dt, "metric": "TB/s", "gpukit": gv, "peer": peer,
                     "peer_value": tv, "rounds": tb, "copy_same_bytes": ceil_, "of_copy": gv / ceil_})
        if a.sweep:
            for tune in SWEEP.get(name, []):
                os.environ["GPUKIT_TUNE"] = tune
                gs = _time(gk, gfn, gargs, max(10, a.rounds // 2), a.iters)
                v = tbs(nbytes, statistics.median(gs))
                print(f"    sweep {name} {dt} {tune:42s} {v:.2f} TB/s ({statistics.median(gs):.1f} us) "
                      f"{v / ceil_:.0%} of copy", flush=True)
            os.environ.pop("GPUKIT_TUNE", None)
        del gargs, targs
    import common  # bench/common.py: one results writer for every benchmark
    for r in recs:
        r["dtype"] = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(r["dtype"], r["dtype"])
    common.write_results(a.out, recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
