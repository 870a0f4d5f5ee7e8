"""The staged 4-bit GEMV's x pairing in the ring (k_w4 MODE 11, src/cuda/common/gemv_w4.cuh) and the int4
g128 / bf16 x default (variant 48 from session 7's final run, 66 since session 15: k_w4i where K % 512 == 0 and
M <= 8, within its fixed-point bound, w4_ref.default_tol).

MODE 11 (M = 1): each stage's x is copied through L1 with its codes and paired in place once per stage
((x0, x4), (x1, x5), .. per 16-byte chunk), so the mma reads its B registers as loaded; the values that
reach the mma are MODE 8's (x through the ring, pairs made per mma): the same bits with the same plan.
M > 1 runs MODE 0 with the same plan, so a row's bits do not depend on M.
Variants: 48 = MODE 11 for int4 g128 with bf16 x (19's bits), 51 = 19 with x copied through L1 (MODE 12;
19's bits); session 8 (every format and x type): 52 = MODE 11 with the default's plan (int4 g32 / g64,
NVF4 and float16 x: the default's bits; int4 g128 with bf16 x: 48), 53 / 55 = MODE 11 with a ring of 3
and a target of 12 / 8 warps per SM, 54 = a ring of 2 and 8 warps per SM (other plans: another split of K
over the warps, so not the default's bits: the float64 bound of the arithmetic, 2 (K + 2) 2^-24 sum |x| |w|,
and M-independence); 57 = 52 without the CTA spreading (the same warps per CTA: 52's bits); 56 = the copies
alone with a ring of 2 (wrong results by design: only that it runs); 58 = 53 with MODE 13 (the first stage
waits for its own codes and x only: 53's bits). Session 7's DEC variants (45-47, 49,
50) were removed in session 8 (slower at every shape). Skipped without a GPU."""
import math

import numpy as np
import pytest

import gpukit as gk
from w4_ref import (DEFAULT_G128, bound_f32, call, default_is_imma, default_tol, f64, make_w4, rows_match, same_bits,
                    within, x_dtype)
from w4_ref import make_x as make_x_rng

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(909)
VX2, VXP, VXCA = 19, 48, 51
VXALL, VXP3, VXP2W8, VXP3W8, VXNOSP, VXP3E = 52, 53, 54, 55, 57, 58
# the int4 g128 / bf16 x default's configuration where N >= 2 K / elsewhere: kG128Wide / kG128Mid in
# src/cuda/gemv_w4_staged.cu (change both places; w4_ref.DEFAULT_G128)
DEFAULT_G128_WIDE, DEFAULT_G128_MID = DEFAULT_G128, DEFAULT_G128
# N >= 2 K: (2051, 1024), (9000, 4096), (4099, 1536); narrow (K % 512 != 0, the narrow kernel):
# (1000, 384), (133, 1152); N < 2 K: (37, 4096), (300, 14336), (37, 32768: split-K), (300, 4864: a
# partial last stage)
SHAPES = [(2051, 1024), (9000, 4096), (1000, 384), (4099, 1536), (37, 4096), (300, 14336), (37, 32768),
          (300, 4864), (133, 1152)]
# int4 group / NVF4, x dtype
FMTS = ["int4_32", "int4_64", "nvf4", "int4_128_f16", "int4_64_f16", "int4_32_f16", "nvf4_f16"]


def make(fmt, n, k):
    """(gemv on CUDA, the float64 of the dequantized weights, x dtype); for fmt in FMTS or "int4_128"."""
    return (*make_w4(RNG, fmt, n, k), x_dtype(fmt))


def make_x(k, xdt, m=8):
    return make_x_rng(RNG, k, xdt, m)




