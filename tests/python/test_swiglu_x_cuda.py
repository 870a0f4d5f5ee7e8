"""EngineOptions::fused_swiglu_x (session 9, branch sgx): the down projection's quantized GEMV
reads the gate/up GEMV's output gu [1, 2K] (gate then up) and makes its x = silu(gate) * up
itself with the engine's SwiGLU kernel's arithmetic and rounding (k_swiglu of
src/cuda/llm_small.cu; device code src/cuda/common/gemv_swiglu_x.cuh: k_w8 XM 3 for fp8 / int8,
k_w4 MODE 15 for int4 g128). So every GPU test compares BIT FOR BIT with the engine's SwiGLU
kernel (gk._C.llm.fused_swiglu) followed by the same GEMV (gk.gemv_fp8 / gemv_int8 / gemv_int4),
and the engine's tokens and logits with the option off. CPU parts: the option, its environment
variable, the e2e flag, the op's CPU path against float64 NumPy. CUDA parts skip without a GPU."""
import importlib.util
import math
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
RNG = np.random.default_rng(2026)
# hidden 1280, intermediate 2560 (down: K 2560 = 5 x 512, int4's wide copies apply)
CFG_B = dict(CFG128, hidden_size=1280, num_attention_heads=10, num_key_value_heads=2, intermediate_size=2560)


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def bits(a):
    return np.ascontiguousarray(np.asarray(gk.to_numpy(a))).tobytes()


_QUANT = {}


def quant(fmt, n, k, seed, dev):
    """((q, scales, zeros or None) of a random [n, k] weight on dev, its exact float64 values or None
    where they would be large (N K > 8M)); quantized on dev (the CUDA rules are the CPU's), cached."""
    key = (fmt, n, k, seed, dev)
    if key not in _QUANT:
        w = gk.asarray(np.random.default_rng(seed).standard_normal((n, k), dtype=np.float32) / np.float32(math.sqrt(k)))
        w = w.to(dev)
        if fmt == "int4":
            q, s, z = gk.quantize_int4(w, group=128)
            deq = f64(gk.dequantize_int4(q, s, z, group=128)) if n * k <= 8 << 20 else None
        else:
            q, s = getattr(gk, f"quantize_{fmt}")(w)
            z = None
            deq = f64(getattr(gk, f"dequantize_{fmt}")(q, s)) if n * k <= 8 << 20 else None
        _QUANT.clear()  # one weight kept at a time (the 8B down shape is 59M codes)
        _QUANT[key] = ((q, s, z), deq)
    return _QUANT[key]


def unfused(fmt, gu, w, out):
    """The engine's path today: its SwiGLU kernel, then the GEMV."""
    act = _C.llm.fused_swiglu(gu if gu.ndim == 2 else gu.reshape((1, gu.shape[0])))
    q, s, z = w
    if fmt == "int4":
        y = gk.gemv_int4(act, q, s, z, group=128, out_dtype=out)
    else:
        y = getattr(gk, f"gemv_{fmt}")(act, q, s, out_dtype=out)
    return y if gu.ndim == 2 else y.reshape((y.shape[1],))


def fused(fmt, gu, w, out):
    q, s, z = w
    return _C.llm.fused_swiglu_gemv(gu, fmt, q, s, z, 128, out)


def gate_up(m, k, dev, scale=2.0, seed=0):
    rng = np.random.default_rng(seed)
    return gk.asarray((rng.standard_normal((m, 2 * k)) * scale).astype(np.float32)).astype("bfloat16").to(dev)


def assert_same(a, b, what):
    ga, gb = np.asarray(gk.to_numpy(a)), np.asarray(gk.to_numpy(b))
    assert ga.shape == gb.shape, f"{what}: shapes {ga.shape} vs {gb.shape}"
    if ga.tobytes() != gb.tobytes():
        fa, fb = ga.astype(np.float64), gb.astype(np.float64)
        bad = np.argwhere((fa != fb) & ~(np.isnan(fa) & np.isnan(fb)))
        first = bad[0].tolist() if bad.size else "(NaN payloads only)"
        raise AssertionError(f"{what}: {len(bad)} of {ga.size} values differ, first {first}: "
                             f"{fa[tuple(bad[0])] if bad.size else ''} vs {fb[tuple(bad[0])] if bad.size else ''}")


