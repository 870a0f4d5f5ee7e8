"""Every GEMV kernel variant (gk._C._gemv_set_variant: 0 the default cp.async ring depth,
with programmatic dependent launch; 1 a 2-stage ring; for int4 and Q8_0 / Q4_0 / Q4_1 /
Q4_K / Q6_K variant 1 is the older kernel instead of the staged tensor-core one; 2 the
default kernels without programmatic dependent launch) and both paths of bf16/fp8/int8
(default / *_cc: the CUDA-core kernel, *_tc: the tensor-core kernel, *_st: the staged
tensor-core kernel of gemv_w8.cu) against float64 products with the exactly dequantized weights, at shapes with ragged per-warp work (odd N,
K with a partial last step, split-K): the variant switch is a benchmarking knob and
must never change correctness. Also: same bits every run, a row alone = the row in a
batch. Skipped without a GPU."""
import math

import numpy as np
import pytest

import gpukit as gk
from w4_ref import default_tol

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def staged_gguf(monkeypatch):
    """The GGUF formats here: the staged kernel, exact in x (GPUKIT_GGUF_IMMA=0: the integer kernel of that switch,
    session 17, has its own tests: test_gguf_imma_cuda.py)."""
    monkeypatch.setenv("GPUKIT_GGUF_IMMA", "0")


RNG = np.random.default_rng(2026)
FMTS = ["bf16", "bf16_cc", "bf16_tc", "bf16_st", "fp8", "int8", "fp8_cc", "int8_cc", "fp8_tc", "int8_tc", "fp8_st",
        "int8_st", "int4_32", "int4_64", "int4_128", "nvf4",
        "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"]


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def make(fmt, n, k):
    """(callable(x) -> y float32 on the GPU, float64 exact weights, GGUF bytes or None)."""
    if fmt in ("fp8_cc", "int8_cc", "fp8_tc", "int8_tc", "fp8_st", "int8_st"):
        fmt = fmt[:-3]
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    wt = gk.asarray(w)
    if fmt.startswith("bf16"):
        wb = wt.astype("bfloat16")
        wc = wb.to("cuda")
        return (lambda x: gk.gemv(x, wc, out_dtype="float32")), f64(wb.astype("float32")), None
    if fmt in ("fp8", "int8"):
        q, s = getattr(gk, f"quantize_{fmt}")(wt)
        qc, sc = q.to("cuda"), s.to("cuda")
        fn = getattr(gk, f"gemv_{fmt}")
        return (lambda x: fn(x, qc, sc, out_dtype="float32")), f64(getattr(gk, f"dequantize_{fmt}")(q, s)), None
    if fmt.startswith("int4"):
        g = int(fmt.split("_")[1])
        q, s, z = gk.quantize_int4(wt, group=g)
        qc, sc, zc = q.to("cuda"), s.to("cuda"), z.to("cuda")
        deq = f64(gk.dequantize_int4(q, s, z, group=g))
        return (lambda x: gk.gemv_int4(x, qc, sc, zc, group=g, out_dtype="float32")), deq, None
    if fmt == "nvf4":
        q, bs, ts = gk.quantize_nvf4(wt)
        qc, bc, tc = q.to("cuda"), bs.to("cuda"), ts.to("cuda")
        return (lambda x: gk.gemv_nvf4(x, qc, bc, tc, out_dtype="float32")), f64(gk.dequantize_nvf4(q, bs, ts)), None
    q = getattr(gk, f"quantize_{fmt}")(wt)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    return (lambda x: fn(x, qc, out_dtype="float32")), f64(getattr(gk, f"dequantize_{fmt}")(q)), gk.to_numpy(q)


def split_bound(fmt, qb, xs):
    """sum over (sub-)blocks of |d sc| 15 sum|x| + |m| sum|x| (codes <= 15); the GGUF default's
    session-6 fold (codes as 128 + q, the 128 sum(x) taken out with the min term, bf16 x) makes it
    143 |d| (Q4_1) / 271 |d sc| (Q4_K)."""
    m = xs.shape[0]
    if fmt == "q4_1":
        b = qb.reshape(qb.shape[0], -1, 20)
        d = np.abs(b[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0])
        mn = np.abs(b[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0])
        ax = np.abs(xs).reshape(m, -1, 32).sum(-1)  # [m, blocks]
        return ax @ (143 * d + mn).T
    b = qb.reshape(qb.shape[0], -1, 144)
    d = np.abs(b[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0])
    dmin = np.abs(b[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0])
    s12 = b[..., 4:16].astype(np.int64)
    sc = np.concatenate([s12[..., 0:4] & 63, (s12[..., 8:12] & 15) | ((s12[..., 0:4] >> 2) & 48)], -1)
    mn = np.concatenate([s12[..., 4:8] & 63, (s12[..., 8:12] >> 4) | ((s12[..., 4:8] >> 2) & 48)], -1)
    ax = np.abs(xs).reshape(m, -1, 8, 32).sum(-1)  # [m, blocks, 8]
    return np.einsum("mbs,nbs->mn", ax, dmin[..., None] * mn + 271 * d[..., None] * sc)


