"""gk.gemv_quantized_swiglu (session 15; gk._C._gemv_int4_swiglu) and EngineOptions::quantized_swiglu: the SwiGLU in
the epilogue of the int4 g128 GEMV on the integer tensor cores (k_w4i, src/cuda/common/gemv_w4i.cuh). The weight is
[gate; up] (2 I rows); each CTA takes gate rows 8 b .. 8 b + 7 and the matching up rows, so a lane holds both sums of
an output, rounds them to the output type and applies k_swiglu's arithmetic. The plan is the plain GEMV's, so the
result must be gemv_int4 then llm.fused_swiglu bit for bit: every test compares that way (M 1..8, odd I, float32 /
bfloat16 / float16 out, poisoned outputs, a graph replay), plus a float64 check of the values. Where the kernel does not
run (K % 512 != 0, split-K, other groups, float16 x, another variant or kernel, an odd row count, the CPU) the entry returns None
and the engine runs the two launches. The engine: the same tokens and logits with the option on and off, one launch
fewer per layer with it. CUDA parts skip without a GPU."""
import os

import numpy as np
import pytest

import gpukit as gk
from bench_ref import e2e_engines
from gpukit import _C
from test_llm_decode_s6 import run_p
from test_llm_step import CFG128, PROMPTS, same
from w4_ref import DEFAULT_G128, f64, w4_weights

CUDA = gk.cuda.is_available()
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
RNG = np.random.default_rng(1515)
# (I, K): the 8B and 1B MLPs, odd I (a partial last CTA: its rows past I clamp and are not stored), one stage
SHAPES = [(14336, 4096), (8192, 2048), (1001, 4096), (4099, 1536), (2053, 512)]


def make(i, k, group=128, device="cuda"):
    """(q, scales, zeros on device, float64 dequantized [2 I, K]) of random [gate; up]."""
    q, s, z = gk.quantize_int4(gk.asarray(w4_weights(RNG, 2 * i, k)), group=group)
    deq = f64(gk.dequantize_int4(q, s, z, group=group))
    return (q.to(device), s.to(device), z.to(device)), deq


def unfused(x, parts, group=128, out="bfloat16"):
    """gemv_int4 then the engine's SwiGLU: the two launches the fused kernel replaces."""
    return _C.llm.fused_swiglu(gk.gemv_int4(x, *parts, group=group, out_dtype=out))


def xs_of(m, k, scale=1.0):
    xb = gk.asarray((RNG.standard_normal((m, k)) * scale).astype(np.float32)).astype("bfloat16")
    return xb.to("cuda"), f64(xb.astype("float32"))


def within_swiglu(tag, got, xs, deq, i):
    """got within the rounding of float64 silu(g) u: g and u each to bf16 (2^-8 relative) after the GEMV's own error
    (at most e = 2^-15 sum |x| |w| per sum, k_w4i's bound with room), the result to bf16; silu' <= 1.1."""
    gu = xs @ deq.T
    g, u = gu[:, :i], gu[:, i:]
    ref = g / (1.0 + np.exp(-g)) * u
    e = 2.0**-15 * (np.abs(xs) @ np.abs(deq).T)
    ge, ue = e[:, :i], e[:, i:]
    ga, ua = np.abs(g) + ge, np.abs(u) + ue
    tol = 2.0**-8 * np.abs(ref) + 1.1 * (2.0**-7 * ga * ua + ge * ua + ue * ga) + 1e-30
    err = np.abs(got - ref)
    assert np.all(err <= tol), f"{tag}: {int(np.sum(~(err <= tol)))} out of the bound, max err / tol {np.max(err / tol):.3g}"


# ---- CPU ----

def test_option_default_and_e2e_flag():
    m = gk.llm.random_model(dict(CFG128, num_hidden_layers=1), device="cpu", dtype="float32", seed=3)
    assert m._m.quantized_swiglu is True, "quantized_swiglu is on by default"
    m._m.quantized_swiglu = False
    assert m._m.quantized_swiglu is False
    e2e = e2e_engines()
    assert e2e.gk_engine("gk-graph+qsw")[1]["attrs"] == {"quantized_swiglu": True}
    assert e2e.gk_engine("gk-graph+noqsw")[1]["attrs"] == {"quantized_swiglu": False}
    assert "quantized_swiglu" not in e2e.gk_engine("gk-graph")[1]["attrs"]


