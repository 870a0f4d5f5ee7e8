"""The staged GGUF GEMV kernel (src/cuda/quant_gguf_st.cu: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K read
from the file's blocks, 16 rows x whole units of blocks per stage) against float64 products
with the exact dequantization: M = 1..8, bf16 and fp16 x, ragged N, K with partial last
stages and ragged per-warp runs, split-K (small N), Q6_K's phased 420-byte units (K % 2048),
strided block rows (16-byte multiples: the staged kernel; other strides: the fallbacks), the
ring-depth variants and the D,WT knob (GPUKIT_GEMV_GGUF). Same bits every run and for a row
alone or in a batch. Skipped without a GPU."""
import math
import os

import numpy as np
import pytest

import gpukit as gk

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def staged_gguf(monkeypatch):
    """These tests hold the staged kernel, exact in x: GPUKIT_GGUF_IMMA=0 (the integer kernel of that switch, session
    17, x as fixed point, has its own tests: test_gguf_imma_cuda.py). Modules that import this fixture take it too."""
    monkeypatch.setenv("GPUKIT_GGUF_IMMA", "0")


RNG = np.random.default_rng(77)
FMTS = ["q4_0", "q4_1", "q8_0", "q4_k", "q6_k"]
BLOCK = {"q4_0": (32, 18), "q4_1": (32, 20), "q8_0": (32, 34), "q4_k": (256, 144), "q6_k": (256, 210)}


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def make(fmt, n, k, scale_rows=True):
    w = RNG.standard_normal((n, k)) / math.sqrt(k)
    if scale_rows:  # rows of very different magnitudes (block scales from 1e-3 to 10)
        w *= np.exp(RNG.uniform(-7, 2.3, (n, 1)))
    q = getattr(gk, f"quantize_{fmt}")(gk.asarray(w.astype(np.float32)))
    return q, f64(getattr(gk, f"dequantize_{fmt}")(q)), gk.to_numpy(q)


def bound_of(fmt, qb, xs, deq):
    """The magnitude the kernel's sums round: sum |x||w| per product, and for Q4_1 / Q4_K the
    split d * sum(q x) + m * sum(x) per (sub-)block, with the session-6 fold (the default with bf16
    x: codes as 128 + q, the 128 sum(x) taken out with the min term) 143 d resp. 271 d sc."""
    m = xs.shape[0]
    if fmt == "q4_1":
        b = qb.reshape(qb.shape[0], -1, 20)
        d = np.abs(b[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0])
        mn = np.abs(b[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0])
        ax = np.abs(xs).reshape(m, -1, 32).sum(-1)
        return ax @ (143 * d + mn).T + np.abs(xs) @ np.abs(deq).T
    if fmt == "q4_k":
        b = qb.reshape(qb.shape[0], -1, 144)
        d = np.abs(b[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0])
        dmin = np.abs(b[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0])
        s12 = b[..., 4:16].astype(np.int64)
        sc = np.concatenate([s12[..., 0:4] & 63, (s12[..., 8:12] & 15) | ((s12[..., 0:4] >> 2) & 48)], -1)
        mn = np.concatenate([s12[..., 4:8] & 63, (s12[..., 8:12] >> 4) | ((s12[..., 4:8] >> 2) & 48)], -1)
        ax = np.abs(xs).reshape(m, -1, 8, 32).sum(-1)
        return np.einsum("mbs,nbs->mn", ax, dmin[..., None] * mn + 271 * d[..., None] * sc)
    return np.abs(xs) @ np.abs(deq).T


