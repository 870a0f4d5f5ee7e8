"""The engine's decode projection kernel (src/cuda/llm_decode.cu, gk._C.llm.fused_project)
beside gk.gemv, on the Llama-3.1-8B and Llama-3.2-1B decode shapes (M = 1, bf16):
TB/s of weight bytes per call, back to back in one CUDA graph (several weight copies
rotated so that no call finds its weight in the L2), with programmatic dependent launch
on and off; then one layer's four projections (qkv, o, gate_up + SwiGLU, down) over 8
layers of distinct weights, the way the decode step chains them.

Usage: python bench/llm_kernels.py [--rounds N]. Exits 0 without CUDA.
"""
from __future__ import annotations

import math

from common import gk, median, parse_args, print_table, record, require_cuda

SHAPES = {  # name: (N rows of the weight, K, swiglu)
    "8b qkv": (6144, 4096, False), "8b o": (4096, 4096, False), "8b gate_up": (28672, 4096, True),
    "8b down": (4096, 14336, False),
    "1b qkv": (3072, 2048, False), "1b o": (2048, 2048, False), "1b gate_up": (16384, 2048, True),
    "1b down": (2048, 8192, False),
}
L2_DEFEAT = 300e6


def time_graph(calls, rounds):
    """Median ms per call of `calls` captured in one gk.Graph (replays timed with events)."""
    for c in calls:
        c()
    gk.synchronize()
    g = gk.Graph()
    with g:
        for c in calls:
            c()
    st = g.stream
    g.replay(st)
    gk.synchronize()
    out = []
    for _ in range(rounds):
        a, b = gk.Event(), gk.Event()
        a.record(st)
        g.replay(st)
        b.record(st)
        b.synchronize()
        out.append(a.elapsed_time(b) / len(calls))
    return median(out)


def main():
    a = parse_args("Engine decode projection kernel", lambda p: None)
    if not require_cuda():
        return 0
    from gpukit import _C
    rounds = max(a.rounds, 5)
    records = []
    print(f"{'shape':<12}{'N':>7}{'K':>7}  {'gk.gemv':>16}  {'llm PDL':>16}  {'llm no PDL':>16}")
    for name, (n, k, sw) in SHAPES.items():
        nbytes = n * k * 2
        copies = max(2, math.ceil(L2_DEFEAT / nbytes))
        ws = [gk.full((n, k), 0.01 * (i + 1), dtype="bfloat16", device="cuda") for i in range(copies)]
        x = gk.full((1, k), 0.5, dtype="bfloat16", device="cuda")
        res = {}
        res["gemv"] = time_graph([lambda w=w: gk.gemv(x, w) for w in ws], rounds)
        for label, pdl in (("pdl", True), ("nopdl", False)):
            _C.llm.set_pdl(pdl)
            res[label] = time_graph([lambda w=w: _C.llm.fused_project(x, w, None, sw) for w in ws], rounds)
        _C.llm.set_pdl(None)
        tbs = {key: nbytes / (ms * 1e-3) / 1e12 for key, ms in res.items()}
        print(f"{name:<12}{n:>7}{k:>7}  " + "  ".join(f"{res[key] * 1e3:7.1f} us {tbs[key]:4.2f}"
                                                     for key in ("gemv", "pdl", "nopdl"))
              + ("  (gemv: no SwiGLU epilogue)" if sw else ""))
        for key, label in (("pdl", "llm_project"), ("nopdl", "llm_project no PDL")):
            records.append(record(label, f"{name} N{n} K{k}", "bfloat16", "TB/s", tbs[key], peer="gk.gemv",
                                  peer_value=tbs["gemv"]))
        del ws
    # one layer's projections, 8 layers of distinct weights, chained as in the decode step
    for model, H, I, Q, KV in (("8b", 4096, 14336, 4096, 1024), ("1b", 2048, 8192, 2048, 512)):
        layers = 8
        W = [dict(qkv=gk.full((Q + 2 * KV, H), 0.01, dtype="bfloat16", device="cuda"),
                  o=gk.full((H, Q), 0.01, dtype="bfloat16", device="cuda"),
                  gu=gk.full((2 * I, H), 0.01, dtype="bfloat16", device="cuda"),
                  down=gk.full((H, I), 0.01, dtype="bfloat16", device="cuda")) for _ in range(layers)]
        xh = gk.full((1, H), 0.5, dtype="bfloat16", device="cuda")
        xq = gk.full((1, Q), 0.5, dtype="bfloat16", device="cuda")
        xi = gk.full((1, I), 0.5, dtype="bfloat16", device="cuda")
        per_layer = ((Q + 2 * KV) * H + H * Q + 2 * I * H + H * I) * 2

        def chain(fn):
            calls = []
            for w in W:
                calls += [lambda w=w: fn(xh, w["qkv"], False), lambda w=w: fn(xq, w["o"], False),
                          lambda w=w: fn(xh, w["gu"], True), lambda w=w: fn(xi, w["down"], False)]
            return calls

        out = {}
        out["gemv"] = time_graph(chain(lambda x, w, sw: gk.gemv(x, w)), rounds) * 4
        for label, pdl in (("pdl", True), ("nopdl", False)):
            _C.llm.set_pdl(pdl)
            out[label] = time_graph(chain(lambda x, w, sw: _C.llm.fused_project(x, w, None, sw)), rounds) * 4
        _C.llm.set_pdl(None)
        print(f"{model} layer projections (qkv, o, gate_up, down; 8 layers): "
              + ", ".join(f"{key} {ms * 1e3:.1f} us/layer ({per_layer / (ms * 1e-3) / 1e12:.2f} TB/s)"
                          for key, ms in out.items()) + "  (gemv: no SwiGLU)")
        for key, label in (("pdl", "llm layer projections"), ("nopdl", "llm layer projections no PDL")):
            records.append(record(label, f"{model} M1", "bfloat16", "us/layer", out[key] * 1e3, peer="gk.gemv",
                                  peer_value=out["gemv"] * 1e3))
        W = None
    print_table(records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
