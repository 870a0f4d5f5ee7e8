"""EngineOptions::fused_norm_epilogue (session 9, branch nepi): the quantized decode GEMVs (fp8 / int8
staged kernel k_w8, int4 k_w4 MODE 11) do the residual add + RMSNorm in their last CTA to finish
(an integer ticket; src/cuda/common/gemv_norm_epi.cuh) instead of a separate add_rms_norm launch.
The result must be the bits of gemv_quantized + llm.fused_add_rms_norm: every GPU test compares bit
for bit, prints the first mismatch, and checks which path ran (_C._gemv_norm_epi_calls: fused in the
GEMV / as its own launch). CPU parts: the option, its environment variable, the fallback."""
import functools
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import gpukit as gk
from gpukit import _C

from test_llm_step import CFG128, PROMPTS, same
from test_llm_decode_s6 import run_p

CUDA = gk.cuda.is_available()
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
EPS = 1e-5


def f64(a):
    return np.asarray(gk.to_numpy(a.astype("float32")), dtype=np.float64)


def bits(a):
    return np.asarray(gk.to_numpy(a.astype("float32")), dtype=np.float32).view(np.uint32)


def first_diff(got, want, what):
    g, w = bits(got), bits(want)
    bad = np.argwhere(g != w)
    assert bad.size == 0, (f"{what}: {len(bad)} of {g.size} differ, first {bad[0].tolist()}: "
                           f"{g.view(np.float32)[tuple(bad[0])]!r} vs {w.view(np.float32)[tuple(bad[0])]!r}")