def check64(got, act, deq, what):
    """got (float32 output) against float64 products of the (already rounded) x and the exact weights."""
    xs = f64(act)
    ref = xs @ deq.T
    bound = np.abs(xs) @ np.abs(deq).T
    err = np.abs(f64(got) - ref)
    tol = 2 * (deq.shape[1] + 2) * 2.0**-24 * bound + 1e-30
    bad = np.argwhere(~(err <= tol))
    assert bad.size == 0, f"{what}: {len(bad)} out of the fp32 bound, first {bad[0].tolist()}"


# ---- CPU: the option, its environment variable, the e2e flag, the op's CPU path ----

SMALL = dict(CFG128, num_hidden_layers=1)


def test_option_default_off_and_cpu_unchanged():
    m = gk.llm.random_model(SMALL, device="cpu", dtype="float32", seed=3)
    assert m._m.fused_swiglu_x is False, "fused_swiglu_x must be off by default"
    base = run_p(m, False, PROMPTS[:1], new=3)
    m._m.fused_swiglu_x = True
    assert m._m.fused_swiglu_x is True
    same(base, run_p(m, False, PROMPTS[:1], new=3), "CPU: fused_swiglu_x has no effect")
    m._m.fused_swiglu_x = False
    assert m._m.fused_swiglu_x is False


def test_option_from_environment(monkeypatch):
    for v, want in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv("GPUKIT_FUSED_SWIGLU_X", v)
        m = gk.llm.random_model(SMALL, device="cpu", dtype="float32", seed=3)
        assert m._m.fused_swiglu_x is want, f"GPUKIT_FUSED_SWIGLU_X={v!r}"
    monkeypatch.delenv("GPUKIT_FUSED_SWIGLU_X")
    assert gk.llm.random_model(SMALL, device="cpu", dtype="float32", seed=3)._m.fused_swiglu_x is False


def test_e2e_flag():
    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "e2e.py"
    sys.path.insert(0, str(path.parent))  # e2e.py imports bench/common.py
    try:
        spec = importlib.util.spec_from_file_location("gk_bench_e2e_sgx", path)
        e2e = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(e2e)
    finally:
        sys.path.remove(str(path.parent))
    assert e2e.gk_engine("gk-graph+sgx")[1]["attrs"] == {"fused_swiglu_x": True}
    assert e2e.gk_engine("gk-graph+nosgx")[1]["attrs"] == {"fused_swiglu_x": False}
    assert "fused_swiglu_x" not in e2e.gk_engine("gk-graph")[1]["attrs"]
    assert e2e.gk_engine("gk-eager+sgx+qxp")[1]["attrs"] == {"fused_swiglu_x": True, "quantized_x_prep": True}


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_op_on_cpu(fmt):
    """The CPU path: the engine's SwiGLU (its CPU reference), then gemv_quantized; against float64
    NumPy (x's bf16 rounding allowed for: half an ulp of |x|), 1-d and 2-d gu, never the fused kernel."""
    n, k = 37, 256
    w, deq = quant(fmt, n, k, 5, "cpu")
    gu = gate_up(3, k, "cpu", scale=3.0, seed=1)
    calls = _C.llm._swiglu_x_calls()
    assert not _C.llm.swiglu_x_applies(gu[:1], fmt, *w[:2], w[2])
    y = fused(fmt, gu, w, "float32")
    assert bits(y) == bits(unfused(fmt, gu, w, "float32")), "CPU: not the SwiGLU + GEMV bits"
    g = f64(gu)
    x = g[:, :k] / (1.0 + np.exp(-g[:, :k])) * g[:, k:]
    ref = x @ deq.T
    tol = (np.abs(x) @ np.abs(deq).T) * (2.0**-8 + 2 * (k + 2) * 2.0**-24) + 1e-30
    err = np.abs(f64(y) - ref)
    assert np.all(err <= tol), f"{fmt}: worst {np.max(err / tol):.3g} of the bound"
    y1 = fused(fmt, gu[1], w, None)
    assert y1.shape == (n,) and y1.dtype == gk.bfloat16
    assert bits(y1) == bits(unfused(fmt, gu[1], w, None))
    assert _C.llm._swiglu_x_calls() == calls, "the CPU took the fused kernel"


