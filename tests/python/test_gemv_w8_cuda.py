"""The staged tensor-core GEMV (src/cuda/gemv_w8.cu, gk._C._gemv_set_dense_path(2)): bf16 /
fp16 weights at M = 1..8, fp8 and int8 weights (W8A16) with bf16 x (through the scaled
fp16 copy of x) and fp16 x, against float64 products with the exactly dequantized weights:
every M, odd N (a CTA's missing rows), K with a partial last stage, split-K shapes, x of
wide range (tiny, huge, zero rows, one large value), the stage / depth / warp knob
(GPUKIT_GEMV_W8), same bits every run, a row alone = the row in a batch, the default
kernel's results within the same tolerance. Skipped without a GPU."""
import math
import os

import numpy as np
import pytest

import gpukit as gk

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(808)


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def make(fmt, n, k, wscale=1.0):
    """(callable(x, out_dtype) -> y on the GPU, float64 exact weights)."""
    w = (RNG.standard_normal((n, k)) * wscale / math.sqrt(k)).astype(np.float32)
    wt = gk.asarray(w)
    if fmt in ("bf16", "fp16"):
        wb = wt.astype("bfloat16" if fmt == "bf16" else "float16")
        wc = wb.to("cuda")
        return (lambda x, o="float32": gk.gemv(x, wc, out_dtype=o)), f64(wb.astype("float32"))
    q, s = getattr(gk, f"quantize_{fmt}")(wt)
    qc, sc = q.to("cuda"), s.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    return (lambda x, o="float32": fn(x, qc, sc, out_dtype=o)), f64(getattr(gk, f"dequantize_{fmt}")(q, s))


def run(fn, x, out="float32", path=2):
    gk._C._gemv_set_dense_path(path)
    try:
        return fn(x, out)
    finally:
        gk._C._gemv_set_dense_path(-1)


def check(got, xs, deq, what, rel=0.0):
    """|got - x @ w.T| within fp32 accumulation (plus `rel` of |ref| for rounded outputs)."""
    ref = xs @ deq.T
    bound = np.abs(xs) @ np.abs(deq).T
    k = deq.shape[1]
    g = f64(got)
    err = np.abs(g - ref)
    tol = 2 * (k + 2) * 2.0**-24 * bound + rel * np.abs(ref) + 1e-37
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        bad = np.argwhere(~(err <= tol))
        raise AssertionError(f"{what}: {len(bad)} of {err.size} out of tolerance; worst y{list(i)} = {g[i]!r}, "
                             f"ref {ref[i]!r}, tol {tol[i]:.3g}; first bad {bad[0].tolist()}")


def xrand(m, k, xdt, scale=1.0):
    xb = gk.asarray((RNG.standard_normal((m, k)) * scale).astype(np.float32)).astype(xdt)
    return xb.to("cuda"), f64(xb.astype("float32"))


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8", "int8"])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1024), (16, 64), (129, 192), (4100, 512)])
def test_w8_matches_exact_every_m(fmt, n, k):
    fn, deq = make(fmt, n, k)
    xdt = "float16" if fmt == "fp16" else "bfloat16"
    x, xs = xrand(8, k, xdt)
    got8 = run(fn, x)
    check(got8, xs, deq, f"{fmt} n={n} k={k} m=8")
    assert f64(run(fn, x)).tobytes() == f64(got8).tobytes(), "not the same bits on a second run"
    for m in (1, 2, 3, 5, 7):
        got = run(fn, x[:m])
        assert f64(got).tobytes() == f64(got8)[:m].tobytes(), f"m={m}: rows differ from the same rows in the batch of 8"
    one = run(fn, x[4:5])
    assert f64(one).tobytes() == f64(got8)[4:5].tobytes(), "row 4 alone differs from row 4 of the batch"


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("n,k", [(37, 4096), (1000, 2048), (64, 14336)])
def test_w8_fp16_activations(fmt, n, k):
    """fp16 x is the B operand as it is (no scaled copy)."""
    fn, deq = make(fmt, n, k)
    x, xs = xrand(3, k, "float16")
    got = run(fn, x)
    check(got, xs, deq, f"{fmt} fp16 x")
    assert f64(run(fn, x)).tobytes() == f64(got).tobytes()


@pytest.mark.parametrize("cfg", [None, "4,3,16,1,2", "4,3,16,1,1"])
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_w8_x_range(fmt, cfg):
    """bf16 x of very different magnitudes per row: the per-row power-of-two scale keeps
    every row exact (tiny, huge, zero row, one large value among small ones)."""
    n, k = 70, 1024
    fn, deq = make(fmt, n, k)
    base = RNG.standard_normal((6, k)).astype(np.float32)
    base[0] *= 1e-30
    base[1] *= 1e30
    base[2] = 0.0
    base[3] *= 1e-3
    base[3, 17] = 3e4
    base[4] *= 2.0**-100
    base[5, ::2] = 0.0
    xb = gk.asarray(base).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    if cfg:
        os.environ["GPUKIT_GEMV_W8"] = cfg
    try:
        got = run(fn, x)
        check(got, xs, deq, f"{fmt} wide-range x (knob {cfg})")
        assert np.all(f64(got)[2] == 0.0)
        for i in range(6):
            assert f64(run(fn, x[i:i + 1])).tobytes() == f64(got)[i:i + 1].tobytes(), f"row {i} alone differs"
    finally:
        os.environ.pop("GPUKIT_GEMV_W8", None)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "int8"])