def test_default_tol_can_fail():
    """The bound's arithmetic (no GPU): the float32 dequantization's product is inside it, the codes of a
    group off by one are not."""
    n, k = 64, 1024
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    q, s, z = gk.quantize_int4(gk.asarray(w), group=128)
    deq = f64(gk.dequantize_int4(q, s, z, group=128))
    xs = f64(gk.asarray(RNG.standard_normal((4, k)).astype(np.float32)).astype("bfloat16").astype("float32"))
    tol = bound_f32(xs, deq)
    qn = gk.to_numpy(q)
    codes = np.empty((n, k), dtype=np.float64)
    codes[:, 0::2], codes[:, 1::2] = qn & 0xF, qn >> 4
    se = np.repeat(f64(s), 128, axis=1)
    exact = (codes - np.repeat(f64(z), 128, axis=1)) * se  # float64 (q - z) s
    assert np.all(np.abs(xs @ deq.T - xs @ exact.T) <= tol)
    wrong = exact.copy()
    wrong[:, :128] += se[:, :128]  # the codes of group 0 + 1: + s sum x over the group
    assert np.mean(np.abs(xs @ wrong.T - xs @ exact.T) > tol) > 0.9, "the bound does not see a code off by one"


@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_default_is_the_shape_plan(n, k):
    """int4 g128 with bf16 x: the default gives the bits of variant DEFAULT_G128_WIDE where N >= 2 K and of
    DEFAULT_G128_MID elsewhere at M = 1, 3 and 8, within the default's float64 bound (k_w4i's where K % 512 == 0),
    = variant 2 (no PDL)."""
    dv = DEFAULT_G128_WIDE if n >= 2 * k else DEFAULT_G128_MID
    fn, deq, xdt = make("int4_128", n, k)
    x, xs = make_x(k, xdt)
    for m in (1, 3, 8):
        a = f64(call(fn, x[:m], 0, out_dtype="float32"))
        within(f"default n={n} k={k} M={m}", a, xs[:m] @ deq.T,
               default_tol(xs[:m], deq, default_is_imma("int4_128", k, m, xdt)))
        same_bits(f"n={n} k={k} M={m}: default vs {dv}", a, f64(call(fn, x[:m], dv, out_dtype="float32")))
        same_bits(f"n={n} k={k} M={m}: default vs variant 2 (no PDL)", a, f64(call(fn, x[:m], 2, out_dtype="float32")))


@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_x_paired_in_ring(n, k):
    """int4 g128, bf16 x: 48, 51, 52 and 57 = 19's bits at M = 1, 3, 8 (the same plan and arithmetic)."""
    fn, deq, xdt = make("int4_128", n, k)
    x, xs = make_x(k, xdt)
    for m in (1, 3, 8):
        b19 = f64(call(fn, x[:m], VX2, out_dtype="float32"))
        within(f"19 n={n} k={k} M={m}", b19, xs[:m] @ deq.T, bound_f32(xs[:m], deq))
        for v in (VXP, VXCA, VXALL, VXNOSP):
            same_bits(f"n={n} k={k} M={m}: {v} vs 19", f64(call(fn, x[:m], v, out_dtype="float32")), b19)


@cuda
@pytest.mark.parametrize("fmt,n,k", [("int4_128", n, k) for n, k in SHAPES] +
                         [(f, n, k) for f in FMTS for n, k in [(2051, 1024), (300, 14336), (37, 32768), (1000, 384)]])
def test_fewer_warps(fmt, n, k):
    """53 / 55 (a ring of 3, 12 / 8 warps per SM) and 54 (a ring of 2, 8 warps per SM): within the float64
    bound, a row's bits independent of M, the same bits on a second call; 58 = 53 at M = 1 and 8; narrow
    rows (K % 512 != 0) run the narrow kernel: the default's bits."""
    fn, deq, xdt = make(fmt, n, k)
    x, xs = make_x(k, xdt)
    ref, tol = xs @ deq.T, bound_f32(xs, deq)
    for v in (VXP3, VXP2W8, VXP3W8):
        full = rows_match(f"{fmt} variant {v} n={n} k={k}", fn, v, x, lambda tag, got: within(tag, got, ref, tol))
        same_bits(f"{fmt} n={n} k={k}: {v} again", f64(call(fn, x, v, out_dtype="float32")), full)
        if v == VXP3:  # 58: 53's plan and arithmetic, another order of the first copies
            for m in (1, 8):
                same_bits(f"{fmt} n={n} k={k} M={m}: 58 vs 53", f64(call(fn, x[:m], VXP3E, out_dtype="float32")),
                          full[:m] if m == 8 else f64(call(fn, x[:1], VXP3, out_dtype="float32")))
        if k % 512 != 0:
            same_bits(f"{fmt} n={n} k={k} narrow: {v} vs the default", full, f64(call(fn, x, 0, out_dtype="float32")))