def check(fmt, got, xs, deq, qb, what, xmax_rel=0.0):
    """xmax_rel: x is used in a copy that may round each value by up to xmax_rel times its row's
    largest |x| (variant 12's fp16 copy of bf16 x: 2^-39, values far below the row maximum)."""
    ref = xs @ deq.T
    k = xs.shape[1]
    tol = 2 * (k + 2) * 2.0**-24 * bound_of(fmt, qb, xs, deq) + 1e-30
    if xmax_rel:
        tol = tol + xmax_rel * np.abs(xs).max(axis=1, keepdims=True) * np.abs(deq).sum(axis=1)[None, :]
    g = f64(got)
    assert g.shape == ref.shape, f"{what}: shape {g.shape} != {ref.shape}"
    err = np.abs(g - ref)
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        bad = np.argwhere(~(err <= tol))
        raise AssertionError(f"{what}: {len(bad)} of {err.size} out of tolerance; worst y{list(i)} = {g[i]!r}, "
                             f"ref {ref[i]!r}, tol {tol[i]:.3g}; first bad {bad[0].tolist()}")


def xrows(m, k, dtype):
    xb = gk.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    return xb, f64(xb.astype("float32"))


def with_variant(v, fn):
    gk._C._gemv_set_variant(v)
    try:
        return fn()
    finally:
        gk._C._gemv_set_variant(0)


SHAPES = [(37, 4096), (300, 14336), (2051, 1024), (133, 1280), (16, 2304), (1, 256), (70, 6144), (24, 2048)]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_staged_matches_exact(fmt, n, k):
    """M = 8 and bf16 x; then each row alone (same bits) and a second run (same bits)."""
    if k % BLOCK[fmt][0]:
        pytest.skip("K is not a multiple of the block")
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    xb, xs = xrows(8, k, "bfloat16")
    x = xb.to("cuda")
    got = fn(x, qc, out_dtype="float32")
    check(fmt, got, xs, deq, qb, f"{fmt} n={n} k={k} M=8")
    assert gk.to_numpy(fn(x, qc, out_dtype="float32")).tobytes() == gk.to_numpy(got).tobytes(), "second run"
    allr = gk.to_numpy(got)
    for i in (0, 3, 7):
        one = gk.to_numpy(fn(x[i], qc, out_dtype="float32"))
        assert one.tobytes() == allr[i].tobytes(), f"row {i} alone differs from the batch"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_staged_every_m(fmt, m, dtype):
    n, k = 211, 4096
    q, deq, qb = make(fmt, n, k)
    xb, xs = xrows(m, k, dtype)
    got = getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), q.to("cuda"), out_dtype="float32")
    check(fmt, got, xs, deq, qb, f"{fmt} M={m} {dtype}")
    y16 = getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), q.to("cuda"))
    assert y16.dtype == getattr(gk, dtype)
    np.testing.assert_allclose(f64(y16), f64(got), rtol=2.0**-7, atol=1e-6)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("variant", [2, 3, 4, 5])
def test_staged_variants(fmt, variant):
    """2: without PDL (the same bits as the default); 3: the session-4 kernels; 4 / 5: 2- / 4-stage rings."""
    n, k = 300, 14336
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    xb, xs = xrows(5, k, "bfloat16")
    x = xb.to("cuda")
    got = with_variant(variant, lambda: fn(x, qc, out_dtype="float32"))
    check(fmt, got, xs, deq, qb, f"{fmt} variant {variant}")
    if variant == 2:
        assert gk.to_numpy(fn(x, qc, out_dtype="float32")).tobytes() == gk.to_numpy(got).tobytes()


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("knob", ["2,8", "3,4", "4,16", "3,32", "3,12,0", "2,16,0", "3,12,1,4", "2,1,0,8", "3,12,1,1,0",
                                  "2,8,0,1", "2,20,1,1,0,2", "2,24,1,2,0,2", "2,12,1,1,0,2,1", "2,20,1,1,0,2,1"])
def test_staged_knob(fmt, knob):
    """GPUKIT_GEMV_GGUF=D,WT[,UX[,WMIN[,PF[,MINB[,R]]]]] changes the ring depth, the warps per CTA /
    split, the units per stage (0: half) and the rolled loop: still exact (PF and MINB only 0 / 2
    since session 6)."""
    n, k = 64, 6144
    q, deq, qb = make(fmt, n, k)
    xb, xs = xrows(3, k, "float16")
    os.environ["GPUKIT_GEMV_GGUF"] = knob
    try:
        got = getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), q.to("cuda"), out_dtype="float32")
    finally:
        del os.environ["GPUKIT_GEMV_GGUF"]
    check(fmt, got, xs, deq, qb, f"{fmt} knob {knob}")


