"""Session 8 (gguf10): GPUKIT_GGUF_LA, the staged GGUF kernel k_ggst with line-aligned copy lanes (kOptLA in
src/cuda/quant_gguf_st_plan.cuh). A stage's chunks go to the lanes by their address (lane l % 8: the chunks at
16 (l % 8) of each 128-byte line) instead of by their place in the stage; the set of chunks and their shared
offsets are unchanged, so the decode reads the same bytes and the results must be the same bits.

- "1": the shipped configuration of Q4_0 / Q4_1 / Q4_K (and Q8_0's with GPUKIT_GGUF_AW=0; Q6_K and the
  aw2 / aw6 paths unchanged) with the aligned lanes: the same bits as without it and exact (float64 products
  with the exact dequantization) at N 37 / 300 / 2051 / 17000 (split-K, ragged tiles, the lm-head rule),
  K 256-multiples up to 14336 (partial last stages, ragged per-warp runs), M 1 / 3 / 8, bf16 and fp16 x;
  random-byte blocks; rows whose starts are at every 16-byte offset of a line (strided views); graph replay.
- "p": variant 7's copies alone with the aligned lanes (zeros, benchmarking): no fault, every output written,
  the next call exact.
- a bad value: a ValueError naming the variable.
Skipped without a GPU."""
import os

import numpy as np
import pytest

import gpukit as gk
from test_gguf_s6_cuda import raw_blocks, run, same_bits
from test_gguf_st_cuda import FMTS, check, make, xrows, staged_gguf  # noqa: F401 (the autouse fixture)

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")

SHAPES = [(37, 14336), (300, 4096), (2051, 1024), (17000, 256), (300, 2304), (19, 256), (133, 1280),
          (300, 14336)]
CASES = ((1, "bfloat16"), (1, "float16"), (3, "bfloat16"), (8, "float16"), (8, "bfloat16"))


def with_env(env, fn):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def base_env(fmt):
    # Q8_0's default is k_ggst_aw2 (untouched by the switch): its k_ggst path with GPUKIT_GGUF_AW=0
    return {"GPUKIT_GGUF_AW": "0"} if fmt == "q8_0" else {}


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_la_same_bits(fmt, n, k):
    if fmt == "q6_k" and k % 2048:
        k = 2048
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    env = base_env(fmt)
    for m, dtype in CASES:
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = with_env({**env, "GPUKIT_GGUF_LA": "1"}, lambda: run(fmt, x, qc))
        what = f"{fmt} GPUKIT_GGUF_LA=1 {env} n={n} k={k} M={m} {dtype}"
        check(fmt, got, xs, deq, qb, what)
        same_bits(got, with_env(env, lambda: run(fmt, x, qc)), what + " against the switch off")
        same_bits(got, with_env({**env, "GPUKIT_GGUF_LA": "1"}, lambda: run(fmt, x, qc)), what + " run again")
        if fmt != "q8_0":
            same_bits(got, with_env({"GPUKIT_GGUF_LA": "0"}, lambda: run(fmt, x, qc)), what + " against LA=0")


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q4_k", "q8_0"])
def test_la_raw_blocks(fmt):
    """Random-byte blocks (every code / scale / min value) and x with outliers: the same bits."""
    env = base_env(fmt)
    for n, k in ((300, 4096), (19, 14336), (17000, 512)):
        if fmt == "q4_k":
            q, deq, qb = make(fmt, n, k)
            qn = gk.to_numpy(q).copy()
            rng = np.random.default_rng(1010)
            qn.reshape(n, -1, 144)[..., 4:] = rng.integers(0, 256, size=qn.reshape(n, -1, 144)[..., 4:].shape)
            q = gk.asarray(qn)
        else:
            q, deq, qb = raw_blocks(fmt, n, k)
        qc = q.to("cuda")
        xb, _ = xrows(2, k, "bfloat16")
        xn = gk.to_numpy(xb.astype("float32"))
        xn[:, ::97] *= 300.0
        x = gk.asarray(xn).astype("bfloat16").to("cuda")
        got = with_env({**env, "GPUKIT_GGUF_LA": "1"}, lambda: run(fmt, x, qc))
        same_bits(got, with_env(env, lambda: run(fmt, x, qc)), f"{fmt} LA=1 raw blocks n={n} k={k}")


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q4_k", "q8_0"])
@pytest.mark.parametrize("lead", [16, 48, 112])
def test_la_rows_at_every_line_offset(fmt, lead):
    """Block rows inside wider rows (pitch = row bytes + 16 * odd: consecutive rows start at different
    16-byte offsets of a line) from a view starting lead bytes into the buffer: each row of a copy has its
    own lead; the poison around the rows must not be read. Same bits and exact."""
    n, k, pad = 45, 4096, 48
    q, deq, qb = make(fmt, n, k)
    rb = q.shape[1]
    wide = np.full((n, lead + rb + pad), 0xFF, np.uint8)
    wide[:, lead:lead + rb] = qb
    qw = gk.asarray(wide).to("cuda")[:, lead:lead + rb]
    env = base_env(fmt)
    for m, dtype in ((1, "bfloat16"), (3, "float16")):
        xb, xs = xrows(m, k, dtype)
        x = xb.to("cuda")
        got = with_env({**env, "GPUKIT_GGUF_LA": "1"}, lambda: run(fmt, x, qw))
        what = f"{fmt} LA=1 rows {lead + rb + pad} bytes apart from +{lead} M={m} {dtype}"
        check(fmt, got, xs, deq, qb, what)
        same_bits(got, with_env(env, lambda: run(fmt, x, qw)), what + " against the switch off")


