"""Session 7's probe of the staged GGUF GEMV (src/cuda/quant_gguf_st_probe.cuh, the knob's V 37 / 38 of
GPUKIT_GEMV_GGUF: the copies alone in 128-byte-line-aligned windows of 256 / 512 bytes per row, on the
format's plan). Benchmarking only (no decode), so the tests check what it must still guarantee: it runs on
every format and shape class (ragged N, split-K, Q6_K rows whose starts are not line-aligned) without a
fault, writes every output (zeros, into NaN-poisoned memory, also through the split-K sum), and the next
normal call is exact again. Its rejections are in test_gguf_s6_cuda.py.

V 39 / 40 (session 7's k_ggst_aw) were removed in the session-8 prep (superseded by k_ggst_aw2: test_gguf_aw2_cuda.py);
the knob rejects them (test_gguf_s6_cuda.py). Skipped without a GPU."""
import numpy as np
import pytest

import gpukit as gk
from test_gguf_s6_cuda import run
from test_gguf_st_cuda import FMTS, check, make, xrows

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def staged_gguf(monkeypatch):
    """The GGUF formats here: the staged kernel, exact in x (GPUKIT_GGUF_IMMA=0: the integer kernel of that switch,
    session 17, has its own tests: test_gguf_imma_cuda.py)."""
    monkeypatch.setenv("GPUKIT_GGUF_IMMA", "0")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("knob", ["2,12,1,1,0,2,0,1,37", "2,12,1,1,0,2,0,1,38", "2,16,1,1,0,2,0,0,37",
                                  "2,12,1,1,0,2,0,2,38"])
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
            bad = np.argwhere(got != 0)
            assert len(bad) == 0, (f"{fmt} knob {knob} n={n} k={k} m={m}: {len(bad)} outputs not written as 0, "
                                   f"first {bad[0].tolist()} = {got[tuple(bad[0])]!r}")
            gk.synchronize()
            check(fmt, run(fmt, x, qc), xs, deq, qb, f"{fmt} after knob {knob} n={n} k={k} m={m}")
