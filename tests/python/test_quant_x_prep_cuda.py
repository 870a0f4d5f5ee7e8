"""EngineOptions::quantized_x_prep (session 9 prep, branch fp8e11): the engine's residual add +
RMSNorm (llm.fused_add_rms_norm_prep, the row-in-registers kernel of src/cuda/llm_small.cu)
also writes the fp8 / int8 staged GEMV's scaled fp16 copy of its output (each row times 2^c,
its largest |value| in [2^14, 2^15); xinv = 2^-c: the values of gemv_w8.cu's x kernel), and
gemv_quantized_prepared reads it (fp16 products, cvt.rn.f16x2.e4m3x2) instead of decoding the
codes to exact bf16. The products are the bf16 ones times 2^c, so the bits must be today's
default (the bf16 decode): every test compares bit for bit with gk.gemv_fp8 / gemv_int8 on
bf16 x, and the engine's tokens and logits with the option off. CUDA parts skip without a GPU."""

import numpy as np
import pytest

import gpukit as gk
from bench_ref import e2e_engines
from gpukit import _C

from test_gemv_w8_cuda import check, f64, make
from test_llm_step import CFG128, PROMPTS, same
from test_llm_decode_s6 import run_p

CUDA = gk.cuda.is_available()
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
RNG = np.random.default_rng(911)
# hidden 1280 (q/k/v 1792 x 1280, o 1280 x 1280, gate/up 5120 x 1280, down 1280 x 2560)
CFG_XP = dict(CFG128, hidden_size=1280, num_attention_heads=10, num_key_value_heads=2, intermediate_size=2560)


def ref_prep(h):
    """NumPy: the scaled fp16 copy of bf16 rows h (float64 values) and 2^-c per row."""
    xh = np.zeros(h.shape, np.float16)
    xinv = np.ones(h.shape[0], np.float32)
    for r in range(h.shape[0]):
        mx = np.max(np.abs(h[r]))
        c = 0
        if mx != 0 and np.isfinite(mx):
            c = 14 - int(np.floor(np.log2(mx)))  # ilogb of a bf16 value: exact
            c = max(-126, min(126, c))
        xh[r] = (h[r] * 2.0**c).astype(np.float32).astype(np.float16)  # exact in fp32, rounded once
        xinv[r] = np.float32(2.0**-c)
    return xh, xinv


def norm_inputs(rows, H, seed=1, wide=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, H)).astype(np.float32)
    res = rng.standard_normal((rows, H)).astype(np.float32)
    w = (1.0 + 0.3 * rng.standard_normal(H)).astype(np.float32)
    if wide and rows >= 4:
        x[0] *= 1e-20
        res[0] *= 1e-20
        x[1] = 0.0
        res[1] = 0.0
        x[2] *= 1e20
        res[2] *= 1e20
        x[3, 5] = 3e4
    b = lambda a: gk.asarray(a).astype("bfloat16").to("cuda")
    return b(x), b(res), b(w)


# ---- CPU: the option and the entry points exist and change nothing ----

def test_option_exists_and_does_nothing_on_cpu():
    m = gk.llm.random_model(dict(CFG128, num_hidden_layers=1), device="cpu", dtype="float32", seed=3)
    assert m._m.quantized_x_prep is False, "quantized_x_prep must be off by default"
    base = run_p(m, False, PROMPTS, new=3)
    m._m.quantized_x_prep = True
    assert m._m.quantized_x_prep is True
    same(base, run_p(m, False, PROMPTS, new=3), "CPU: quantized_x_prep has no effect")


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_prepared_falls_back_on_cpu(fmt):
    w = gk.asarray((RNG.standard_normal((24, 128)) / 11).astype(np.float32))
    q, s = getattr(gk, f"quantize_{fmt}")(w)
    x = gk.asarray(RNG.standard_normal((3, 128)).astype(np.float32)).astype("bfloat16")
    calls = _C._gemv_quantized_prepared_calls()
    a = f64(_C._gemv_quantized_prepared(fmt, q, s, x, None, None, "float32"))
    b = f64(getattr(gk, f"gemv_{fmt}")(x, q, s, out_dtype="float32"))
    assert a.tobytes() == b.tobytes(), "the CPU fallback differs from gemv_quantized"
    assert _C._gemv_quantized_prepared_calls() == calls, "the CPU took the prepared path"
    with pytest.raises(ValueError):
        _C._gemv_quantized_prepared("int4", q, s, x, None, None)


