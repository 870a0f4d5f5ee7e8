"""EngineOptions::quantized_x_prep (session 9 prep, branch fp8e11): the engine's residual add +
RMSNorm (llm.fused_add_rms_norm_prep, the row-in-registers kernel of src/cuda/llm_small.cu)
also writes the fp8 / int8 staged GEMV's scaled fp16 copy of its output (each row times 2^c,
its largest |value| in [2^14, 2^15); xinv = 2^-c: the values of gemv_w8.cu's x kernel), and
gemv_quantized_prepared reads it (fp16 products, cvt.rn.f16x2.e4m3x2) instead of decoding the
codes to exact bf16. The products are the bf16 ones times 2^c, so the bits must be today's
default (the bf16 decode): every test compares bit for bit with gk.gemv_fp8 / gemv_int8 on
bf16 x, and the engine's tokens and logits with the option off. CUDA parts skip without a GPU."""
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import gpukit as gk
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


def test_norm_prep_refuses_negative_eps():
    """The kernel's bound treats eps < 0 as open, but the front end refuses it first (no launch)."""
    x = gk.asarray(np.ones((1, 64), np.float32)).astype("bfloat16")
    with pytest.raises(ValueError, match="eps"):
        _C.llm.fused_add_rms_norm_prep(x, x, gk.asarray(np.ones(64, np.float32)).astype("bfloat16"), -1e-3)


def test_e2e_flag():
    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "e2e.py"
    sys.path.insert(0, str(path.parent))  # e2e.py imports bench/common.py
    try:
        spec = importlib.util.spec_from_file_location("gk_bench_e2e_qxp", path)
        e2e = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(e2e)
    finally:
        sys.path.remove(str(path.parent))
    assert e2e.gk_engine("gk-graph+qxp")[1]["attrs"] == {"quantized_x_prep": True}
    assert e2e.gk_engine("gk-graph+noqxp")[1]["attrs"] == {"quantized_x_prep": False}
    assert "quantized_x_prep" not in e2e.gk_engine("gk-graph")[1]["attrs"]


# ---- GPU ----

@cuda_only
@pytest.mark.parametrize("rows,H", [(1, 4096), (3, 4096), (8, 1280), (2, 8192), (5, 512), (1, 64), (4, 4096)])
def test_norm_prep_values(rows, H):
    """h and the residual: add_rms_norm's bits; xh / xinv: the x kernel's rule from h."""
    x, r, w = norm_inputs(rows, H, seed=rows * 7 + H, wide=rows >= 4)
    check_prep(x, r, w, 1e-6, f"({rows}, {H})")


def bits_eq(a, b):
    """Same float bits, any NaN equal to any NaN (NumPy and the GPU write different NaN codes)."""
    a, b = np.asarray(a), np.asarray(b)
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return (a.view(u) == b.view(u)) | (np.isnan(a) & np.isnan(b))


def check_prep(x, r, w, eps, what, outs=None):
    """h and the residual: add_rms_norm's bits; xh / xinv: the x kernel's rule from h (NumPy).
    outs: the (h, res, xh, xinv) to check (a graph's), else computed here. Returns h (float64)."""
    h, res, xh, xinv = outs if outs is not None else _C.llm.fused_add_rms_norm_prep(x, r, w, eps)
    h0, res0 = _C.llm.fused_add_rms_norm(x, r, w, eps)
    for got, want, name in ((h, h0, "h"), (res, res0, "the residual")):
        ok = bits_eq(gk.to_numpy(got.astype("float32")), gk.to_numpy(h0.astype("float32") if name == "h" else
                                                                       res0.astype("float32")))
        assert ok.all(), f"{what}: {name} differs from add_rms_norm at {np.argwhere(~ok)[0].tolist()}"
    assert xh is not None and xinv is not None, f"{what}: no scaled copy written"
    hf = f64(h)
    with np.errstate(invalid="ignore", over="ignore"):
        want_h, want_inv = ref_prep(hf)
    got_h = np.asarray(gk.to_numpy(xh))
    got_inv = np.asarray(gk.to_numpy(xinv))
    bad = np.argwhere(got_inv != want_inv)
    assert bad.size == 0, (f"{what}: xinv row {bad[0].tolist()}: {got_inv[bad[0][0]]!r}, expected "
                           f"{want_inv[bad[0][0]]!r} (max |h| of the row {np.nanmax(np.abs(hf[bad[0][0]]))!r})")
    bad = np.argwhere(~bits_eq(got_h, want_h))
    assert bad.size == 0, (f"{what}: {len(bad)} of {got_h.size} xh values differ, first {bad[0].tolist()}: "
                           f"{got_h[tuple(bad[0])]!r}, expected {want_h[tuple(bad[0])]!r}")
    return hf


