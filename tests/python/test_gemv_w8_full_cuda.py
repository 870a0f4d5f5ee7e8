"""The fp8 / int8 staged GEMV's full ring (src/cuda/gemv_w8.cu, k_w8's FR; session 8, branch
fp8e10): where every CTA of the grid can be resident at once with a ring that holds each
warp's whole k range (2..4 stages), all weight bytes are requested before the PDL wait. The
plan (warps per CTA, split-K) is the usual one's, so the bits must be those of the usual ring:
every test compares bit for bit with the default path (fp8 and int8, M = 1..8, odd N, a
partial last stage, split-K, bf16 / fp32 outputs, wide-range x, a PDL chain eager and in a
graph, the engine's decode graph and eager) and against float64 products with the exactly
dequantized weights. Switches: gk._C._gemv_w8_set_full_ring (this thread's launches; the
engine's EngineOptions::quantized_full_ring), the knob GPUKIT_GEMV_W8's 10th field FR.
Which depth a shape takes is read from gk._C._gemv_w8_full_ring_depth, so a test cannot pass
without the full ring running. CUDA parts skip without a GPU."""
import os

import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_gemv_w8_cuda import check, f64, make, xrand
from test_llm_step import CFG128, PROMPTS, same
from test_llm_decode_s6 import run_p

CUDA = gk.cuda.is_available()
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
# 10 heads of 128 (2 kv heads), hidden 1280, intermediate 2560: q/k/v 1792 x 1280 (N > K, 3
# stages), o 1280 x 1280 (3 stages), gate/up 5120 x 1280 (3 stages), down 1280 x 2560 (2):
# every decode GEMV takes the full ring with mask 3
CFG_FR = dict(CFG128, hidden_size=1280, num_attention_heads=10, num_key_value_heads=2, intermediate_size=2560)


def sms():
    return gk.cuda.get_device_properties("cuda:0")["multiprocessors"]


def depth(n, k, mask):
    return _C._gemv_w8_full_ring_depth(n, k, mask)


def with_ring(mask, fn, *a):
    prev = _C._gemv_w8_full_ring()
    _C._gemv_w8_set_full_ring(mask)
    try:
        return fn(*a)
    finally:
        _C._gemv_w8_set_full_ring(prev)


def test_full_ring_switch_and_option():
    assert _C._gemv_w8_full_ring() == 0, "the full ring must be off by default"
    for bad in (-1, 4):
        with pytest.raises(ValueError):
            _C._gemv_w8_set_full_ring(bad)
    assert with_ring(3, _C._gemv_w8_full_ring) == 3
    assert _C._gemv_w8_full_ring() == 0, "the switch was not restored"
    m = gk.llm.random_model(dict(CFG128, num_hidden_layers=1), device="cpu", dtype="float32", seed=3)
    assert m._m.quantized_full_ring == 0, "quantized_full_ring must be off by default"
    for bad in (-1, 4):
        with pytest.raises(ValueError):
            m._m.quantized_full_ring = bad
    base = run_p(m, False, PROMPTS, new=3)
    m._m.quantized_full_ring = 3
    assert m._m.quantized_full_ring == 3
    same(base, run_p(m, False, PROMPTS, new=3), "CPU: quantized_full_ring has no effect")


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int8"])
def test_full_ring_engine_same_bits(quantize):
    """The engine with quantized_full_ring: the same tokens and logits as without, graph and
    eager, three sequences (M = 3) and one (M = 1)."""
    # first in the file: the occupancy queries of the full ring's kernels run during the graph's
    # capture (as in bench/e2e.py), not before it
    if sms() < 132:
        pytest.skip(f"the model's shapes are sized for an H200 (132 SMs), this GPU has {sms()}")
    m = gk.llm.random_model(CFG_FR, device="cuda", dtype="bfloat16", seed=41, quantize=quantize)
    assert m._m.quantized_full_ring == 0
    base = run_p(m, True, PROMPTS, new=24)
    one = run_p(m, True, PROMPTS[1:2], new=12)
    for mask in (3, 1, 2):
        m._m.quantized_full_ring = mask
        same(base, run_p(m, True, PROMPTS, new=24), f"{quantize}: quantized_full_ring {mask}, graph")
    m._m.quantized_full_ring = 3
    same(base, run_p(m, False, PROMPTS, new=24), f"{quantize}: quantized_full_ring 3, eager")
    same(one, run_p(m, True, PROMPTS[1:2], new=12), f"{quantize}: quantized_full_ring 3, one sequence")
    assert _C._gemv_w8_full_ring() == 0, "the engine left the full ring on for this thread"
    got = {s_: depth(*s_) for s_ in ((1792, 1280, 1), (1280, 1280, 2), (5120, 1280, 1), (1280, 2560, 2), (512, 1280, 2))}
    assert all(v > 0 for v in got.values()), f"the model's GEMVs do not all take the full ring: {got}"


