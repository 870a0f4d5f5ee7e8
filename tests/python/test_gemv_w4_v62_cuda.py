"""Variant 62 of the staged 4-bit GEMV (session 10; int4 g128 with bf16 x; off by default; 48's bits):
k_w4 MODE 15 (common/gemv_w4.cuh) at M = 1 is 48's kernel (MODE 11: x copied with the codes and paired in place
once per stage, a ring of 2, 48's plan) with two changes that leave the arithmetic alone:
- the next stage's copies are issued BEFORE the wait for this stage's bytes (48: wait, pair x, then issue), into the
  slot the previous stage held (its reads end at the __syncwarp before the copies), then cp.async.wait_group 1:
  a waiting warp has two stages in flight instead of one;
- a full stage's code / scale / zero-point copies come from addresses computed once (LEAN's copies of MODE 3:
  no per-stage row clamps, predicates or byte counts), its x copies without per-chunk predicates.
A wrong group count or a missing __syncwarp shows as wrong values at some shapes (a stage read before its bytes
landed, or overwritten while read): compared bit for bit against 48 at every shape below.
So 62 must give 48's bits at every shape: the tests compare bit for bit (and against the float64 bound
2 (K + 2) 2^-24 sum |x| |w| with diagnostics). M > 1 runs 48's M > 1 kernel (MODE 0 on the same plan): 48's bits;
K % 512 != 0 runs the narrow kernel (the default's, as under 48); int4 g64 / g32 and float16 x under 62 run what
they run under 48. CPU tests (no GPU): the variant bound takes 62 (refuses 67; 63-66: session 14), bench/gemv.py lists and names 62,
bench/e2e.py's +w4v62 sets GPUKIT_GEMV_W4_VARIANT=62."""
import os
import pathlib

import numpy as np
import pytest

import gpukit as gk
from bench_ref import bench_gemv_lists, check_variant_bound, e2e_engines
from w4_ref import (bf16_out_is_rounded, bf16_x, bound_f32, call_f32, f64, graph_replays_same_bits, make_w4,
                    poisoned_calls, same_bits, within)

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(6262)
V48, V62 = 48, 62
ROOT = pathlib.Path(__file__).resolve().parents[2]
call = call_f32
# (N, K): odd N; K = 4096 / 14336 (the layer shapes' K), 512 (one stage), 1536 / 2560 (odd stage counts: the ring's
# parity), 640 / 4224 (K % 512 != 0: the narrow kernel, not a multiple of the 4-block stage)
SHAPES = [(4097, 4096), (2051, 14336), (37, 14336), (301, 512), (9000, 1536), (2051, 2560), (37, 640), (301, 4224),
          (14336, 4096)]


def make(n, k, group=128):
    return make_w4(RNG, f"int4_{group}", n, k)


# ---- CPU (no GPU) ----

def test_variant_bound_takes_62():
    """gk._C._gemv_set_variant takes 0..62 and refuses 67 and -1 (the bound in src/ops/gemv.cpp)."""
    check_variant_bound(62, (67, -1))


def test_bench_gemv_lists_62():
    """bench/gemv.py runs 62 for int4 only and names it (read without importing: the bench needs a GPU)."""
    vals = bench_gemv_lists()
    assert 62 in vals["INT4_ONLY_VARIANTS"] and 62 in vals["W4_VARIANT_NAMES"]


def test_e2e_engine_option_w4v62():
    """bench/e2e.py's engine option +w4v62 sets GPUKIT_GEMV_W4_VARIANT=62 for that engine's run."""
    base, opt = e2e_engines().gk_engine("gk-graph+w4v62")
    assert base == "gk-graph" and opt["env"] == {"GPUKIT_GEMV_W4_VARIANT": "62"}


# ---- GPU ----

