"""The staged 4-bit GEMV's session-6 variants (src/cuda/gemv_w4_staged.cu, common/gemv_w4.cuh).

int4 with the zero-point mma (k_w4's MODE 6, benchmarking variant 15; with x through the ring
at M = 1: variant 18): the mma runs on the magic-biased codes (magic + q, exact in bf16:
magic 128) and a second mma per k-step with the constant A = -(magic + z) of each row adds
-(magic + z) * sum(x) into the same fp32 accumulator. The arithmetic differs from the default
(one packed subtraction (magic + q) - (magic + z) per pair), so the bits differ; the bound:

    |y - y64| <= 2 (2K + 2) 2^-24 sum_k |x_k| s_g(k) (2 magic + q_k + z_g(k))

i.e. the default's bound (2 (K + 2) 2^-24 sum |x| |w|, an fp32 sum of exact products in any
order, with a factor 2 for the tensor cores' accumulation) over the 2K exact products the
accumulator now adds: (magic + q) x and -(magic + z) x, each group's sum times its scale.
Tested for M = 1..8 (rows alone = rows in a batch), odd N, split-K (N = 37, long K), partial
last stages (K = 1152), K % 512 != 0 (narrow copies: MODE 0 runs there), groups of 32 / 64 /
128, the same bits on a second run, every code equal to its zero point (the worst case of
the cancellation), and float16 x (the variant runs the default there).

x through the ring (MODE 8, variant 17; M = 1 only, M > 1 runs MODE 0 with the same plan): the
same arithmetic as MODE 0 with x read from shared memory, so M = 1 must give the bits of the
same row at M = 2..8, and the default's float64 bound; int4 g32 / g64 / g128 and NVF4 (K = 4864:
NVF4's partial last stage, with the x copy of its 2 valid blocks). Skipped without a GPU."""
import math

import numpy as np
import pytest

import gpukit as gk

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(606)
VZS, VXS, VXZ, VX2 = 15, 17, 18, 19
MAGIC = {"bfloat16": 128.0, "float16": 1024.0}


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def make(g, w):
    q, s, z = gk.quantize_int4(gk.asarray(w), group=g)
    deq = f64(gk.dequantize_int4(q, s, z, group=g))
    qn = np.asarray(gk.to_numpy(q)).astype(np.int64)
    codes = np.empty((qn.shape[0], qn.shape[1] * 2), np.float64)
    codes[:, 0::2], codes[:, 1::2] = qn & 15, qn >> 4
    sn = np.repeat(f64(s), g, axis=1)
    zn = np.repeat(np.asarray(gk.to_numpy(z)).astype(np.float64), g, axis=1)
    qc, sc, zc = q.to("cuda"), s.to("cuda"), z.to("cuda")
    return (lambda x, **kw: gk.gemv_int4(x, qc, sc, zc, group=g, **kw)), deq, codes, sn, zn


def call(fn, x, variant, **kw):
    gk._C._gemv_set_variant(variant)
    try:
        return fn(x, **kw)
    finally:
        gk._C._gemv_set_variant(0)


def check(tag, got, xs, deq, codes, sn, zn, magic):
    k = xs.shape[1]
    ref = xs @ deq.T
    err = np.abs(f64(got) - ref)
    tol_zs = 2 * (2 * k + 2) * 2.0**-24 * (np.abs(xs) @ (sn * (2 * magic + codes + zn)).T) + 1e-30
    tol_def = 2 * (k + 2) * 2.0**-24 * (np.abs(xs) @ np.abs(deq).T) + 1e-30
    if not np.all(err <= tol_zs):
        i = np.unravel_index(np.argmax(err / tol_zs), err.shape)
        bad = np.argwhere(~(err <= tol_zs))
        raise AssertionError(f"{tag}: {len(bad)} of {err.size} out of the bound; worst y{list(i)} = "
                             f"{f64(got)[i]!r}, ref {ref[i]!r}, bound {tol_zs[i]:.3g} (err / default's bound "
                             f"{np.max(err / tol_def):.3g}); first bad {bad[0].tolist()}")
    return float(np.max(err / tol_def))


