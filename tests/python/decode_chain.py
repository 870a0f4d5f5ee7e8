"""Helpers shared by the attention_decode route and chain tests (test_attention_decode_{fold,route,clroute,
pdlroute}.py): a PDL chain of calls (each q the previous output), a call with the path log (GPUKIT_DECODE_LOG) and
poisoned allocations, and the step-by-step check of a chain against the float64 reference and a base chain's bits."""
import numpy as np

import gpukit as gk
from test_attention import f64
from test_attention_decode import bits, check, ref_decode


def chain_outs(qd, kd, vd, ld, n):
    """n attention_decode calls, each q the previous output: the outputs (read them after the whole chain: the
    launches overlap under PDL)."""
    outs, x = [], qd
    for _ in range(n):
        x = gk.nn.attention_decode(x, kd, vd, ld)
        outs.append(x)
    return outs


def run_logged(fn, monkeypatch, capfd, poison=True, guards=False):
    """fn() with GPUKIT_DECODE_LOG=1, synchronized: (its result, the log on stderr). poison: allocations start as
    0xFF bytes (NaN: every output element must be written, a read before a write shows); guards: the allocation
    guards checked too (cleared before, asserted after)."""
    capfd.readouterr()
    monkeypatch.setenv("GPUKIT_DECODE_LOG", "1")
    if guards:
        gk._C._debug_check_guards()  # clear what earlier code left
    if poison:
        gk._C._debug_alloc_poison(0xFF)
    try:
        out = fn()
        gk.cuda.synchronize()
    finally:
        if poison:
            gk._C._debug_alloc_poison(-1)
    violations = gk._C._debug_check_guards() if guards else None
    log = capfd.readouterr().err
    monkeypatch.delenv("GPUKIT_DECODE_LOG")
    assert not violations, violations
    return out, log


def check_chain(outs, q, kk, vv, lens, base, tag, vs, where=""):
    """Step i of a chain (outs, started from q) within the float64 reference of its q (step i - 1's output) and
    bitwise equal to base[i] (the bits of the chain of variant `vs`)."""
    prev = f64(q)
    for i, o in enumerate(outs):
        check(o, ref_decode(prev, kk, vv, lens), 3.2e-2, f"{tag} step {i}")
        prev = f64(o)
        d = np.argwhere(bits(o) != base[i])
        assert d.size == 0, f"{tag} step {i} differs from {vs} at {d[0]}{where}"