@cuda_only
def test_norm_prep_not_where_it_cannot():
    for rows, H, dt in ((9, 4096, "bfloat16"), (1, 8200, "bfloat16"), (2, 4096, "float16"), (1, 4100, "bfloat16")):
        x, r, w = (a.astype(dt) for a in norm_inputs(rows, H))
        h, res, xh, xinv = _C.llm.fused_add_rms_norm_prep(x, r, w, 1e-6)
        h0, _ = _C.llm.fused_add_rms_norm(x, r, w, 1e-6)
        assert xh is None and xinv is None, f"({rows}, {H}, {dt}): a copy where the kernel cannot write one"
        assert f64(h).tobytes() == f64(h0).tobytes()


def bf16_round(v):
    """float64 -> the nearest bf16 value (ties to even), as float64."""
    u = np.asarray(v, np.float64).astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)


def bf16_floor(v):
    """The largest bf16 value <= v (v >= 0)."""
    u = np.asarray(v, np.float64).astype(np.float32)
    u = np.where(u.astype(np.float64) > v, np.nextafter(u, np.float32(0)), u)
    return (u.view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)


def boundary_rows(H, offsets, sign=1.0):
    """Rows r = [M, d1, ..., d11, 0, ...] (residual 0, so h = r * inv * w) whose largest |h| before
    the bf16 rounding is T (1 + o) for each o in offsets, T = 2^e (2 - 2^-8) the value that rounds
    up to 2^(e+1): the norm's bound cannot tell c there, so these rows take its second reduction.
    With eps = 0 and weights 1 (or w[0] a power of 2 >= 1: the boundary moves to T w[0] and h[0]
    stays the largest), |d_i| < 1: the d_i make sum(r^2) hit the target to ~2^-40 (float64); the
    GPU's fp32 sum and rsqrtf land within ~2^-21 of T (1 + o)."""
    e = int(np.floor(np.log2(np.sqrt(H)))) - 1  # T < sqrt(H): reachable with |d_i| < M
    T = 2.0**e * (2 - 2.0**-8)
    rows = []
    for o in offsets:
        y = T * (1 + o)  # wanted M * inv, M = 1: (1 + D) / H = 1 / y^2
        D = H / y**2 - 1.0
        assert 0 < D < 5, (H, o, D)
        r = np.zeros(H)
        r[0] = sign
        rem = D
        for i in range(1, 12):  # |d_i| <= 1 - 2^-8 < M
            d = min(float(bf16_floor(np.sqrt(rem))), 1 - 2.0**-8)
            r[i] = d * (1 if i % 2 else -1)
            rem -= d * d
        rows.append(r)
    return np.array(rows), e


def to_dev(a):
    return gk.asarray(np.asarray(a, np.float32)).astype("bfloat16").to("cuda")


