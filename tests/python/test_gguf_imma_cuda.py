"""The GGUF integer GEMV (src/cuda/quant_gguf_imma.cu: Q4_0, Q4_1, Q8_0 with bf16 x on mma.m16n8k32 u8 / s8, x as
16-bit fixed point per 128-element block; GPUKIT_GGUF_IMMA) against a float64 emulation of its fixed point (x rounded
to X 2^(e - 141) per block, e the biased exponent of the block's largest |x| clamped to 15..254) within the float32
bound of the staged kernels' tests, and against the exact product within that bound plus the fixed point's rounding.
M = 1..8, ragged N, split-K, strided rows, every output type, inf / NaN in x (NaN rows), extreme scales, raw Q8_0
codes (-128), K % 512 != 0 (the staged kernel runs), the switch's values. Same bits every run, for a row alone or in a
batch, and under graph replay. Skipped without a GPU."""
import os

import numpy as np
import pytest

import gpukit as gk
from test_gguf_st_cuda import RNG, bound_of, f64, make, raw_q8_0, xrows

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
FMTS = ["q4_0", "q4_1", "q8_0"]
DEFAULT_IMMA = ()  # kImmaDefault in src/cuda/quant_gguf_imma.cu (session 17: none; run s17-B: slower at M = 4)


class imma:
    """GPUKIT_GGUF_IMMA=v within the block (restored after)."""

    def __init__(self, v="1"):
        self.v = v

    def __enter__(self):
        self.old = os.environ.get("GPUKIT_GGUF_IMMA")
        os.environ["GPUKIT_GGUF_IMMA"] = self.v

    def __exit__(self, *a):
        if self.old is None:
            del os.environ["GPUKIT_GGUF_IMMA"]
        else:
            os.environ["GPUKIT_GGUF_IMMA"] = self.old


def fixed_point(xs):
    """x (m, k) float64 (bf16 values; k % 128 == 0) as the kernel's fixed point: X = rint(x 2^(141 - c)) per
    128-element block, c = clamp(biased exponent of the block's largest |x|, 15, 254); returns X 2^(c - 141) and the
    half step 2^(c - 142) per element."""
    m, k = xs.shape
    b = xs.reshape(m, k // 128, 128)
    mx = np.abs(b).max(-1)
    _, ex = np.frexp(mx)  # mx = f 2^ex, f in [0.5, 1): biased exponent ex - 1 + 127 (0 for zero / subnormal)
    c = np.clip(np.where(mx > 0, ex + 126, 0), 15, 254)
    f = np.ldexp(1.0, 141 - c)[..., None]
    xf = (np.rint(b * f) / f).reshape(m, k)
    half = np.broadcast_to(0.5 / f, b.shape).reshape(m, k)
    return xf, half


def check_imma(fmt, got, xs, deq, qb, what):
    """got against the float64 of the fixed-point x within the float32 bound, and against the exact x within that
    bound plus sum half step |w|."""
    xf, half = fixed_point(xs)
    k = xs.shape[1]
    tol = 2 * (k + 2) * 2.0**-24 * bound_of(fmt, qb, xf, deq) + 1e-30
    g = f64(got)
    for ref, t, name in ((xf @ deq.T, tol, "fixed point"), (xs @ deq.T, tol + half @ np.abs(deq).T, "exact")):
        err = np.abs(g - ref)
        if not np.all(err <= t):
            i = np.unravel_index(np.argmax(err / t), err.shape)
            bad = np.argwhere(~(err <= t))
            raise AssertionError(f"{what} ({name}): {len(bad)} of {err.size} out of tolerance; worst y{list(i)} = "
                                 f"{g[i]!r}, ref {ref[i]!r}, tol {t[i]:.3g}; first bad {bad[0].tolist()}")


SHAPES = [(37, 4096), (300, 14336), (2051, 1024), (70, 6144), (24, 512), (133, 1536), (16, 14336)]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_imma_matches(fmt, n, k):
    """M = 8 and M = 1 (row 0); a second run; rows 0 / 3 / 7 alone give the batch's bits."""
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    xb, xs = xrows(8, k, "bfloat16")
    x = xb.to("cuda")
    with imma():
        got = fn(x, qc, out_dtype="float32")
        check_imma(fmt, got, xs, deq, qb, f"{fmt} n={n} k={k} M=8")
        assert gk.to_numpy(fn(x, qc, out_dtype="float32")).tobytes() == gk.to_numpy(got).tobytes(), "second run"
        allr = gk.to_numpy(got)
        for i in (0, 3, 7):
            one = gk.to_numpy(fn(x[i], qc, out_dtype="float32"))
            assert one.tobytes() == allr[i].tobytes(), f"row {i} alone differs from the batch"
        two = gk.to_numpy(fn(x[2:4], qc, out_dtype="float32"))
        assert two.tobytes() == allr[2:4].tobytes(), "rows 2-3 differ from the batch"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8])
