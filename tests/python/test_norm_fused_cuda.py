"""CUDA launch shapes of the bandwidth-bound fused kernels (rms_norm / layer_norm,
softmax, gated activations, rope) against the CPU reference.

The kernels pick a launch shape from the row length; GPUKIT_TUNE
(src/cuda/common/vec.cuh) forces the others so that every shape the benchmark
may select is checked here: rows in registers with 1 to 16 vectors per thread,
several rows per block (with a dead row in the last block), and every unroll of
the gated and rope kernels. Each case also checks bit-identical reruns.
Skips without a CUDA device."""
import os

import numpy as np
import pytest

import gpukit as gk

CUDA = gk.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="no CUDA device")
TOL = {"float32": 4e-5, "float16": 4e-3, "bfloat16": 3.2e-2}
DTYPES = ["float32", "bfloat16", "float16"]


def make(shape, dtype, seed, scale=1.0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return gk.asarray(a).astype(dtype)


def f64(x):
    return np.asarray(gk.to_numpy(x), dtype=np.float64)


def bits(x):
    return gk.to_numpy(x).view(np.uint8)


@pytest.fixture
def tune():
    """Sets GPUKIT_TUNE for the test, restores it after."""
    old = os.environ.get("GPUKIT_TUNE")

    def set_(v):
        os.environ["GPUKIT_TUNE"] = v
    yield set_
    if old is None:
        os.environ.pop("GPUKIT_TUNE", None)
    else:
        os.environ["GPUKIT_TUNE"] = old


def check(got, want, dtype, what):
    g, w = f64(got), f64(want)
    t = TOL[dtype]
    bad = ~np.isclose(g, w, rtol=t, atol=t)
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {g.size} differ, first at {i}: got {g[i]!r} "
                             f"want {w[i]!r}; max abs err {np.nanmax(np.abs(g - w)):.3g}")


ROWS_SHAPES = ["rows.on=1", "rows.on=1,rows.wpr=1", "rows.on=1,rows.wpr=2", "rows.on=1,rows.wpr=8,rows.rpc=2",
               "rows.on=1,rows.wpr=16", "rows.on=1,rows.rpc=4,rows.hint=7", "rows.on=1,rows.wpr=2,rows.rpc=3,rows.hint=3",
               "rows.on=1,rows.wpr=1,rows.rpc=3,rows.hint=1", "rows.on=1,rows.v=8", "rows.on=1,rows.v=2,rows.hint=4",
               # persistent (2 or 4 vectors per lane; others fall back): several groups per block
               "rows.on=1,rows.pers=1", "rows.on=1,rows.pers=1,rows.grid=3", "rows.on=1,rows.pers=1,rows.rpc=3,rows.grid=5",
               "rows.on=1,rows.pers=1,rows.v=2,rows.rpc=1,rows.grid=2"]


def old(*shapes):
    """The older forms (register forms of norm.cu / reduce.cu, staged form): rows.on=0."""
    return ["rows.on=0" + ("," + v if v else "") for v in shapes]


# "": the default (the warp-row form of src/cuda/rows_warp.cu for rows of >= 32 vectors)
NORM_SHAPES = ["", *old("", "norm.tpr=32", "norm.tpr=64", "norm.tpr=128", "norm.tpr=256", "norm.tpr=512",
                        "norm.tpr=1024", "norm.tpr=128,norm.rows=2", "norm.tpr=64,norm.rows=4", "norm.tpr=32,norm.rows=8",
                        "norm.persist=1", "norm.persist=1,norm.grid=5", "norm.persist=1,norm.tpr=64,norm.rows=2,norm.grid=3",
                        "norm.persist=1,norm.tpr=32,norm.rows=4,norm.grid=2", "norm.persist=1,norm.tpr=128,norm.grid=1",
                        "norm.prew=1", "norm.prew=1,norm.tpr=64,norm.rows=2", "norm.prew=1,norm.persist=1,norm.grid=4",
                        # rows staged in shared memory (src/cuda/rows_pipe.cu, with norm.pipe=1): one slot, few
                        # slots, several rows per CTA and per warp, 3 CTAs per SM
                        "norm.pipe=0", "norm.pipe=1", "norm.pipe=1,pipe.grid=2,pipe.kb=20",
                        "norm.pipe=1,pipe.grid=1,pipe.kb=70", "norm.pipe=1,pipe.grid=3", "norm.pipe=1,pipe.cta=3",
                        "norm.pipe=1,pipe.ef=1", "norm.pipe=1,pipe.w=11,pipe.grid=3", "norm.pipe=1,pipe.kb=100,pipe.grid=4",
                        "norm.pipe=1,pipe.w=11,pipe.kb=220,pipe.grid=2", "norm.pipe=1,pipe.w=15",
                        "norm.pipe=1,pipe.w=15,pipe.grid=2"),
               # the warp-row form: 1 to 16 warps per row (1 to 16 vectors per lane), 1 to 4 rows per block
               # (3: a dead row), the cache hints, persistent
               *ROWS_SHAPES]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", [512, 1000, 2056, 4096, 8192])
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_norm_shapes(tune, dtype, H, shape):
    tune(shape)
    rows = 37  # odd: the last block of a multi-row shape has dead rows
    x, r, w, b = (make((rows, H), dtype, s) for s in (1, 2, 3, 4))
    xd, rd, wd, bd = (a.to("cuda") for a in (x, r, w, b))
    y, nr = gk.nn.rms_norm(xd, wd[0], residual=rd)
    y2, nr2 = gk.nn.rms_norm(xd, wd[0], residual=rd)
    yc, nrc = gk.nn.rms_norm(x, w[0], residual=r)
    what = f"rms_norm residual {dtype} H={H} [{shape}]"
    np.testing.assert_array_equal(bits(nr), bits(nrc), err_msg=what + ": new residual differs from the CPU")
    check(y, yc, dtype, what)
    assert np.array_equal(bits(y), bits(y2)) and np.array_equal(bits(nr), bits(nr2)), what + ": reruns differ"
    check(gk.nn.rms_norm(xd, wd[0], gemma=True), gk.nn.rms_norm(x, w[0], gemma=True), dtype, f"rms_norm gemma [{shape}]")
    ln = gk.nn.layer_norm(xd, wd[0], bd[0])
    check(ln, gk.nn.layer_norm(x, w[0], b[0]), dtype, f"layer_norm {dtype} H={H} [{shape}]")
    assert np.array_equal(bits(ln), bits(gk.nn.layer_norm(xd, wd[0], bd[0]))), f"layer_norm [{shape}]: reruns differ"


