"""The staged tensor-core GEMV (src/cuda/gemv_w8.cu, gk._C._gemv_set_dense_path(2)): bf16 /
fp16 weights at M = 1..8, fp8 and int8 weights (W8A16) with bf16 x (through the scaled
fp16 copy of x) and fp16 x, against float64 products with the exactly dequantized weights:
every M, odd N (a CTA's missing rows), K with a partial last stage, split-K shapes, x of
wide range (tiny, huge, zero rows, one large value), the stage / depth / warp knob
(GPUKIT_GEMV_W8), same bits every run, a row alone = the row in a batch, the default
kernel's results within the same tolerance; the 8-bit weights decoded to exact bf16 with
bf16 x used as it is (knob XS = 3): every code at every position exactly, the bits of the
x-kernel path. Skipped without a GPU."""
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


@pytest.mark.parametrize("cfg", [None, "4,3,16,1,2", "4,3,16,1,1", "4,3,16,1,3", "4,3,16,1,3,1"])
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
                                 "2,4,16,2", "4,3,1,2", "4,3,16,1,2", "4,2,16,1,2", "4,3,4,1,2", "4,3,16,1,0,1",
                                 "4,4,8,1,0,1", "4,3,16,1,3", "4,2,16,1,3", "8,2,16,1,3", "2,4,16,1,3", "4,4,8,1,3",
                                 "4,3,16,2,3", "4,3,16,1,3,1", "4,4,8,1,3,1", "4,3,16,1,3,0,0",
                                 "4,4,8,1,3,0,0,2", "4,3,16,1,0,1,1,4", "2,4,16,1,3,0,1,64", "4,3,16,2,0,0,0,1",
                                 "4,3,8,1,3,0,0,0,4", "4,2,16,1,0,0,1,0,3", "4,3,16,2,3,0,1,1,2",
                                 "8,2,16,1,3,0,1,0,64", "4,2,16,1,3,1,0", "4,2,16,1,0,1"])
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
    for bad in ("4,4,16,2", "2,4,16,1,0,1", "8,2,16,1,3,1", "4,3,16,2,3,1"):
        os.environ["GPUKIT_GEMV_W8"] = bad
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