def weights(n, k):
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    w[:, : min(k, 64)] *= 8.0
    return w


@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1536), (37, 32768), (133, 4608),
                                 (133, 1152), (300, 4864), (37, 896)])
def test_zs_within_bound_all_m(g, n, k):
    fn, deq, codes, sn, zn = make(g, weights(n, k))
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x = xb.to("cuda")
    xs = f64(xb.astype("float32"))
    full = call(fn, x, VZS, out_dtype="float32")
    check(f"g{g} n={n} k={k} M=8", full, xs, deq, codes, sn, zn, MAGIC["bfloat16"])
    assert f64(call(fn, x, VZS, out_dtype="float32")).tobytes() == f64(full).tobytes(), "not the same bits twice"
    for m in range(1, 8):
        got = call(fn, x[:m], VZS, out_dtype="float32")
        a, b = f64(got), f64(full)[:m]
        if a.tobytes() != b.tobytes():
            bad = np.argwhere(a != b)
            raise AssertionError(f"M={m}: {len(bad)} elements differ from the same rows at M=8; first "
                                 f"{bad[0].tolist()}: {a[tuple(bad[0])]!r} vs {b[tuple(bad[0])]!r}")
    one = call(fn, x[5], VZS, out_dtype="float32")
    assert f64(one).tobytes() == f64(full)[5].tobytes(), "row 5 alone (1-d x) differs from row 5 of the batch"


@pytest.mark.parametrize("g", [32, 128])
def test_zs_codes_at_zero_point(g):
    """Rows whose weights are all equal in a group but one (q = z almost everywhere: the result is
    small while the accumulator adds +-(128 + z) x terms): the bound above holds, and the
    default's tighter bound is reported in the message."""
    n, k = 64, 4096
    w = np.full((n, k), 0.01, np.float32)
    w[:, ::g] = -0.3  # one weight per group far away: a scale, and the rest at the zero point
    w += (RNG.standard_normal((n, k)) * 1e-4).astype(np.float32)
    fn, deq, codes, sn, zn = make(g, w)
    xb = gk.asarray((RNG.standard_normal((4, k)) * 30).astype(np.float32)).astype("bfloat16")
    got = call(fn, xb.to("cuda"), VZS, out_dtype="float32")
    check(f"g{g} codes at the zero point", got, f64(xb.astype("float32")), deq, codes, sn, zn, MAGIC["bfloat16"])


@pytest.mark.parametrize("out", ["float32", "bfloat16"])
def test_zs_fp16_x_and_out(out):
    """float16 x runs the default configuration under the variant; bfloat16 output."""
    n, k, g = 77, 2048, 64
    fn, deq, codes, sn, zn = make(g, weights(n, k))
    for dt in ("float16", "bfloat16"):
        xh = gk.asarray(RNG.standard_normal((4, k)).astype(np.float32)).astype(dt)
        got = call(fn, xh.to("cuda"), VZS, out_dtype=out)
        assert str(got.dtype) == out
        xs = f64(xh.astype("float32"))
        if out == "float32":
            check(f"{dt} x", got, xs, deq, codes, sn, zn, MAGIC[dt])
        else:
            ref = xs @ deq.T
            err = np.abs(f64(got.astype("float32")) - ref)
            tol = 2.0**-7 * np.abs(ref) + 2 * (2 * k + 2) * 2.0**-24 * (
                np.abs(xs) @ (sn * (2 * MAGIC[dt] + codes + zn)).T) + 1e-6
            assert np.all(err <= tol), f"{dt} x, out {out}: worst {np.max(err / tol):.3g} x tol"


def test_zs_poisoned_output_fully_written():
    n, k, g = 1000, 1024, 128
    fn, deq, codes, sn, zn = make(g, weights(n, k))
    junk = gk.full((4, n), float("nan"), dtype="float32", device="cuda")
    del junk
    xb = gk.asarray(RNG.standard_normal((4, k)).astype(np.float32)).astype("bfloat16")
    got = call(fn, xb.to("cuda"), VZS, out_dtype="float32")
    assert np.isfinite(f64(got)).all()
    check("poisoned", got, f64(xb.astype("float32")), deq, codes, sn, zn, MAGIC["bfloat16"])