@pytest.mark.parametrize("out", ["bfloat16", "float16", "float32"])
def test_w8_out_dtypes_and_1d(fmt, out):
    n, k = 333, 2048
    fn, deq = make(fmt, n, k)
    x, xs = xrand(1, k, "bfloat16")
    got = run(fn, x[0], out)
    assert tuple(got.shape) == (n,)
    assert got.dtype == getattr(gk, out)
    rel = {"bfloat16": 2.0**-8, "float16": 2.0**-11, "float32": 0.0}[out]
    check(got.astype("float32").reshape((1, n)), xs, deq, f"{fmt} out {out}", rel=rel)


@pytest.mark.parametrize("cfg", ["2,4,16", "2,6,8", "4,2,16", "4,4,12", "8,2,16", "4,3,4", "4,3,64", "4,3,16,2",
                                 "2,4,16,2", "4,3,1,2", "4,3,16,1,2", "4,2,16,1,2", "4,3,4,1,2"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "int8"])
def test_w8_knob_configs(fmt, cfg):
    """GPUKIT_GEMV_W8 (a benchmarking knob) changes stages / warps, never correctness."""
    n, k = 515, 4096
    fn, deq = make(fmt, n, k)
    x, xs = xrand(5, k, "bfloat16")
    os.environ["GPUKIT_GEMV_W8"] = cfg
    try:
        got = run(fn, x)
        check(got, xs, deq, f"{fmt} cfg {cfg}")
        assert f64(run(fn, x[2:3])).tobytes() == f64(got)[2:3].tobytes()
    finally:
        del os.environ["GPUKIT_GEMV_W8"]


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("n,k,m", [(37, 4096, 1), (300, 14336, 2), (2051, 1024, 8), (640, 192, 3)])
def test_w8_x_copy_in_cta_same_bits(fmt, n, k, m):
    """The CTAs' own scaled copy of bf16 x (knob XS = 1) gives the bits of the x kernel (XS = 0)."""
    fn, deq = make(fmt, n, k)
    x, xs = xrand(m, k, "bfloat16", 3.0)
    outs = []
    for cfg in ("4,3,16,1,0", "4,3,16,1,1", "4,2,16,1,0", "4,2,16,1,1"):
        os.environ["GPUKIT_GEMV_W8"] = cfg
        try:
            outs.append(f64(run(fn, x)))
        finally:
            del os.environ["GPUKIT_GEMV_W8"]
    check(outs[1], xs, deq, f"{fmt} XS=1")
    assert outs[0].tobytes() == outs[1].tobytes(), "the CTA copy of x and the x kernel differ (D 3)"
    assert outs[2].tobytes() == outs[3].tobytes(), "the CTA copy of x and the x kernel differ (D 2)"


def test_w8_bad_knob():
    fn, _ = make("fp8", 32, 256)
    x, _ = xrand(1, 256, "bfloat16")
    os.environ["GPUKIT_GEMV_W8"] = "3,3,16"
    try:
        with pytest.raises(ValueError, match="GPUKIT_GEMV_W8"):
            run(fn, x)
    finally:
        del os.environ["GPUKIT_GEMV_W8"]
    os.environ["GPUKIT_GEMV_W8"] = "4,4,16,2"
    try:
        with pytest.raises(ValueError, match="GPUKIT_GEMV_W8"):
            run(fn, x)
    finally:
        del os.environ["GPUKIT_GEMV_W8"]


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "int8"])
def test_w8_is_the_default(fmt):
    """The default path (-1) is the staged kernel where it applies: the same bits as path 2;
    the CUDA-core kernel (path 0) stays within the same tolerance."""
    n, k = 515, 4096
    fn, deq = make(fmt, n, k)
    x, xs = xrand(3, k, "bfloat16")
    st = f64(run(fn, x, path=2))
    assert f64(run(fn, x, path=-1)).tobytes() == st.tobytes()
    check(run(fn, x, path=0), xs, deq, f"{fmt} CUDA-core path")


def test_w8_falls_back_when_k_does_not_fit():
    """K % 64 != 0 (fp8/int8) or K % 32 != 0 (bf16): path 2 takes the other kernels, same tolerance."""
    for fmt, k in (("fp8", 48), ("int8", 1040), ("bf16", 1000)):
        fn, deq = make(fmt, 45, k)
        x, xs = xrand(2, k, "bfloat16")
        check(run(fn, x), xs, deq, f"{fmt} k={k} fallback")


def test_w8_pdl_chain():
    """Chained staged GEMVs, each reading the previous output (the x copy kernel and the GEMV
    both wait for their predecessor): the bits of the same chain without PDL."""
    k = 2048
    fns = [make(f, k, k)[0] for f in ("fp8", "bf16", "int8", "fp8")]
    x0 = gk.asarray(RNG.standard_normal((2, k)).astype(np.float32)).astype("bfloat16").to("cuda")

    def chain(variant):
        gk._C._gemv_set_variant(variant)
        gk._C._gemv_set_dense_path(2)
        try:
            y = x0
            for fn in fns:
                y = fn(y, "float32").astype("bfloat16")
            return gk.to_numpy(y.astype("float32"))
        finally:
            gk._C._gemv_set_variant(0)
            gk._C._gemv_set_dense_path(-1)

    ref = chain(2)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    for _ in range(3):
        got = chain(0)
        bad = np.argwhere(got != ref)
        assert bad.size == 0, f"PDL chain differs at {len(bad)} places, first {bad[0].tolist()}"
