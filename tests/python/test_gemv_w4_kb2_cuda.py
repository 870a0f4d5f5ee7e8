"""The staged 4-bit GEMV on stages of 2 blocks (k_w4 with KB = 2, MODE 13; src/cuda/gemv_w4_staged.cu,
common/gemv_w4.cuh), variants 59 / 60 (session 8, int4 g128 with bf16 x; off by default), and the engine's
switch GPUKIT_GEMV_W4_VARIANT.

59 (a ring of 4) and 60 (a ring of 3) run 48's plan (warps per CTA, CTA spreading) and 48's split of K over the
warps (units of 4 blocks, k_w4's SU), so a warp decodes 48's blocks in 48's order with 48's arithmetic: 48's bits
at every M (M > 1 runs 48's kernel). The zero points of a 2-block stage are copied as the aligned 4-byte word
around them (W4Layout's ZW) and read at byte 2 (j & 1) of it: a wrong byte there moves every row's result by
s (z' - z) sum x over a group, far outside the float64 bound checked beside the bits.
Other formats and float16 x under 59 / 60 run the default. The CPU tests (no GPU) check that the variant bound
of src/ops/gemv.cpp takes 0..62 (61: session 9, 62: session 10) (session 8's checkpoint A refused 52-58: the bound was 51)."""
import math
import os

import numpy as np
import pytest

import gpukit as gk
from bench_ref import check_variant_bound, e2e_engines
from w4_ref import bound_f32, call_f32, default_tol, f64, make_w4, same_bits, within, x_dtype
from w4_ref import make_x as make_x_rng

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(1010)
V48, KB2_R4, KB2_R3 = 48, 59, 60
# N >= 2 K: (2051, 1024), (9000, 4096), (4099, 1536); narrow (K % 512 != 0): (1000, 384), (133, 1152);
# N < 2 K: (37, 4096), (300, 14336), (37, 32768: split-K, warps without blocks), (512, 14336: 8 warps per CTA)
SHAPES = [(2051, 1024), (9000, 4096), (1000, 384), (4099, 1536), (37, 4096), (300, 14336), (37, 32768),
          (512, 14336), (133, 1152)]


def make(fmt, n, k):
    """(gemv on CUDA, the float64 of the dequantized weights, x dtype); fmt int4_G[_f16] or nvf4[_f16]."""
    return (*make_w4(RNG, fmt, n, k), x_dtype(fmt))


def make_x(k, xdt, m=8):
    return make_x_rng(RNG, k, xdt, m)


call, tol_of = call_f32, bound_f32


def test_variant_bound_takes_every_variant():
    """No GPU: gk._C._gemv_set_variant takes 0..62 (52-58 of session 8, 59 / 60 here, 61 of session 9, 62 of
    session 10) and refuses 67 (63-66: session 14) and -1."""
    check_variant_bound(62, (67, -1, 1000))


def test_e2e_engine_option_sets_the_switch():
    """No GPU: bench/e2e.py's engine option +w4vV sets GPUKIT_GEMV_W4_VARIANT=V for that engine's run."""
    e2e = e2e_engines()
    base, opt = e2e.gk_engine("gk-graph+w4v59")
    assert base == "gk-graph" and opt["env"] == {"GPUKIT_GEMV_W4_VARIANT": "59"}
    assert "GPUKIT_GEMV_W4_VARIANT" not in e2e.gk_engine("gk-graph")[1]["env"]


def test_zero_word_byte_can_fail():
    """No GPU: reading the zero point of the other half of the word (a zero point off by the neighbour's) is
    outside the bound for most rows, so the bound sees a wrong ZW byte."""
    n, k = 64, 1024
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    q, s, z = gk.quantize_int4(gk.asarray(w), group=128)
    deq = f64(gk.dequantize_int4(q, s, z, group=128))
    xs = f64(gk.asarray(RNG.standard_normal((2, k)).astype(np.float32)).astype("bfloat16").astype("float32"))
    zn, sn = f64(z), f64(s)
    wrong = deq.copy()
    wrong[:, 0:128] -= (zn[:, 2:3] - zn[:, 0:1]) * sn[:, 0:1]  # block 0 decoded with block 2's zero point
    d = np.abs(xs @ wrong.T - xs @ deq.T)
    moved = np.any(zn[:, 2] != zn[:, 0])
    assert moved and np.mean((d > tol_of(xs, deq))[:, zn[:, 2] != zn[:, 0]]) > 0.9