def test_imma_every_m(fmt, m):
    n, k = 211, 4096
    q, deq, qb = make(fmt, n, k)
    xb, xs = xrows(m, k, "bfloat16")
    with imma():
        got = getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), q.to("cuda"), out_dtype="float32")
        check_imma(fmt, got, xs, deq, qb, f"{fmt} M={m}")
        for dt in ("bfloat16", "float16"):
            y = getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), q.to("cuda"), out_dtype=dt)
            assert y.dtype == getattr(gk, dt)
            assert f64(y).tobytes() == f64(got.astype(dt)).tobytes(), f"out_dtype {dt}: the float32 sums rounded"


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("pad", [16, 48])
def test_imma_strided_rows(fmt, pad):
    """Block rows inside wider rows (16-byte aligned): only the rows' own bytes are read (0xFF poison around)."""
    n, k = 45, 2048
    q, deq, qb = make(fmt, n, k)
    rb = q.shape[1]
    wide = np.full((n, rb + pad), 0xFF, np.uint8)
    wide[:, :rb] = qb
    qw = gk.asarray(wide).to("cuda")[:, :rb]
    xb, xs = xrows(4, k, "bfloat16")
    with imma():
        got = getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), qw, out_dtype="float32")
    check_imma(fmt, got, xs, deq, qb, f"{fmt} rows {rb + pad} bytes apart")


@pytest.mark.parametrize("fmt", FMTS)
def test_imma_inf_nan_rows(fmt):
    """inf in x row 1, NaN in row 2: every output of those rows NaN; the other rows as without them."""
    n, k = 64, 2048
    q, deq, qb = make(fmt, n, k)
    xb, xs = xrows(4, k, "bfloat16")
    xs[1, 700] = np.inf
    xs[2, 5] = np.nan
    xb = gk.asarray(xs.astype(np.float32)).astype("bfloat16")
    with imma():
        got = gk.to_numpy(getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), q.to("cuda"), out_dtype="float32"))
        xc = gk.asarray(xs[[0, 3]].astype(np.float32)).astype("bfloat16")
        clean = gk.to_numpy(getattr(gk, f"gemv_{fmt}")(xc.to("cuda"), q.to("cuda"), out_dtype="float32"))
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()
    assert got[[0, 3]].tobytes() == clean.tobytes()


def test_imma_extreme_values():
    """The largest fp16 scales, zero rows, tiny weights; x spanning 2^-60 .. 2^40 within and across blocks."""
    n, k = 32, 2048
    w = np.zeros((n, k), np.float32)
    w[1] = 60000.0 * np.sign(RNG.standard_normal(k))
    w[2, ::7] = -1e-6
    w[3] = RNG.standard_normal(k).astype(np.float32) * 100
    w[4:] = RNG.standard_normal((n - 4, k)).astype(np.float32)
    xs = RNG.standard_normal((3, k)) * np.exp2(RNG.integers(-60, 40, size=(3, k)))
    xs[2, :512] = 0.0  # whole zero blocks
    xb = gk.asarray(xs.astype(np.float32)).astype("bfloat16")
    xs = f64(xb.astype("float32"))
    for fmt in FMTS:
        q = getattr(gk, f"quantize_{fmt}")(gk.asarray(w))
        deq = f64(getattr(gk, f"dequantize_{fmt}")(q))
        with imma():
            got = getattr(gk, f"gemv_{fmt}")(xb.to("cuda"), q.to("cuda"), out_dtype="float32")
        check_imma(fmt, got, xs, deq, gk.to_numpy(q), f"{fmt} extreme")


@pytest.mark.parametrize("m", [1, 5])
def test_imma_raw_q8_0(m):
    """Q8_0 blocks holding every byte value (-128 too) and random fp16 scales."""
    q, deq, qb = raw_q8_0(300, 4096)
    xb, xs = xrows(m, 4096, "bfloat16")
    with imma():
        got = gk.gemv_q8_0(xb.to("cuda"), q.to("cuda"), out_dtype="float32")
    check_imma("q8_0", got, xs, deq, qb, f"raw q8_0 M={m}")


