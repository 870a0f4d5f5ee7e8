"""The staged 4-bit GEMV (src/cuda/gemv_w4_staged.cu, common/gemv_w4.cuh): int4 with groups of
32 / 64 / 128 and NVF4 against float64 products with the exactly dequantized weights, for
M = 1..8, odd N (a partial last row tile), split-K (small N, long K), partial last stages
(K = 1152), K % 512 != 0 (rows of scales and
zero points not 16-byte aligned), every benchmarking variant that computes
(6 / 9; 2 without PDL must give the default's bits, 11 / 14, the copy modes, 13's; the
session-6 ring configurations 17 / 19 / 20 / 27: tests/python/test_gemv_w4_s6_cuda.py), float16 x and every
output dtype; same bits on a second run, a row alone = the row in a batch, and the output
poisoned before the call. Skipped without a GPU."""
import numpy as np
import pytest

import gpukit as gk
from w4_ref import call, check_default, check_exact, default_is_imma, f64, make_w4

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(4242)
FMTS = ["int4_32", "int4_64", "int4_128", "nvf4"]
# the variant that runs each kernel's default configuration: int4's and NVF4's default is the
# staged kernel (NVF4 since session 6); "nvf4_lane" is NVF4's per-lane kernel (quant_nvf4_lane.cu,
# variant 3; the default of sessions 4-5)
BASE = {"nvf4_lane": 3}
# True when the int4 default runs MODE 0 / 3 / 5 with a ring of 3 (session 5's plan): its bits
# are then variant 13's. Session 6's default (x through a ring of 2) has another plan.
DEFAULT_MODE0 = False


def make(fmt, n, k):
    return make_w4(RNG, fmt, n, k)  # ("nvf4" and "nvf4_lane": NVF4)


check = check_exact  # (tag, got, xs, deq, k): within 2 (k + 2) 2^-24 sum |x| |w| of x @ w^T


def check_base(fmt, base, tag, got, xs, deq, k):
    """check, or where the call ran the default on int4 g128 with bf16 x (k_w4i since session 15: x as fixed point)
    the default's bound (w4_ref.check_default)."""
    if base == 0 and default_is_imma(fmt, k, len(xs)):
        check_default(tag, got, xs, deq, True)
    else:
        check(tag, got, xs, deq, k)


@pytest.mark.parametrize("fmt", FMTS + ["nvf4_lane"])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (2051, 1536), (37, 32768), (133, 4608),
                                 (133, 1152), (300, 4864), (37, 896)])
def test_matches_exact_all_m(fmt, n, k):
    """K % 512 != 0 (1152, 4864, 896): the rows of scales / zero points are not 16-byte aligned
    (narrow copies; 1152: a partial last stage of one block). M = 1 runs x through the ring (the
    default's MODE 8), M > 1 MODE 0 with the same plan. nvf4_lane: NVF4's per-lane kernel."""
    base = BASE.get(fmt, 0)
    fn, deq = make(fmt, n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x = xb.to("cuda")
    xs = f64(xb.astype("float32"))
    full = call(fn, x, base, out_dtype="float32")
    check_base(fmt, base, f"{fmt} n={n} k={k} M=8", full, xs, deq, k)
    assert f64(call(fn, x, base, out_dtype="float32")).tobytes() == f64(full).tobytes(), "not the same bits twice"
    if base == 0:
        assert f64(call(fn, x, 2, out_dtype="float32")).tobytes() == f64(full).tobytes(), "variant 2 (no PDL) differs"
        assert f64(call(fn, x[2:3], 2, out_dtype="float32")).tobytes() == f64(full)[2:3].tobytes(), \
            "variant 2 (no PDL) at M=1 differs from row 2 of the batch"
    for m in range(1, 8):
        got = call(fn, x[:m], base, out_dtype="float32")
        assert f64(got).tobytes() == f64(full)[:m].tobytes(), f"M={m}: rows differ from the same rows at M=8"
    one = call(fn, x[5], base, out_dtype="float32")
    assert f64(one).tobytes() == f64(full)[5].tobytes(), "row 5 alone (1-d x) differs from row 5 of the batch"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("variant", [6, 8, 9])
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (133, 4608), (37, 32768), (133, 1152)])
def test_variants_match_exact(fmt, variant, n, k):
    """6: without the CTA spreading, 8: NVF4's per-lane kernel with mul.hi shifts (int4: the
    default since session 6), 9: a ring of 2 with registers for 24 warps per SM."""
    fn, deq = make(fmt, n, k)
    xb = gk.asarray(RNG.standard_normal((3, k)).astype(np.float32)).astype("bfloat16")
    got = call(fn, xb.to("cuda"), variant, out_dtype="float32")
    check(f"{fmt} variant {variant} n={n} k={k}", got, f64(xb.astype("float32")), deq, k)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", [(37, 4096), (300, 14336), (133, 4608), (37, 32768), (300, 4864), (133, 1152)])
