"""GGUF blocks Q8_0, Q4_0, Q4_1, Q4_K, Q6_K: quantization bit-identical to the `gguf`
package's reference where it has one (Q8_0, Q4_0, Q4_1: ggml's rules), dequantization
bit-identical to the package's (on our blocks and on random valid blocks), the plain Q4_K /
Q6_K rules within their step, and the GEMV reading the blocks directly (CPU here; CUDA when
present) against float64 products with the exactly dequantized weights. Bad input."""
import numpy as np
import pytest

import gpukit as gk


@pytest.fixture(autouse=True)
def staged_gguf(monkeypatch):
    """The GGUF formats here: the staged kernel, exact in x (GPUKIT_GGUF_IMMA=0: the integer kernel of that switch,
    session 17, has its own tests: test_gguf_imma_cuda.py)."""
    monkeypatch.setenv("GPUKIT_GGUF_IMMA", "0")


try:  # the reference of the bit-identity tests; the GEMV tests run without it
    from gguf import GGMLQuantizationType as QT
    from gguf import quants
except ImportError:  # pragma: no cover - no gguf package
    QT = quants = None
needs_gguf = pytest.mark.skipif(quants is None, reason="needs the gguf package")

RNG = np.random.default_rng(606)
CUDA = gk.cuda.is_available()


def f64(x):
    return np.asarray(gk.to_numpy(x) if isinstance(x, gk.Array) else x).astype(np.float64)


def weights(n, k):
    w = (RNG.standard_normal((n, k)) * np.linspace(0.01, 2, n)[:, None]).astype(np.float32)
    if n > 2:
        w[1, :32] = 0  # an all-zero block
        w[2, 5] = 7.0  # ties and outliers
        w[2, 9] = -7.0
    return w


QK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q4_k": 256, "q6_k": 256}
BB = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q4_k": 144, "q6_k": 210}
QTS = {f: getattr(QT, f.upper()) for f in QK} if QT is not None else {}
FMTS = list(QK)