def test_la_graph_replay_same_bits():
    """Captured with the switch on (read at capture), replayed: the same bits as the eager default."""
    k = 4096
    xs_, ws_ = [], []
    for fmt, n in (("q4_0", 300), ("q4_1", 2051), ("q4_k", 37)):
        q, _, _ = make(fmt, n, k)
        ws_.append((fmt, q.to("cuda")))
    x = xrows(3, k, "bfloat16")[0].to("cuda")
    eager = [gk.to_numpy(getattr(gk, f"gemv_{f}")(x, w, out_dtype="float32")).tobytes() for f, w in ws_]

    def capture():
        g = gk.Graph(gk.Stream("cuda"))
        with g.stream:  # warm-up on the capture stream
            for f, w in ws_:
                getattr(gk, f"gemv_{f}")(x, w, out_dtype="float32")
        g.stream.synchronize()
        with g:
            outs = [getattr(gk, f"gemv_{f}")(x, w, out_dtype="float32") for f, w in ws_]
        return g, outs

    g, outs = with_env({"GPUKIT_GGUF_LA": "1"}, capture)
    for _ in range(3):
        g.replay()
        g.stream.synchronize()
        for (f, _), o, e in zip(ws_, outs, eager):
            got = gk.to_numpy(o)
            if got.tobytes() != e:
                ref = np.frombuffer(e, np.float32).reshape(got.shape)
                i = np.argwhere(got.view(np.uint32) != ref.view(np.uint32))
                raise AssertionError(f"{f} graph replay with LA=1: {len(i)} outputs differ, first {i[0].tolist()}")


@pytest.mark.parametrize("fmt", FMTS)
def test_la_copies_alone_run(fmt):
    """GPUKIT_GGUF_LA=p: variant 7's copies alone with the aligned lanes (Q6_K: variant 7's own): zeros into
    NaN-poisoned memory (split-K included), no fault; the next normal call exact."""
    for n, k in ((300, 4096), (19, 14336), (16, 2048), (2051, 1024), (17000, 2048)):
        if fmt == "q6_k" and k % 2048:
            continue
        q, deq, qb = make(fmt, n, k)
        qc = q.to("cuda")
        for m in (1, 3):
            xb, xs = xrows(m, k, "bfloat16")
            x = xb.to("cuda")
            got = with_env({"GPUKIT_GGUF_LA": "p"}, lambda: run(fmt, x, qc))
            g = gk.to_numpy(got)
            what = f"{fmt} GPUKIT_GGUF_LA=p n={n} k={k} m={m}"
            assert g.shape == (m, n), what
            bad = np.argwhere(g != 0)
            assert len(bad) == 0, f"{what}: {len(bad)} outputs not written as 0, first {bad[0].tolist()}"
            gk.synchronize()
            check(fmt, run(fmt, x, qc), xs, deq, qb, f"{fmt} after LA=p n={n} k={k} m={m}")


@pytest.mark.parametrize("value", ["2", "yes", "P", "1,p"])
def test_la_switch_rejects(value):
    q, _, _ = make("q4_0", 16, 256)
    x = gk.asarray(np.ones((1, 256), np.float32)).astype("bfloat16").to("cuda")
    with pytest.raises(ValueError, match="GPUKIT_GGUF_LA"):
        with_env({"GPUKIT_GGUF_LA": value}, lambda: gk.gemv_q4_0(x, q.to("cuda")))