def check_exact(tag, got, xs, deq):
    """The default's bound: 2 (K + 2) 2^-24 sum |x| |w|."""
    k = xs.shape[1]
    ref = xs @ deq.T
    err = np.abs(f64(got) - ref)
    tol = 2 * (k + 2) * 2.0**-24 * (np.abs(xs) @ np.abs(deq).T) + 1e-30
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        bad = np.argwhere(~(err <= tol))
        raise AssertionError(f"{tag}: {len(bad)} of {err.size} out of tolerance; worst y{list(i)} = "
                             f"{f64(got)[i]!r}, ref {ref[i]!r}, tol {tol[i]:.3g}; first bad {bad[0].tolist()}")


def make_any(fmt, n, k):
    w = weights(n, k)
    if fmt == "nvf4":
        q, bs, ts = gk.quantize_nvf4(gk.asarray(w))
        qc, bc, tc = q.to("cuda"), bs.to("cuda"), ts.to("cuda")
        return (lambda x, **kw: gk.gemv_nvf4(x, qc, bc, tc, **kw)), f64(gk.dequantize_nvf4(q, bs, ts)), None
    g = int(fmt.split("_")[1])
    fn, deq, codes, sn, zn = make(g, w)
    return fn, deq, (codes, sn, zn)


@pytest.mark.parametrize("fmt", ["int4_32", "int4_64", "int4_128", "nvf4"])
@pytest.mark.parametrize("variant", [VXS, VXZ, VX2])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1536), (37, 32768), (133, 4608),
                                 (300, 4864), (133, 1152)])
def test_x_through_ring_rows_match(fmt, variant, n, k):
    """M = 1 (x through the ring) = the same row at M = 2..8 (x from global memory, the same
    plan), bit for bit; within the default's bound (17, 19: a ring of 2; NVF4 18 = 17) or the
    zero-point mma's (int4 18). K = 4864: NVF4's partial last stage; 1152: narrow copies (MODE 0 runs)."""
    fn, deq, zs = make_any(fmt, n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x = xb.to("cuda")
    xs = f64(xb.astype("float32"))
    full = f64(call(fn, x, variant, out_dtype="float32"))
    if variant == VXZ and zs is not None:
        check(f"{fmt} variant {variant} n={n} k={k} M=8", full, xs, deq, *zs, MAGIC["bfloat16"])
    else:
        check_exact(f"{fmt} variant {variant} n={n} k={k} M=8", full, xs, deq)
    for r in (0, 3, 7):
        one = f64(call(fn, x[r:r + 1], variant, out_dtype="float32"))
        if one.tobytes() != full[r:r + 1].tobytes():
            bad = np.argwhere(one != full[r:r + 1])
            raise AssertionError(f"{fmt} variant {variant} n={n} k={k}: row {r} at M=1 differs from M=8 in "
                                 f"{len(bad)} of {one.size}; first {bad[0].tolist()}: {one[tuple(bad[0])]!r} vs "
                                 f"{full[r:r + 1][tuple(bad[0])]!r}")
    again = f64(call(fn, x[3], variant, out_dtype="float32"))
    assert again.tobytes() == full[3].tobytes(), "row 3 alone (1-d x) differs on a second call"
    for m in (2, 5):
        assert f64(call(fn, x[:m], variant, out_dtype="float32")).tobytes() == full[:m].tobytes(), f"M={m} rows differ"


@pytest.mark.parametrize("fmt", ["int4_128", "nvf4"])
def test_x_through_ring_x_offset_and_stride(fmt):
    """x as a view into a wider 2-d array, not its first row (the front end makes x contiguous
    and 16-byte aligned): the copies read the right row."""
    n, k = 300, 4096
    fn, deq, zs = make_any(fmt, n, k)
    big = gk.asarray(RNG.standard_normal((3, k + 64)).astype(np.float32)).astype("bfloat16").to("cuda")
    xv = big[1:2, :k]
    got = f64(call(fn, xv, VXS, out_dtype="float32"))
    xs = f64(xv.astype("float32"))
    check_exact(f"{fmt} strided x", got, xs, deq)
