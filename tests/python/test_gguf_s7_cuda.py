"""Session 7's probe of the staged GGUF GEMV (src/cuda/quant_gguf_st_probe.cuh, the knob's V 37 / 38 of
GPUKIT_GEMV_GGUF: the copies alone in 128-byte-line-aligned windows of 256 / 512 bytes per row, on the
format's plan). Benchmarking only (no decode), so the tests check what it must still guarantee: it runs on
every format and shape class (ragged N, split-K, Q6_K rows whose starts are not line-aligned) without a
fault, writes every output (zeros, into NaN-poisoned memory, also through the split-K sum), and the next
normal call is exact again. Its rejections are in test_gguf_s6_cuda.py.

V 40: k_ggst_aw's copies alone (Q8_0 / Q4_0 / Q4_1; zeros as above; Q4_K / Q6_K as V 39).
V 39 (src/cuda/quant_gguf_st_aw.cuh: Q8_0 / Q4_0 / Q4_1 with the shipped math and line-aligned window
copies): with the default's plan (the knob's UX as the shipped one: 0 for Q4_0 / Q4_1 below 132 x 8 row
tiles) the same bits as the default, and exact (Q4_1 with bf16 x: the fold bound); the other formats
run their default math. Skipped without a GPU."""
import numpy as np
import pytest

import gpukit as gk
from test_gguf_s6_cuda import FOLDED, check_fold, raw_blocks, run, same_bits
from test_gguf_st_cuda import FMTS, check, make, xrows

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("knob", ["2,12,1,1,0,2,0,1,37", "2,12,1,1,0,2,0,1,38", "2,16,1,1,0,2,0,0,37",
                                  "2,12,1,1,0,2,0,2,38", "2,12,1,1,0,2,0,1,40", "2,12,0,1,0,2,0,1,40"])
def test_s7_aligned_copies_run(fmt, knob):
    for n, k in ((300, 4096), (19, 14336), (16, 2048), (2051, 1024), (5, 6144)):
        if fmt == "q6_k" and k % 2048:
            continue
        q, deq, qb = make(fmt, n, k)
        qc = q.to("cuda")
        for m in (1, 3):
            xb, xs = xrows(m, k, "bfloat16")
            x = xb.to("cuda")
            got = gk.to_numpy(run(fmt, x, qc, 0, knob))
            assert got.shape == (m, n)
            if knob.endswith(",40") and fmt in ("q4_k", "q6_k"):  # V 40 = V 39 there: their default math
                (check_fold if fmt in FOLDED else check)(fmt, gk.asarray(got), xs, deq, qb,
                                                         f"{fmt} knob {knob} n={n} k={k} m={m}")
                continue
            bad = np.argwhere(got != 0)
            assert len(bad) == 0, (f"{fmt} knob {knob} n={n} k={k} m={m}: {len(bad)} outputs not written as 0, "
                                   f"first {bad[0].tolist()} = {got[tuple(bad[0])]!r}")
            gk.synchronize()
            check(fmt, run(fmt, x, qc), xs, deq, qb, f"{fmt} after knob {knob} n={n} k={k} m={m}")


# shapes: ragged N, split-K (few row tiles), K not a multiple of a ring, the lm-head rule (N > 132 x 8 x 16)
AW_SHAPES = [(300, 14336), (37, 4096), (133, 1280), (16, 2304), (1, 2048), (2051, 1024), (70, 6144), (17000, 512),
             (19, 256)]


def aw_knob(fmt, n):
    few = (n + 15) // 16 <= 132 * 8
    return f"2,12,{0 if few and fmt in ('q4_0', 'q4_1') else 1},1,0,2,0,1,39"


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("n,k", AW_SHAPES)
def test_s7_aw_same_bits(fmt, n, k):
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    knob = aw_knob(fmt, n)
    for m, dtype in ((1, "bfloat16"), (1, "float16"), (3, "bfloat16"), (8, "float16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = run(fmt, x, qc, 0, knob)
        what = f"{fmt} knob {knob} n={n} k={k} M={m} {dtype}"
        if fmt in FOLDED and dtype == "bfloat16":
            check_fold(fmt, got, xs, deq, qb, what)
        else:
            check(fmt, got, xs, deq, qb, what)
        same_bits(got, run(fmt, x, qc), what + " against the default")


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_s7_aw_raw_blocks(fmt):
    """Random-byte blocks (every code / scale value) and x with outliers: same bits as the default."""
    for n, k in ((300, 4096), (19, 14336)):
        q, deq, qb = raw_blocks(fmt, n, k)
        qc = q.to("cuda")
        xb, xs = xrows(2, k, "bfloat16")
        xn = gk.to_numpy(xb.astype("float32"))
        xn[:, ::97] *= 300.0
        x = gk.asarray(xn).astype("bfloat16").to("cuda")
        got = run(fmt, x, qc, 0, aw_knob(fmt, n))
        same_bits(got, run(fmt, x, qc), f"{fmt} raw blocks n={n} k={k} against the default")


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_s7_aw_other_formats_exact(fmt):
    """V 39 on Q4_K / Q6_K: their default OPT bits through the session-6 kernel (no aligned copies): exact."""
    n, k = 37, 4096
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    xb, xs = xrows(1, k, "float16")
    check(fmt, run(fmt, x=xb.to("cuda"), qc=qc, variant=0, knob="2,12,1,1,0,2,0,1,39"), xs, deq, qb, f"{fmt} V 39")
