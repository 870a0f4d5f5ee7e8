"""The bulk-copy form of the staged 8-bit GEMV (session 11; src/cuda/gemv_w8b.cu; GPUKIT_GEMV_W8's 5th field XS = 4,
a benchmarking setting): fp8 / int8 codes decoded to bf16, bf16 x, on the plan of the same fields with XS = 3, whose
arithmetic it repeats. So it must give XS 3's bits at every shape, M and configuration it takes (rings of 2..4
stages of 4 blocks, stages of 8 blocks, other warp counts, split-K shapes, odd N), eagerly, in a chain of launches
that overlap through PDL and in a replayed CUDA graph; and XS 4 with a configuration it does not take is refused
with an error naming the knob. bench/e2e.py's knob options carry XS 4 like any other field (no GPU)."""
import contextlib
import math

import numpy as np
import pytest

import gpukit as gk
from bench_ref import e2e_engines
from w4_ref import check_exact, f64, make_x, same_bits

RNG = np.random.default_rng(8118)
cuda_only = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")

CONFIGS = ("4,2,16,1", "4,3,16,1", "4,4,16,1", "8,2,16,1", "4,3,11,1", "8,2,11,1", "4,2,8,1")


@contextlib.contextmanager
def _env(name, value):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        yield


def _w8(fmt, n, k):
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    q, s = getattr(gk, f"quantize_{fmt}")(gk.asarray(w))
    qc, sc = q.to("cuda"), s.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    return (lambda x: fn(x, qc, sc, out_dtype="float32")), f64(getattr(gk, f"dequantize_{fmt}")(q, s))


def test_e2e_option_carries_xs4():
    e2e = e2e_engines()
    env = e2e.gk_engine("gk-graph+w8s4-3-11-1-4-0-0+w8o4-2-16-1-3-0-0")[1]["env"]
    assert env == {"GPUKIT_GEMV_W8_SMALL": "4,3,11,1,4,0,0", "GPUKIT_GEMV_W8_O": "4,2,16,1,3,0,0"}


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (1001, 4096), (4096, 14336), (128, 4096), (2048, 8192),
                                 (272, 1088)])
def test_xs4_same_bits_as_xs3(fmt, n, k):
    """XS 4 = XS 3 bit for bit (M = 1, 3, 8), within the float64 bound, in a PDL chain of three calls."""
    fn, deq = _w8(fmt, n, k)
    x, xs = make_x(RNG, k, "bfloat16", m=8)
    for cfg in CONFIGS:
        with _env("GPUKIT_GEMV_W8", cfg + ",3,0,0"):
            base = {m: f64(fn(x[:m])) for m in (1, 3, 8)}
        with _env("GPUKIT_GEMV_W8", cfg + ",4,0,0"):
            for m in (1, 3, 8):
                y = f64(fn(x[:m]))
                same_bits(f"{fmt} ({n}, {k}) {cfg} M={m}", y, base[m])
            check_exact(f"{fmt} ({n}, {k}) {cfg} XS 4 M=8", fn(x), xs, deq)
            chain = [fn(x[:1]) for _ in range(3)]
            for i, y in enumerate(chain):
                same_bits(f"{fmt} ({n}, {k}) {cfg} chain {i}", f64(y), base[1])


@cuda_only
def test_xs4_graph_replay_and_bad_config():
    """XS 4 captured in a CUDA graph and replayed gives the eager bits; XS 4 with two row tiles, XP, the full ring or
    stages of 2 blocks is refused naming the knob."""
    fn, _ = _w8("fp8", 6144, 4096)
    x, _ = make_x(RNG, 4096, "bfloat16", m=1)
    with _env("GPUKIT_GEMV_W8_SMALL", "4,3,16,1,4,0,0"):
        eager = f64(fn(x))
        g = gk.Graph()
        with g:
            outs = [fn(x), fn(x)]
    for _ in range(3):
        g.replay()
        gk.cuda.synchronize()
        for o in outs:
            same_bits("graph replay", f64(o), eager)
    for bad in ("4,3,16,2,4,0,0", "4,3,16,1,4,1,0", "4,3,16,1,4,0,0,0,0,3", "2,4,16,1,4,0,0"):
        with _env("GPUKIT_GEMV_W8", bad):
            with pytest.raises(ValueError, match="GPUKIT_GEMV_W8.*XS 4"):
                fn(x)