@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_kb2_same_bits_as_48(n, k):
    """int4 g128, bf16 x: 59 and 60 = 48 bit for bit at M = 1, 3, 8 (the default until session 15), within the
    float64 bound; a second call gives the same bits."""
    fn, deq, xdt = make("int4_128", n, k)
    x, xs = make_x(k, xdt)
    for m in (1, 3, 8):
        b48 = call(fn, x[:m], V48)
        within(f"48 n={n} k={k} M={m}", b48, xs[:m] @ deq.T, tol_of(xs[:m], deq))
        for v in (KB2_R4, KB2_R3):
            got = call(fn, x[:m], v)
            within(f"{v} n={n} k={k} M={m}", got, xs[:m] @ deq.T, tol_of(xs[:m], deq))
            same_bits(f"n={n} k={k} M={m}: {v} vs 48", got, b48)
            if m == 1:
                same_bits(f"n={n} k={k} M=1: {v} second call", call(fn, x[:1], v), got)


@cuda
@pytest.mark.parametrize("n,k", [(4099, 1536), (300, 14336)])
def test_kb2_x_view_and_out_dtype(n, k):
    """M = 1 with x a view into a wider array (not its first row): 59 / 60 = 48; the output in x's dtype is
    48's too."""
    fn, deq, xdt = make("int4_128", n, k)
    big = gk.asarray(RNG.standard_normal((3, k + 64)).astype(np.float32)).astype(xdt)
    xs = f64(big.astype("float32"))[1:2, :k]
    xv = big.to("cuda")[1:2, :k]
    b48 = call(fn, xv, V48)
    within(f"48 view n={n} k={k}", b48, xs @ deq.T, tol_of(xs, deq))
    for v in (KB2_R4, KB2_R3):
        same_bits(f"view n={n} k={k}: {v} vs 48", call(fn, xv, v), b48)
        gk._C._gemv_set_variant(v)
        try:
            got = f64(fn(xv).astype("float32"))
        finally:
            gk._C._gemv_set_variant(0)
        gk._C._gemv_set_variant(V48)
        try:
            ref = f64(fn(xv).astype("float32"))
        finally:
            gk._C._gemv_set_variant(0)
        same_bits(f"view n={n} k={k}: {v} vs 48 in {xdt}", got, ref)


@cuda
@pytest.mark.parametrize("fmt", ["int4_64", "int4_32", "nvf4", "int4_128_f16"])
def test_kb2_other_formats_run_the_default(fmt):
    """59 / 60 change int4 g128 with bf16 x only: elsewhere the default's bits."""
    for n, k in [(2051, 1024), (300, 14336)]:
        fn, deq, xdt = make(fmt, n, k)
        x, xs = make_x(k, xdt)
        for m in (1, 8):
            d = call(fn, x[:m], 0)
            within(f"{fmt} default n={n} k={k} M={m}", d, xs[:m] @ deq.T, tol_of(xs[:m], deq))
            for v in (KB2_R4, KB2_R3):
                same_bits(f"{fmt} n={n} k={k} M={m}: {v} vs the default", call(fn, x[:m], v), d)


@cuda
def test_env_variant_switch():
    """GPUKIT_GEMV_W4_VARIANT=V runs variant V's configuration where the process variant is 0: 59 gives 59's
    (48's) bits, 53 gives 53's bits; the probes and out-of-range values are refused by name."""
    n, k = 300, 14336
    fn, deq, xdt = make("int4_128", n, k)
    x, xs = make_x(k, xdt)
    try:
        for v in (59, 53):
            os.environ["GPUKIT_GEMV_W4_VARIANT"] = str(v)
            for m in (1, 8):
                got = call(fn, x[:m], 0)
                within(f"env {v} M={m}", got, xs[:m] @ deq.T, tol_of(xs[:m], deq))
                del os.environ["GPUKIT_GEMV_W4_VARIANT"]
                same_bits(f"env {v} M={m} vs variant {v}", got, call(fn, x[:m], v))
                os.environ["GPUKIT_GEMV_W4_VARIANT"] = str(v)
        for bad in ("7", "56", "67", "2", "abc", "59x"):
            os.environ["GPUKIT_GEMV_W4_VARIANT"] = bad
            with pytest.raises(ValueError, match="GPUKIT_GEMV_W4_VARIANT"):
                call(fn, x[:1], 0)
    finally:
        os.environ.pop("GPUKIT_GEMV_W4_VARIANT", None)
    gk.cuda.synchronize()
    within("after the env tests", call(fn, x[:1], 0), xs[:1] @ deq.T, default_tol(xs[:1], deq, True))
