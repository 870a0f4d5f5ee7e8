"""CUDA reductions, softmax and matmul against the CPU backend (and float64
NumPy), and bitwise run-to-run determinism. Skipped without a GPU.

Covers the kernel paths: one warp per row (rows up to 1024 elements), one block
per row (longer rows), the two-pass split for rows over 65536 elements, grid
loops for many rows / many batches, and matmul tile edges."""
import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")

RNG = np.random.default_rng(7)
NP_DT = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float64": np.float64,
         "int8": np.int8, "int32": np.int32, "int64": np.int64, "bool": np.bool_, "uint8": np.uint8}
EPS = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "float64": 2.0**-53}


def rand(shape, dtype):
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype in ("int8", "int32", "int64", "uint8"):
        return RNG.integers(0 if dtype == "uint8" else -100, 100, size=shape).astype(NP_DT[dtype])
    return RNG.standard_normal(shape).astype(NP_DT[dtype])


def f64(x):
    return np.asarray(gk.to_numpy(x) if isinstance(x, gk.Array) else x).astype(np.float64)


def both(x_np):
    c = gk.asarray(x_np)
    return c, c.to("cuda")


def close_sum(gpu, cpu, x_np, axis, dtype, mean=False):
    """GPU and CPU sums both within the accumulation bound of the float64 value."""
    ref_in = f64(x_np)
    ref = ref_in.sum(axis=axis)
    absum = np.abs(ref_in).sum(axis=axis)
    n = max(1, ref_in.size // max(1, ref.size))
    if mean:
        ref, absum = ref / n, absum / n
    tol = 2 * EPS.get(dtype, 0) * np.abs(ref) + 4 * (np.log2(n) + 8) * 2.0**-24 * absum
    if dtype == "float64":
        tol = 1e-13 * (absum + 1)
    for r in (gpu, cpu):
        assert np.all(np.abs(f64(r) - ref) <= tol)


SHAPES = [((1,), None), ((7,), 0), ((1023,), None), ((1024,), None), ((1025,), -1), ((4097,), None),
          ((3, 4097), 1), ((4097, 3), 0), ((65536,), None), ((65537,), None), ((3, 100_003), -1),
          ((5, 6, 7), (0, 2)), ((2, 3, 4, 5), (1, 3)), ((300_000, 2), 1), ((6, 7), ())]


@pytest.mark.parametrize("shape,axis", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int8", "int64", "bool"])
def test_reductions_match_cpu(shape, axis, dtype):
    x = rand(shape, dtype)
    c, g = both(x)
    ax = tuple(range(len(shape))) if axis is None else axis
    for op in ("sum", "mean"):
        rg, rc = getattr(gk, op)(g, axis=axis), getattr(gk, op)(c, axis=axis)
        assert rg.device.type == "cuda" and rg.dtype == rc.dtype and rg.shape == rc.shape
        if dtype in EPS:
            close_sum(rg, rc, x, ax, dtype, mean=op == "mean")
        elif op == "sum":
            np.testing.assert_array_equal(gk.to_numpy(rg), gk.to_numpy(rc))
        else:
            np.testing.assert_allclose(f64(rg), f64(rc), rtol=2**-22)
    for op in ("max", "min"):
        np.testing.assert_array_equal(f64(getattr(gk, op)(g, axis=axis)), f64(getattr(gk, op)(c, axis=axis)))
    if axis is None or isinstance(axis, int):
        for op in ("argmax", "argmin"):
            for keepdims in (False, True):
                rg = getattr(gk, op)(g, axis=axis, keepdims=keepdims)
                np.testing.assert_array_equal(gk.to_numpy(rg), gk.to_numpy(getattr(gk, op)(c, axis=axis,
                                                                                             keepdims=keepdims)))


def test_nan_and_ties_on_long_rows():
    y = np.zeros((2, 200_003), np.float32)
    y[:, 70_000] = y[:, 199_999] = 2.0
    y[1, 150_000] = np.nan
    y[1, 180_000] = np.nan
    g = gk.asarray(y).to("cuda")
    np.testing.assert_array_equal(gk.argmax(g, axis=1).numpy(), [70_000, 150_000])
    np.testing.assert_array_equal(gk.argmin(g, axis=1).numpy(), [0, 150_000])
    m = gk.max(g, axis=1).numpy()
    assert m[0] == 2 and np.isnan(m[1])
    assert int(gk.argmax(g).numpy()) == 200_003 + 150_000


def test_huge_single_row_sum():
    n = 1 << 27
    g = gk.ones((n,), dtype=gk.float32, device="cuda")
    assert float(gk.sum(g).numpy()) == float(n)
    assert float(gk.mean(g).numpy()) == 1.0
    h = gk.ones((n,), dtype=gk.bfloat16, device="cuda")
    assert float(gk.sum(h, dtype=gk.float32).numpy()) == float(n)
    i = gk.ones((n,), dtype=gk.int8, device="cuda")
    assert int(gk.sum(i).numpy()) == n


def test_many_rows_grid_loop():
    x = rand(((1 << 24) + 3, 2), "float32")  # more warps than one grid launches (2^20 blocks of 8)
    c, g = both(x)
    np.testing.assert_allclose(gk.sum(g, axis=1).numpy(), gk.sum(c, axis=1).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(gk.argmax(g, axis=1).numpy(), x.argmax(1))


def test_determinism_bitwise():
    cases = [rand((1 << 24,), "float32"), rand((37, 70_001), "bfloat16"), rand((4097, 33), "float16")]
    for x in cases:
        g = gk.asarray(x).to("cuda")
        for fn in (lambda a: gk.sum(a), lambda a: gk.mean(a, axis=-1), lambda a: gk.sum(a, axis=0),
                   lambda a: gk.softmax(a, axis=-1), lambda a: gk.log_softmax(a, axis=0)):
            r = [gk.to_numpy(fn(g)).tobytes() for _ in range(3)]
            assert r[0] == r[1] == r[2]
    a = gk.asarray(rand((3, 300, 257), "bfloat16")).to("cuda")
    b = gk.asarray(rand((257, 129), "bfloat16")).to("cuda")
    r = [gk.to_numpy(gk.matmul(a, b)).tobytes() for _ in range(3)]
    assert r[0] == r[1] == r[2]
    # a row's result does not depend on how many rows are reduced with it
    x = gk.asarray(rand((64, 100_003), "float32")).to("cuda")
    one = gk.to_numpy(gk.sum(x[5:6], axis=1))
    allr = gk.to_numpy(gk.sum(x, axis=1))
    assert one.tobytes() == allr[5:6].tobytes()


@pytest.mark.parametrize("shape,axis", [((1,), 0), ((7,), -1), ((3, 1024), -1), ((3, 1025), -1), ((2, 4097), 1),
                                        ((4097, 3), 0), ((4, 5, 6), 1), ((2, 70_000), -1)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_softmax_matches_cpu(shape, axis, dtype):
    x = (rand(shape, "float32") * 3).astype(NP_DT[dtype])
    c, g = both(x)
    tol = {"float32": 2e-6, "float64": 1e-13, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    for fn in (gk.softmax, gk.log_softmax):
        rg, rc = fn(g, axis=axis), fn(c, axis=axis)
        assert rg.dtype == rc.dtype and rg.shape == rc.shape
        # log_softmax values near 0 come from cancellation (x - max - log sum): absolute error
        # scales with |x|, so the absolute tolerance is tol times the input's magnitude
        np.testing.assert_allclose(f64(rg), f64(rc), rtol=tol, atol=tol * 10)
    edge = np.array([[-np.inf] * 5, [0, -np.inf, 1, 2, 3]], np.float32)
    p = gk.softmax(gk.asarray(edge).to("cuda")).numpy()
    assert np.all(np.isnan(p[0])) and p[1, 1] == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 7, 7), (65, 17, 129), (64, 64, 64), (1023, 33, 65),
                                   (3, 4097, 5), (130, 0, 3)])
def test_matmul_matches_cpu(dtype, m, k, n):
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    (ac, ag), (bc, bg) = both(a), both(b)
    rg, rc = gk.matmul(ag, bg), gk.matmul(ac, bc)
    ref = f64(a) @ f64(b)
    bound = np.abs(f64(a)) @ np.abs(f64(b))
    eps_acc = 2.0**-53 if dtype == "float64" else 2.0**-24
    tol = 2 * EPS[dtype] * np.abs(ref) + 2 * (k + 2) * eps_acc * bound + 2.0**-24
    for r in (rg, rc):
        assert np.all(np.abs(f64(r) - ref) <= tol)


def test_matmul_strided_batched():
    a = rand((4, 1, 40, 33), "float32")
    b = rand((5, 33, 50), "float32")
    (ac, ag), (bc, bg) = both(a), both(b)
    views = [(ag, bg, a, b),
             (ag[:, :, ::2, 1:], bg[:, 1:, ::-1], a[:, :, ::2, 1:], b[:, 1:, ::-1]),
             (bg.transpose(1, 2), ag[0, 0].T, b.transpose(0, 2, 1), a[0, 0].T)]
    for xg, yg, xn, yn in views:
        r = gk.matmul(xg, yg)
        ref = f64(xn) @ f64(yn)
        assert r.shape == ref.shape
        np.testing.assert_allclose(f64(r), ref, rtol=1e-5, atol=1e-4)
    # more batches than one grid dimension holds
    x = rand((70_000, 2, 3), "float32")
    y = rand((3, 2), "float32")
    r = gk.matmul(gk.asarray(x).to("cuda"), gk.asarray(y).to("cuda"))
    np.testing.assert_allclose(f64(r), f64(x) @ f64(y), rtol=1e-5, atol=1e-5)


def test_streams_and_devices():
    s = gk.Stream("cuda")
    x = gk.asarray(rand((100, 3000), "float32")).to("cuda")
    r = gk.sum(x, axis=1, stream=s)
    s.synchronize()
    np.testing.assert_allclose(r.numpy(), gk.sum(x.to("cpu"), axis=1).numpy(), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="device|cuda|cpu"):
        gk.matmul(x, gk.zeros((3000, 2)))
    assert gk.matmul(x, gk.zeros((3000, 2), device="cuda"), stream=s).device.type == "cuda"
    assert gk.softmax(x, stream=s).device.type == "cuda"