def test_op_bad_input():
    w, _ = quant("fp8", 16, 128, 2, "cpu")
    q, s, _ = w
    with pytest.raises(ValueError):
        _C.llm.fused_swiglu_gemv(gate_up(1, 128, "cpu")[:, :255], "fp8", q, s)  # odd last dimension
    with pytest.raises(ValueError):
        _C.llm.fused_swiglu_gemv(gate_up(1, 64, "cpu"), "fp8", q, s)  # 2 I = 128 but K = 128
    with pytest.raises(ValueError):
        _C.llm.fused_swiglu_gemv(gate_up(1, 128, "cpu"), "q4_0", q, s)
    with pytest.raises(TypeError):
        _C.llm.fused_swiglu_gemv(gate_up(1, 128, "cpu"), "fp8", q, s, out_dtype="int32")
    with pytest.raises((ValueError, TypeError)):
        _C.llm.fused_swiglu_gemv(gate_up(1, 128, "cpu"), "int8", q, s)  # fp8 codes given as int8


# ---- GPU: the op bit for bit against SwiGLU + GEMV ----

# (N, K): the 8B down projection, a smaller N, split-K (small N), an odd K the kernels accept
# (fp8 / int8: K % 64 == 0, here 65 blocks of 64: a partial last stage; int4: K % 512 == 0)
SHAPES_8 = [(4096, 14336), (1000, 14336), (300, 14336), (4096, 4160), (37, 4160), (2051, 1024)]
SHAPES_4 = [(4096, 14336), (1000, 14336), (300, 14336), (4096, 2560), (37, 1536), (2051, 512)]


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
@pytest.mark.parametrize("si", range(6))
def test_fused_same_bits(fmt, si):
    n, k = (SHAPES_4 if fmt == "int4" else SHAPES_8)[si]
    w, deq = quant(fmt, n, k, n + k, "cuda")
    assert _C.llm.swiglu_x_applies(gate_up(1, k, "cuda"), fmt, *w[:2], w[2]), f"{fmt} ({n}, {k}): not taken"
    for seed, scale in ((1, 1.0), (2, 4.0), (3, 0.01)):
        gu = gate_up(1, k, "cuda", scale=scale, seed=seed)
        calls = _C.llm._swiglu_x_calls()
        for out in ("float32", "bfloat16"):
            want = unfused(fmt, gu, w, out)
            got = fused(fmt, gu, w, out)
            assert_same(got, want, f"{fmt} ({n}, {k}) scale {scale} {out}")
            if out == "float32" and deq is not None:
                check64(got, _C.llm.fused_swiglu(gu), deq, f"{fmt} ({n}, {k}) scale {scale}")
        assert _C.llm._swiglu_x_calls() == calls + 2, "the fused kernel did not run"
        assert bits(fused(fmt, gu, w, "float32")) == bits(fused(fmt, gu, w, "float32")), "not the same bits twice"


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_fused_extremes(fmt):
    """Gate / up values where silu saturates, exp(-g) overflows, g * u overflows bf16 to inf, and
    inf / NaN inputs: the same bits (inf / NaN included) as the SwiGLU kernel + GEMV."""
    n, k = 300, 2560
    w, _ = quant(fmt, n, k, 7, "cuda")
    rng = np.random.default_rng(9)
    g = rng.standard_normal(k) * 3
    u = rng.standard_normal(k) * 3
    cases = {
        "saturating": (np.where(rng.random(k) < 0.5, 1, -1) * rng.uniform(10, 120, k), u),
        "exp overflow": (-rng.uniform(85, 3e4, k), u * 1e3),
        "bf16 overflow": (g * 1e19, u * 1e20),
        "tiny": (g * 1e-30, u * 1e-10),
    }
    special = g.copy()
    special[::97] = np.inf
    special[5::97] = -np.inf
    special[11::97] = np.nan
    ups = u.copy()
    ups[17::89] = np.nan
    ups[23::89] = np.inf
    cases["inf / nan"] = (special, ups)
    for name, (gg, uu) in cases.items():
        gu = gk.asarray(np.concatenate([gg, uu])[None].astype(np.float32)).astype("bfloat16").to("cuda")
        for out in ("float32", "bfloat16"):
            assert_same(fused(fmt, gu, w, out), unfused(fmt, gu, w, out), f"{fmt} {name} {out}")
    assert not np.isfinite(f64(fused(fmt, gu, w, "float32"))).all(), "the inf / NaN case produced no inf / NaN"


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_fused_views_and_fallbacks(fmt):
    """gu as an aligned view (fused), a misaligned view, M = 3, and a 1-d gu (the same bits);
    shapes the fused kernels do not take fall back to SwiGLU + GEMV with the same bits."""
    n, k = 1000, 2560
    w, _ = quant(fmt, n, k, 11, "cuda")
    big = gate_up(2, k + 16, "cuda", seed=4)  # rows of 2 k + 32 elements
    calls = _C.llm._swiglu_x_calls()
    view = big[1:2, 8:8 + 2 * k]  # 16-byte aligned
    assert_same(fused(fmt, view, w, "float32"), unfused(fmt, view, w, "float32"), f"{fmt} aligned view")
    assert _C.llm._swiglu_x_calls() == calls + 1, "the aligned view did not take the fused kernel"
    one = big[1, 8:8 + 2 * k]
    assert_same(fused(fmt, one, w, "float32"), unfused(fmt, one, w, "float32"), f"{fmt} 1-d gu")
    assert _C.llm._swiglu_x_calls() == calls + 2, "the 1-d gu did not take the fused kernel"
    calls = _C.llm._swiglu_x_calls()
    mis = big[0:1, 3:3 + 2 * k]  # 6 bytes off
    assert not _C.llm.swiglu_x_applies(mis, fmt, *w[:2], w[2])
    assert_same(fused(fmt, mis, w, "float32"), unfused(fmt, mis, w, "float32"), f"{fmt} misaligned view")
    three = gate_up(3, k, "cuda", seed=5)
    assert_same(fused(fmt, three, w, "bfloat16"), unfused(fmt, three, w, "bfloat16"), f"{fmt} M = 3")
    kk = 640 if fmt == "int4" else 96  # int4: K % 512 != 0 (the narrow kernel); fp8: K % 64 != 0
    w2, _ = quant(fmt, 64, kk, 12, "cuda")
    gu2 = gate_up(1, kk, "cuda", seed=6)
    assert not _C.llm.swiglu_x_applies(gu2, fmt, *w2[:2], w2[2])
    assert_same(fused(fmt, gu2, w2, "float32"), unfused(fmt, gu2, w2, "float32"), f"{fmt} K {kk}")
    assert _C.llm._swiglu_x_calls() == calls, "a fallback took the fused kernel"
    if fmt == "fp8":  # another kernel (the per-lane tensor-core path): not fused, the same bits as its GEMV
        gk._C._gemv_set_dense_path(1)
        try:
            gu = gate_up(1, k, "cuda", seed=7)
            assert not _C.llm.swiglu_x_applies(gu, fmt, *w[:2], w[2])
            assert_same(fused(fmt, gu, w, "float32"), unfused(fmt, gu, w, "float32"), "fp8 dense path 1")
        finally:
            gk._C._gemv_set_dense_path(-1)


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_fused_poisoned_output(fmt):
    """The output's memory poisoned with NaN beforehand (freed blocks of the same size): every
    element written."""
    n, k = 4096, 14336
    w, _ = quant(fmt, n, k, 13, "cuda")
    gu = gate_up(1, k, "cuda", seed=8)
    want = bits(unfused(fmt, gu, w, "float32"))
    for out, dt in (("float32", "float32"), ("bfloat16", "bfloat16")):
        poison = [gk.full((1, n), float("nan"), dtype=dt, device="cuda") for _ in range(8)]
        gk.cuda.synchronize()
        del poison
        y = fused(fmt, gu, w, out)
        assert np.isfinite(f64(y)).all(), f"{fmt} {out}: unwritten (NaN) outputs"
    assert bits(fused(fmt, gu, w, "float32")) == want


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_fused_graph_and_pdl_chain(fmt):
    """h -> gate/up GEMV (PDL) -> fused down GEMV, whose PDL wait must come before it reads gu:
    the bits of the chain GEMV -> SwiGLU -> GEMV without PDL; eager twice, replayed from a graph,
    and replayed on new input values."""
    hdim, inter = 1280, 2560
    wgu, _ = quant(fmt, 2 * inter, hdim, 21, "cuda")
    wd, _ = quant(fmt, hdim, inter, 22, "cuda")
    rng = np.random.default_rng(23)
    h = gk.asarray(rng.standard_normal((1, hdim)).astype(np.float32)).astype("bfloat16").to("cuda")

    def up(x):
        q, s, z = wgu
        if fmt == "int4":
            return gk.gemv_int4(x, q, s, z, group=128, out_dtype="bfloat16")
        return gk.gemv_fp8(x, q, s, out_dtype="bfloat16")

    def chain(use):
        gu = up(h)
        return fused(fmt, gu, wd, "float32") if use else unfused(fmt, gu, wd, "float32")

    _C.llm.set_pdl(False)
    _C._gemv_set_variant(2)
    try:
        ref = bits(chain(False))
    finally:
        _C._gemv_set_variant(0)
        _C.llm.set_pdl(None)
    _C.llm.set_pdl(True)
    try:
        calls = _C.llm._swiglu_x_calls()
        for _ in range(2):
            assert bits(chain(True)) == ref, f"{fmt}: the eager chain differs"
        assert _C.llm._swiglu_x_calls() == calls + 2
        g = gk.Graph()
        with g:
            outs = [chain(True), chain(True)]
        for _ in range(2):
            g.replay()
            gk.cuda.synchronize()
            for o in outs:
                assert bits(o) == ref, f"{fmt}: a graph replay differs"
        gk.copy_into(h, gk.asarray(rng.standard_normal((1, hdim)).astype(np.float32) * 3).astype("bfloat16").to("cuda"))
        g.replay()
        gk.cuda.synchronize()
        want = bits(chain(False))
        assert want != ref, "the new input gave the old result: the replay test cannot fail"
        for o in outs:
            assert bits(o) == want, f"{fmt}: the replay on new input differs"
    finally:
        _C.llm.set_pdl(None)