SOFTMAX_SHAPES = ["", *old("", "softmax.tpr=32", "softmax.tpr=64", "softmax.tpr=128", "softmax.tpr=256",
                           "softmax.tpr=512", "softmax.tpr=64,softmax.rows=4", "softmax.persist=1",
                           "softmax.persist=1,softmax.grid=5", "softmax.persist=1,softmax.tpr=64,softmax.rows=2,softmax.grid=3",
                           "softmax.persist=1,softmax.tpr=32,softmax.rows=4,softmax.grid=1", "softmax.pipe=0",
                           "softmax.pipe=1", *("softmax.pipe=1," + v for v in (
                               "pipe.grid=2,pipe.kb=20", "pipe.grid=1,pipe.kb=40", "pipe.grid=5", "pipe.cta=3",
                               "pipe.ef=1,pipe.grid=3", "pipe.w=11,pipe.grid=2", "pipe.w=7,pipe.grid=2",
                               "pipe.kb=100,pipe.grid=4", "pipe.w=11,pipe.kb=220,pipe.grid=2", "pipe.w=15",
                               "pipe.w=15,pipe.grid=3"))),
                  *ROWS_SHAPES]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", [8, 1000, 2056, 4096, 8192])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
def test_softmax_shapes(tune, dtype, H, shape):
    tune(shape)
    x = make((37, H), dtype, 5, scale=4.0)
    xd = x.to("cuda")
    for log in (False, True):
        f = gk.log_softmax if log else gk.softmax
        got = f(xd)
        check(got, f(x), dtype, f"{f.__name__} {dtype} H={H} [{shape}]")
        assert np.array_equal(bits(got), bits(f(xd))), f"{f.__name__} [{shape}]: reruns differ"


@pytest.mark.parametrize("shape", ["", *old("softmax.pipe=0", "softmax.pipe=1", "softmax.pipe=1,pipe.grid=1,pipe.kb=20",
                                           "softmax.pipe=1,pipe.w=15"),
                                   "rows.wpr=1", "rows.wpr=2,rows.rpc=3", "rows.pers=1,rows.grid=3", "rows.hint=0"])
@pytest.mark.parametrize("H", [2048, 4096])
def test_softmax_special_rows(tune, shape, H):
    tune(shape)
    a = np.random.default_rng(0).standard_normal((8, H)).astype(np.float32)
    a[1, :] = -np.inf          # a row of -inf
    a[2, 7] = np.inf           # +inf in a row
    a[3, 100] = np.nan         # NaN propagates
    a[4, :H - 96] = -np.inf    # mostly -inf (whole lanes of -inf)
    a[5, 3] = np.inf           # two +inf
    a[5, H - 1] = np.inf
    a[6, ::2] = -np.inf        # every other -inf
    a[7, 5:] = -np.inf         # one lane of finite values
    for dtype in DTYPES:
        x = gk.asarray(a).astype(dtype)
        for f in (gk.softmax, gk.log_softmax):
            g, c = f64(f(x.to("cuda"))), f64(f(x))
            same = (g == c) | np.isclose(g, c, rtol=TOL[dtype], atol=TOL[dtype]) | (np.isnan(g) & np.isnan(c))
            assert same.all(), (f"{f.__name__} {dtype} H={H} [{shape}]: rows "
                                f"{sorted(set(np.argwhere(~same)[:, 0].tolist()))} differ")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", [2048, 4096])
