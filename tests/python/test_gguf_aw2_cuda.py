"""Session 7 (gguf8): k_ggst_aw2, the staged GGUF GEMV with line-aligned window copies at low per-unit
cost (src/cuda/quant_gguf_st_aw2.cuh): the knob's V 41 (Q8_0 / Q4_0 / Q4_1 / Q4_K with the shipped math;
Q6_K: its shipped kernel), V 42 (its copies alone: zeros, benchmarking), V 43 / 44 (the same with the
run-time wait, DYN), and the switch GPUKIT_GGUF_AW that runs the shipped defaults through it.

- V 41 / 43 with the default's plan (the knob's UX as the shipped one: 0 for Q4_0 / Q4_1 below 132 x 8 row
  tiles, 0 for Q4_K, 1 otherwise): the same bits as the default and exact (against float64 products
  with the exact dequantization; Q4_1 / Q4_K with bf16 x: the fold bound of test_gguf_st_cuda.check),
  at ragged N, split-K, K = 256 (a single unit), long K (many trips around the ring), M 1 / 3 / 8,
  bf16 and fp16 x; random-byte blocks with x outliers.
- GPUKIT_GGUF_AW=1 / d / a format list (d:...): every format's default the same bits as without it (N 300 and the
  lm-head rule N 17000); a bad value a ValueError naming the variable.
- V 42 / 44: no fault on every format and shape class, every output written (zeros into NaN-poisoned
  memory, split-K included; Q6_K: its default math, exact); the next normal call exact.
- Other plans through V 41 / 43 (WT 16 / 24, SP 0 / 2): exact.
- Session 8 prep (gguf9): V 47 / GPUKIT_GGUF_AW=o (V 43 with the magic bytes opaque to ptxas, kOptOpq: the
  same values, so the same bits as the default, in the same-bits, raw-block and switch tests above), V 48 /
  GPUKIT_GGUF_AW=e (V 47 with the freed windows issued before the next unit's decode: the same bits); the
  compiled default (Q8_0 through V 43 on every shape, Q6_K through V 45 on the lm-head) the same bits as
  GPUKIT_GGUF_AW=d / d:q6_k and =0.
Skipped without a GPU."""
import os

import numpy as np
import pytest

import gpukit as gk
from test_gguf_s6_cuda import raw_blocks, run, same_bits
from test_gguf_st_cuda import FMTS, check, make, xrows, staged_gguf  # noqa: F401 (the autouse fixture)

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")

AW_FMTS = ["q8_0", "q4_0", "q4_1", "q4_k"]
# ragged N, split-K (few row tiles), K = 256, long K, the lm-head rule (N > 132 x 8 x 16)
SHAPES = [(300, 14336), (37, 4096), (133, 1280), (16, 2304), (1, 2048), (2051, 1024), (70, 6144), (17000, 512),
          (19, 256), (33, 32768)]


def default_ux(fmt, n):
    few = (n + 15) // 16 <= 132 * 8
    if fmt == "q4_k":
        return 0
    return 0 if few and fmt in ("q4_0", "q4_1") else 1


def aw2_knob(fmt, n, v=41, wt=12, sp=1):
    return f"2,{wt},{default_ux(fmt, n)},1,0,2,0,{sp},{v}"


def with_aw(value, fn):
    os.environ["GPUKIT_GGUF_AW"] = value
    try:
        return fn()
    finally:
        del os.environ["GPUKIT_GGUF_AW"]


