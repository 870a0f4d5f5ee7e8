"""The int4 g128 integer GEMV (k_w4i, the default for bf16 x since session 15) at M > 1 reads x from k_w4i_xprep's
workspace: per row (GPUKIT_W4I_REC=0, sessions 14-16) or, since session 17, in one record per 128-element block
holding x rows 0..7 and their exponents and sums (GPUKIT_W4I_REC=1; rows M..7 repeat row M - 1). The same values,
so the same bits: both layouts at every M against each other and against each row alone, for the plain GEMV and the
SwiGLU epilogue, with split-K, a graph replay and the engine's decode step. Skipped without a GPU."""
import numpy as np
import pytest

import gpukit as gk
from gpukit import _C
from w4_ref import f64, w4_weights

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(1717)


def parts_of(n, k):
    q, s, z = gk.quantize_int4(gk.asarray(w4_weights(RNG, n, k)), group=128)
    return q.to("cuda"), s.to("cuda"), z.to("cuda")


def x_of(m, k):
    return gk.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype("bfloat16").to("cuda")


def run(layout, fn, monkeypatch):
    monkeypatch.setenv("GPUKIT_W4I_REC", layout)
    return gk.to_numpy(fn())


@cuda
@pytest.mark.parametrize("n,k", [(4097, 4096), (2051, 14336), (37, 14336), (301, 512), (6144, 4096)])
def test_records_same_bits(n, k, monkeypatch):
    parts = parts_of(n, k)
    x = x_of(8, k)
    alone = [run("1", lambda i=i: gk.gemv_int4(x[i], *parts, group=128, out_dtype="float32"), monkeypatch)
             for i in range(8)]
    for m in range(2, 9):
        a = run("0", lambda: gk.gemv_int4(x[:m], *parts, group=128, out_dtype="float32"), monkeypatch)
        b = run("1", lambda: gk.gemv_int4(x[:m], *parts, group=128, out_dtype="float32"), monkeypatch)
        assert a.tobytes() == b.tobytes(), f"({n}, {k}) M={m}: the two layouts differ"
        for i in range(m):
            assert b[i].tobytes() == alone[i].tobytes(), f"({n}, {k}) M={m}: row {i} differs from the row alone"
        assert np.isfinite(b).all()


@cuda
@pytest.mark.parametrize("i,k", [(2053, 4096), (7168, 4096), (1000, 1536)])
def test_records_swiglu_same_bits(i, k, monkeypatch):
    parts = parts_of(2 * i, k)
    x = x_of(8, k)
    for m in (2, 5, 8):
        a = run("0", lambda: _C._gemv_int4_swiglu(x[:m], *parts).astype("float32"), monkeypatch)
        b = run("1", lambda: _C._gemv_int4_swiglu(x[:m], *parts).astype("float32"), monkeypatch)
        assert a.tobytes() == b.tobytes(), f"({i}, {k}) M={m}: the two layouts differ (SwiGLU)"


@cuda
def test_records_graph_and_nonfinite(monkeypatch):
    n, k = 515, 4096
    parts = parts_of(n, k)
    xs = RNG.standard_normal((6, k)).astype(np.float32)
    xs[2, 300] = np.inf
    x = gk.asarray(xs).astype("bfloat16").to("cuda")
    monkeypatch.setenv("GPUKIT_W4I_REC", "1")
    ref = gk.to_numpy(gk.gemv_int4(x, *parts, group=128, out_dtype="float32"))
    assert np.isnan(ref[2]).all() and np.isfinite(np.delete(ref, 2, 0)).all()
    g = gk.Graph()
    with g:
        out = gk.gemv_int4(x, *parts, group=128, out_dtype="float32")
    for _ in range(2):
        g.replay()
        gk.cuda.synchronize()
        assert gk.to_numpy(out).tobytes() == ref.tobytes()
    monkeypatch.setenv("GPUKIT_W4I_REC", "0")
    assert gk.to_numpy(gk.gemv_int4(x, *parts, group=128, out_dtype="float32")).tobytes() == ref.tobytes()


@cuda
@pytest.mark.parametrize("bad", ["2", "yes", "-1"])
def test_records_switch_rejects_garbage(bad, monkeypatch):
    parts = parts_of(64, 512)
    monkeypatch.setenv("GPUKIT_W4I_REC", bad)
    with pytest.raises(ValueError, match="GPUKIT_W4I_REC"):
        gk.gemv_int4(x_of(2, 512), *parts, group=128)


def test_e2e_flags():
    from bench_ref import e2e_engines
    eng = e2e_engines()
    assert eng.gk_engine("gk-graph+w4irec0")[1]["env"] == {"GPUKIT_W4I_REC": "0"}
    assert eng.gk_engine("gk-graph+w4irec1")[1]["env"] == {"GPUKIT_W4I_REC": "1"}