@needs_gguf
@pytest.mark.parametrize("fmt,bb", [("q8_0", 34), ("q4_0", 18), ("q4_1", 20)])
def test_blocks_match_gguf_package(fmt, bb):
    qt = QTS[fmt]
    w = weights(6, 256)
    ours = gk.to_numpy(getattr(gk, f"quantize_{fmt}")(gk.asarray(w)))
    ref = quants.quantize(w, qt)
    assert ours.dtype == np.uint8 and ours.shape == (6, 256 // 32 * bb)
    assert np.array_equal(ours, np.asarray(ref).reshape(ours.shape))
    deq = f64(getattr(gk, f"dequantize_{fmt}")(gk.asarray(ours)))
    assert np.array_equal(deq, quants.dequantize(ours, qt).astype(np.float64).reshape(deq.shape))


def random_blocks(fmt, n, nb):
    """Random bytes made valid blocks (finite f16 scales)."""
    b = RNG.integers(0, 256, size=(n, nb, BB[fmt]), dtype=np.uint8)
    d = (RNG.standard_normal((n, nb, 2)) * 0.01).astype(np.float16).view(np.uint8)
    if fmt in ("q8_0", "q4_0"):
        b[..., 0:2] = d[..., 0:2]
    elif fmt == "q4_1":
        b[..., 0:4] = d
    elif fmt == "q4_k":
        b[..., 0:4] = np.abs(d.view(np.float16)).view(np.uint8)
    else:
        b[..., 208:210] = d[..., 0:2]
    return b.reshape(n, nb * BB[fmt])


@needs_gguf
@pytest.mark.parametrize("fmt", FMTS)
def test_dequantize_matches_gguf_package(fmt):
    for q in (random_blocks(fmt, 3, 4), gk.to_numpy(getattr(gk, f"quantize_{fmt}")(gk.asarray(weights(5, 512))))):
        ours = f64(getattr(gk, f"dequantize_{fmt}")(gk.asarray(q)))
        ref = quants.dequantize(q, QTS[fmt]).astype(np.float64).reshape(ours.shape)
        assert np.array_equal(ours, ref), f"{fmt}: {np.sum(ours != ref)} values differ"


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_k_quant_rules_within_step(fmt):
    w = weights(6, 512)
    q = getattr(gk, f"quantize_{fmt}")(gk.asarray(w))
    assert q.dtype == gk.uint8 and q.shape == (6, 2 * BB[fmt])
    deq = f64(getattr(gk, f"dequantize_{fmt}")(q))
    sub = 32 if fmt == "q4_k" else 16
    wg = w.reshape(6, -1, sub).astype(np.float64)
    err = np.abs(deq.reshape(wg.shape) - wg).max(-1)
    if fmt == "q4_k":
        span = np.maximum(wg.max(-1), 0) - np.minimum(wg.min(-1), 0)
        step = span / 15
        d = step.max(-1, keepdims=True) / 63  # super-block scale units
        dmin = (-np.minimum(wg.min(-1), 0)).max(-1, keepdims=True) / 63
        limit = 0.5 * step + 8 * d + dmin  # rounding of the code, the 6-bit scale and the 6-bit min
    else:
        step = np.abs(wg).max(-1) / 31
        d = step.max(-1, keepdims=True) / 127
        limit = 0.5 * step + 16.5 * d  # rounding of the code and the 8-bit scale (clamped codes)
    assert np.all(err <= limit * 1.001 + 1e-7), float((err / limit).max())
    assert float((err / limit).max()) > 0.2  # the bound is not vacuous


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no GPU"))])
@pytest.mark.parametrize("m,n,k", [(1, 7, 256), (3, 33, 1024), (8, 65, 4096), (2, 300, 14336), (5, 1, 512),
                                   (3, 9, 96), (1, 40, 160)])
def test_gemv_blocks(fmt, dtype, device, m, n, k):
    """K = 96, 160: rows of 32-weight blocks that are not 16-byte multiples (the per-lane kernel)."""
    if device == "cpu" and n * k > 1_000_000:
        pytest.skip("the CPU reference is slow at this size")
    if k % QK[fmt]:
        pytest.skip("K is not a multiple of the block")
    w = weights(n, k)
    q = getattr(gk, f"quantize_{fmt}")(gk.asarray(w))
    deq = f64(getattr(gk, f"dequantize_{fmt}")(q))
    x = gk.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    got = getattr(gk, f"gemv_{fmt}")(x.to(device), q.to(device), out_dtype="float32")
    ref = f64(x) @ deq.T
    bound = np.abs(f64(x)) @ np.abs(deq).T
    if fmt == "q4_k" and device == "cuda":  # summed as d1 * sum(q x) - m1 * sum(x) per sub-block
        bound = q4k_split_bound(q, x)
    if fmt == "q4_1" and device == "cuda":  # d sum((128 + q) x) + (m - 128 d) sum(x) per block (bf16 x)
        bound = bound + q41_fold_bound(q, x)
    err = np.abs(f64(got) - ref)
    tol = 2 * (k + 2) * 2.0**-24 * bound + 1e-30
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err / tol), err.shape)
        raise AssertionError(f"{fmt} {device} y{list(i)} = {f64(got)[i]!r}, ref {ref[i]!r}, tol {tol[i]:.3g}")
    if device == "cuda":
        assert gk.to_numpy(getattr(gk, f"gemv_{fmt}")(x.to(device), q.to(device), out_dtype="float32")).tobytes() \
            == gk.to_numpy(got).tobytes()


def q41_fold_bound(q, x):
    """sum over blocks of (143 |d| + |m|) sum|x|: the magnitudes the CUDA kernel's folded sums round
    (session 6: the codes enter the mma as 128 + q, the 128 sum(x) leaves with the min term)."""
    b = gk.to_numpy(q).reshape(q.shape[0], -1, 20)
    d = np.abs(b[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0])
    mn = np.abs(b[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0])
    ax = np.abs(f64(x)).reshape(x.shape[0], -1, 32).sum(-1)
    return ax @ (143 * d + mn).T


