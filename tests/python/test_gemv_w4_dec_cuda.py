"""The staged int4 GEMV's session-7 decode (k_w4's DEC, src/cuda/common/gemv_w4.cuh) and the int4 g128
default (bf16 x: the per-shape plan of variant 37 since session 7). int4 g128, bf16 x.

DEC 1 ("zero point through x sums"): the mma takes the codes as (128 + q) (one lop3 per pair, no packed
subtraction); each group's fp32 sum starts at -(128 + z) S, S = the group's fp32 sum of x made by WPG
more mma (A = x as loaded, B = ones), each column's S shuffled from the quad of its x row. Not the
default's bits: the bound is the default's plus the cancellation of the (128 + q) / (128 + z) terms,
    |err| <= 2^-24 [2 (G + 2) sum_k |x_k| s_k (256 + q_k + z_k) + 2 (K + 2) sum_k |x_k| s_k |q_k - z_k|]
(G = 128; a zero point off by one gives ~s |S| per group, far above it: the test can fail).
Variants: 45 = 37's plan with DEC 1, 46 = DEC 2 (DEC 1 with the code shifts as mul.hi: the same
values, so 45's bits), 47 = 39 (37 on mma-nibble-order codes) with DEC 1. MODE 11 (x paired in place in
the ring once per stage at M = 1; M > 1: MODE 0 with the same plan) at every shape: 48 = DEC 0 (19's
bits: the same plan and arithmetic), 49 = DEC 1 (45's bits where 45 runs 19's plan: N < 2 K), 50 =
DEC 2 (49's bits); 51 = 19 with x copied through L1 (MODE 12; 19's bits). Narrow rows (K % 512 != 0) run the narrow kernel's default decode under 45-50. Skipped without a GPU (the bound's own
arithmetic test runs everywhere)."""
import math

import numpy as np
import pytest

import gpukit as gk
from test_gemv_w4_s7_cuda import mma_order

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(808)
VSHAPE, VBOTH, VX2, VD2 = 37, 39, 19, 20
VDEC, VDEC_HI, VDEC_ORD = 45, 46, 47
VXP, VXP_DEC, VXP_HI, VXCA = 48, 49, 50, 51
# the int4 g128 / bf16 x default's configuration where N >= 2 K / elsewhere: kG128Wide / kG128Mid in
# src/cuda/gemv_w4_staged.cu (change both places)
DEFAULT_G128_WIDE, DEFAULT_G128_MID = 48, 48
DEC_VARIANTS = (45, 46, 47, 49, 50)
G = 128


def f64(a):
    return np.asarray(gk.to_numpy(a) if isinstance(a, gk.Array) else a).astype(np.float64)


def expand(q, s, z, g=G):
    """Per-element codes, scales and zero points [N, K] (float64) of quantize_int4's outputs."""
    q = np.asarray(q, dtype=np.uint8)
    codes = np.empty((q.shape[0], q.shape[1] * 2), dtype=np.float64)
    codes[:, 0::2], codes[:, 1::2] = q & 0xF, q >> 4
    se = np.repeat(np.asarray(s, dtype=np.float64), g, axis=1)
    ze = np.repeat(np.asarray(z, dtype=np.float64), g, axis=1)
    return codes, se, ze


def dec_tol(xs, codes, se, ze, g=G):
    k = xs.shape[1]
    ax = np.abs(xs)
    big = ax @ (se * (256.0 + codes + ze)).T
    small = ax @ (se * np.abs(codes - ze)).T
    return 2.0**-24 * (2 * (g + 2) * big + 2 * (k + 2) * small) + 1e-30


def make(n, k, order=False, w=None):
    """(gemv on CUDA, the float64 of dequantize_int4, (codes, scales, zeros expanded, (q - z) s in float64))."""
    if w is None:
        w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
        w[:, : min(k, 64)] *= 8.0
    q, s, z = gk.quantize_int4(gk.asarray(w), group=G)
    deq = f64(gk.dequantize_int4(q, s, z, group=G))
    codes, se, ze = expand(gk.to_numpy(q), gk.to_numpy(s), gk.to_numpy(z))
    exact = (codes - ze) * se  # float64: the kernel's (q - z) s with no rounding
    assert np.allclose(exact, deq, rtol=2.0**-23, atol=0), "expand() disagrees with dequantize_int4"
    if order:
        q = gk.asarray(mma_order(gk.to_numpy(q)))
    qc, sc, zc = q.to("cuda"), s.to("cuda"), z.to("cuda")
    return (lambda x, **kw: gk.gemv_int4(x, qc, sc, zc, group=G, **kw)), deq, (codes, se, ze, exact)