def test_norm_prep_on_cpu_writes_no_copy():
    rng = np.random.default_rng(2)
    x, r = (gk.asarray(rng.standard_normal((2, 64)).astype(np.float32)).astype("bfloat16") for _ in range(2))
    w = gk.asarray(np.ones(64, np.float32)).astype("bfloat16")
    h, res, xh, xinv = _C.llm.fused_add_rms_norm_prep(x, r, w, 1e-6)
    h0, res0 = _C.llm.fused_add_rms_norm(x, r, w, 1e-6)
    assert xh is None and xinv is None
    assert f64(h).tobytes() == f64(h0).tobytes() and f64(res).tobytes() == f64(res0).tobytes()


def test_e2e_flag():
    e2e = e2e_engines()
    assert e2e.gk_engine("gk-graph+qxp")[1]["attrs"] == {"quantized_x_prep": True}
    assert e2e.gk_engine("gk-graph+noqxp")[1]["attrs"] == {"quantized_x_prep": False}
    assert "quantized_x_prep" not in e2e.gk_engine("gk-graph")[1]["attrs"]


# ---- GPU ----

@cuda_only
@pytest.mark.parametrize("rows,H", [(1, 4096), (3, 4096), (8, 1280), (2, 8192), (5, 512), (1, 64), (4, 4096)])
def test_norm_prep_values(rows, H):
    """h and the residual: add_rms_norm's bits; xh / xinv: the x kernel's rule from h."""
    x, r, w = norm_inputs(rows, H, seed=rows * 7 + H, wide=rows >= 4)
    h, res, xh, xinv = _C.llm.fused_add_rms_norm_prep(x, r, w, 1e-6)
    h0, res0 = _C.llm.fused_add_rms_norm(x, r, w, 1e-6)
    assert f64(h).tobytes() == f64(h0).tobytes(), "h differs from add_rms_norm"
    assert f64(res).tobytes() == f64(res0).tobytes(), "the residual differs from add_rms_norm"
    assert xh is not None and xinv is not None, "no scaled copy written"
    want_h, want_inv = ref_prep(f64(h))
    got_h = np.asarray(gk.to_numpy(xh))
    got_inv = np.asarray(gk.to_numpy(xinv))
    bad = np.argwhere(got_inv != want_inv)
    assert bad.size == 0, f"xinv row {bad[0].tolist()}: {got_inv[bad[0][0]]!r}, expected {want_inv[bad[0][0]]!r}"
    bad = np.argwhere(got_h.view(np.uint16) != want_h.view(np.uint16))
    assert bad.size == 0, (f"{len(bad)} of {got_h.size} xh values differ, first {bad[0].tolist()}: "
                           f"{got_h[tuple(bad[0])]!r}, expected {want_h[tuple(bad[0])]!r}")


@cuda_only
def test_norm_prep_not_where_it_cannot():
    for rows, H, dt in ((9, 4096, "bfloat16"), (1, 8200, "bfloat16"), (2, 4096, "float16"), (1, 4100, "bfloat16")):
        x, r, w = (a.astype(dt) for a in norm_inputs(rows, H))
        h, res, xh, xinv = _C.llm.fused_add_rms_norm_prep(x, r, w, 1e-6)
        h0, _ = _C.llm.fused_add_rms_norm(x, r, w, 1e-6)
        assert xh is None and xinv is None, f"({rows}, {H}, {dt}): a copy where the kernel cannot write one"
        assert f64(h).tobytes() == f64(h0).tobytes()


def prepared(fmt, n, k, seed):
    w = (np.random.default_rng(seed).standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    q, s = getattr(gk, f"quantize_{fmt}")(gk.asarray(w))
    qc, sc = q.to("cuda"), s.to("cuda")
    deq = f64(getattr(gk, f"dequantize_{fmt}")(q, s))
    base = lambda x, o: getattr(gk, f"gemv_{fmt}")(x, qc, sc, out_dtype=o)
    prep = lambda x, xh, xi, o: _C._gemv_quantized_prepared(fmt, qc, sc, x, xh, xi, o)
    return base, prep, deq


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (300, 14336), (2051, 1024), (37, 4096), (16, 64),
                                 (4099, 512)])