@cuda_only
@pytest.mark.parametrize("H", [4096, 64, 1280, 8192])
def test_norm_prep_power_of_two_boundary(H):
    """Rows whose max |h| sits on the bf16 rounding boundary below a power of 2 (so c depends on
    the last rounding: the kernel's fallback reduction), both sides of it, both signs, another
    exponent through the weight: the bits of the rule, and the boundary really straddled."""
    # |o| <= 21 * 2^-23: inside the bound's window (32 * 2^-23: the fallback reduction); 40, 64 *
    # 2^-23: outside it but still near the boundary (the bound's own c, which must then be right)
    offs = [k * 2.0**-23 for k in list(range(-21, 22, 3)) + [-64, -40, 40, 64]]
    seen = set()
    for sign, w0 in ((1.0, 1.0), (-1.0, 1.0), (1.0, 8.0)):
        rows, e = boundary_rows(H, offs, sign)
        w = np.ones(H)
        w[0] = w0
        for b in range(0, len(rows), 8):
            x = to_dev(rows[b:b + 8])
            zero = to_dev(np.zeros_like(rows[b:b + 8]))
            hf = check_prep(x, zero, to_dev(w), 0.0, f"H {H} sign {sign} w0 {w0} rows {b}..")
            for m in np.max(np.abs(hf), axis=1):
                seen.add(m / 2.0**e / w0)
    # the rows' maxima must fall on both sides: 2 - 2^-7 (rounded down) and 2 (rounded up)
    assert any(abs(v - (2 - 2.0**-7)) < 1e-12 for v in seen) and any(abs(v - 2.0) < 1e-12 for v in seen), (
        f"H {H}: the boundary was not straddled (max |h| / 2^e seen: {sorted(seen)})")


@cuda_only
def test_norm_prep_special_rows():
    """Zero, inf, NaN rows; a NaN weight, weights above the bound's 2^20 (and exactly 2^20), a huge
    weight, eps 0 with a zero row (rsqrt(0) = inf), tiny and huge rows, a subnormal largest |r w|
    with a large inv: every row by the rule.
    (A negative eps is refused by the front end before any launch.)"""
    H = 4096
    rng = np.random.default_rng(5)
    base = lambda: rng.standard_normal(H)
    w1 = 1.0 + 0.3 * rng.standard_normal(H)
    rows = [np.zeros(H), base(), base(), base(), base() * 1e-30, base() * 1e30, base(), base() * 2.0**-70]
    rows[1][7] = np.inf
    rows[2][9] = np.nan
    rows[3][11] = -np.inf
    rows[6][100] = 3e38
    zero = np.zeros((len(rows), H))
    for w, eps, what in ((w1, 1e-6, "plain weights"), (w1, 0.0, "eps 0"),
                         (np.where(np.arange(H) == 17, np.nan, w1), 1e-6, "a NaN weight"),
                         (np.where(np.arange(H) == 17, 2.0**21, w1), 1e-6, "a weight 2^21"),
                         (np.where(np.arange(H) == 17, 2.0**20, w1), 1e-6, "a weight 2^20"),
                         (np.where(np.arange(H) == 17, -3e30, w1), 1e-6, "a weight -3e30"),
                         # row 7: max |r w| ~2^-130 (subnormal: not exact, the bound must not use
                         # it) while max |r w| * inv ~2^-80 (inv ~2^50 from eps 1e-30)
                         (w1 * 2.0**-60, 1e-30, "weights 2^-60, eps 1e-30")):
        check_prep(to_dev(rows), to_dev(zero), to_dev(w), eps, what)
        # the same rows as x + residual halves (the rounded sum is what the norm sees)
        check_prep(to_dev(np.array(rows) / 2), to_dev(np.array(rows) / 2), to_dev(w), eps, what + ", halves")


@cuda_only
def test_norm_prep_graph_replay_switches_paths():
    """One graph of norm-with-copy launches replayed on inputs that take the bound's fast path,
    the boundary fallback and the special rows in turn (decided in the kernel per row): each
    replay equals the eager kernel's bits and the rule."""
    H = 4096
    rows_b, _ = boundary_rows(H, [k * 2.0**-23 for k in range(-3, 5)])
    rng = np.random.default_rng(8)
    inputs = [rng.standard_normal((8, H)), rows_b, np.vstack([np.zeros(H), rows_b[:3], rng.standard_normal((4, H))])]
    inputs[2][5, 3] = np.nan
    w = to_dev(1.0 + 0.2 * rng.standard_normal(H))
    x = to_dev(inputs[0])
    res = to_dev(np.zeros((8, H)))
    _C.llm.set_pdl(True)
    try:
        g = gk.Graph()
        with g:
            outs = _C.llm.fused_add_rms_norm_prep(x, res, w, 0.0)
        for rep in range(2):
            for i, v in enumerate(inputs):
                gk.copy_into(x, to_dev(v))
                g.replay()
                gk.cuda.synchronize()
                check_prep(x, res, w, 0.0, f"graph replay {rep} input {i}", outs=outs)
    finally:
        _C.llm.set_pdl(None)