@pytest.mark.parametrize("knob", ["4,8,2", "2,12,1,1,0,2,2", "3,12,1,1,0,2,1", "2,12,2,1,0,2,1", "2,12,2", "2,12,1,1,4",
                                  "2,12,1,1,0,3", "2,20,1,1,0,3,1"])
def test_staged_knob_rejects_garbage(knob):
    q, _, _ = make("q4_0", 16, 256)
    os.environ["GPUKIT_GEMV_GGUF"] = knob
    try:
        with pytest.raises(ValueError, match="GPUKIT_GEMV_GGUF"):
            gk.gemv_q4_0(gk.zeros((1, 256), dtype="bfloat16", device="cuda"), q.to("cuda"))
    finally:
        del os.environ["GPUKIT_GEMV_GGUF"]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("pad", [16, 48, 2, 6])
def test_strided_rows(fmt, pad):
    """Block rows inside wider rows: pad 16 / 48 keeps them 16-byte aligned (the staged kernel,
    using only its own bytes); pad 2 / 6 leaves them 2-byte aligned (the fallback kernels)."""
    n, k = 45, 2048
    q, deq, qb = make(fmt, n, k)
    rb = q.shape[1]
    wide = np.full((n, rb + pad), 0xFF, np.uint8)  # poison around the rows: NaN-ish scales if read
    wide[:, :rb] = qb
    qw = gk.asarray(wide).to("cuda")[:, :rb]
    xb, xs = xrows(4, k, "bfloat16")
    fn = getattr(gk, f"gemv_{fmt}")
    if pad % 4 and fmt == "q4_k":  # Q4_K's fallback needs 16-byte aligned rows
        with pytest.raises(ValueError, match="aligned"):
            fn(xb.to("cuda"), qw, out_dtype="float32")
        return
    got = fn(xb.to("cuda"), qw, out_dtype="float32")
    check(fmt, got, xs, deq, qb, f"{fmt} rows {rb + pad} bytes apart")


@pytest.mark.parametrize("fmt", FMTS)
def test_split_k_small_n(fmt):
    """N = 16 (one CTA): split-K slices added in order by the second pass; M independent."""
    n, k = 16, 14336
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    xb, xs = xrows(6, k, "bfloat16")
    x = xb.to("cuda")
    got = fn(x, qc, out_dtype="float32")
    check(fmt, got, xs, deq, qb, f"{fmt} split-K")
    one = gk.to_numpy(fn(x[5:6], qc, out_dtype="float32"))
    assert one.tobytes() == gk.to_numpy(got)[5:6].tobytes()