@functools.lru_cache(maxsize=8)
def weight(fmt, n, k, seed, device):
    """(fmt, q, scales, zeros, group) of random weights [n, k] (quantized on the device: the CPU's
    bits); fmt 'int4g64' etc. for int4 groups."""
    kk = min(k, 2048)  # columns drawn, then tiled along K (fast; every row and group still differs)
    w = np.random.default_rng(seed).standard_normal((n, kk), dtype=np.float32) * np.float32(1 / np.sqrt(k))
    if kk < k:
        w = np.tile(w, (1, -(-k // kk)))[:, :k]
        w[:, kk:] *= np.float32(0.5)
    wa = gk.asarray(w).to(device)
    if fmt.startswith("int4"):
        g = int(fmt[5:]) if len(fmt) > 4 else 128
        q, s, z = gk.quantize_int4(wa, g)
        return ("int4", q.to(device), s.to(device), z.to(device), g)
    q, s = getattr(gk, f"quantize_{fmt}")(wa)
    return (fmt, q.to(device), s.to(device), None, 0)


def reference(qw, x, res, w):
    fmt, q, s, z, g = qw
    y = gk.gemv_int4(x, q, s, z, g, out_dtype=x.dtype) if fmt == "int4" else \
        getattr(gk, f"gemv_{fmt}")(x, q, s, out_dtype=x.dtype)
    return _C.llm.fused_add_rms_norm(y, res, w, EPS)


def inputs(m, n, k, seed, device, dt="bfloat16"):
    rng = np.random.default_rng(seed)
    x = gk.asarray(rng.standard_normal((m, k)).astype(np.float32)).astype(dt).to(device)
    res = gk.asarray((3 * rng.standard_normal((m, n))).astype(np.float32)).astype(dt).to(device)
    w = gk.asarray((1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)).astype(dt).to(device)
    return x, res, w


def fused(qw, x, res, w, ctr, slot=0):
    fmt, q, s, z, g = qw
    return _C.llm.fused_quantized_add_norm(fmt, q, s, z, g, x, res, w, EPS, ctr, slot)


def poison_pool(n, m):
    """Allocate and free NaN arrays of the outputs' size so that the caching allocator hands the
    op poisoned blocks (best effort: an element the kernels do not write then reads NaN)."""
    a = [gk.full((m, n), float("nan"), dtype="bfloat16", device="cuda") for _ in range(4)]
    gk.cuda.synchronize()
    del a


# ---- CPU ----

def test_option_default_and_python():
    m = gk.llm.random_model(dict(CFG128, num_hidden_layers=1), device="cpu", dtype="float32", seed=3)
    assert m._m.fused_norm_epilogue is False, "fused_norm_epilogue must be off by default"
    base = run_p(m, False, PROMPTS, new=3)
    m._m.fused_norm_epilogue = True
    assert m._m.fused_norm_epilogue is True
    same(base, run_p(m, False, PROMPTS, new=3), "CPU: fused_norm_epilogue has no effect")
    with pytest.raises(TypeError):
        m._m.fused_norm_epilogue = "yes"


def test_option_env(monkeypatch):
    cfg = dict(CFG128, num_hidden_layers=1)
    monkeypatch.setenv("GPUKIT_FUSED_NORM_EPI", "1")
    assert gk.llm.random_model(cfg, device="cpu", dtype="float32", seed=3)._m.fused_norm_epilogue is True
    monkeypatch.setenv("GPUKIT_FUSED_NORM_EPI", "0")
    assert gk.llm.random_model(cfg, device="cpu", dtype="float32", seed=3)._m.fused_norm_epilogue is False
    for bad in ("yes", "2", "on", "-1"):
        monkeypatch.setenv("GPUKIT_FUSED_NORM_EPI", bad)
        with pytest.raises(ValueError, match="GPUKIT_FUSED_NORM_EPI"):
            gk.llm.random_model(cfg, device="cpu", dtype="float32", seed=3)


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_cpu_quantized_engine_unchanged(fmt):
    cfg = dict(CFG128, num_hidden_layers=1)
    a = gk.llm.random_model(cfg, device="cpu", dtype="float32", seed=5, quantize=fmt)
    base = run_p(a, False, PROMPTS[:1], new=3)
    a._m.fused_norm_epilogue = True
    same(base, run_p(a, False, PROMPTS[:1], new=3), f"CPU {fmt}: fused_norm_epilogue has no effect")


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_cpu_op_falls_back(fmt):
    """On the CPU the op is gemv_quantized + add_rms_norm, and not fusable."""
    qw = weight(fmt, 64, 256, 7, "cpu")
    x, res, w = inputs(2, 64, 256, 8, "cpu")
    ctr = gk.zeros((4,), dtype="int32")
    h, r = fused(qw, x, res, w, ctr)
    h0, r0 = reference(qw, x, res, w)
    first_diff(h, h0, f"CPU {fmt} h")
    first_diff(r, r0, f"CPU {fmt} residual")
    assert not _C.llm.quantized_add_norm_fusable(*qw, x, res, w, ctr, 0)
    with pytest.raises(ValueError):
        fused(("nvf4",) + qw[1:], x, res, w, ctr)


def test_e2e_flag():
    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "e2e.py"
    sys.path.insert(0, str(path.parent))  # e2e.py imports bench/common.py
    try:
        spec = importlib.util.spec_from_file_location("gk_bench_e2e_nepi", path)
        e2e = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(e2e)
    finally:
        sys.path.remove(str(path.parent))
    assert e2e.gk_engine("gk-graph+nepi")[1]["attrs"] == {"fused_norm_epilogue": True}
    assert e2e.gk_engine("gk-graph+nonepi")[1]["attrs"] == {"fused_norm_epilogue": False}
    assert "fused_norm_epilogue" not in e2e.gk_engine("gk-graph")[1]["attrs"]


# ---- GPU: the op ----

SHAPES = [(4096, 4096), (4096, 14336), (2048 + 64 * 3, 4096), (2048 + 64 * 3, 14336), (2048, 8192), (512, 1280)]


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4", "int4g64"])
@pytest.mark.parametrize("n,k", SHAPES)
def test_op_same_bits(fmt, n, k):
    """M = 1 (and 3 for fp8 / int8): h and the residual bit for bit as gemv + add_rms_norm, the
    counter left zero, the same bits on a second run; the 8B shapes must take the fused kernel."""
    qw = weight(fmt, n, k, 5, "cuda")
    ctr = gk.zeros((3,), dtype="int32", device="cuda")
    for m in (1, 3):  # int4 at M = 3: the separate launch
        x, res, w = inputs(m, n, k, m + n + k, "cuda")
        assert _C.llm.quantized_add_norm_fusable(*qw, x, res, w, ctr, 1)
        h0, r0 = reference(qw, x, res, w)
        poison_pool(n, m)
        before = _C._gemv_norm_epi_calls()
        h, r = fused(qw, x, res, w, ctr, 1)
        gk.cuda.synchronize()
        after = _C._gemv_norm_epi_calls()
        print(f"{fmt} ({n}, {k}) m={m}: fused {after[0] - before[0]} separate {after[1] - before[1]}")
        assert sum(after) - sum(before) == 1, "one epilogue per call"
        if m == 1 and (n, k) in ((4096, 4096), (4096, 14336)):
            assert after[0] == before[0] + 1, f"{fmt} ({n}, {k}): the 8B shape did not take the fused kernel"
        first_diff(h, h0, f"{fmt} ({n}, {k}) m={m} h")
        first_diff(r, r0, f"{fmt} ({n}, {k}) m={m} residual")
        assert np.isfinite(f64(h)).all()
        assert not np.asarray(gk.to_numpy(ctr)).any(), "the ticket counter was not reset to 0"
        h2, r2 = fused(qw, x, res, w, ctr, 1)
        first_diff(h2, h, f"{fmt} ({n}, {k}) m={m} second run")


@cuda_only
def test_op_comparison_can_fail():
    qw = weight("fp8", 4096, 4096, 1, "cuda")
    x, res, w = inputs(1, 4096, 4096, 2, "cuda")
    ctr = gk.zeros((1,), dtype="int32", device="cuda")
    h, _ = fused(qw, x, res, w, ctr)
    x2, _, _ = inputs(1, 4096, 4096, 3, "cuda")
    h2, _ = reference(qw, x2, res, w)
    with pytest.raises(AssertionError):
        first_diff(h, h2, "two inputs")


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_op_graph_replays(fmt):
    """Captured twice in one graph (two slots and one shared slot), replayed 3 times: the same bits
    each time (the counters reset), then new x values: the new result."""
    n, k = 4096, 4096
    qw = weight(fmt, n, k, 11, "cuda")
    x, res, w = inputs(1, n, k, 12, "cuda")
    ctr = gk.zeros((2,), dtype="int32", device="cuda")
    h0, r0 = reference(qw, x, res, w)
    fused(qw, x, res, w, ctr)  # warm-up (kernel attributes) outside the capture
    g = gk.Graph()
    with g:
        outs = [fused(qw, x, res, w, ctr, 0), fused(qw, x, res, w, ctr, 1), fused(qw, x, res, w, ctr, 0)]
    for rep in range(3):
        g.replay()
        gk.cuda.synchronize()
        for i, (h, r) in enumerate(outs):
            first_diff(h, h0, f"{fmt} replay {rep} output {i} h")
            first_diff(r, r0, f"{fmt} replay {rep} output {i} residual")
        assert not np.asarray(gk.to_numpy(ctr)).any(), "counters not reset after a replay"
    x2, _, _ = inputs(1, n, k, 13, "cuda")
    gk.copy_into(x, x2)
    g.replay()
    gk.cuda.synchronize()
    h1, r1 = reference(qw, x, res, w)
    assert bits(h1).tobytes() != bits(h0).tobytes(), "the new input gave the old result: the test cannot fail"
    for i, (h, r) in enumerate(outs):
        first_diff(h, h1, f"{fmt} new-input replay output {i} h")
        first_diff(r, r1, f"{fmt} new-input replay output {i} residual")


@cuda_only
def test_op_float16_and_knob_fall_back():
    """float16 x (int4 and fp8: no fused kernel for it): the separate launch, the same bits."""
    n, k = 4096, 4096
    for fmt in ("int4", "fp8"):
        qw = weight(fmt, n, k, 21, "cuda")
        x, res, w = inputs(1, n, k, 22, "cuda", dt="float16")
        ctr = gk.zeros((1,), dtype="int32", device="cuda")
        h0, r0 = reference(qw, x, res, w)
        h, r = fused(qw, x, res, w, ctr)
        first_diff(h, h0, f"{fmt} float16 h")
        first_diff(r, r0, f"{fmt} float16 residual")


# ---- GPU: the engine ----

CFG_1280 = dict(CFG128, hidden_size=1280, num_attention_heads=10, num_key_value_heads=2, intermediate_size=2560)


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int8", "int4"])
@pytest.mark.parametrize("cfg", ["512", "1280"])
def test_engine_same_bits(quantize, cfg):
    """Tokens and every step's logits bit for bit with the option on and off: decode graph and eager,
    one sequence (M = 1: the epilogue path) and three (the engine keeps the separate norm)."""
    c = CFG128 if cfg == "512" else CFG_1280
    m = gk.llm.random_model(c, device="cuda", dtype="bfloat16", seed=43, quantize=quantize)
    assert m._m.fused_norm_epilogue is False
    one = run_p(m, True, PROMPTS[1:2], new=12)
    one_eager = run_p(m, False, PROMPTS[1:2], new=6)
    three = run_p(m, True, PROMPTS, new=12)
    m._m.fused_norm_epilogue = True
    before = _C._gemv_norm_epi_calls()
    same(one, run_p(m, True, PROMPTS[1:2], new=12), f"{quantize} {cfg}: one sequence, graph")
    mid = _C._gemv_norm_epi_calls()
    print(f"{quantize} {cfg}: fused {mid[0] - before[0]} separate {mid[1] - before[1]} (graph, one sequence)")
    # int4 with K = 1280 (K % 512 != 0): the narrow kernel, so the epilogue's own launch
    k = 1 if quantize == "int4" and cfg == "1280" else 0
    assert mid[k] > before[k], "the engine never took the epilogue path" + (" (fused)" if k == 0 else "")
    same(one_eager, run_p(m, False, PROMPTS[1:2], new=6), f"{quantize} {cfg}: one sequence, eager")
    layers = c.get("num_hidden_layers", 2)
    after = _C._gemv_norm_epi_calls()
    assert after[k] - mid[k] >= 5 * 2 * layers, f"too few epilogues in eager decode: {mid} -> {after}"
    same(three, run_p(m, True, PROMPTS, new=12), f"{quantize} {cfg}: three sequences, graph")


@cuda_only
def test_engine_8b_layer_shapes():
    """Two layers of the 8B shape (hidden 4096, intermediate 14336) with fp8 and int4: bits on / off."""
    c = dict(CFG128, hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
             head_dim=128, num_hidden_layers=2)
    for quantize in ("fp8", "int4"):
        m = gk.llm.random_model(c, device="cuda", dtype="bfloat16", seed=7, quantize=quantize)
        base = run_p(m, True, PROMPTS[:1], new=8)
        m._m.fused_norm_epilogue = True
        before = _C._gemv_norm_epi_calls()
        same(base, run_p(m, True, PROMPTS[:1], new=8), f"8B-shaped {quantize}")
        after = _C._gemv_norm_epi_calls()
        assert after[0] > before[0] and after[1] == before[1], f"{quantize}: {before} -> {after}"
        del m