def test_copy_modes_same_bits(fmt, n, k):
    """k_w4's MODE 0 (variant 13, checkpoint A's copies, the default's plan), 3 (variant 11, lean
    copies: a full stage's copies from addresses computed once, block 0's shared reads before
    the next copies are issued) and 5 (variant 14: 3 with x of a stage's first block loaded
    during the previous stage) do the same arithmetic: 11 and 14 give 13's bits at M = 8 and
    M = 1 (and the default's, when kDefaultMode in gemv_w4_staged.cu is 0, 3 or 5), within the
    bound of the float64 reference. K = 4864: NVF4 with a partial last stage (its copies take
    the general path); 1152: narrow rows of scales (MODE 0 runs); 32768: split-K."""
    fn, deq = make(fmt, n, k)
    xb = gk.asarray(RNG.standard_normal((8, k)).astype(np.float32)).astype("bfloat16")
    x = xb.to("cuda")
    b = f64(call(fn, x, 13, out_dtype="float32"))
    if fmt != "nvf4" and DEFAULT_MODE0:
        assert f64(call(fn, x, 0, out_dtype="float32")).tobytes() == b.tobytes(), "the default differs from MODE 0"
    for variant in (11, 13, 14):
        got = call(fn, x, variant, out_dtype="float32")
        check(f"{fmt} variant {variant} n={n} k={k} M=8", got, f64(xb.astype("float32")), deq, k)
        a = f64(got)
        if a.tobytes() != b.tobytes():
            bad = np.argwhere(a != b)
            raise AssertionError(f"{fmt} n={n} k={k}: variant {variant} differs from variant 13 in {len(bad)} of "
                                 f"{a.size}; first {bad[0].tolist()}: {a[tuple(bad[0])]!r} vs {b[tuple(bad[0])]!r}")
        one = call(fn, x[2:3], variant, out_dtype="float32")
        assert f64(one).tobytes() == b[2:3].tobytes(), f"variant {variant} at M=1 differs from variant 13's row 2"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16"])
def test_fp16_x_and_out_dtypes(fmt, out):
    n, k = 77, 2048
    fn, deq = make(fmt, n, k)
    xh = gk.asarray(RNG.standard_normal((4, k)).astype(np.float32)).astype("float16")
    got = call(fn, xh.to("cuda"), BASE.get(fmt, 0), out_dtype=out)
    assert str(got.dtype) == out
    xs = f64(xh.astype("float32"))
    if out == "float32":
        check(f"{fmt} fp16 x", got, xs, deq, k)
        one = call(fn, xh[1:2].to("cuda"), BASE.get(fmt, 0), out_dtype=out)  # M = 1: x through the ring
        assert f64(one).tobytes() == f64(got)[1:2].tobytes(), f"{fmt} fp16 x: M=1 differs from row 1 of M=4"
    else:
        ref = xs @ deq.T
        err = np.abs(f64(got.astype("float32")) - ref)
        tol = 2.0**-7 * np.abs(ref) + 2 * (k + 2) * 2.0**-24 * (np.abs(xs) @ np.abs(deq).T) + 1e-6
        assert np.all(err <= tol), f"{fmt} out {out}: worst {np.max(err / tol):.3g} x tol"


@pytest.mark.parametrize("fmt", FMTS)
def test_poisoned_output_fully_written(fmt):
    """gemv writes every element: NaN-poisoned memory from an earlier result must not show."""
    n, k = 1000, 1024
    fn, deq = make(fmt, n, k)
    junk = gk.full((4, n), float("nan"), dtype="float32", device="cuda")
    del junk  # its memory returns to the pool; the next result may reuse it
    xb = gk.asarray(RNG.standard_normal((4, k)).astype(np.float32)).astype("bfloat16")
    got = call(fn, xb.to("cuda"), BASE.get(fmt, 0), out_dtype="float32")
    assert np.isfinite(f64(got)).all()
    check_base(fmt, BASE.get(fmt, 0), f"{fmt} poisoned", got, f64(xb.astype("float32")), deq, k)


def test_misaligned_q_is_an_error():
    """Code rows that start 8 bytes into a 16-byte line: a ValueError before any launch."""
    n, k = 64, 2048
    w = gk.asarray((RNG.standard_normal((n, k)) / 40).astype(np.float32))
    q, s, z = gk.quantize_int4(w, group=32)
    big = gk.zeros((n, k // 2 + 8), dtype="uint8", device="cuda")
    qbad = big[:, 8:]  # rows k/2 + 8 bytes apart, starting 8 bytes in
    gk.copy_into(qbad, q.to("cuda"))
    x = gk.asarray(np.ones((1, k), np.float32)).astype("bfloat16").to("cuda")
    with pytest.raises(ValueError, match="aligned"):
        gk.gemv_int4(x, qbad, s.to("cuda"), z.to("cuda"), group=32)


def test_k_not_divisible_by_group_is_an_error():
    w = gk.asarray(np.ones((16, 96), np.float32))
    with pytest.raises(ValueError, match="divisible"):
        gk.quantize_int4(w, group=64)