# ---- GPU: the engine ----

@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int8", "int4"])
@pytest.mark.parametrize("cfg", ["512", "1280"])
def test_engine_same_bits(quantize, cfg):
    """The engine with fused_swiglu_x: the same greedy tokens and logits (every step) as without, one
    sequence (the fused kernel runs: counted in eager decode) and three (M = 3: the SwiGLU launch
    stays), decode graph and eager."""
    c = CFG128 if cfg == "512" else CFG_B
    m = gk.llm.random_model(c, device="cuda", dtype="bfloat16", seed=43, quantize=quantize)
    assert m._m.fused_swiglu_x is False
    one = PROMPTS[1:2]
    base_g = run_p(m, True, one, new=12)
    base_e = run_p(m, False, one, new=12)
    three = run_p(m, True, PROMPTS, new=8)
    m._m.fused_swiglu_x = True
    try:
        calls = _C.llm._swiglu_x_calls()
        same(base_e, run_p(m, False, one, new=12), f"{quantize} {cfg}: fused_swiglu_x, eager")
        layers = c.get("num_hidden_layers", 2)
        assert _C.llm._swiglu_x_calls() - calls >= 11 * layers, "the engine did not take the fused kernel"
        same(base_g, run_p(m, True, one, new=12), f"{quantize} {cfg}: fused_swiglu_x, graph")
        calls = _C.llm._swiglu_x_calls()
        same(three, run_p(m, True, PROMPTS, new=8), f"{quantize} {cfg}: fused_swiglu_x, three sequences")
        assert _C.llm._swiglu_x_calls() == calls, "M = 3 took the fused kernel"
    finally:
        m._m.fused_swiglu_x = False


@cuda_only
def test_engine_comparison_can_fail():
    a = run_p(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=43, quantize="int4"), True,
              PROMPTS[1:2], new=3)
    b = run_p(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=44, quantize="int4"), True,
              PROMPTS[1:2], new=3)
    with pytest.raises(AssertionError):
        same(a, b, "two seeds")