@cuda_only
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_prepared_gemv_same_bits_boundary_rows(fmt):
    """The GEMV on the copy of boundary rows (fallback) and random rows (fast path) in one batch:
    today's bf16-x bits for M 1..8."""
    H, n = 4096, 1536
    base, prep, _ = prepared(fmt, n, H, 77)
    rows_b, _ = boundary_rows(H, [k * 2.0**-23 for k in (-6, -1, 0, 1, 6)])
    rng = np.random.default_rng(9)
    rows = np.vstack([rows_b[:4], rng.standard_normal((4, H))])
    h, _, xh, xinv = _C.llm.fused_add_rms_norm_prep(to_dev(rows), to_dev(np.zeros_like(rows)),
                                                     to_dev(1.0 + 0.2 * rng.standard_normal(H)), 0.0)
    assert xh is not None
    for m in range(1, 9):
        for o in ("float32", "bfloat16"):
            a = f64(base(h[:m], o))
            b = f64(prep(h[:m], xh[:m], xinv[:m], o))
            bad = np.argwhere(a != b)
            assert bad.size == 0, (f"{fmt} m={m} {o}: {len(bad)} of {a.size} differ, first {bad[0].tolist()}: "
                                   f"{b[tuple(bad[0])]!r} vs {a[tuple(bad[0])]!r}")


def test_boundary_rows_model():
    """CPU: the test rows put |r[0]| * inv within 2^-30 of T (1 + o) in float64 (what the GPU tests rely on)."""
    for H in (64, 1280, 4096, 8192):
        offs = [k * 2.0**-23 for k in (-21, -1, 0, 1, 21)]
        for sign in (1.0, -1.0):
            rows, e = boundary_rows(H, offs, sign)
            T = 2.0**e * (2 - 2.0**-8)
            assert np.all(rows == bf16_round(rows)), "the rows are not bf16 values"
            for r, o in zip(rows, offs):
                assert np.argmax(np.abs(r)) == 0 and np.sum(np.abs(r) == 1.0) == 1 and r[0] == sign
                y = 1.0 / np.sqrt(np.sum(r * r) / H)
                assert abs(y / (T * (1 + o)) - 1) < 2.0**-30, (H, sign, o, y, T)


def bound_is_open(p):
    """The kernel's decision (xprep_exponent_bound) for p = max|r w| * inv in fp32: the bf16
    exponent fields of p (1 -+ 2^-18) differ, so the second reduction runs."""
    f = lambda v: int((np.float32(v).view(np.uint32).astype(np.uint64) + 0x7FFF +
                       ((np.float32(v).view(np.uint32).astype(np.uint64) >> 16) & 1)) >> 23)
    p = np.float32(p)
    return f(p * np.float32(1 - 2.0**-18)) != f(p * np.float32(1 + 2.0**-18))


def test_boundary_rows_take_both_paths():
    """CPU model of the GPU test's rows: |o| <= 21 * 2^-23 open the bound (the fallback runs), 40
    and 64 * 2^-23 do not (the bound's c near the boundary), with 2^-21 to spare for the GPU's
    rsqrtf (2 ulp) and fp32 sum."""
    for H in (64, 1280, 4096, 8192):
        offs = [k * 2.0**-23 for k in (-21, -3, 0, 3, 21, -64, -40, 40, 64)]
        rows, _ = boundary_rows(H, offs)
        for w0 in (1.0, 8.0):
            for r, o in zip(rows, offs):
                inv = 1.0 / np.sqrt(np.sum(r * r) / H)
                for rel in (1 - 2.0**-21, 1.0, 1 + 2.0**-21):  # the GPU's inv, generously
                    p = np.float32(w0) * np.float32(inv * rel)
                    assert bound_is_open(p) == (abs(o) <= 21 * 2.0**-23), (H, w0, o, rel)


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
