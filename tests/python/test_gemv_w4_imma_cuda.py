"""Variants 63-66 of the staged 4-bit GEMV (session 14; int4 g128 with bf16 x, M <= 8; off by default; NEW NUMERICS):
k_w4i (src/cuda/common/gemv_w4i.cuh) feeds the codes as u8 to mma.sync.m16n8k32 (int32, exact) against x as 16-bit
fixed point per 128-element block: X = round(x 2^(141 - c_b)), c_b the biased exponent of the block's largest |x|
clamped to 15..254, split into a signed high byte and an unsigned low byte; the zero point through the block's sum of
X. 63: 48's plan with a ring of 2; 64: 24 target warps per SM, registers for 3 CTAs; 65: a ring of 3; 66: 63 with one
stage per warp allowed. M > 1: a small kernel (k_w4i_xprep) converts x once per call into a workspace with the same
conversion (the same integers), and the GEMV (the MULTI kernel, on the M = 1 plan) reads column m of the mma as x row m
from there, so a row of x gives the same bits alone or in a batch.

What the tests hold it to:
- the float64 emulation of its x (numpy: the same X) times the dequantized weights, within the fp32 bound
  2 (K / 128 + 40) 2^-24 sum |x| |w| (the int32 sums are exact; one rounding per block conversion and per fma);
  a wrong plane order, exponent, zero point or block sum is far outside it (test_emulation_bound_can_fail);
- float64 x @ w^T within that bound plus the fixed point's own error sum_k |w_k| 2^(c_b - 142);
- the same bits run to run, in a graph replay, for a strided view of x, over a poisoned output buffer;
- inf / NaN in x: NaN rows (never a finite wrong value);
- M = 2 .. 8: rows 0 / 3 / 7 alone, M = 2 / 5 give M = 8's bits, each row within the bound of its own x;
- K % 512 != 0, int4 g64 / g32 and float16 x under 63-66: what they run under 48 (its bits).
CPU tests (no GPU): the variant bound takes 66 (refuses 67), bench/gemv.py lists and names 63-66, bench/e2e.py's
+w4v63 sets GPUKIT_GEMV_W4_VARIANT=63."""
import os

import numpy as np
import pytest

import gpukit as gk
from bench_ref import bench_gemv_lists, check_variant_bound, e2e_engines
from w4_ref import (bf16_x, bound_f32, call_f32, check_v, emu_bound, f64, fixed_point, graph_replays_same_bits, make_w4,
                    poisoned_calls, rows_match, same_bits, within)

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(6363)
V48 = 48
VARIANTS = (63, 64, 65, 66)
call = call_f32
# (N, K): odd N; the layer shapes' K 4096 / 14336; 512 (one stage), 1536 / 2560 (odd stage counts), 37 rows (split-K)
SHAPES = [(4097, 4096), (2051, 14336), (37, 14336), (301, 512), (9000, 1536), (2051, 2560), (14336, 4096),
          (6144, 4096), (4096, 14336)]


def make(n, k, group=128):
    return make_w4(RNG, f"int4_{group}", n, k)


# ---- CPU (no GPU) ----

def test_variant_bound_takes_66():
    """gk._C._gemv_set_variant takes 0..66 and refuses 67 and -1 (the bound in src/ops/gemv.cpp)."""
    check_variant_bound(66, (67, -1))


def test_bench_gemv_lists_63_66():
    """bench/gemv.py runs 63-66 for int4 only and names them (read without importing: the bench needs a GPU)."""
    vals = bench_gemv_lists()
    for v in VARIANTS:
        assert v in vals["INT4_ONLY_VARIANTS"] and v in vals["W4_VARIANT_NAMES"]


def test_e2e_engine_option_w4v63():
    """bench/e2e.py's engine option +w4v63 sets GPUKIT_GEMV_W4_VARIANT=63 for that engine's run."""
    base, opt = e2e_engines().gk_engine("gk-graph+w4v63")
    assert base == "gk-graph" and opt["env"] == {"GPUKIT_GEMV_W4_VARIANT": "63"}