def test_imma_graph_replay():
    n, k = 515, 4096
    q, deq, qb = make("q4_0", n, k)
    qc = q.to("cuda")
    xb, xs = xrows(3, k, "bfloat16")
    x = xb.to("cuda")
    with imma():
        ref = [gk.to_numpy(gk.gemv_q4_0(x, qc)), gk.to_numpy(gk.gemv_q4_0(x[1], qc))]
        g = gk.Graph()
        with g:
            outs = [gk.gemv_q4_0(x, qc), gk.gemv_q4_0(x[1], qc)]
    for _ in range(2):
        g.replay()
        gk.cuda.synchronize()
        assert gk.to_numpy(outs[0]).tobytes() == ref[0].tobytes()
        assert gk.to_numpy(outs[1]).tobytes() == ref[1].tobytes()


@pytest.mark.parametrize("fmt", FMTS)
def test_imma_switch_selects(fmt):
    """GPUKIT_GGUF_IMMA=0 runs the staged kernel (exact x: its own bound); a list names the formats that take the
    integer kernel; float16 x and K % 512 != 0 always run the staged kernel (the same bits as with the switch off)."""
    n, k = 300, 4096
    q, deq, qb = make(fmt, n, k)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    xb, xs = xrows(2, k, "bfloat16")
    x = xb.to("cuda")
    with imma("0"):
        off = gk.to_numpy(fn(x, qc, out_dtype="float32"))
    with imma(fmt):
        on = gk.to_numpy(fn(x, qc, out_dtype="float32"))
    with imma("q4_0,q4_1,q8_0".replace(fmt, "").strip(",").replace(",,", ",")):
        others = gk.to_numpy(fn(x, qc, out_dtype="float32"))
    assert others.tobytes() == off.tobytes(), "a list without the format: the staged kernel"
    check_imma(fmt, on, xs, deq, qb, f"{fmt} listed")
    assert on.tobytes() != off.tobytes(), "the listed format should run the integer kernel (other bits)"
    xh = x.astype("float16")
    with imma("0"):
        h0 = gk.to_numpy(fn(xh, qc, out_dtype="float32"))
    with imma("1"):
        h1 = gk.to_numpy(fn(xh, qc, out_dtype="float32"))
    assert h0.tobytes() == h1.tobytes(), "float16 x: the staged kernel either way"
    q2, _, _ = make(fmt, 40, 2304)
    xk, _ = xrows(2, 2304, "bfloat16")
    with imma("0"):
        k0 = gk.to_numpy(fn(xk.to("cuda"), q2.to("cuda"), out_dtype="float32"))
    with imma("1"):
        k1 = gk.to_numpy(fn(xk.to("cuda"), q2.to("cuda"), out_dtype="float32"))
    assert k0.tobytes() == k1.tobytes(), "K % 512 != 0: the staged kernel either way"


@pytest.mark.parametrize("bad", ["2", "q4_k", "q4_0,,q8_0", "yes"])
def test_imma_switch_rejects_garbage(bad):
    q, _, _ = make("q4_0", 16, 512)
    with imma(bad):
        with pytest.raises(ValueError, match="GPUKIT_GGUF_IMMA"):
            gk.gemv_q4_0(gk.zeros((1, 512), dtype="bfloat16", device="cuda"), q.to("cuda"))


@pytest.mark.parametrize("fmt", FMTS)
def test_imma_default_formats(fmt, monkeypatch):
    """GPUKIT_GGUF_IMMA unset: the formats of the compiled default (DEFAULT_IMMA) give the integer kernel's bits, the
    others the staged kernel's, at M = 1 and M = 5."""
    n, k = 300, 4096
    q, _, _ = make(fmt, n, k)
    qc = q.to("cuda")
    fn = getattr(gk, f"gemv_{fmt}")
    for m in (1, 5):
        xb, _ = xrows(m, k, "bfloat16")
        x = xb.to("cuda")
        with imma("1"):
            on = gk.to_numpy(fn(x, qc, out_dtype="float32"))
        with imma("0"):
            off = gk.to_numpy(fn(x, qc, out_dtype="float32"))
        monkeypatch.delenv("GPUKIT_GGUF_IMMA", raising=False)
        dflt = gk.to_numpy(fn(x, qc, out_dtype="float32"))
        assert dflt.tobytes() == (on if fmt in DEFAULT_IMMA else off).tobytes(), f"{fmt} M={m}"