def test_prepared_gemv_same_bits(fmt, n, k):
    """The prepared x (from the norm kernel) against today's default on bf16 x: every M 1..8,
    float32 / bfloat16 outputs, odd N, split-K (K 14336), a wide-range batch."""
    base, prep, deq = prepared(fmt, n, k, n + k)
    x, r, w = norm_inputs(8, k, seed=k, wide=True)
    h, _, xh, xinv = _C.llm.fused_add_rms_norm_prep(x, r, w, 1e-6)
    if k > 8192:  # beyond the norm's register kernel: the same copy made by the NumPy rule
        assert xh is None
        a_, b_ = ref_prep(f64(h))
        xh, xinv = gk.asarray(a_).to("cuda"), gk.asarray(b_).to("cuda")
    assert xh is not None
    calls = _C._gemv_quantized_prepared_calls()
    for m in range(1, 9):
        for o in ("float32", "bfloat16"):
            a = f64(base(h[:m], o))
            b = f64(prep(h[:m], xh[:m], xinv[:m], o))
            bad = np.argwhere(a != b)
            assert bad.size == 0, (f"{fmt} ({n}, {k}) m={m} {o}: {len(bad)} of {a.size} differ, first "
                                   f"{bad[0].tolist()}: {b[tuple(bad[0])]!r} vs {a[tuple(bad[0])]!r}")
            if o == "float32":
                check(b, f64(h[:m]), deq, f"{fmt} ({n}, {k}) m={m} prepared")
    assert _C._gemv_quantized_prepared_calls() == calls + 16, "the prepared path did not run"
    again = f64(prep(h, xh, xinv, "float32"))
    assert again.tobytes() == f64(prep(h, xh, xinv, "float32")).tobytes(), "not the same bits on a second run"


@cuda_only
def test_prepared_falls_back_when_it_does_not_match():
    base, prep, _ = prepared("fp8", 512, 1024, 3)
    x, r, w = norm_inputs(3, 1024)
    h, _, xh, xinv = _C.llm.fused_add_rms_norm_prep(x, r, w, 1e-6)
    want = f64(base(h, "float32")).tobytes()
    calls = _C._gemv_quantized_prepared_calls()
    for a, b in ((xh[:2], xinv), (xh, xinv[:2]), (None, xinv), (xh, None), (xh.astype("float32"), xinv)):
        assert f64(prep(h, a, b, "float32")).tobytes() == want
    gk._C._gemv_set_dense_path(1)  # another kernel: gemv_quantized on bf16 x
    try:
        want1 = f64(base(h, "float32")).tobytes()
        assert f64(prep(h, xh, xinv, "float32")).tobytes() == want1
    finally:
        gk._C._gemv_set_dense_path(-1)
    assert _C._gemv_quantized_prepared_calls() == calls, "a mismatching copy took the prepared path"