def test_fixed_point_emulation():
    """The emulation: elements within 2^7 of their block's largest are exact, smaller ones round to the block's step;
    blocks of zeros stay zero; the step follows the largest's exponent."""
    x = np.zeros((1, 256))
    x[0, 0] = 3.0  # block 0: largest 3 (exponent 1, biased 128): step 2^(128 - 141) = 2^-13
    x[0, 1] = 3.0 / 64  # within 2^7: exact
    x[0, 2] = 2.0**-14 + 2.0**-20  # more than 2^7 below the largest: rounded to a multiple of the step
    xq, step = fixed_point(x)
    assert step[0, 0] == 2.0**-13 and step[0, 200] == 2.0**(15 - 141)
    assert xq[0, 0] == 3.0 and xq[0, 1] == 3.0 / 64
    assert xq[0, 2] % 2.0**-13 == 0 and abs(xq[0, 2] - x[0, 2]) <= 2.0**-14
    assert np.all(xq[0, 128:] == 0)


def test_emulation_bound_can_fail():
    """The emulation bound catches a zero point off by one in one group, and x without its fixed-point rounding where
    the rounding matters (the bound is not loose enough to hide the kernel's own step)."""
    rng = np.random.default_rng(1)
    k = 1024
    w = rng.standard_normal((16, k)) / 32
    x = rng.standard_normal((1, k))
    x[0, ::128] = 1e3  # every block's largest 1e3: small elements lose bits
    xq, _ = fixed_point(x)
    ref = xq @ w.T
    wrong = w.copy()
    wrong[:, :128] += 0.01  # a zero point off by one at scale 0.01
    assert np.any(np.abs(xq @ wrong.T - ref) > emu_bound(x, w))
    assert np.any(np.abs(x @ w.T - ref) > emu_bound(x, w))


# ---- GPU ----

@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_imma_variants(n, k):
    """Under 63-66: M = 1 within the emulation bound and a second call the same bits; M = 8 within the bound, rows
    0 / 3 / 7 alone and M = 2 / 5 its bits (rows_match)."""
    fn, deq = make(n, k)
    xf = RNG.standard_normal((8, k))
    xf[3] *= 1e-3  # rows of different size: each row's own block exponents
    xf[5, :128] *= 1e4
    x, xs = bf16_x(xf)
    for v in VARIANTS:
        got = call(fn, x[:1], v)
        check_v(f"{v} n={n} k={k} M=1", got, xs[:1], deq)
        same_bits(f"{v} n={n} k={k} M=1 second call", call(fn, x[:1], v), got)
        rows_match(f"{v} n={n} k={k}", fn, v, x, lambda tag, y: check_v(tag, y, xs, deq))


@cuda
def test_imma_block_scales():
    """Blocks of very different size (1e5, 1e-9, 0, 1), an outlier block (one 1e3 among N(0, 1)), tiny values
    (1e-36), ties of the rounding (x = odd multiples of half a step) and the bf16 extremes: within the emulation bound."""
    n, k = 2051, 4096
    fn, deq = make(n, k)
    xf = RNG.standard_normal((1, k)).astype(np.float32)
    xf[0, :128] *= 1e5
    xf[0, 128:256] *= 1e-9
    xf[0, 256:384] = 0.0
    xf[0, 512] = 1e3
    xf[0, 640:768] *= 1e-36
    xf[0, 768] = 2.0**10  # step 2^(137 - 141) = 2^-4 for block 6; ties at odd multiples of 2^-5
    xf[0, 769:896] = (2 * RNG.integers(-100, 100, 127) + 1) * 2.0**-5
    xf[0, 1024] = 3.0e38
    x, xs = bf16_x(xf)
    for v in VARIANTS:
        check_v(f"{v} block scales", call(fn, x, v), xs, deq)


