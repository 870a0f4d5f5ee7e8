"""EngineOptions::quantized_swiglu_epi (session 10, branch sge): the gate/up GEMV of quantized decode
(w = [gate; up], 2 I rows) writes act = SwiGLU(gate, up) in its epilogue (src/cuda/common/gemv_sge.cuh;
k_w8 XM 4 for fp8 / int8, k_w4 MODE 111 / 115 for int4), so the engine's SwiGLU launch goes away.
The contract is BIT equality with today's path: the GEMV (gk.gemv_fp8 / gemv_int8 / gemv_int4, or
gemv_quantized_prepared) rounded to its output type, then the engine's SwiGLU kernel
(gk._C.llm.fused_swiglu). CPU parts: the option, its environment variable, the e2e flag, the op's CPU
path (= the composition of the CPU references), bad input. CUDA parts skip without a GPU."""
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
SMALL = dict(CFG128, num_hidden_layers=1)


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def bits(a):
    return np.ascontiguousarray(np.asarray(gk.to_numpy(a))).tobytes()


_QUANT = {}
_BASE = {}


def source(n, k, seed):
    """A float32 [n, k] random weight (rows of unit variance / sqrt(k)). Large ones are slices of two cached
    random matrices ([28672, 4096] and [8192, 14336]: one draw each per session, the host's time), so tests
    that use the same shape share them."""
    if n * k <= 4 << 20:
        w = np.random.default_rng(seed).standard_normal((n, k), dtype=np.float32)
    else:
        big = (28672, 4096) if n <= 28672 and k <= 4096 else (8192, 14336)
        assert n <= big[0] and k <= big[1], (n, k)
        if big not in _BASE:
            _BASE[big] = np.random.default_rng(big[0] + big[1]).standard_normal(big, dtype=np.float32)
        w = np.ascontiguousarray(_BASE[big][:n, :k])
    return w / np.float32(np.sqrt(k))


def quant(fmt, n, k, seed, dev, group=128):
    """(q, scales, zeros or None, group) of a random [n, k] weight quantized on dev (cached)."""
    key = (fmt, n, k, seed if n * k <= 4 << 20 else 0, dev, group)
    if key not in _QUANT:
        w = gk.asarray(source(n, k, seed)).to(dev)
        if fmt == "int4":
            q, s, z = gk.quantize_int4(w, group=group)
        else:
            q, s = getattr(gk, f"quantize_{fmt}")(w)
            z = None
        del w
        if len(_QUANT) >= 12:
            _QUANT.pop(next(iter(_QUANT)))
        _QUANT[key] = (q, s, z, group)
    return _QUANT[key]


def gemv(fmt, x, w, out):
    q, s, z, group = w
    if fmt == "int4":
        return gk.gemv_int4(x, q, s, z, group=group, out_dtype=out)
    return getattr(gk, f"gemv_{fmt}")(x, q, s, out_dtype=out)


def unfused(fmt, x, w, out, xh=None, xinv=None):
    """Today's path: the GEMV, then the engine's SwiGLU kernel."""
    q, s, z, group = w
    if xh is not None:
        gu = _C._gemv_quantized_prepared(fmt, q, s, x, xh, xinv, out)
    else:
        gu = gemv(fmt, x, w, out)
    one = gu.ndim == 1
    act = _C.llm.fused_swiglu(gu.reshape((1, gu.shape[0])) if one else gu)
    return act.reshape((act.shape[1],)) if one else act


def fused(fmt, x, w, out, xh=None, xinv=None):
    q, s, z, group = w
    return _C.llm.gemv_quantized_swiglu(x, fmt, q, s, z, group, out, xh, xinv)


def applies(fmt, x, w, xh=None, xinv=None):
    q, s, z, group = w
    return _C.llm.swiglu_gemv_epi_applies(x, fmt, q, s, z, group, xh, xinv)