def test_extreme_values():
    """Blocks with the largest fp16 scales and zero rows: no overflow in the decode paths."""
    n, k = 32, 2048
    w = np.zeros((n, k), np.float32)
    w[1] = 60000.0 * np.sign(RNG.standard_normal(k))
    w[2, ::7] = -1e-6
    w[3] = RNG.standard_normal(k).astype(np.float32) * 100
    for fmt in FMTS:
        q = getattr(gk, f"quantize_{fmt}")(gk.asarray(w))
        deq = f64(getattr(gk, f"dequantize_{fmt}")(q))
        xb, xs = xrows(2, k, "bfloat16")
        xs = xs * 1e-3
        xb = gk.asarray(xs.astype(np.float32)).astype("bfloat16")
        xs = f64(xb.astype("float32"))
        got = getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), q.to("cuda"), out_dtype="float32")
        check(fmt, got, xs, deq, gk.to_numpy(q), f"{fmt} extreme")


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(300, 4096), (16, 14336), (37, 2304)])
def test_q8_0_fp16_copy_of_x(m, n, k):
    """Variant 12: Q8_0 with bf16 x through an fp16 copy of x scaled by 2^c per row (x kernel);
    a row with a huge outlier: bf16 values down to 2^-31 of the row's maximum are exact in the
    copy, smaller ones round to fp16 subnormals (an error of at most 2^-39 of the maximum each;
    H200 checkpoint A: with the outlier 3e30 the other values of row 0 are lost, as bounded).
    Same bits every run and for a row alone."""
    q, deq, qb = make("q8_0", n, k)
    xb, xs = xrows(m, k, "bfloat16")
    xs[0, 5] = 3.0e30
    xs[m - 1, 7] = -1e-30
    xb = gk.asarray(xs.astype(np.float32)).astype("bfloat16")
    xs = f64(xb.astype("float32"))
    x, qc = xb.to("cuda"), q.to("cuda")
    got = with_variant(12, lambda: gk.gemv_q8_0(x, qc, out_dtype="float32"))
    check("q8_0", got, xs, deq, qb, f"q8_0 variant 12 n={n} k={k} M={m}", xmax_rel=2.0**-38)
    again = with_variant(12, lambda: gk.gemv_q8_0(x, qc, out_dtype="float32"))
    assert gk.to_numpy(again).tobytes() == gk.to_numpy(got).tobytes()
    one = with_variant(12, lambda: gk.gemv_q8_0(x[m - 1], qc, out_dtype="float32"))
    assert gk.to_numpy(one).tobytes() == gk.to_numpy(got)[m - 1].tobytes()


def raw_q8_0(n, k):
    """Q8_0 blocks with every byte value among the codes (-128 included, which quantize never
    writes but a file may hold) and random fp16 scales."""
    nb = k // 32
    b = RNG.integers(0, 256, size=(n, nb, 34), dtype=np.uint8)
    d = (RNG.uniform(1e-3, 1.0, size=(n, nb)) * RNG.choice([-1, 1], size=(n, nb))).astype(np.float16)
    b[..., 0:2] = d.view(np.uint8).reshape(n, nb, 2)
    q = gk.asarray(b.reshape(n, nb * 34))
    return q, f64(gk.dequantize_q8_0(q)), b.reshape(n, nb * 34)


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(300, 4096), (16, 14336), (37, 2304)])
def test_q8_0_bf16_byte_decode(m, n, k):
    """Variant 13: Q8_0 codes with bf16 x as (128 + low7) - (128 + 128 s) in bf16 (no fp32): the
    same exact operands as the default decode, so the same bits; every code value -128..127."""
    q, deq, qb = raw_q8_0(n, k)
    xb, xs = xrows(m, k, "bfloat16")
    x, qc = xb.to("cuda"), q.to("cuda")
    got = with_variant(13, lambda: gk.gemv_q8_0(x, qc, out_dtype="float32"))
    check("q8_0", got, xs, deq, qb, f"q8_0 variant 13 n={n} k={k} M={m}")
    ref = with_variant(29, lambda: gk.gemv_q8_0(x, qc, out_dtype="float32"))  # the session-5 default
    assert gk.to_numpy(got).tobytes() == gk.to_numpy(ref).tobytes(), "variant 13 and the default differ"
    one = with_variant(13, lambda: gk.gemv_q8_0(x[m - 1], qc, out_dtype="float32"))
    assert gk.to_numpy(one).tobytes() == gk.to_numpy(got)[m - 1].tobytes()