@cuda
def test_imma_non_finite_x():
    """inf or NaN anywhere in x: every output of that x row NaN (the block's scale is NaN), never a finite value; at
    M = 8 the other rows keep their bits (those of each row alone)."""
    n, k = 301, 4096
    fn, _ = make(n, k)
    for bad in (np.inf, -np.inf, np.nan):
        xf = RNG.standard_normal((8, k)).astype(np.float32)
        xf[2, 1000] = bad
        x, _ = bf16_x(xf)
        for v in VARIANTS:
            got = call(fn, x[2:3], v)
            assert np.all(np.isnan(got)), f"{v} x with {bad}: {int(np.sum(np.isfinite(got)))} finite rows"
            full = call(fn, x, v)
            assert np.all(np.isnan(full[2])), f"{v} M=8, row 2 with {bad}: finite values"
            for r in (0, 7):
                same_bits(f"{v} M=8 with {bad} in row 2: row {r} vs alone", full[r:r + 1], call(fn, x[r:r + 1], v))


@cuda
def test_imma_poisoned_output_strided_x_graph():
    """The output reused from a NaN-filled allocation (every row written; M = 8 too, whose x workspace also comes from
    the caching allocator); x a strided view (row 1 of a wider array) gives the contiguous copy's bits; graph replays
    (M = 1, and M = 8 with its conversion kernel) give the eager bits."""
    n, k = 4097, 14336
    fn, deq = make(n, k)
    big = gk.asarray(RNG.standard_normal((3, k + 64)).astype(np.float32)).astype("bfloat16")
    xs = f64(big.astype("float32"))[1:2, :k]
    xv = big.to("cuda")[1:2, :k]
    xc = gk.asarray(np.ascontiguousarray(gk.to_numpy(big)[1:2, :k])).to("cuda")
    x8, xs8 = bf16_x(RNG.standard_normal((8, k)))
    for v in VARIANTS:
        got = poisoned_calls(fn, xv, v, n, lambda y, v=v: check_v(f"{v} strided view", y, xs, deq))
        same_bits(f"{v} strided view vs contiguous copy", got, call(fn, xc, v))
        graph_replays_same_bits(f"{v} graph replay", fn, xc, v, got)
        got8 = poisoned_calls(fn, x8, v, 8 * n, lambda y, v=v: check_v(f"{v} M=8", y, xs8, deq))
        graph_replays_same_bits(f"{v} graph replay M=8 (x converted by its own kernel)", fn, x8, v, got8)


@cuda
def test_imma_other_inputs_run_48():
    """Under 63-66: K % 512 != 0 (the narrow kernel), int4 g64 / g32 and float16 x give 48's bits; the env switch
    GPUKIT_GEMV_W4_VARIANT=63 gives variant 63's bits."""
    fn, deq = make(301, 640)
    x, xs = bf16_x(RNG.standard_normal((1, 640)))
    for v in VARIANTS:
        same_bits(f"{v} K=640 vs 48", call(fn, x, v), call(fn, x, V48))
    for group, xdt in ((64, "bfloat16"), (32, "bfloat16"), (128, "float16")):
        fo, deqo = make(2051, 1024, group=group)
        xo, _ = bf16_x(RNG.standard_normal((8, 1024)), xdt)
        for m in (1, 8):
            for v in VARIANTS:
                same_bits(f"g{group} {xdt} M={m}: {v} vs 48", call(fo, xo[:m], v), call(fo, xo[:m], V48))
    fn, deq = make(2051, 4096)
    x, xs = bf16_x(RNG.standard_normal((1, 4096)))
    try:
        os.environ["GPUKIT_GEMV_W4_VARIANT"] = "63"
        env = call(fn, x, 0)
    finally:
        del os.environ["GPUKIT_GEMV_W4_VARIANT"]
    same_bits("env 63 vs variant 63", env, call(fn, x, 63))
    within("default after the env test", call(fn, x, 0), xs @ deq.T, bound_f32(xs, deq))