def make_x(m, k, dev, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return gk.asarray((rng.standard_normal((m, k)) * scale).astype(np.float32)).astype("bfloat16").to(dev)


def assert_same(a, b, what):
    ga, gb = np.asarray(gk.to_numpy(a)), np.asarray(gk.to_numpy(b))
    assert ga.shape == gb.shape, f"{what}: shapes {ga.shape} vs {gb.shape}"
    assert ga.dtype == gb.dtype, f"{what}: dtypes {ga.dtype} vs {gb.dtype}"
    if ga.tobytes() != gb.tobytes():
        fa, fb = ga.astype(np.float64), gb.astype(np.float64)
        diff = (fa != fb) & ~(np.isnan(fa) & np.isnan(fb))
        bad = np.argwhere(diff | (np.isnan(fa) != np.isnan(fb)))
        if bad.size == 0:  # NaN payloads only
            ba = ga.reshape(-1).view(np.uint8 if ga.itemsize == 1 else f"u{ga.itemsize}")
            bb = gb.reshape(-1).view(ba.dtype)
            i = int(np.argmax(ba != bb))
            raise AssertionError(f"{what}: NaN payloads differ, first flat index {i}: {ba[i]:#x} vs {bb[i]:#x}")
        fin = diff & np.isfinite(fa) & np.isfinite(fb)
        mx = float(np.max(np.abs(fa - fb)[fin])) if fin.any() else float("nan")
        i = tuple(bad[0])
        raise AssertionError(f"{what}: {len(bad)} of {ga.size} values differ (max finite diff {mx:.4g}), "
                             f"first {list(i)}: {fa[i]!r} vs {fb[i]!r}")


# ---- CPU: the option, its environment variable, the e2e flag, the op's CPU path ----

def test_option_default_off_and_cpu_unchanged():
    m = gk.llm.random_model(SMALL, device="cpu", dtype="float32", seed=3)
    assert m._m.quantized_swiglu_epi is False, "quantized_swiglu_epi must be off by default"
    base = run_p(m, False, PROMPTS[:1], new=3)
    m._m.quantized_swiglu_epi = True
    assert m._m.quantized_swiglu_epi is True
    same(base, run_p(m, False, PROMPTS[:1], new=3), "CPU: quantized_swiglu_epi has no effect")
    m._m.quantized_swiglu_epi = False
    assert m._m.quantized_swiglu_epi is False


@pytest.mark.parametrize("quantize", ["fp8", "int4"])
def test_option_cpu_quantized_unchanged(quantize):
    m = gk.llm.random_model(SMALL, device="cpu", dtype="float32", seed=5, quantize=quantize)
    base = run_p(m, False, PROMPTS[:1], new=3)
    m._m.quantized_swiglu_epi = True
    same(base, run_p(m, False, PROMPTS[:1], new=3), f"CPU {quantize}: quantized_swiglu_epi has no effect")


def test_option_from_environment(monkeypatch):
    for v, want in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv("GPUKIT_QUANTIZED_SWIGLU_EPI", v)
        m = gk.llm.random_model(SMALL, device="cpu", dtype="float32", seed=3)
        assert m._m.quantized_swiglu_epi is want, f"GPUKIT_QUANTIZED_SWIGLU_EPI={v!r}"
    monkeypatch.delenv("GPUKIT_QUANTIZED_SWIGLU_EPI")
    assert gk.llm.random_model(SMALL, device="cpu", dtype="float32", seed=3)._m.quantized_swiglu_epi is False


def test_e2e_flag():
    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "e2e.py"
    sys.path.insert(0, str(path.parent))  # e2e.py imports bench/common.py
    try:
        spec = importlib.util.spec_from_file_location("gk_bench_e2e_sge", path)
        e2e = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(e2e)
    finally:
        sys.path.remove(str(path.parent))
    assert e2e.gk_engine("gk-graph+sge")[1]["attrs"] == {"quantized_swiglu_epi": True}
    assert e2e.gk_engine("gk-graph+nosge")[1]["attrs"] == {"quantized_swiglu_epi": False}
    assert "quantized_swiglu_epi" not in e2e.gk_engine("gk-graph")[1]["attrs"]
    assert e2e.gk_engine("gk-eager+sge+qxp")[1]["attrs"] == {"quantized_swiglu_epi": True, "quantized_x_prep": True}


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_op_on_cpu(fmt):
    """The CPU path: gemv_quantized then the engine's SwiGLU (their CPU references); against float64 NumPy
    (the GEMV's bf16 rounding of gate and up and the final rounding allowed for), 1-d and 2-d x."""
    n, k = 2 * 36, 256
    w = quant(fmt, n, k, 5, "cpu")
    x = make_x(3, k, "cpu", scale=3.0, seed=1)
    calls = _C.llm._swiglu_epi_calls()
    assert not applies(fmt, x[:1], w)
    for out in ("float32", "bfloat16", None):
        y = fused(fmt, x, w, out)
        assert_same(y, unfused(fmt, x, w, out), f"CPU {fmt} {out}")
    y = fused(fmt, x, w, "float32")
    assert y.shape == (3, n // 2)
    q, s, z, group = w
    deq = f64(gk.dequantize_int4(q, s, z, group=group) if fmt == "int4" else getattr(gk, f"dequantize_{fmt}")(q, s))
    gu = f64(x) @ deq.T
    g, u = gu[:, : n // 2], gu[:, n // 2:]
    ref = g / (1.0 + np.exp(-g)) * u
    err = np.abs(f64(y) - ref)
    assert np.all(err <= 1e-5 * (np.abs(ref) + np.abs(u) + np.abs(g) + 1e-3)), f"{fmt}: max err {err.max():.3g}"
    y1 = fused(fmt, x[1], w, None)
    assert y1.shape == (n // 2,) and y1.dtype == gk.bfloat16
    assert_same(y1, unfused(fmt, x[1], w, None), f"CPU {fmt} 1-d")
    assert _C.llm._swiglu_epi_calls() == calls, "the CPU took the fused kernel"


def test_op_bad_input():
    q, s, _, _ = quant("fp8", 16, 128, 2, "cpu")
    x = make_x(1, 128, "cpu")
    qo, so, _, _ = quant("fp8", 15, 128, 2, "cpu")
    with pytest.raises(ValueError):
        _C.llm.gemv_quantized_swiglu(x, "fp8", qo, so)  # 15 rows: no [gate; up]
    with pytest.raises(ValueError):
        _C.llm.gemv_quantized_swiglu(make_x(1, 64, "cpu"), "fp8", q, s)  # K 64 but the weight has 128
    with pytest.raises(ValueError):
        _C.llm.gemv_quantized_swiglu(x, "q4_0", q, s)
    with pytest.raises(TypeError):
        _C.llm.gemv_quantized_swiglu(x, "fp8", q, s, out_dtype="int32")
    with pytest.raises((ValueError, TypeError)):
        _C.llm.gemv_quantized_swiglu(x, "int8", q, s)  # fp8 codes given as int8
    with pytest.raises(ValueError):
        _C.llm.gemv_quantized_swiglu(x, "fp8", q, s, xh=x)  # xh without xinv


# ---- GPU: the op bit for bit against the GEMV + SwiGLU ----

# (2 I, K): the 8B gate/up and other shapes without split-K (the plan's split is 1 where N is large enough
# for the K); I % 8 != 0 (I = 14332, 14335) and a small N (split-K) fall back
SHAPES_8 = [(28672, 4096), (12000, 4096), (8192, 14336), (2 * 5000, 1024)]
SHAPES_4 = [(28672, 4096), (12000, 4096), (8192, 14336), (2 * 9000, 1536)]
FALLBACK = [(2 * 14332, 4096), (2 * 14335, 4096), (2 * 64, 4096)]


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
@pytest.mark.parametrize("si", range(4))
def test_fused_same_bits(fmt, si):
    n, k = (SHAPES_4 if fmt == "int4" else SHAPES_8)[si]
    w = quant(fmt, n, k, n + k, "cuda")
    assert applies(fmt, make_x(1, k, "cuda"), w), f"{fmt} ({n}, {k}): the fused kernel is not taken"
    for seed, scale in ((1, 1.0), (2, 8.0), (3, 0.01)):
        x = make_x(1, k, "cuda", scale=scale, seed=seed)
        calls = _C.llm._swiglu_epi_calls()
        for out in ("bfloat16", "float32", "float16"):
            assert_same(fused(fmt, x, w, out), unfused(fmt, x, w, out), f"{fmt} ({n}, {k}) scale {scale} {out}")
        assert _C.llm._swiglu_epi_calls() == calls + 3, "the fused kernel did not run"
        assert bits(fused(fmt, x, w, None)) == bits(fused(fmt, x, w, None)), "not the same bits twice"
        x1 = x.reshape((k,))
        assert_same(fused(fmt, x1, w, None), unfused(fmt, x1, w, None), f"{fmt} ({n}, {k}) 1-d x")


@cuda_only
@pytest.mark.parametrize("group", [64, 32])
def test_fused_int4_groups(group):
    for n, k in ((28672, 4096), (12000, 2048)):
        w = quant("int4", n, k, 17, "cuda", group=group)
        x = make_x(1, k, "cuda", scale=2.0, seed=4)
        assert applies("int4", x, w), f"g{group} ({n}, {k}): not taken"
        calls = _C.llm._swiglu_epi_calls()
        for out in ("bfloat16", "float32"):
            assert_same(fused("int4", x, w, out), unfused("int4", x, w, out), f"int4 g{group} ({n}, {k}) {out}")
        assert _C.llm._swiglu_epi_calls() == calls + 2


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_fused_fallbacks(fmt):
    """Shapes the fused kernel does not take (I % 8 != 0, split-K), M = 3 (int4: M = 1 only), K not wide for
    int4, 64-aligned K only for fp8 / int8: the composition, the same bits, the counter unchanged."""
    calls = _C.llm._swiglu_epi_calls()
    for n, k in FALLBACK:
        w = quant(fmt, n, k, 3, "cuda")
        x = make_x(1, k, "cuda", seed=2)
        assert not applies(fmt, x, w), f"{fmt} ({n}, {k}) must fall back"
        assert_same(fused(fmt, x, w, None), unfused(fmt, x, w, None), f"{fmt} fallback ({n}, {k})")
    assert _C.llm._swiglu_epi_calls() == calls, "a fallback took the fused kernel"
    w = quant(fmt, 12000, 2048, 4, "cuda")
    x3 = make_x(3, 2048, "cuda", seed=3)
    assert applies(fmt, x3, w) == (fmt != "int4"), f"{fmt} M = 3"
    assert_same(fused(fmt, x3, w, None), unfused(fmt, x3, w, None), f"{fmt} M = 3")
    x8 = make_x(8, 2048, "cuda", seed=3)
    assert_same(fused(fmt, x8, w, "float32"), unfused(fmt, x8, w, "float32"), f"{fmt} M = 8")
    big = make_x(2, 2048 + 8, "cuda", seed=5)
    mis = big[0:1, 3:3 + 2048]  # not 16-byte aligned
    assert not applies(fmt, mis, w)
    assert_same(fused(fmt, mis, w, None), unfused(fmt, mis, w, None), f"{fmt} misaligned x")
    if fmt == "int4":
        w2 = quant(fmt, 12000, 640, 6, "cuda")  # K % 512 != 0: the narrow kernel
        x2 = make_x(1, 640, "cuda", seed=6)
        assert not applies(fmt, x2, w2)
        assert_same(fused(fmt, x2, w2, None), unfused(fmt, x2, w2, None), "int4 K 640")
        for v in (1, 3):  # other kernels
            _C._gemv_set_variant(v)
            try:
                x = make_x(1, 2048, "cuda", seed=7)
                assert not applies(fmt, x, w), f"variant {v} must fall back"
                assert_same(fused(fmt, x, w, None), unfused(fmt, x, w, None), f"int4 variant {v}")
            finally:
                _C._gemv_set_variant(0)
    else:
        _C._gemv_set_dense_path(1)  # the per-lane tensor-core path
        try:
            x = make_x(1, 2048, "cuda", seed=7)
            assert not applies(fmt, x, w)
            assert_same(fused(fmt, x, w, None), unfused(fmt, x, w, None), f"{fmt} dense path 1")
        finally:
            _C._gemv_set_dense_path(-1)


@cuda_only
def test_fused_int4_variant62():
    """Variant 62 (k_w4 MODE 15; possibly the default this session): MODE 115, the same bits as its GEMV."""
    w = quant("int4", 28672, 4096, 8, "cuda")
    _C._gemv_set_variant(62)
    try:
        calls = _C.llm._swiglu_epi_calls()
        for seed in (1, 2):
            x = make_x(1, 4096, "cuda", scale=3.0, seed=seed)
            assert applies("int4", x, w)
            for out in ("bfloat16", "float32"):
                assert_same(fused("int4", x, w, out), unfused("int4", x, w, out), f"int4 v62 {out}")
        assert _C.llm._swiglu_epi_calls() == calls + 4
    finally:
        _C._gemv_set_variant(0)


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_fused_extremes(fmt):
    """x scaled so that gate / up saturate silu, overflow exp(-g), overflow bf16 to inf, and x with inf / NaN
    (NaN / inf gate and up): the same bits (inf / NaN included) as the GEMV + SwiGLU."""
    n, k = 12000, 2048
    w = quant(fmt, n, k, 9, "cuda")
    assert applies(fmt, make_x(1, k, "cuda"), w)
    rng = np.random.default_rng(10)
    base = rng.standard_normal(k)
    cases = {f"scale {s:g}": base * s for s in (1e-30, 30.0, 300.0, 1e4, 1e20, 1e36)}
    sparse = np.zeros(k)
    sparse[::61] = rng.standard_normal(len(sparse[::61])) * 1e3
    cases["sparse large"] = sparse
    withinf = base.copy()
    withinf[7] = np.inf
    cases["inf"] = withinf
    withnan = base.copy()
    withnan[11] = np.nan
    cases["nan"] = withnan
    seen_nonfinite = False
    for name, v in cases.items():
        x = gk.asarray(v[None].astype(np.float32)).astype("bfloat16").to("cuda")
        for out in ("bfloat16", "float32", "float16"):
            got = fused(fmt, x, w, out)
            assert_same(got, unfused(fmt, x, w, out), f"{fmt} {name} {out}")
            seen_nonfinite |= not np.isfinite(f64(got)).all()
    assert seen_nonfinite, "no case produced inf / NaN: the extremes test cannot fail there"


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_fused_poisoned_output(fmt):
    """The output's memory poisoned with NaN beforehand (freed blocks of the same size): every element written."""
    n, k = 28672, 4096
    w = quant(fmt, n, k, 13, "cuda")
    x = make_x(1, k, "cuda", seed=8)
    want = bits(unfused(fmt, x, w, "float32"))
    for out in ("float32", "bfloat16"):
        poison = [gk.full((1, n // 2), float("nan"), dtype=out, device="cuda") for _ in range(8)]
        gk.cuda.synchronize()
        del poison
        y = fused(fmt, x, w, out)
        fy = f64(y)
        assert np.isfinite(fy).all(), f"{fmt} {out}: {int(np.sum(~np.isfinite(fy)))} unwritten (NaN) outputs, " \
                                      f"first {np.argwhere(~np.isfinite(fy))[0].tolist()}"
    assert bits(fused(fmt, x, w, "float32")) == want


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_fused_prepared_x(fmt):
    """quantized_x_prep's input: the norm's bf16 h with its scaled fp16 copy xh and xinv (the fp16-x kernel):
    the bits of gemv_quantized_prepared then the SwiGLU."""
    n, k = 28672, 4096
    w = quant(fmt, n, k, 14, "cuda")
    rng = np.random.default_rng(15)
    b = lambda a: gk.asarray(a.astype(np.float32)).astype("bfloat16").to("cuda")
    calls = _C.llm._swiglu_epi_calls()
    took = 0
    for s in (1.0, 1e-3, 50.0):
        xin, res = b(rng.standard_normal((1, k)) * s), b(rng.standard_normal((1, k)) * s)
        nw = b(1.0 + 0.3 * rng.standard_normal(k))
        h, _, xh, xinv = _C.llm.fused_add_rms_norm_prep(xin, res, nw, 1e-6)
        assert xh is not None, "the norm wrote no fp16 copy"
        if applies(fmt, h, w, xh, xinv):
            took += 1
        for out in ("bfloat16", "float32"):
            assert_same(fused(fmt, h, w, out, xh, xinv), unfused(fmt, h, w, out, xh, xinv), f"{fmt} prepared x {s} {out}")
    assert took == 3, "the prepared x did not take the fused kernel"
    assert _C.llm._swiglu_epi_calls() == calls + 6


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_fused_graph(fmt):
    """x -> fused gate/up GEMV -> the down GEMV, captured in a graph: replays = eager bits, and a replay on new
    input = the new eager result; the PDL chain (on) against the chain without PDL."""
    hdim, inter = 4096, 6144
    wgu = quant(fmt, 2 * inter, hdim, 21, "cuda")
    wdf = gk.asarray(source(hdim, inter, 22)).to("cuda")
    if fmt == "int4":
        q, s, z = gk.quantize_int4(wdf, group=128)
        wd = (q, s, z, 128)
    else:
        q, s = gk.quantize_fp8(wdf)
        wd = (q, s, None, 128)
    x0 = make_x(1, hdim, "cuda")
    assert applies(fmt, x0, wgu), f"{fmt}: the gate/up shape must take the fused kernel"
    rng = np.random.default_rng(23)
    x = gk.asarray(rng.standard_normal((1, hdim)).astype(np.float32)).astype("bfloat16").to("cuda")

    def chain(use):
        act = fused(fmt, x, wgu, "bfloat16") if use else unfused(fmt, x, wgu, "bfloat16")
        return gemv(fmt, act, wd, "float32")

    _C.llm.set_pdl(False)
    _C._gemv_set_variant(2)
    try:
        ref = bits(chain(False))
    finally:
        _C._gemv_set_variant(0)
        _C.llm.set_pdl(None)
    _C.llm.set_pdl(True)
    try:
        calls = _C.llm._swiglu_epi_calls()
        for _ in range(2):
            assert bits(chain(True)) == ref, f"{fmt}: the eager chain differs"
        assert _C.llm._swiglu_epi_calls() == calls + 2
        gr = gk.Graph()
        with gr:
            outs = [chain(True), chain(True)]
        for _ in range(2):
            gr.replay()
            gk.cuda.synchronize()
            for o in outs:
                assert bits(o) == ref, f"{fmt}: a graph replay differs"
        gk.copy_into(x, gk.asarray(rng.standard_normal((1, hdim)).astype(np.float32) * 3).astype("bfloat16").to("cuda"))
        gr.replay()
        gk.cuda.synchronize()
        want = bits(chain(False))
        assert want != ref, "the new input gave the old result: the replay test cannot fail"
        for o in outs:
            assert bits(o) == want, f"{fmt}: the replay on new input differs"
    finally:
        _C.llm.set_pdl(None)


# ---- GPU: the engine ----

# gate/up N = 2 x 8448 rows: the plan's split is 1 at K = 512 / 1024 (so the fused kernel runs)
CFG_A = dict(CFG128, intermediate_size=8448)
CFG_B = dict(CFG128, hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, intermediate_size=8448)


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int8", "int4"])
@pytest.mark.parametrize("cfg", ["512", "1024"])
def test_engine_same_bits(quantize, cfg):
    """The engine with quantized_swiglu_epi: the same greedy tokens and logits (every step) as without, one
    sequence (counted in eager decode) and three, decode graph and eager."""
    c = CFG_A if cfg == "512" else CFG_B
    m = gk.llm.random_model(c, device="cuda", dtype="bfloat16", seed=43, quantize=quantize)
    assert m._m.quantized_swiglu_epi is False
    one = PROMPTS[1:2]
    base_g = run_p(m, True, one, new=12)
    base_e = run_p(m, False, one, new=12)
    three = run_p(m, True, PROMPTS, new=8)
    m._m.quantized_swiglu_epi = True
    try:
        calls = _C.llm._swiglu_epi_calls()
        same(base_e, run_p(m, False, one, new=12), f"{quantize} {cfg}: quantized_swiglu_epi, eager")
        layers = c.get("num_hidden_layers", 2)
        assert _C.llm._swiglu_epi_calls() - calls >= 11 * layers, "the engine did not take the fused kernel"
        same(base_g, run_p(m, True, one, new=12), f"{quantize} {cfg}: quantized_swiglu_epi, graph")
        same(three, run_p(m, True, PROMPTS, new=8), f"{quantize} {cfg}: quantized_swiglu_epi, three sequences")
    finally:
        m._m.quantized_swiglu_epi = False


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int8"])
def test_engine_with_x_prep(quantize):
    """With quantized_x_prep (the gate/up GEMV reads the norm's fp16 copy): the same tokens and logits."""
    m = gk.llm.random_model(CFG_A, device="cuda", dtype="bfloat16", seed=44, quantize=quantize)
    m._m.quantized_x_prep = True
    one = PROMPTS[1:2]
    base_g = run_p(m, True, one, new=10)
    base_e = run_p(m, False, one, new=10)
    m._m.quantized_swiglu_epi = True
    try:
        calls = _C.llm._swiglu_epi_calls()
        same(base_e, run_p(m, False, one, new=10), f"{quantize} qxp: eager")
        assert _C.llm._swiglu_epi_calls() - calls >= 9 * 2, "the engine did not take the fused kernel"
        same(base_g, run_p(m, True, one, new=10), f"{quantize} qxp: graph")
    finally:
        m._m.quantized_swiglu_epi = False
        m._m.quantized_x_prep = False


@cuda_only
def test_engine_comparison_can_fail():
    a = run_p(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=43, quantize="int4"), True,
              PROMPTS[1:2], new=3)
    b = run_p(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=44, quantize="int4"), True,
              PROMPTS[1:2], new=3)
    with pytest.raises(AssertionError):
        same(a, b, "two seeds")