@cuda
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", [(2051, 1024), (4099, 1536), (37, 4096), (300, 14336), (37, 32768), (300, 4864),
                                 (1000, 384)])
def test_x_paired_other_formats(fmt, n, k):
    """52 / 57 (MODE 11 with the default's plan) on int4 g32 / g64, NVF4 and float16 x: the default's bits at
    M = 1, 3, 8 (MODE 8's arithmetic on the same values), within the float64 bound; 48 and 51 change int4
    g128 with bf16 x only (the default's bits here)."""
    fn, deq, xdt = make(fmt, n, k)
    x, xs = make_x(k, xdt)
    for m in (1, 3, 8):
        a = f64(call(fn, x[:m], 0, out_dtype="float32"))
        within(f"{fmt} default n={n} k={k} M={m}", a, xs[:m] @ deq.T, bound_f32(xs[:m], deq))
        for v in (VXALL, VXP, VXCA, VXNOSP):
            same_bits(f"{fmt} n={n} k={k} M={m}: {v} vs the default", f64(call(fn, x[:m], v, out_dtype="float32")), a)


@cuda
@pytest.mark.parametrize("fmt", ["int4_128", "int4_64", "int4_32", "nvf4", "nvf4_f16"])
def test_x_paired_partial_stage_and_view(fmt):
    """MODE 11 with a partial last stage (K = 4864: 2 valid blocks of 4) and x as a view into a wider
    array (not its first row), M = 1: 48 / 51 / 52 / 57 = 19 (int4 g128) or the default; 53-55, 58 within
    the bound, 58 = 53; an output in x's dtype within the bound plus its rounding."""
    n, k = 300, 4864
    fn, deq, xdt = make(fmt, n, k)
    big = gk.asarray(RNG.standard_normal((3, k + 64)).astype(np.float32)).astype(xdt)
    xs = f64(big.astype("float32"))[1:2, :k]
    xv = big.to("cuda")[1:2, :k]
    ref, tol = xs @ deq.T, bound_f32(xs, deq)
    base = f64(call(fn, xv, VX2 if fmt == "int4_128" else 0, out_dtype="float32"))
    within(f"{fmt} x view: base", base, ref, tol)
    for v in (VXP, VXCA, VXALL, VXNOSP):
        same_bits(f"{fmt} x view: {v} vs base", f64(call(fn, xv, v, out_dtype="float32")), base)
    for v in (VXP3, VXP2W8, VXP3W8, VXP3E):
        within(f"{fmt} x view: {v}", f64(call(fn, xv, v, out_dtype="float32")), ref, tol)
        got = f64(call(fn, xv, v).astype("float32"))  # the output dtype of x
        assert np.all(np.isfinite(got)), f"{fmt} variant {v}: non-finite outputs"
        within(f"{fmt} x view: {v} {xdt} out", got, ref, tol + 2.0**-8 * np.abs(ref))
    same_bits(f"{fmt} x view: 58 vs 53", f64(call(fn, xv, VXP3E, out_dtype="float32")),
              f64(call(fn, xv, VXP3, out_dtype="float32")))


@cuda
@pytest.mark.parametrize("fmt", ["int4_128", "int4_32", "nvf4"])
def test_probe_ring2_runs(fmt):
    """56 (the copies alone with a ring of 2; wrong results by design) runs at a partial last stage, split-K
    and M = 1 / 8 without an error, its outputs are not NaN (its sums are of subnormal bit patterns), and the
    default is right after it."""
    for n, k in [(300, 4864), (37, 32768)]:
        fn, deq, xdt = make(fmt, n, k)
        x, xs = make_x(k, xdt)
        for m in (1, 8):
            y = f64(call(fn, x[:m], 56, out_dtype="float32"))
            assert y.shape == (m, n) and not np.any(np.isnan(y)), f"{fmt} n={n} k={k} M={m}: NaN in the probe's output"
            gk.cuda.synchronize()
        got = f64(call(fn, x, 0, out_dtype="float32"))
        within(f"{fmt} n={n} k={k}: default after 56", got, xs @ deq.T,
               default_tol(xs, deq, default_is_imma(fmt, k, len(xs), xdt)))