class knob:
    """GPUKIT_GEMV_W8 set for a block (None: unset)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __enter__(self):
        if self.cfg:
            os.environ["GPUKIT_GEMV_W8"] = self.cfg

    def __exit__(self, *a):
        os.environ.pop("GPUKIT_GEMV_W8", None)


BF16_DECODE = "4,3,16,1,3"  # knob: 8-bit weights decoded to exact bf16, bf16 x as it is


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1024), (16, 64), (129, 192), (4100, 512)])
def test_w8_bf16_decode_every_m(fmt, n, k):
    """XS = 3: exact against float64, same bits every run, a row alone = the row in a batch."""
    fn, deq = make(fmt, n, k)
    x, xs = xrand(8, k, "bfloat16")
    with knob(BF16_DECODE):
        got8 = run(fn, x)
        check(got8, xs, deq, f"{fmt} bf16 decode n={n} k={k} m=8")
        assert f64(run(fn, x)).tobytes() == f64(got8).tobytes(), "not the same bits on a second run"
        for m in (1, 2, 3, 5, 7):
            got = run(fn, x[:m])
            assert f64(got).tobytes() == f64(got8)[:m].tobytes(), f"m={m}: rows differ from the batch of 8"


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
@pytest.mark.parametrize("n,k,m", [(37, 4096, 1), (300, 14336, 2), (2051, 1024, 8), (640, 192, 3), (4100, 512, 5)])
def test_w8_bf16_decode_same_bits_as_x_kernel(fmt, n, k, m):
    """The weights decoded to bf16 with bf16 x (XS = 3) and to fp16 with the x kernel's scaled
    fp16 x (XS = 0): the same products scaled by a power of two, so the same bits (x within
    the 2^-31 of its row's largest value that the fp16 copy keeps exactly)."""
    fn, deq = make(fmt, n, k)
    x, xs = xrand(m, k, "bfloat16", 3.0)
    with knob("4,3,16,1,0"):
        a = f64(run(fn, x))
    with knob(BF16_DECODE):
        b = f64(run(fn, x))
    check(b, xs, deq, f"{fmt} XS=3")
    bad = np.argwhere(a != b)
    assert bad.size == 0, (f"{len(bad)} of {a.size} differ between XS=3 and XS=0, first {bad[0].tolist()}: "
                           f"{b[tuple(bad[0])]!r} vs {a[tuple(bad[0])]!r}")


def code_weights(fmt, n, k):
    """q [n, k] where row j holds code (k + 37 j) % 256 at column k (fp8: the NaN codes 0x7f,
    0xff replaced by 0x7e, 0xfe), scales of mixed size; (q, s on the GPU, float32 values of
    the codes [n, k], scales float32 [n])."""
    codes = ((np.arange(k)[None, :] + 37 * np.arange(n)[:, None]) % 256).astype(np.uint8)
    if fmt == "fp8":
        codes[(codes & 0x7f) == 0x7f] -= 1
    qc = gk.asarray(codes).view_dtype("float8_e4m3fn" if fmt == "fp8" else "int8")
    sc = (2.0 ** RNG.integers(-20, 20, n) * RNG.uniform(0.5, 1.0, n)).astype(np.float32)
    vals = gk.to_numpy(getattr(gk, f"dequantize_{fmt}")(qc, gk.asarray(np.ones(n, np.float32)))).astype(np.float32)
    assert np.isfinite(vals).all()
    return qc.to("cuda"), gk.asarray(sc).to("cuda"), vals, sc


@pytest.mark.parametrize("cfg", [None, "4,3,16,1,0", BF16_DECODE, "4,3,16,1,3,1", "4,2,16,1,3"])
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_w8_every_code_exact(fmt, cfg):
    """Every weight code at every k position: x rows with one nonzero value v (of very
    different magnitudes) give y = (v * code) * scale rounded once in float32, exactly."""
    n, k = 64, 256
    q, s, vals, sc = code_weights(fmt, n, k)
    fn = getattr(gk, f"gemv_{fmt}")
    vs = np.array([1.5, -3.0, 2.0**-60, 1.25 * 2.0**70, 0.5, -7.0, 1.0, -(2.0**-100) * 1.75], np.float32)
    with knob(cfg):
        for k0 in range(0, k, 8):
            xm = np.zeros((8, k), np.float32)
            cols = (k0 + np.arange(8) * 33) % k
            xm[np.arange(8), cols] = vs
            x = gk.asarray(xm).astype("bfloat16").to("cuda")
            gk._C._gemv_set_dense_path(2)
            try:
                got = gk.to_numpy(fn(x, q, s, out_dtype="float32"))
            finally:
                gk._C._gemv_set_dense_path(-1)
            ref = (vs[:, None] * vals[:, cols].T).astype(np.float32) * sc[None, :]
            bad = np.argwhere(~(got == ref))  # values (a zero's sign may differ: +0 sums)
            if bad.size:
                i, j = bad[0]
                raise AssertionError(f"{fmt} knob {cfg}: {len(bad)} of {got.size} differ; first y[{i}, {j}] = "
                                     f"{got[i, j]!r}, expected {ref[i, j]!r} (code byte "
                                     f"{int(((cols[i] + 37 * j) % 256))}, k {cols[i]}, v {vs[i]!r})")


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_w8_bf16_decode_pdl_chain(fmt):
    """XS = 3 in a chain of GEMVs reading each other's outputs: with and without PDL, the same bits."""
    k = 2048
    fns = [make(f, k, k)[0] for f in (fmt, "bf16", fmt)]
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

    with knob(BF16_DECODE):
        ref = chain(2)
        assert np.isfinite(ref).all() and np.abs(ref).max() > 0
        for _ in range(2):
            got = chain(0)
            bad = np.argwhere(got != ref)
            assert bad.size == 0, f"PDL chain differs at {len(bad)} places, first {bad[0].tolist()}"


@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_w8_default_is_bf16_decode_two_stages(fmt):
    """The default for 8-bit weights with bf16 x: decoded to bf16, 2 stages, no spreading
    (the knob "4,2,16,1,3,0,0"): the same bits; fp16 x likewise with 2 stages."""
    n, k = 777, 4096
    fn, deq = make(fmt, n, k)
    for xdt in ("bfloat16", "float16"):
        x, xs = xrand(4, k, xdt)
        got = f64(run(fn, x))
        check(got, xs, deq, f"{fmt} default {xdt}")
        with knob("4,2,16,1,3,0,0"):
            assert f64(run(fn, x)).tobytes() == got.tobytes(), f"{xdt}: the default is not 4,2,16,1,3,0,0"