@cuda
@pytest.mark.parametrize("n,k", SHAPES)
def test_v62_is_48_bit_for_bit(n, k):
    """M = 1: 62 = 48 bit for bit and within the float64 bound; a second call the same bits; M = 3 / 8: 62 = 48."""
    fn, deq = make(n, k)
    x, xs = bf16_x(RNG.standard_normal((8, k)))
    got = call(fn, x[:1], V62)
    within(f"62 n={n} k={k} M=1", got, xs[:1] @ deq.T, bound_f32(xs[:1], deq))
    same_bits(f"62 vs 48 n={n} k={k} M=1", got, call(fn, x[:1], V48))
    same_bits(f"62 n={n} k={k} M=1 second call", call(fn, x[:1], V62), got)
    for m in (3, 8):
        got_m = call(fn, x[:m], V62)
        within(f"62 n={n} k={k} M={m}", got_m, xs[:m] @ deq.T, bound_f32(xs[:m], deq))
        same_bits(f"62 vs 48 n={n} k={k} M={m}", got_m, call(fn, x[:m], V48))


@cuda
def test_v62_row_magnitudes_and_x_scales():
    """Rows of magnitudes 1e-3 .. 1e3 and x of very different size per stage (1e5 / 1e-9 / 0 / 1): 48's bits."""
    n, k = 2051, 4096
    fn, deq = make(n, k)
    xf = RNG.standard_normal((1, k)).astype(np.float32)
    xf[0, :512] *= 1e5
    xf[0, 512:1024] *= 1e-9
    xf[0, 1024:1536] = 0.0
    x, xs = bf16_x(xf)
    got = call(fn, x, V62)
    within("62 stage magnitudes", got, xs @ deq.T, bound_f32(xs, deq))
    same_bits("62 vs 48 stage magnitudes", got, call(fn, x, V48))


@cuda
def test_v62_poisoned_output_and_strided_x():
    """The output buffer reused from a NaN-filled allocation of the same size (the caching allocator): every row
    written; x a strided view (row 1 of a wider array, a row stride of k + 64); bf16 output = float32 rounded."""
    n, k = 4097, 14336
    fn, deq = make(n, k)
    big = gk.asarray(RNG.standard_normal((3, k + 64)).astype(np.float32)).astype("bfloat16")
    xs = f64(big.astype("float32"))[1:2, :k]
    xv = big.to("cuda")[1:2, :k]
    xc = gk.asarray(np.ascontiguousarray(gk.to_numpy(big)[1:2, :k])).to("cuda")
    got = poisoned_calls(fn, xv, V62, n, lambda y: within("62 strided view", y, xs @ deq.T, bound_f32(xs, deq)))
    same_bits("62 strided view vs contiguous copy", got, call(fn, xc, V62))
    same_bits("62 strided view vs 48", got, call(fn, xv, V48))
    bf16_out_is_rounded("62 bf16 out vs float32 rounded", fn, xv, V62, got)


@cuda
def test_v62_graph_replay():
    """62 captured in a graph (the process variant is read at capture), replayed twice: the eager bits (= 48's)."""
    n, k = 14336, 4096
    fn, deq = make(n, k)
    x, xs = bf16_x(RNG.standard_normal((1, k)))
    ref = call(fn, x, V62)
    same_bits("62 eager vs 48", ref, call(fn, x, V48))
    graph_replays_same_bits("62 graph replay", fn, x, V62, ref)


@cuda
def test_v62_env_switch_and_other_formats():
    """GPUKIT_GEMV_W4_VARIANT=62 gives variant 62's bits; int4 g64 / g32 and float16 x under 62 give 48's bits
    (what they run under 48)."""
    n, k = 301, 14336
    fn, deq = make(n, k)
    x, xs = bf16_x(RNG.standard_normal((1, k)))
    try:
        os.environ["GPUKIT_GEMV_W4_VARIANT"] = "62"
        env = call(fn, x, 0)
    finally:
        del os.environ["GPUKIT_GEMV_W4_VARIANT"]
    same_bits("env 62 vs variant 62", env, call(fn, x, V62))
    for group, xdt in ((64, "bfloat16"), (32, "bfloat16"), (128, "float16")):
        fo, deqo = make(2051, 1024, group=group)
        xo, xos = bf16_x(RNG.standard_normal((8, 1024)), xdt)
        for m in (1, 8):
            got = call(fo, xo[:m], V62)
            within(f"g{group} {xdt} M={m} under 62", got, xos[:m] @ deqo.T, bound_f32(xos[:m], deqo))
            same_bits(f"g{group} {xdt} M={m}: 62 vs 48", got, call(fo, xo[:m], V48))