def test_none_on_cpu():
    parts, _ = make(64, 512, device="cpu")
    x = gk.asarray(RNG.standard_normal((2, 512)).astype(np.float32)).astype("bfloat16")
    assert _C._gemv_int4_swiglu(x, *parts) is None


# ---- GPU ----

@cuda_only
@pytest.mark.parametrize("i,k", SHAPES)
def test_same_bits_as_gemv_then_swiglu(i, k):
    """M = 1..8, bfloat16 out: the bits of gemv_int4 then fused_swiglu; the values within bf16 rounding of float64
    silu(g) u; a second call the same bits; a row alone = the row in the batch."""
    parts, deq = make(i, k)
    x, xs = xs_of(8, k)
    full = None
    for m in range(1, 9):
        got = _C._gemv_int4_swiglu(x[:m], *parts)
        assert got is not None, f"({i}, {k}) M={m}: the fused kernel did not run"
        assert tuple(got.shape) == (m, i) and str(got.dtype) == "bfloat16"
        a, b = f64(got.astype("float32")), f64(unfused(x[:m], parts).astype("float32"))
        bad = np.argwhere(a != b)
        assert bad.size == 0, (f"({i}, {k}) M={m}: {len(bad)} of {a.size} differ from gemv + swiglu, first "
                               f"{bad[0].tolist()}: {a[tuple(bad[0])]!r} vs {b[tuple(bad[0])]!r}")
        within_swiglu(f"({i}, {k}) M={m}", a, xs[:m], deq, i)
        if m == 8:
            full = a
    for r in (0, 3, 7):
        one = f64(_C._gemv_int4_swiglu(x[r], *parts).astype("float32"))
        assert one.tobytes() == full[r].tobytes(), f"row {r} alone (1-d x) differs from the batch"
    assert f64(_C._gemv_int4_swiglu(x, *parts).astype("float32")).tobytes() == full.tobytes(), "second call"


@cuda_only
@pytest.mark.parametrize("out", ["float32", "float16"])
def test_out_dtypes(out):
    """float32 out: the unrounded sums into the SwiGLU (gemv_int4 float32 then fused_swiglu on float32); float16: each
    sum rounded to float16 first."""
    i, k = 1001, 4096
    parts, _ = make(i, k)
    x, _ = xs_of(5, k)
    got = _C._gemv_int4_swiglu(x, *parts, out_dtype=out)
    assert got is not None and str(got.dtype) == out
    want = unfused(x, parts, out=out)
    assert f64(got.astype("float32")).tobytes() == f64(want.astype("float32")).tobytes()


@cuda_only
def test_wide_rows_and_poison():
    """Rows of very different size (1e-3, 1e4 in one block), inf in one row (NaN outputs in that row only, as the
    plain kernel); the output written everywhere over NaN-poisoned memory."""
    i, k = 4099, 1536
    parts, _ = make(i, k)
    xf = RNG.standard_normal((8, k)).astype(np.float32)
    xf[2] *= 1e-3
    xf[4, :128] *= 1e4
    xf[6, 7] = np.inf
    x = gk.asarray(xf).astype("bfloat16").to("cuda")
    for _ in range(2):
        poison = gk.full((8, i), float("nan"), dtype="bfloat16", device="cuda")
        gk.cuda.synchronize()
        del poison
        got = f64(_C._gemv_int4_swiglu(x, *parts).astype("float32"))
        want = f64(unfused(x, parts).astype("float32"))
        assert got.tobytes() == want.tobytes()
        fin = np.isfinite(got)
        assert fin[[0, 1, 2, 3, 4, 5, 7]].all(), "an output not written (NaN poison) or not finite"
        assert not fin[6].any(), "inf in x row 6: its outputs must be NaN"


