"""Session 7 (gguf8): k_ggst_aw6, Q6_K through line-aligned window copies (src/cuda/quant_gguf_st_aw6.cuh):
the knob's V 45 (its copies alone: V 46; the other formats: as V 43 / 44) and the switch
GPUKIT_GGUF_AW with q6_k listed. Its 420-byte units lie at any byte offset of a 896-byte ring; a block
that crosses the ring's end is decoded with its addresses taken back (the wrap path). Kept apart from
test_gguf_aw2_cuda.py so that a failure here leaves the other formats' results standing.

- V 45 with the default's plan: the same bits as the default (Q6_K: quad-shared scales, byte permutes
  with immediate selectors) and exact against float64 products with the exact dequantization, at
  ragged N, split-K, long K (every unit phase 0 / 4 / 8 / 12 and many trips around the ring, so both
  blocks take the wrap path at some offsets), the lm-head rule, M 1 / 3 / 8, bf16 and fp16 x;
  random-byte blocks with x outliers.
- GPUKIT_GGUF_AW=q6_k (and d:q6_k,q8_0): the default through it: the same bits.
- V 46: no fault, every output written (zeros into NaN-poisoned memory, split-K included); the next
  normal call exact. Skipped without a GPU."""
import os

import numpy as np
import pytest

import gpukit as gk
from test_gguf_s6_cuda import run, same_bits
from test_gguf_st_cuda import check, make, xrows, staged_gguf  # noqa: F401 (the autouse fixture)

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")

SHAPES = [(300, 14336), (37, 4096), (16, 2048), (2051, 2048), (70, 6144), (17000, 2048), (33, 32768), (1, 4096),
          (19, 55296)]
KNOB = "2,12,1,1,0,2,0,1,45"


@pytest.mark.parametrize("n,k", SHAPES)
def test_aw6_same_bits(n, k):
    q, deq, qb = make("q6_k", n, k)
    qc = q.to("cuda")
    for m, dtype in ((1, "bfloat16"), (1, "float16"), (3, "bfloat16"), (8, "float16"), (8, "bfloat16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = run("q6_k", x, qc, 0, KNOB)
        what = f"q6_k knob {KNOB} n={n} k={k} M={m} {dtype}"
        check("q6_k", got, xs, deq, qb, what)
        same_bits(got, run("q6_k", x, qc), what + " against the default")


def test_aw6_raw_blocks():
    """Random bytes for every code and scale (d kept finite) and x with outliers: same bits."""
    rng = np.random.default_rng(606)
    for n, k in ((300, 4096), (19, 14336)):
        q, _, _ = make("q6_k", n, k)
        qn = gk.to_numpy(q).copy()
        b = qn.reshape(n, -1, 210)
        b[..., :208] = rng.integers(0, 256, size=b[..., :208].shape)
        qc = gk.asarray(qn).to("cuda")
        xb, xs = xrows(2, k, "bfloat16")
        xn = gk.to_numpy(xb.astype("float32"))
        xn[:, ::97] *= 300.0
        x = gk.asarray(xn).astype("bfloat16").to("cuda")
        same_bits(run("q6_k", x, qc, 0, KNOB), run("q6_k", x, qc), f"q6_k raw blocks n={n} k={k} against the default")


@pytest.mark.parametrize("value", ["q6_k", "d:q6_k,q8_0"])
def test_aw6_switch_same_bits(value):
    for n, k in ((300, 4096), (17000, 2048)):
        q, deq, qb = make("q6_k", n, k)
        qc = q.to("cuda")
        xb, xs = xrows(3, k, "bfloat16")
        x = xb.to("cuda")
        os.environ["GPUKIT_GGUF_AW"] = value
        try:
            got = run("q6_k", x, qc)
        finally:
            del os.environ["GPUKIT_GGUF_AW"]
        what = f"q6_k GPUKIT_GGUF_AW={value} n={n} k={k}"
        check("q6_k", got, xs, deq, qb, what)
        same_bits(got, run("q6_k", x, qc), what + " against the default")


def test_aw6_copies_alone_run():
    knob = "2,12,1,1,0,2,0,1,46"
    for n, k in ((300, 4096), (19, 14336), (16, 2048), (2051, 2048), (5, 6144)):
        q, deq, qb = make("q6_k", n, k)
        qc = q.to("cuda")
        for m in (1, 3):
            xb, xs = xrows(m, k, "bfloat16")
            x = xb.to("cuda")
            g = gk.to_numpy(run("q6_k", x, qc, 0, knob))
            assert g.shape == (m, n)
            bad = np.argwhere(g != 0)
            assert len(bad) == 0, f"knob {knob} n={n} k={k} m={m}: {len(bad)} outputs not 0, first {bad[0].tolist()}"
            gk.synchronize()
            check("q6_k", run("q6_k", x, qc), xs, deq, qb, f"q6_k after knob {knob} n={n} k={k} m={m}")


@pytest.mark.parametrize("wt,sp", [(16, 1), (12, 0), (12, 2)])
def test_aw6_other_plans_exact(wt, sp):
    for n, k in ((300, 4096), (2051, 2048), (40, 14336)):
        q, deq, qb = make("q6_k", n, k)
        qc = q.to("cuda")
        knob = f"2,{wt},1,1,0,2,0,{sp},45"
        for m, dtype in ((1, "bfloat16"), (5, "float16")):
            xb, xs = xrows(m, k, dtype)
            check("q6_k", run("q6_k", xb.to("cuda"), qc, 0, knob), xs, deq, qb, f"q6_k knob {knob} n={n} k={k} M={m}")