def q4k_split_bound(q, x):
    """sum over sub-blocks of |d1| sum|q x| + |m1| sum|x|: the magnitude the split sum rounds; with
    the session-6 fold (codes as 128 + q, (m1 + 128 d1) sum(x)) d1 counts 271 times."""
    b = gk.to_numpy(q).reshape(q.shape[0], -1, 144)
    d = b[..., 0:2].copy().view(np.float16).astype(np.float64)[..., 0]
    dmin = b[..., 2:4].copy().view(np.float16).astype(np.float64)[..., 0]
    s12 = b[..., 4:16].astype(np.int64)  # the 6-bit scales and mins (ops/gguf_blocks.h k_scale_min)
    sc = np.concatenate([s12[..., 0:4] & 63, (s12[..., 8:12] & 15) | ((s12[..., 0:4] >> 2) & 48)], -1)
    mn = np.concatenate([s12[..., 4:8] & 63, (s12[..., 8:12] >> 4) | ((s12[..., 4:8] >> 2) & 48)], -1)
    sc, mn = sc.astype(np.float64), mn.astype(np.float64)
    ax = np.abs(f64(x)).reshape(x.shape[0], -1, 8, 32).sum(-1)  # [m, blocks, 8]
    return np.einsum("mbs,nbs->mn", ax, (dmin[..., None] * mn) + 271 * (d[..., None] * sc))


def test_gguf_bad_input():
    with pytest.raises(ValueError, match="block size 32|divisible"):
        gk.quantize_q8_0(gk.zeros((2, 48)))
    q = gk.quantize_q4_0(gk.asarray(weights(3, 64)))
    with pytest.raises(ValueError, match="multiple of 18"):
        gk.gemv_q4_0(gk.zeros(64, dtype="bfloat16"), q[:, :35])
    with pytest.raises(TypeError, match="uint8"):
        gk.gemv_q8_0(gk.zeros(64, dtype="bfloat16"), gk.zeros((3, 68), dtype="int8"))
    with pytest.raises(ValueError, match="features|K"):
        gk.gemv_q4_0(gk.zeros(32, dtype="bfloat16"), q)
    with pytest.raises(ValueError, match="block size 256|divisible"):
        gk.quantize_q4_k(gk.zeros((2, 288)))
    with pytest.raises(ValueError, match="block size 256|divisible"):
        gk.quantize_q6_k(gk.zeros((2, 32)))
    with pytest.raises(ValueError, match="multiple of 210"):
        gk.gemv_q6_k(gk.zeros(256, dtype="bfloat16"), gk.zeros((2, 200), dtype="uint8"))
    with pytest.raises(ValueError, match="multiple of 144"):
        gk.dequantize_q4_k(gk.zeros((2, 150), dtype="uint8"))
    with pytest.raises(ValueError, match="q"):
        gk.gemv_q4_1(gk.zeros(32, dtype="bfloat16"), gk.zeros(20, dtype="uint8"))  # 1-d blocks



@pytest.mark.skipif(not CUDA, reason="no GPU")
def test_gguf_cuda_alignment_error():
    q = gk.zeros((3, 35), dtype="uint8", device="cuda")[:, 1:]  # Q8_0 rows 35 bytes apart, odd offset
    with pytest.raises(ValueError, match="2-byte aligned"):
        gk.gemv_q8_0(gk.zeros(32, dtype="bfloat16", device="cuda"), q)
    q4k = gk.zeros((2, 160), dtype="uint8", device="cuda")[:, 16:]  # Q4_K rows 160 bytes apart: fine (16-aligned)
    gk.gemv_q4_k(gk.zeros(256, dtype="bfloat16", device="cuda"), q4k)
    q4k = gk.zeros((2, 152), dtype="uint8", device="cuda")[:, 8:]  # 8-byte offset: the chunk kernel refuses
    with pytest.raises(ValueError, match="aligned"):
        gk.gemv_q4_k(gk.zeros(256, dtype="bfloat16", device="cuda"), q4k)