@cuda_only
def test_full_ring_engine_differs_from_nothing():
    # guard: the engine comparison can fail (another seed gives other logits)
    a = run_p(gk.llm.random_model(CFG_FR, device="cuda", dtype="bfloat16", seed=41, quantize="fp8"), True,
              PROMPTS, new=3)
    b = run_p(gk.llm.random_model(CFG_FR, device="cuda", dtype="bfloat16", seed=42, quantize="fp8"), True,
              PROMPTS, new=3)
    with pytest.raises(AssertionError):
        same(a, b, "two seeds")


@cuda_only
def test_full_ring_depths():
    """The depth each shape takes (H200: 132 SMs): 8B's o (bit 2) fits; its q/k/v (bit 1) did with
    6-warp CTAs and does not since session 12's plan of 5-warp CTAs (16 warps per SM: 13 blocks per
    warp need a ring of 4, and too few such CTAs fit per SM), but does with the knob's 6 warps; gate/up,
    down and the lm head never do; the mask picks by N > K; the knob's FR field asks too."""
    if sms() < 132:
        pytest.skip(f"the expected depths are an H200's (132 SMs), this GPU has {sms()}")
    want = {(6144, 4096, 1): 0, (6144, 4096, 2): 0, (6144, 4096, 3): 0, (4096, 4096, 2): 2, (4096, 4096, 1): 0,
            (28672, 4096, 3): 0, (4096, 14336, 3): 0, (128256, 4096, 3): 0, (1792, 1280, 1): 3,
            (1280, 1280, 2): 3, (5120, 1280, 1): 3, (1280, 2560, 2): 2, (6144, 4096, 0): 0, (300, 14336, 2): 3}
    got = {key: depth(*key) for key in want}
    assert got == want, f"full ring depths {got}, expected {want}"
    os.environ["GPUKIT_GEMV_W8"] = "4,2,16,1,3,0,0,0,0,3"
    try:
        assert depth(6144, 4096, 0) == 3 and depth(4096, 4096, 0) == 2, "the knob's FR field is not read"
    finally:
        del os.environ["GPUKIT_GEMV_W8"]
    os.environ["GPUKIT_GEMV_W8"] = "4,2,16,1,3,0,0,0,0,4"
    try:
        with pytest.raises(ValueError, match="GPUKIT_GEMV_W8"):
            depth(6144, 4096, 0)
    finally:
        del os.environ["GPUKIT_GEMV_W8"]