@cuda_only
def test_graph_replay():
    i, k = 2053, 512
    parts, _ = make(i, k)
    x, _ = xs_of(3, k)
    ref = f64(unfused(x, parts).astype("float32"))
    g = gk.Graph()
    with g:
        outs = [_C._gemv_int4_swiglu(x, *parts), _C._gemv_int4_swiglu(x[1], *parts)]
    for _ in range(2):
        g.replay()
        gk.cuda.synchronize()
        assert f64(outs[0].astype("float32")).tobytes() == ref.tobytes()
        assert f64(outs[1].astype("float32")).tobytes() == ref[1].tobytes()


@cuda_only
def test_none_where_the_kernel_does_not_run():
    """K % 512 != 0, group 64, float16 x, an odd row count, split-K (few rows, long K), M > 8, another process variant
    (48; 1 / 3: other kernels) or GPUKIT_GEMV_W4_VARIANT=65: None (the engine falls back). Variants 66 (the default's)
    and 2 (the default without PDL) take it."""
    x, _ = xs_of(9, 4096)
    parts, _ = make(1001, 4096)
    assert _C._gemv_int4_swiglu(x, *parts) is None, "M = 9"
    p64, _ = make(1001, 4096, group=64)
    assert _C._gemv_int4_swiglu(x[:2], *p64, group=64) is None, "group 64"
    assert _C._gemv_int4_swiglu(x[:2].astype("float16"), *parts) is None, "float16 x"
    pk, _ = make(300, 1152)
    assert _C._gemv_int4_swiglu(xs_of(2, 1152)[0], *pk) is None, "K % 512 != 0"
    q, s, z = parts
    assert _C._gemv_int4_swiglu(x[:2], q[:2001], s[:2001], z[:2001]) is None, "odd rows"
    ps, _ = make(20, 32768)
    assert _C._gemv_int4_swiglu(xs_of(1, 32768)[0], *ps) is None, "split-K"
    for v, runs in ((48, False), (DEFAULT_G128, True), (2, True), (1, False), (3, False)):
        gk._C._gemv_set_variant(v)
        try:
            got = _C._gemv_int4_swiglu(x[:2], *parts)
        finally:
            gk._C._gemv_set_variant(0)
        assert (got is not None) == runs, f"variant {v}"
    os.environ["GPUKIT_GEMV_W4_VARIANT"] = "65"
    try:
        assert _C._gemv_int4_swiglu(x[:2], *parts) is None, "GPUKIT_GEMV_W4_VARIANT=65"
    finally:
        del os.environ["GPUKIT_GEMV_W4_VARIANT"]


# the engine: hidden 512 (K % 512 == 0), intermediate 2048 (gate/up 4096 x 512: no split-K)
CFG_SW = dict(CFG128, intermediate_size=2048)


@cuda_only
@pytest.mark.parametrize("graph", [False, True])
def test_engine_same_tokens_and_logits(graph):
    """int4 model, decode of three prompts: the tokens and logits of quantized_swiglu off, eager and graph."""
    m = gk.llm.random_model(CFG_SW, device="cuda", dtype="bfloat16", seed=21, quantize="int4")
    assert m._m.quantized_swiglu
    on = run_p(m, graph, PROMPTS, new=6)
    m._m.quantized_swiglu = False
    off = run_p(m, graph, PROMPTS, new=6)
    same(on, off, f"quantized_swiglu on vs off (graph {graph})")


@cuda_only
def test_engine_one_launch_fewer_per_layer():
    """The captured decode step of a 2-layer int4 model: 2 kernels fewer with quantized_swiglu (the SwiGLU launches)."""
    m = gk.llm.random_model(dict(CFG_SW, num_hidden_layers=2), device="cuda", dtype="bfloat16", seed=4,
                            quantize="int4")
    nodes = {}
    for on in (True, False):
        m._m.quantized_swiglu = on
        g = _C.llm.Generation(m._m, PROMPTS[:1], max_new_tokens=3, ignore_eos=True, cuda_graph=True)
        while not g.done:
            g.step()
        nodes[on] = list(g.graph_nodes)
    assert nodes[False][1] - nodes[True][1] == 2, nodes