def run(fmt, fn, x, variant):
    gk._C._gemv_set_variant(variant)
    gk._C._gemv_set_dense_path({"_tc": 1, "_cc": 0, "_st": 2}.get(fmt[-3:], -1))
    try:
        return fn(x)
    finally:
        gk._C._gemv_set_variant(0)
        gk._C._gemv_set_dense_path(-1)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("variant", [0, 1, 2])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1024)])
def test_variant_matches_exact(fmt, variant, n, k):
    fn, deq, qbytes = make(fmt, n, k)
    m = 5
    xb = gk.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype("bfloat16")
    x = xb.to("cuda")
    got = run(fmt, fn, x, variant)
    xs = f64(xb.astype("float32"))
    ref = xs @ deq.T
    bound = np.abs(xs) @ np.abs(deq).T
    if fmt in ("q4_k", "q4_1"):  # d * sum(q x) + m * sum(x) per (sub-)block: a bound over the split sums
        bound = split_bound(fmt, qbytes, xs)
    err = np.abs(f64(got) - ref)
    tol = 2 * (k + 2) * 2.0**-24 * bound + 1e-30
    if fmt == "int4_128" and variant in (0, 2, 10) and k % 512 == 0:  # the default: k_w4i since session 15
        tol = default_tol(xs, deq, True)
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        bad = np.argwhere(~(err <= tol))
        raise AssertionError(f"{fmt} variant {variant} n={n} k={k}: {len(bad)} of {err.size} out of tolerance; "
                             f"worst y{list(i)} = {f64(got)[i]!r}, ref {ref[i]!r}, tol {tol[i]:.3g}; "
                             f"first bad {bad[0].tolist()}")
    assert f64(run(fmt, fn, x, variant)).tobytes() == f64(got).tobytes(), "not the same bits on a second run"
    one = run(fmt, fn, x[3:4], variant)
    assert f64(one).tobytes() == f64(got)[3:4].tobytes(), "row 3 alone differs from row 3 of the batch"
    if variant == 2 or (variant == 1 and fmt not in ("q8_0", "q4_0", "q4_1", "q6_k", "q4_k", "nvf4") and
                        not fmt.startswith("int4")):
        # ring depth / launch attribute only: the same sums in the same order
        assert f64(run(fmt, fn, x, 0)).tobytes() == f64(got).tobytes(), f"variant {variant} and 0 differ"


@pytest.mark.parametrize("fmt", ["int4_32", "int4_64", "int4_128"])
@pytest.mark.parametrize("variant", [3, 6, 9, 10])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1024), (133, 1152)])
def test_int4_variants_match_exact(fmt, variant, n, k):
    """int4's extra variants (the default is the staged kernel of gemv_w4_staged.cu wherever
    K % 128 == 0): 3 the session-3 staged-tile kernel (quant_int4_mma.cu; K = 1152: gemv_mma.cuh's
    kernel), 6 / 9 / 10 the staged kernel with no CTA spreading / registers for 24 warps per SM /
    its default (K = 1152: the default configuration). 4 / 5 / 8 were removed in session 6 (they
    run the default); 16 / 17 / 19 / 20 / 27: tests/python/test_gemv_w4_s6_cuda.py."""
    test_variant_matches_exact(fmt, variant, n, k)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0", "q4_k", "q6_k", "nvf4"])
@pytest.mark.parametrize("variant", [3, 4, 5])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1024), (133, 1280), (19, 1536)])
def test_gguf_variants_match_exact(fmt, variant, n, k):
    """The GGUF formats' and NVF4's extra variants: GGUF 3 the older kernels (Q4_K / Q6_K:
    quant_gguf_k.cu; others: quant_gguf.cu), 4 / 5 the staged kernel (quant_gguf_st.cu) with a 3- /
    4-stage ring; NVF4 (the staged kernel of gemv_w4_staged.cu by default since session 6): 3 the
    per-lane kernel of quant_nvf4_lane.cu, 4 / 5 the default."""
    test_variant_matches_exact(fmt, variant, n, k)


@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (133, 1280)])
def test_nvf4_mulhi_variant_matches_exact(n, k):
    """NVF4 variant 8: the per-lane kernel with its right shifts as mul.hi."""
    test_variant_matches_exact("nvf4", 8, n, k)


def test_pdl_chain_reads_the_previous_output():
    """The default (PDL) launches: each GEMV reads the previous one's output; the result
    must be the bits of the same chain without PDL (variant 2; a kernel that read x before
    griddepcontrol.wait would see stale or partial data)."""
    k = 4096
    fmts = ["fp8", "q4_0", "bf16", "int4_128", "q6_k", "q4_k", "q8_0", "nvf4", "int8"]
    fns = [make(f, k, k)[0] for f in fmts]
    x0 = gk.asarray(RNG.standard_normal((2, k)).astype(np.float32)).astype("bfloat16").to("cuda")

    def chain(variant):
        gk._C._gemv_set_variant(variant)
        try:
            y = x0
            for fn in fns:
                y = fn(y).astype("bfloat16")
            return gk.to_numpy(y.astype("float32"))
        finally:
            gk._C._gemv_set_variant(0)

    ref = chain(2)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    for _ in range(3):
        got = chain(0)
        bad = np.argwhere(got != ref)
        assert bad.size == 0, f"PDL chain differs at {len(bad)} places, first {bad[0].tolist()}"