# (n, k): 8B's q/k/v (3 stages per warp) and o (2), an odd N, K with a partial last stage
# (4160 = 65 blocks), 2 warps of 10 blocks, few rows (one row tile), split-K 3, tiny K
SHAPES = [(6144, 4096), (4096, 4096), (6143, 4160), (1792, 1280), (37, 4096), (300, 14336), (16, 64), (2051, 1024)]
# since session 12 the default plan gives these 5-warp CTAs, whose ring of 4 does not fit often enough per SM:
# they run with session 11's plan (6 warps per CTA, the knob without the 16-warp cap) for both rings
OLD_PLAN = {(6144, 4096): "4,2,16,1,3,0,0", (6143, 4160): "4,2,16,1,3,0,0"}


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_full_ring_same_bits(fmt, n, k, monkeypatch):
    if (n, k) in OLD_PLAN:
        monkeypatch.setenv("GPUKIT_GEMV_W8", OLD_PLAN[(n, k)])
    d = depth(n, k, 3)
    if d == 0:
        assert sms() < 132, f"({n}, {k}) should take the full ring on an H200"
        pytest.skip(f"({n}, {k}) does not fit this GPU ({sms()} SMs)")
    fn, deq = make(fmt, n, k)
    x, xs = xrand(8, k, "bfloat16", 2.0)
    for out in ("float32", "bfloat16"):
        base = f64(fn(x, out))
        got = f64(with_ring(3, fn, x, out))
        bad = np.argwhere(got != base)
        assert bad.size == 0, (f"{fmt} ({n}, {k}) depth {d} out {out}: {len(bad)} of {got.size} differ from the "
                               f"usual ring, first {bad[0].tolist()}: {got[tuple(bad[0])]!r} vs {base[tuple(bad[0])]!r}")
        if out == "float32":
            check(got, xs, deq, f"{fmt} ({n}, {k}) full ring")
    got8 = f64(with_ring(3, fn, x, "float32"))
    for m in (1, 2, 3, 5, 7):
        a = f64(with_ring(3, fn, x[:m], "float32"))
        assert a.tobytes() == got8[:m].tobytes(), f"{fmt} ({n}, {k}): m={m} rows differ from the batch of 8"
        assert a.tobytes() == f64(fn(x[:m], "float32")).tobytes(), f"{fmt} ({n}, {k}): m={m} differs from the usual"
    one = f64(with_ring(3, fn, x[6], "float32"))
    assert one.tobytes() == got8[6].tobytes(), "row 6 alone (1-d x) differs from row 6 of the batch"
    assert f64(with_ring(3, fn, x, "float32")).tobytes() == got8.tobytes(), "not the same bits on a second run"


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_full_ring_wide_range_x(fmt):
    """Rows of very different magnitudes (tiny, huge, zero, one large value among small ones)."""
    n, k = 1792, 1280
    if depth(n, k, 1) == 0:
        pytest.skip("the shape does not fit this GPU")
    fn, deq = make(fmt, n, k)
    base = np.random.default_rng(5).standard_normal((6, k)).astype(np.float32)
    base[0] *= 1e-30
    base[1] *= 1e30
    base[2] = 0.0
    base[3] *= 1e-3
    base[3, 17] = 3e4
    base[4] *= 2.0**-100
    xb = gk.asarray(base).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    got = f64(with_ring(1, fn, x))
    check(got, xs, deq, f"{fmt} wide-range x, full ring")
    assert np.all(got[2] == 0.0)
    assert got.tobytes() == f64(fn(x)).tobytes(), "the full ring differs from the usual ring"


@cuda_only
def test_full_ring_knob_same_bits():
    """The knob's FR field: the same bits as the same knob without it."""
    outs = {}
    for n, k in ((6144, 4096), (300, 14336)):
        fn, deq = make("fp8", n, k)
        x, xs = xrand(3, k, "bfloat16")
        for cfg in ("4,2,16,1,3,0,0", "4,2,16,1,3,0,0,0,0,3"):
            os.environ["GPUKIT_GEMV_W8"] = cfg
            try:
                outs[cfg] = f64(fn(x))
            finally:
                del os.environ["GPUKIT_GEMV_W8"]
        check(outs["4,2,16,1,3,0,0,0,0,3"], xs, deq, f"knob FR ({n}, {k})")
        assert outs["4,2,16,1,3,0,0"].tobytes() == outs["4,2,16,1,3,0,0,0,0,3"].tobytes(), f"({n}, {k})"


@cuda_only
def test_full_ring_pdl_chain_eager_and_graph():
    """A chain of PDL-launched GEMVs, each reading the previous output (the full ring issues
    all its weight copies before the wait; x must still be read after it): the bits of the
    chain without PDL and without the full ring, eager and replayed from a graph."""
    dims = [4096, 6144, 4096, 4096, 1280, 1792]  # q/k/v-like (3 stages), 6144 -> 4096 (3), o-like (2), ...
    layers = [make("fp8" if i % 2 == 0 else "int8", dims[i + 1], dims[i])[0] for i in range(len(dims) - 1)]
    x0 = gk.asarray(np.random.default_rng(7).standard_normal((2, dims[0])).astype(np.float32)).astype("bfloat16")
    x0 = x0.to("cuda")

    def chain():
        y = x0
        for fn in layers:
            y = fn(y, "bfloat16")
        return y

    _C._gemv_set_variant(2)
    try:
        ref = f64(chain())
    finally:
        _C._gemv_set_variant(0)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    for mask in (0, 3, 3):
        got = f64(with_ring(mask, chain))
        bad = np.argwhere(got != ref)
        assert bad.size == 0, f"mask {mask}: the chain differs at {len(bad)} places, first {bad[0].tolist()}"
    prev = _C._gemv_w8_full_ring()
    _C._gemv_w8_set_full_ring(3)
    try:
        g = gk.Graph()
        with g:
            outs = [chain(), chain()]
    finally:
        _C._gemv_w8_set_full_ring(prev)
    for _ in range(2):
        g.replay()
        gk.cuda.synchronize()
        for o in outs:
            bad = np.argwhere(f64(o) != ref)
            assert bad.size == 0, f"graph replay differs at {len(bad)} places, first {bad[0].tolist()}"