def test_rows_batch_invariant(tune, dtype, H):
    """A row gives the same bits alone and in a batch of 300 (several rows per CTA and
    per warp in the staged form), for the default and the register forms."""
    for shape in ("", *old("norm.pipe=0,softmax.pipe=0", "norm.pipe=1,softmax.pipe=1",
                           "norm.pipe=1,softmax.pipe=1,pipe.w=15,pipe.grid=7"),
                  "rows.wpr=2,rows.rpc=3", "rows.wpr=1,rows.rpc=4", "rows.pers=1,rows.rpc=3,rows.grid=7",
                  "rows.pers=0", "rows.hint=0"):
        tune(shape)
        x = make((300, H), dtype, 11, scale=3.0).to("cuda")
        r = make((300, H), dtype, 12).to("cuda")
        w, b = make((H,), dtype, 13).to("cuda"), make((H,), dtype, 14).to("cuda")
        one, onr = x[217:218], r[217:218]
        pairs = [(gk.softmax(x), gk.softmax(one)), (gk.log_softmax(x), gk.log_softmax(one)),
                 (gk.nn.layer_norm(x, w, b), gk.nn.layer_norm(one, w, b)),
                 (gk.nn.rms_norm(x, w, residual=r)[0], gk.nn.rms_norm(one, w, residual=onr)[0])]
        for i, (full, single) in enumerate(pairs):
            assert np.array_equal(bits(full[217:218]), bits(single)), f"op {i} {dtype} H={H} [{shape}]: batch-dependent"
        # and the whole batch against the CPU
        xc, wc, bc = x.to("cpu"), w.to("cpu"), b.to("cpu")
        check(pairs[0][0], gk.softmax(xc), dtype, f"softmax 300x{H} {dtype} [{shape}]")
        check(pairs[2][0], gk.nn.layer_norm(xc, wc, bc), dtype, f"layer_norm 300x{H} {dtype} [{shape}]")
        big = make((300, H + 64), dtype, 15).to("cuda")  # rows with a stride of H + 64 elements
        xs = big[:, :H]
        check(gk.nn.layer_norm(xs, w, b), gk.nn.layer_norm(xs.to("cpu"), wc, bc), dtype, f"layer_norm strided [{shape}]")
        y, nr = gk.nn.rms_norm(xs, w, residual=big[:, 64:])
        yc, nrc = gk.nn.rms_norm(xs.to("cpu"), wc, residual=big[:, 64:].to("cpu"))
        check(y, yc, dtype, f"rms_norm strided [{shape}]")
        np.testing.assert_array_equal(bits(nr), bits(nrc), err_msg=f"rms_norm strided residual [{shape}]")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["swiglu", "geglu", "relu2"])
@pytest.mark.parametrize("shape", ["", "gated.unroll=2", "gated.unroll=8", "gated.bpsm=1", "gated.unroll=2,gated.bpsm=1"])
def test_gated_shapes(tune, dtype, act, shape):
    tune(shape)
    for rows, I in [(37, 4096), (5, 8 * 1111), (3, 7)]:
        x = make((rows, 2 * I), dtype, 7, scale=3.0)
        xd = x.to("cuda")
        if act == "relu2":
            f = lambda v: gk.nn.relu2(v)  # noqa: E731
        else:
            f = lambda v: getattr(gk.nn, act)(v)  # noqa: E731
        got = f(xd)
        check(got, f(x), dtype, f"{act} {dtype} rows={rows} I={I} [{shape}]")
        assert np.array_equal(bits(got), bits(f(xd))), f"{act} [{shape}]: reruns differ"
        if act != "relu2":  # strided gate/up halves of one buffer and separate operands
            g, u = xd[:, :I], xd[:, I:]
            check(getattr(gk.nn, act)(g, u), getattr(gk.nn, act)(x[:, :I], x[:, I:]), dtype, f"{act} two operands")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["", "rope.k=1", "rope.k=2", "rope.k=4", "rope.k=8"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_shapes(tune, dtype, shape, interleaved):
    tune(shape)
    T, Hq, Hkv, D = 33, 32, 8, 128
    q, k = make((T, Hq, D), dtype, 1), make((T, Hkv, D), dtype, 2)
    pos = gk.asarray(np.random.default_rng(3).integers(0, 9000, T).astype(np.int32))
    qd, kd, pd = q.to("cuda"), k.to("cuda"), pos.to("cuda")
    got = gk.nn.rope(qd, kd, pd, interleaved=interleaved)
    want = gk.nn.rope(q, k, pos, interleaved=interleaved)
    for g, w, nm in zip(got, want, "qk"):
        check(g, w, dtype, f"rope {nm} {dtype} interleaved={interleaved} [{shape}]")
    # in place on a fused qkv buffer: same values as out of place
    buf = make((T, Hq + 2 * Hkv, D), dtype, 4).to("cuda")
    qv, kv = buf[:, :Hq], buf[:, Hq:Hq + Hkv]
    wq, wk = gk.nn.rope(qv.to("cpu"), kv.to("cpu"), pos, interleaved=interleaved)
    gk.nn.rope(qv, kv, pd, interleaved=interleaved, inplace=True)
    check(buf[:, :Hq], wq, dtype, f"rope in place q [{shape}]")
    check(buf[:, Hq:Hq + Hkv], wk, dtype, f"rope in place k [{shape}]")