@pytest.mark.parametrize("v", [41, 43, 47, 48])
@pytest.mark.parametrize("fmt", AW_FMTS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_aw2_same_bits(fmt, n, k, v):
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    knob = aw2_knob(fmt, n, v)
    for m, dtype in ((1, "bfloat16"), (1, "float16"), (3, "bfloat16"), (8, "float16"), (8, "bfloat16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = run(fmt, x, qc, 0, knob)
        what = f"{fmt} knob {knob} n={n} k={k} M={m} {dtype}"
        check(fmt, got, xs, deq, qb, what)
        same_bits(got, run(fmt, x, qc), what + " against the default")
        same_bits(got, run(fmt, x, qc, 0, knob), what + " run again")


@pytest.mark.parametrize("v", [41, 43, 47, 48])
@pytest.mark.parametrize("fmt", AW_FMTS)
def test_aw2_raw_blocks(fmt, v):
    """Random-byte blocks (every code / scale / min value) and x with outliers: same bits as the default."""
    for n, k in ((300, 4096), (19, 14336)):
        if fmt == "q4_k":
            q, deq, qb = make(fmt, n, k)
            qn = gk.to_numpy(q).copy()
            rng = np.random.default_rng(808)
            qn.reshape(n, -1, 144)[..., 4:] = rng.integers(0, 256, size=qn.reshape(n, -1, 144)[..., 4:].shape)
            q = gk.asarray(qn)
        else:
            q, deq, qb = raw_blocks(fmt, n, k)
        qc = q.to("cuda")
        xb, xs = xrows(2, k, "bfloat16")
        xn = gk.to_numpy(xb.astype("float32"))
        xn[:, ::97] *= 300.0
        x = gk.asarray(xn).astype("bfloat16").to("cuda")
        got = run(fmt, x, qc, 0, aw2_knob(fmt, n, v))
        same_bits(got, run(fmt, x, qc), f"{fmt} V {v} raw blocks n={n} k={k} against the default")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("value", ["1", "d", "o", "e", "q8_0,q4_0,q4_1,q4_k", "d:q4_k,q8_0"])
def test_aw2_switch_same_bits(fmt, value):
    """The switch runs the defaults through k_ggst_aw2 (Q6_K unchanged: it is not listed; its aligned
    kernel: test_gguf_aw6_cuda.py): the same bits, exact."""
    for n, k in ((300, 4096), (17000, 256 if fmt != "q6_k" else 2048)):
        q, deq, qb = make(fmt, n, k)
        qc = q.to("cuda")
        for m, dtype in ((1, "bfloat16"), (3, "float16")):
            xb, xs = xrows(m, k, dtype)
            x = xb.to("cuda")
            got = with_aw(value, lambda: run(fmt, x, qc))
            what = f"{fmt} GPUKIT_GGUF_AW={value} n={n} k={k} M={m} {dtype}"
            check(fmt, got, xs, deq, qb, what)
            same_bits(got, with_aw("0", lambda: run(fmt, x, qc)), what + " against GPUKIT_GGUF_AW=0")
            same_bits(got, run(fmt, x, qc), what + " against the compiled default")


@pytest.mark.parametrize("fmt,n,k", [("q8_0", 300, 4096), ("q8_0", 37, 14336), ("q8_0", 17000, 512),
                                     ("q8_0", 2051, 1024), ("q6_k", 17000, 2048), ("q6_k", 300, 4096)])
def test_aw2_compiled_default_same_bits(fmt, n, k):
    """Session 8 prep (gguf9): the compiled default runs Q8_0 through k_ggst_aw2 with the run-time wait on
    every shape (kAwDefault = kAwDefaultMany = Q8_0, kAwDefaultDyn) and Q6_K through k_ggst_aw6 on the
    lm-head (kAwDefaultMany): the unset switch must give the bits of GPUKIT_GGUF_AW=d (Q8_0) / d:q6_k (Q6_K)
    and of GPUKIT_GGUF_AW=0 (the session-7 default kernel), and be exact."""
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    on = "d" if fmt == "q8_0" else "d:q6_k"
    for m, dtype in ((1, "bfloat16"), (1, "float16"), (3, "bfloat16"), (8, "float16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = run(fmt, x, qc)
        what = f"{fmt} compiled default n={n} k={k} M={m} {dtype}"
        check(fmt, got, xs, deq, qb, what)
        same_bits(got, with_aw(on, lambda: run(fmt, x, qc)), what + f" against GPUKIT_GGUF_AW={on}")
        same_bits(got, with_aw("0", lambda: run(fmt, x, qc)), what + " against GPUKIT_GGUF_AW=0")
        same_bits(got, run(fmt, x, qc), what + " run again")


@pytest.mark.parametrize("value", ["2", "q5_0", "q8_0,", "yes", "d:", "D", "O", "o:q4_0", "E"])
def test_aw2_switch_rejects(value):
    q, _, _ = make("q4_0", 16, 256)
    x = gk.asarray(np.ones((1, 256), np.float32)).astype("bfloat16").to("cuda")
    with pytest.raises(ValueError, match="GPUKIT_GGUF_AW"):
        with_aw(value, lambda: gk.gemv_q4_0(x, q.to("cuda")))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("ux,v", [(1, 42), (0, 42), (1, 44), (0, 44)])
def test_aw2_copies_alone_run(fmt, ux, v):
    knob = f"2,12,{ux},1,0,2,0,1,{v}"
    for n, k in ((300, 4096), (19, 14336), (16, 2048), (2051, 1024), (5, 6144)):
        if fmt == "q6_k" and k % 2048:
            continue
        q, deq, qb = make(fmt, n, k)
        qc = q.to("cuda")
        for m in (1, 3):
            xb, xs = xrows(m, k, "bfloat16")
            x = xb.to("cuda")
            got = run(fmt, x, qc, 0, knob)
            what = f"{fmt} knob {knob} n={n} k={k} m={m}"
            if fmt == "q6_k":  # V 42 / 44 = V 41 there: its default math
                check(fmt, got, xs, deq, qb, what)
                continue
            g = gk.to_numpy(got)
            assert g.shape == (m, n)
            bad = np.argwhere(g != 0)
            assert len(bad) == 0, f"{what}: {len(bad)} outputs not written as 0, first {bad[0].tolist()} = {g[tuple(bad[0])]!r}"
            gk.synchronize()
            check(fmt, run(fmt, x, qc), xs, deq, qb, f"{fmt} after knob {knob} n={n} k={k} m={m}")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("wt,sp,v", [(16, 1, 41), (12, 0, 41), (12, 2, 43), (24, 1, 43), (16, 1, 48), (12, 0, 48)])
def test_aw2_other_plans_exact(fmt, wt, sp, v):
    for n, k in ((300, 4096), (2051, 1024), (40, 14336)):
        if fmt == "q6_k" and k % 2048:
            continue
        q, deq, qb = make(fmt, n, k)
        qc = q.to("cuda")
        knob = aw2_knob(fmt, n, v, wt, sp)
        for m, dtype in ((1, "bfloat16"), (5, "float16")):
            xb, xs = xrows(m, k, dtype)
            got = run(fmt, xb.to("cuda"), qc, 0, knob)
            check(fmt, got, xs, deq, qb, f"{fmt} knob {knob} n={n} k={k} M={m} {dtype}")