ROLL_SHAPES = [(300, 14336), (37, 4096), (133, 1280), (16, 2304), (70, 6144), (1, 256)]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", ROLL_SHAPES)
def test_rolled_loop_same_bits(fmt, n, k):
    """Variant 21 (the stage and unit loops not unrolled: ring slot and unit offset at run time):
    exact, and the same bits as the default (same operations in the same order); ragged per-warp
    runs, partial last stages, split-K, Q6_K's phased units."""
    if k % BLOCK[fmt][0] or (fmt == "q6_k" and k % 2048):
        pytest.skip("not a shape of the staged kernel")
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    for m, dtype in ((1, "bfloat16"), (6, "float16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = with_variant(21, lambda: fn(x, qc, out_dtype="float32"))
        check(fmt, got, xs, deq, qb, f"{fmt} variant 21 n={n} k={k} M={m} {dtype}")
        ref = with_variant(29, lambda: fn(x, qc, out_dtype="float32"))  # the session-5 default
        g, r = gk.to_numpy(got), gk.to_numpy(ref)
        if g.tobytes() != r.tobytes():
            i = np.argwhere(g.view(np.uint32) != r.view(np.uint32))
            raise AssertionError(f"{fmt} n={n} k={k} M={m}: variant 21 and the default differ at {len(i)} "
                                 f"outputs, first {i[0].tolist()}: {g[tuple(i[0])]!r} != {r[tuple(i[0])]!r}")


@pytest.mark.parametrize("knob", ["2,12,1,1,0,2,1", "2,20,1,1,0,2,1"])
def test_q8_0_byte_decode_rolled(knob):
    """Variant 13 (Q8_0, bf16 x decoded by byte operations) with the knob's R 1 (rolled): the same
    bits as the default."""
    q, deq, qb = raw_q8_0(300, 4096)
    xb, xs = xrows(3, 4096, "bfloat16")
    x, qc = xb.to("cuda"), q.to("cuda")
    os.environ["GPUKIT_GEMV_GGUF"] = knob
    try:
        got = with_variant(13, lambda: gk.gemv_q8_0(x, qc, out_dtype="float32"))
    finally:
        del os.environ["GPUKIT_GEMV_GGUF"]
    check("q8_0", got, xs, deq, qb, f"q8_0 variant 13 knob {knob}")
    ref = with_variant(29, lambda: gk.gemv_q8_0(x, qc, out_dtype="float32"))  # the session-5 default
    assert gk.to_numpy(got).tobytes() == gk.to_numpy(ref).tobytes(), f"variant 13 with knob {knob} differs from the default"


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
@pytest.mark.parametrize("n,k", [(300, 14336), (37, 4096), (133, 2048), (16, 2304), (70, 6144)])
@pytest.mark.parametrize("knob", [None, "2,20,1,1,0,2"])
def test_quad_scales_same_bits(fmt, n, k, knob):
    """Variant 22 (Q4_K / Q6_K block scales formed once per quad and shared through a per-warp
    scratch in shared memory; also with 20 target warps per SM): exact, and the same bits as the
    default (the same scale values, the same operations in the same order)."""
    if k % BLOCK[fmt][0] or (fmt == "q6_k" and k % 2048):
        pytest.skip("not a shape of the staged kernel")
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    for m, dtype in ((1, "bfloat16"), (7, "float16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        if knob:
            os.environ["GPUKIT_GEMV_GGUF"] = knob
        try:
            got = with_variant(22, lambda: fn(x, qc, out_dtype="float32"))
        finally:
            os.environ.pop("GPUKIT_GEMV_GGUF", None)
        check(fmt, got, xs, deq, qb, f"{fmt} variant 22 knob {knob} n={n} k={k} M={m} {dtype}")
        if knob:  # the same plan (warps per CTA, split): the knob's fields for the reference too
            os.environ["GPUKIT_GEMV_GGUF"] = knob
        try:
            ref = with_variant(29, lambda: fn(x, qc, out_dtype="float32"))  # the session-5 default
        finally:
            os.environ.pop("GPUKIT_GEMV_GGUF", None)
        g, r = gk.to_numpy(got), gk.to_numpy(ref)
        if g.tobytes() != r.tobytes():
            i = np.argwhere(g.view(np.uint32) != r.view(np.uint32))
            raise AssertionError(f"{fmt} n={n} k={k} M={m}: variant 22 and the default differ at {len(i)} "
                                 f"outputs, first {i[0].tolist()}: {g[tuple(i[0])]!r} != {r[tuple(i[0])]!r}")