@cuda_only
def test_prepared_chain_pdl_eager_and_graph():
    """norm (with the copy) -> prepared GEMV -> norm -> ..., PDL on (each kernel reads the previous
    one's output after its wait): the bits of the chain of add_rms_norm + gemv_fp8 / gemv_int8
    without PDL, eager and replayed from a graph, and a replay on new input values."""
    dims = [4096, 6144, 4096, 1280, 1024]
    rng = np.random.default_rng(17)
    layers = []
    for i in range(len(dims) - 1):
        fmt = "fp8" if i % 2 == 0 else "int8"
        base, prep, _ = prepared(fmt, dims[i + 1], dims[i], 100 + i)
        bf = lambda a: gk.asarray(a.astype(np.float32)).astype("bfloat16").to("cuda")
        res = bf(rng.standard_normal((3, dims[i])))
        w = bf(1.0 + 0.2 * rng.standard_normal(dims[i]))
        layers.append((base, prep, res, w))
    x0 = gk.asarray(rng.standard_normal((3, dims[0])).astype(np.float32)).astype("bfloat16").to("cuda")

    def chain(use_prep):
        y = x0
        for base, prep, res, w in layers:
            if use_prep:
                h, _, xh, xinv = _C.llm.fused_add_rms_norm_prep(y, res, w, 1e-6)
                y = prep(h, xh, xinv, "bfloat16")
            else:
                h, _ = _C.llm.fused_add_rms_norm(y, res, w, 1e-6)
                y = base(h, "bfloat16")
        return y

    _C.llm.set_pdl(False)
    _C._gemv_set_variant(2)
    try:
        ref = f64(chain(False))
    finally:
        _C._gemv_set_variant(0)
        _C.llm.set_pdl(None)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    _C.llm.set_pdl(True)
    try:
        calls = _C._gemv_quantized_prepared_calls()
        for _ in range(2):
            got = f64(chain(True))
            bad = np.argwhere(got != ref)
            assert bad.size == 0, f"eager chain differs at {len(bad)} places, first {bad[0].tolist()}"
        assert _C._gemv_quantized_prepared_calls() == calls + 2 * len(layers)
        g = gk.Graph()
        with g:
            outs = [chain(True), chain(True)]
        for _ in range(2):
            g.replay()
            gk.cuda.synchronize()
            for o in outs:
                bad = np.argwhere(f64(o) != ref)
                assert bad.size == 0, f"graph replay differs at {len(bad)} places, first {bad[0].tolist()}"
        new = gk.asarray(rng.standard_normal((3, dims[0])).astype(np.float32) * 5).astype("bfloat16").to("cuda")
        gk.copy_into(x0, new)
        g.replay()
        gk.cuda.synchronize()
        want = f64(chain(False))
        for o in outs:
            bad = np.argwhere(f64(o) != want)
            assert bad.size == 0, f"replay on new input differs at {len(bad)} places, first {bad[0].tolist()}"
        assert not np.array_equal(want, ref), "the new input gave the old result: the replay test cannot fail"
    finally:
        _C.llm.set_pdl(None)


@cuda_only
@pytest.mark.parametrize("quantize", ["fp8", "int8"])
@pytest.mark.parametrize("cfg", ["512", "1280"])
def test_engine_same_bits(quantize, cfg):
    """The engine with quantized_x_prep: the same tokens and logits as without, decode graph and
    eager, three sequences (M = 3) and one (M = 1); the prepared path must run."""
    c = CFG128 if cfg == "512" else CFG_XP
    m = gk.llm.random_model(c, device="cuda", dtype="bfloat16", seed=43, quantize=quantize)
    assert m._m.quantized_x_prep is False
    base = run_p(m, True, PROMPTS, new=20)
    eager = run_p(m, False, PROMPTS, new=20)
    one = run_p(m, True, PROMPTS[1:2], new=10)
    m._m.quantized_x_prep = True
    calls = _C._gemv_quantized_prepared_calls()
    same(base, run_p(m, True, PROMPTS, new=20), f"{quantize} {cfg}: quantized_x_prep, graph")
    assert _C._gemv_quantized_prepared_calls() > calls, "the engine never took the prepared path"
    calls = _C._gemv_quantized_prepared_calls()
    same(eager, run_p(m, False, PROMPTS, new=20), f"{quantize} {cfg}: quantized_x_prep, eager")
    # eager, 19 decode steps: per step the q/k/v of layers 1.., the gate/up of every layer, the lm head
    layers = c.get("num_hidden_layers", 2)
    assert _C._gemv_quantized_prepared_calls() - calls >= 19 * (2 * layers - 1), "too few prepared GEMVs"
    same(one, run_p(m, True, PROMPTS[1:2], new=10), f"{quantize} {cfg}: quantized_x_prep, one sequence")


@cuda_only
def test_engine_comparison_can_fail():
    a = run_p(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=43, quantize="fp8"), True,
              PROMPTS, new=3)
    b = run_p(gk.llm.random_model(CFG128, device="cuda", dtype="bfloat16", seed=44, quantize="fp8"), True,
              PROMPTS, new=3)
    with pytest.raises(AssertionError):
        same(a, b, "two seeds")
