"""Variant 61 of the staged 4-bit GEMV (session 9; int4 g128 with bf16 x at M = 1; off by default, NEW NUMERICS):
k_w4 MODE 14 (common/gemv_w4.cuh, helpers in common/gemv_w4_ops.cuh): each warp turns its stage's x (512 bf16
values) into fp16 times 2^e in place, e from the stage's largest |x| (that one lands in [2^14, 2^15)), decodes the
codes as fp16 (1024 + q by lop3; the odd nibbles in place as 1024 + 16 q, scaled by 1/16 in the fma that subtracts
64 + z: one shift per 8 codes instead of 3), multiplies on the f16 tensor cores with fp32 accumulation (as 48), and
puts 2^-e on the group scale (exact).

Error bound (float64 reference of the exact dequantization): the fp32 accumulation of 48, 2 (K + 2) 2^-24 |x| |W|,
plus the conversion of x: a bf16 value v of the stage scaled by 2^e is exact in fp16 where |v 2^e| >= 2^-14 (8
significant bits into 11) and off by at most 2^-25 below that (fp16's subnormals), i.e. by <= 2^-39 max |x_stage|
<= 2^-39 max |x_row| in x's units; where the stage's largest is below 2^-86 e stops at 100 (off by <= 2^-125).
So |y - ref| <= 2 (K + 2) 2^-24 (|x| |W|^T) + (2^-38 max |x_row| + 2^-124) sum_k |W[n, k]| (a factor 2 of room on
the conversion term). The products (q - z) x' are exact in fp16 x fp16, so no fp16 accumulation error enters (the
mma accumulates in fp32). M > 1 and the other formats / float16 x run 48 / the default: their bits are checked.
CPU tests (no GPU): the variant bound takes 61 (and 62 of session 10; refuses 67 since session 14), bench/gemv.py and bench/e2e.py take it, and the
bound sees x converted to fp16 without the scale (overflow / flushed values)."""
import math
import os
import pathlib

import numpy as np
import pytest

import gpukit as gk
from bench_ref import bench_gemv_lists, check_variant_bound, e2e_engines
from w4_ref import (bf16_out_is_rounded, bf16_x, call_f32, f64, graph_replays_same_bits, make_w4, poisoned_calls,
                    same_bits, within)

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(6161)
V48, V61 = 48, 61
ROOT = pathlib.Path(__file__).resolve().parents[2]
# N 37 / 300 / 2051 / 9000, K multiples of 128 up to 14336 (K % 512 != 0: the narrow kernel, the default's bits)
SHAPES = [(37, 4096), (300, 14336), (2051, 1024), (9000, 4096), (2051, 1536), (37, 14336), (300, 640), (9000, 128)]


def make(n, k, row_mag=None, group=128, xdt="bfloat16"):
    """(gemv on CUDA, float64 of the dequantized weights); row_mag: per-row magnitudes (rows of very different size)."""
    return make_w4(RNG, f"int4_{group}", n, k, row_mag=row_mag)


call = call_f32


def tol61(xs, deq):
    """The bound of the module docstring, per (m, n)."""
    acc = 2 * (xs.shape[1] + 2) * 2.0**-24 * (np.abs(xs) @ np.abs(deq).T)
    conv = (2.0**-38 * np.max(np.abs(xs), axis=1, keepdims=True) + 2.0**-124) * np.sum(np.abs(deq), axis=1)[None, :]
    return acc + conv + 1e-30


def bits_note(tag, a, b):
    """61 at M = 1 often gives 48's bits (x exact in fp16, products exact, 2^-e exact): printed, not required."""
    nd = int(np.sum(a != b))
    print(f"{tag}: 61 vs 48 differ at {nd} of {a.size}" + (f", max |diff| {np.max(np.abs(a - b)):.3g}" if nd else ""))


def hard_x(k, kind):
    """bf16-representable x rows (float32) of large / tiny / mixed magnitudes, per 512-element stage."""
    x = RNG.standard_normal(k).astype(np.float32)
    if kind == "huge":  # beyond fp16's range everywhere: needs e < 0
        x *= 3e6
    elif kind == "tiny":  # below fp16's normals everywhere: needs e > 14
        x *= 1e-12
    elif kind == "stages":  # one stage huge, one tiny, one zero, the rest ordinary
        x[:512] *= 1e5
        if k > 512:
            x[512:1024] *= 1e-9
        if k > 1024:
            x[1024:1536] = 0.0
    elif kind == "mixed":  # huge and tiny values in the same stage (the tiny ones lose bits: in the bound)
        x[::7] *= 4e4
        x[3::11] *= 1e-6
    elif kind == "denorm":  # a stage of bf16 subnormals and zeros only (e stops at 100)
        x[: min(k, 512)] = np.float32(1e-39) * np.sign(x[: min(k, 512)])
    return x


# ---- CPU (no GPU) ----

def test_variant_bound_takes_61():
    """gk._C._gemv_set_variant takes 0..62 and refuses 67 and -1 (the bound in src/ops/gemv.cpp; 62: session 10; 63-66:
    session 14)."""
    check_variant_bound(62, (67, -1))


def test_bench_gemv_lists_61():
    """bench/gemv.py runs 61 for int4 only and names it (read without importing: the bench needs a GPU)."""
    vals = bench_gemv_lists()
    assert 61 in vals["INT4_ONLY_VARIANTS"] and 61 in vals["W4_VARIANT_NAMES"]


def test_e2e_engine_option_w4v61():
    """bench/e2e.py's engine option +w4v61 sets GPUKIT_GEMV_W4_VARIANT=61 for that engine's run."""
    base, opt = e2e_engines().gk_engine("gk-graph+w4v61")
    assert base == "gk-graph" and opt["env"] == {"GPUKIT_GEMV_W4_VARIANT": "61"}