def call(fn, x, variant, **kw):
    gk._C._gemv_set_variant(variant)
    try:
        return fn(x, **kw)
    finally:
        gk._C._gemv_set_variant(0)


def within(tag, got, ref, tol):
    err = np.abs(f64(got) - ref)
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        bad = np.argwhere(~(err <= tol))
        raise AssertionError(f"{tag}: {len(bad)} of {err.size} out of tolerance; worst y{list(i)} = "
                             f"{f64(got)[i]!r}, ref {ref[i]!r}, err {err[i]:.3g}, tol {tol[i]:.3g}; "
                             f"first bad {bad[0].tolist()}; max err / tol {np.max(err / tol):.3g}")


def default_tol(xs, deq):
    return 2 * (xs.shape[1] + 2) * 2.0**-24 * (np.abs(xs) @ np.abs(deq).T) + 1e-30


def same_bits(tag, a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.tobytes() != b.tobytes():
        bad = np.argwhere(a != b)
        raise AssertionError(f"{tag}: {len(bad)} of {a.size} differ; first {bad[0].tolist()}: "
                             f"{a[tuple(bad[0])]!r} vs {b[tuple(bad[0])]!r}")


def rows_match(tag, fn, variant, x, check):
    """M = 8 checked; rows 0 / 3 / 7 alone, M = 2 / 5 and a second call (1-d x) give its bits."""
    full = f64(call(fn, x, variant, out_dtype="float32"))
    check(f"{tag} M=8", full)
    for r in (0, 3, 7):
        same_bits(f"{tag}: row {r} at M=1 vs M=8", f64(call(fn, x[r:r + 1], variant, out_dtype="float32")),
                  full[r:r + 1])
    for m in (2, 5):
        same_bits(f"{tag}: M={m} vs M=8", f64(call(fn, x[:m], variant, out_dtype="float32")), full[:m])
    same_bits(f"{tag}: row 3 (1-d x) second call", f64(call(fn, x[3], variant, out_dtype="float32")), full[3])
    return full


def test_dec_bound_can_fail():
    """The bound's arithmetic (no GPU): the exact product is inside it, a zero point off by one is not."""
    n, k = 64, 1024
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    q, s, z = gk.quantize_int4(gk.asarray(w), group=G)
    codes, se, ze = expand(gk.to_numpy(q), gk.to_numpy(s), gk.to_numpy(z))
    xs = f64(gk.asarray(RNG.standard_normal((4, k)).astype(np.float32)).astype("bfloat16").astype("float32"))
    ref = xs @ ((codes - ze) * se).T
    tol = dec_tol(xs, codes, se, ze)
    wrong = xs @ ((codes - ze - (ze < 15)) * se).T  # the zero points + 1
    deq = f64(gk.dequantize_int4(q, s, z, group=G))  # float32 dequantization: 2^-24-relative away
    assert np.all(np.abs(xs @ deq.T - ref) <= tol)
    # |wrong - ref| = s |sum of x over a group| per group, ~ s sqrt(K); the bound is ~3.4 s here
    assert np.mean(np.abs(wrong - ref) > tol) > 0.5, "the bound does not see a zero point off by one"


# N >= 2 K (variant 20's plan under 37 / 45-47): (2051, 1024), (9000, 4096), (4099, 1536); narrow
# (K % 512 != 0, the narrow kernel's default decode): (1000, 384), (133, 1152); N < 2 K: (37, 4096),
# (300, 14336), (37, 32768: split-K), (300, 4864: a partial last stage)
SHAPES = [(2051, 1024), (9000, 4096), (1000, 384), (4099, 1536), (37, 4096), (300, 14336), (37, 32768),
          (300, 4864), (133, 1152)]


@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_default_is_the_shape_plan(n, k):
    """int4 g128 with bf16 x: the default gives the bits of variant DEFAULT_G128_WIDE where N >= 2 K and of
    DEFAULT_G128_MID elsewhere at M = 1, 3 and 8 (37: variant 20's configuration where N >= 2 K, x through
    a ring of 2 elsewhere), within the float64 bound of its arithmetic (the DEC bound for a DEC variant)."""
    DEFAULT_G128 = DEFAULT_G128_WIDE if n >= 2 * k else DEFAULT_G128_MID
    fn, deq, (codes, se, ze, exact) = make(n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    for m in (1, 3, 8):
        a = f64(call(fn, x[:m], 0, out_dtype="float32"))
        if DEFAULT_G128 in DEC_VARIANTS and k % 512 == 0:
            within(f"default n={n} k={k} M={m}", a, xs[:m] @ exact.T, dec_tol(xs[:m], codes, se, ze))
        else:
            within(f"default n={n} k={k} M={m}", a, xs[:m] @ deq.T, default_tol(xs[:m], deq))
        same_bits(f"n={n} k={k} M={m}: default vs {DEFAULT_G128}", a,
                  f64(call(fn, x[:m], DEFAULT_G128, out_dtype="float32")))
        b = f64(call(fn, x[:m], 2, out_dtype="float32"))  # variant 2: the default without PDL
        same_bits(f"n={n} k={k} M={m}: default vs variant 2 (no PDL)", a, b)
    if DEFAULT_G128 == VSHAPE and (k % 512 != 0 or n < 2 * k):  # the previous default's configuration there
        same_bits(f"n={n} k={k}: default vs 19", f64(call(fn, x, 0, out_dtype="float32")),
                  f64(call(fn, x, VX2, out_dtype="float32")))


@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_dec_rows_match(n, k):
    """45 (DEC 1) within the bound of its arithmetic, a row's bits independent of M, the same bits run
    to run; 46 (mul.hi shifts) = 45's bits; narrow rows = the default's bits."""
    fn, deq, (codes, se, ze, exact) = make(n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    tol = dec_tol(xs, codes, se, ze)
    ref = xs @ exact.T
    full = rows_match(f"variant 45 n={n} k={k}", fn, VDEC, x, lambda tag, got: within(tag, got, ref, tol))
    same_bits(f"n={n} k={k}: 45 again", f64(call(fn, x, VDEC, out_dtype="float32")), full)
    same_bits(f"n={n} k={k}: 46 vs 45 (M=8)", f64(call(fn, x, VDEC_HI, out_dtype="float32")), full)
    same_bits(f"n={n} k={k}: 46 vs 45 (M=1)", f64(call(fn, x[5:6], VDEC_HI, out_dtype="float32")), full[5:6])
    if k % 512 != 0:
        same_bits(f"n={n} k={k} narrow: 45 vs the default", full, f64(call(fn, x, 0, out_dtype="float32")))


@cuda
@pytest.mark.parametrize("n,k", [(2051, 1024), (300, 14336), (133, 1152), (37, 32768)])
def test_dec_mma_order(n, k):
    """47 (39 with DEC 1) on codes in the mma nibble order: within the bound of the natural-order
    dequantization, a row's bits independent of M."""
    fn, deq, (codes, se, ze, exact) = make(n, k, order=True)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    tol = dec_tol(xs, codes, se, ze)
    ref = xs @ exact.T
    rows_match(f"variant 47 n={n} k={k}", fn, VDEC_ORD, x, lambda tag, got: within(tag, got, ref, tol))


@cuda
@pytest.mark.parametrize("case", ["zero_at_15", "x_cancels", "x_wide_range"])
def test_dec_hard_inputs(case):
    """45 where the (128 + q) / (128 + z) sums cancel most: every zero point 15 with codes near it
    (weights of one sign per group), x whose group sums are ~0 (pairs +v, -v), x over 2^-20 .. 2^10."""
    n, k = 2051, 1024
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    xf = RNG.standard_normal((8, k)).astype(np.float32)
    if case == "zero_at_15":
        w = -np.abs(w) - 1e-3  # all negative: min = the zero point's end of the range
    elif case == "x_cancels":
        xf[:, 1::2] = -xf[:, 0::2]
        xf *= 64.0
    else:
        xf *= np.exp2(RNG.integers(-20, 11, size=xf.shape)).astype(np.float32)
    fn, deq, (codes, se, ze, exact) = make(n, k, w=w)
    xb = gk.asarray(xf).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    if case == "zero_at_15":
        assert np.mean(ze) > 7, f"zero points {np.unique(ze)}"
    tol = dec_tol(xs, codes, se, ze)
    ref = xs @ exact.T
    for v in (VDEC, VDEC_HI, VXP_DEC):
        rows_match(f"{case} variant {v}", fn, v, x, lambda tag, got: within(tag, got, ref, tol))


@cuda
def test_dec_bf16_out():
    """45 with bf16 output (the engine's), M = 1 and 8: finite, within the bound plus the output's rounding."""
    n, k = 4099, 1536
    fn, deq, (codes, se, ze, exact) = make(n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    for m in (1, 8):
        got = f64(call(fn, x[:m], VDEC).astype("float32"))
        ref = xs[:m] @ exact.T
        tol = dec_tol(xs[:m], codes, se, ze) + 2.0**-8 * np.abs(ref)  # + bf16 rounding of the output
        assert np.all(np.isfinite(got)), "non-finite outputs"
        within(f"bf16 out M={m}", got, ref, tol)


@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_x_paired_in_ring(n, k):
    """MODE 11 / 12: 48 and 51 = 19's bits at M = 1, 3, 8; 49 within the DEC bound, a row's bits independent of M,
    = 45's bits where N < 2 K or narrow; 50 = 49's bits."""
    fn, deq, (codes, se, ze, exact) = make(n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x, xs = xb.to("cuda"), f64(xb.astype("float32"))
    for m in (1, 3, 8):
        b19 = f64(call(fn, x[:m], VX2, out_dtype="float32"))
        same_bits(f"n={n} k={k} M={m}: 48 vs 19", f64(call(fn, x[:m], VXP, out_dtype="float32")), b19)
        same_bits(f"n={n} k={k} M={m}: 51 vs 19", f64(call(fn, x[:m], VXCA, out_dtype="float32")), b19)
    tol = dec_tol(xs, codes, se, ze)
    ref = xs @ exact.T
    full = rows_match(f"variant 49 n={n} k={k}", fn, VXP_DEC, x, lambda tag, got: within(tag, got, ref, tol))
    same_bits(f"n={n} k={k}: 50 vs 49 (M=8)", f64(call(fn, x, VXP_HI, out_dtype="float32")), full)
    same_bits(f"n={n} k={k}: 50 vs 49 (M=1)", f64(call(fn, x[6:7], VXP_HI, out_dtype="float32")), full[6:7])
    if n < 2 * k or k % 512 != 0:
        same_bits(f"n={n} k={k}: 49 vs 45 (M=8)", full, f64(call(fn, x, VDEC, out_dtype="float32")))
        same_bits(f"n={n} k={k}: 49 vs 45 (M=1)", f64(call(fn, x[1:2], VXP_DEC, out_dtype="float32")),
                  f64(call(fn, x[1:2], VDEC, out_dtype="float32")))


@cuda
def test_x_paired_partial_stage_and_view():
    """MODE 11 with a partial last stage (K = 4864: 2 valid blocks of 4) and x as a view into a wider
    array (not its first row): 48 = 19, 49 within the bound."""
    n, k = 300, 4864
    fn, deq, (codes, se, ze, exact) = make(n, k)
    big = gk.asarray(RNG.standard_normal((3, k + 64)).astype(np.float32)).astype("bfloat16")
    xs = f64(big.astype("float32"))[1:2, :k]
    xv = big.to("cuda")[1:2, :k]
    b19 = f64(call(fn, xv, VX2, out_dtype="float32"))
    same_bits("x view: 48 vs 19", f64(call(fn, xv, VXP, out_dtype="float32")), b19)
    same_bits("x view: 51 vs 19", f64(call(fn, xv, VXCA, out_dtype="float32")), b19)
    within("x view: 49", f64(call(fn, xv, VXP_DEC, out_dtype="float32")), xs @ exact.T, dec_tol(xs, codes, se, ze))


@cuda
@pytest.mark.parametrize("fmt", ["int4_32", "int4_64", "nvf4", "int4_128_f16"])
def test_other_formats_run_the_default(fmt):
    """45-51 change int4 g128 with bf16 x only: int4 g32 / g64, NVF4 and float16 x give the default's bits."""
    n, k = 2051, 1024
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    if fmt == "nvf4":
        q, bs, ts = gk.quantize_nvf4(gk.asarray(w))
        qc, bc, tc = q.to("cuda"), bs.to("cuda"), ts.to("cuda")
        fn = lambda x, **kw: gk.gemv_nvf4(x, qc, bc, tc, **kw)  # noqa: E731
    else:
        g = 128 if fmt == "int4_128_f16" else int(fmt.split("_")[1])
        q, s, z = gk.quantize_int4(gk.asarray(w), group=g)
        qc, sc, zc = q.to("cuda"), s.to("cuda"), z.to("cuda")
        fn = lambda x, **kw: gk.gemv_int4(x, qc, sc, zc, group=g, **kw)  # noqa: E731
    xdt = "float16" if fmt.endswith("_f16") else "bfloat16"
    x = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype(xdt).to("cuda")
    for m in (1, 8):
        a = f64(call(fn, x[:m], 0, out_dtype="float32"))
        for v in (VDEC, VDEC_HI, VDEC_ORD, VXP, VXP_DEC, VXP_HI, VXCA):
            same_bits(f"{fmt} M={m}: variant {v} vs the default", f64(call(fn, x[:m], v, out_dtype="float32")), a)