def test_bound_sees_unscaled_fp16():
    """The bound fails x converted to fp16 without the per-stage scale (huge values -> inf, tiny ones -> 0 or a few
    bits), and holds for the scaled conversion simulated in float64: the GPU checks below can fail."""
    n, k = 64, 2048
    w = (RNG.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
    q, s, z = gk.quantize_int4(gk.asarray(w), group=128)
    deq = f64(gk.dequantize_int4(q, s, z, group=128))
    for kind in ("huge", "tiny", "stages"):
        xs = f64(gk.asarray(hard_x(k, kind)[None, :]).astype("bfloat16").astype("float32"))
        ref = xs @ deq.T
        with np.errstate(over="ignore", invalid="ignore"):
            unscaled = xs.astype(np.float16).astype(np.float64) @ deq.T
        err = np.abs(unscaled - ref)
        assert not np.all(err <= tol61(xs, deq)), kind
        scaled = np.empty_like(xs)  # the kernel's conversion: per 512-element stage, largest in [2^14, 2^15)
        for j in range(0, k, 512):
            seg = xs[:, j:j + 512]
            mx = np.max(np.abs(seg))
            e = 0 if mx == 0 else min(14 - int(np.floor(np.log2(mx))), 100)
            scaled[:, j:j + 512] = (seg * 2.0**e).astype(np.float16).astype(np.float64) * 2.0**-e
        within(f"simulated 61 {kind}", scaled @ deq.T, ref, tol61(xs, deq))


# ---- GPU ----

@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_half_within_bound(n, k):
    """M = 1: 61 within the float64 bound; M = 3, 8: 48's bits (M > 1 runs 48's kernel); same bits on a second
    call; 61 vs 48 at M = 1 printed."""
    fn, deq = make(n, k)
    x, xs = bf16_x(RNG.standard_normal((8, k)))
    got = call(fn, x[:1], V61)
    within(f"61 n={n} k={k} M=1", got, xs[:1] @ deq.T, tol61(xs[:1], deq))
    same_bits(f"61 n={n} k={k} M=1 second call", call(fn, x[:1], V61), got)
    bits_note(f"n={n} k={k}", got, call(fn, x[:1], V48))
    for m in (3, 8):
        same_bits(f"61 n={n} k={k} M={m} vs 48", call(fn, x[:m], V61), call(fn, x[:m], V48))


@cuda
@pytest.mark.parametrize("kind", ["huge", "tiny", "stages", "mixed", "denorm"])
@pytest.mark.parametrize("n,k", [(2051, 4096), (300, 14336)])
def test_half_x_magnitudes(n, k, kind):
    """x of large (beyond fp16), tiny (below fp16's normals), per-stage different, in-stage mixed and subnormal
    magnitudes, on rows of very different magnitudes (1e-3 .. 1e3): within the bound, all finite."""
    mags = 10.0 ** RNG.uniform(-3, 3, n)
    fn, deq = make(n, k, row_mag=mags)
    x, xs = bf16_x(hard_x(k, kind)[None, :])
    got = call(fn, x, V61)
    assert np.all(np.isfinite(got)), f"{kind}: {int(np.sum(~np.isfinite(got)))} non-finite outputs"
    within(f"61 {kind} n={n} k={k}", got, xs @ deq.T, tol61(xs, deq))
    same_bits(f"61 {kind} second call", call(fn, x, V61), got)


@cuda
def test_half_poisoned_output_and_view():
    """The output buffer reused from a NaN-filled allocation of the same size (the caching allocator): every row
    written; x a view into a wider array (not its first row); bf16 output = 61's float32 rounded."""
    n, k = 2051, 4096
    fn, deq = make(n, k)
    big = gk.asarray(RNG.standard_normal((3, k + 64)).astype(np.float32)).astype("bfloat16")
    xs = f64(big.astype("float32"))[1:2, :k]
    xv = big.to("cuda")[1:2, :k]
    got = poisoned_calls(fn, xv, V61, n, lambda y: within("61 view", y, xs @ deq.T, tol61(xs, deq)))
    bf16_out_is_rounded("61 bf16 out vs float32 rounded", fn, xv, V61, got)


@cuda
def test_half_graph_replay():
    """61 captured in a graph (the process variant is read at capture), replayed twice: the eager bits."""
    n, k = 9000, 4096
    fn, deq = make(n, k)
    x, xs = bf16_x(RNG.standard_normal((1, k)))
    ref = call(fn, x, V61)
    graph_replays_same_bits("61 graph replay", fn, x, V61, ref)


@cuda
def test_half_env_switch_and_other_formats():
    """GPUKIT_GEMV_W4_VARIANT=61 gives variant 61's bits; int4 g64 / g32 and float16 x under 61 run the default."""
    n, k = 300, 14336
    fn, deq = make(n, k)
    x, xs = bf16_x(RNG.standard_normal((1, k)))
    try:
        os.environ["GPUKIT_GEMV_W4_VARIANT"] = "61"
        env = call(fn, x, 0)
    finally:
        del os.environ["GPUKIT_GEMV_W4_VARIANT"]
    same_bits("env 61 vs variant 61", env, call(fn, x, V61))
    for group, xdt in ((64, "bfloat16"), (32, "bfloat16"), (128, "float16")):
        fo, deqo = make(2051, 1024, group=group)
        xo, _ = bf16_x(RNG.standard_normal((8, 1024)), xdt)
        for m in (1, 8):
            same_bits(f"g{group} {xdt} M={m}: 61 vs the default", call(fo, xo[:m], V61), call(fo, xo[:m], 0))
