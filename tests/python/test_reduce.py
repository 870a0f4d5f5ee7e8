"""Reductions (sum, mean, max, min, argmax, argmin) and softmax/log_softmax on the
CPU backend against float64 NumPy: any axis set, keepdims, negative axes, odd
sizes (1, 7, 1023, 4097), non-contiguous views, empty arrays, NaN and ties,
result dtypes, and bad input."""
import math

import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(1234)

NP_DT = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "int8": np.int8,
    "uint8": np.uint8,
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
}
# Unit roundoff of each float dtype (for the result rounding) and of its accumulator.
EPS_OUT = {"float32": 2.0**-24, "float64": 2.0**-53, "float16": 2.0**-11, "bfloat16": 2.0**-8}
EPS_ACC = {"float32": 2.0**-24, "float64": 2.0**-53, "float16": 2.0**-24, "bfloat16": 2.0**-24}


def rand(shape, dtype):
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype in ("int8", "uint8", "int32", "int64"):
        info = np.iinfo(NP_DT[dtype])
        lo, hi = max(info.min, -100), min(info.max, 100)
        return RNG.integers(lo, hi, size=shape, endpoint=True).astype(NP_DT[dtype])
    return RNG.standard_normal(shape).astype(NP_DT[dtype])


def as_f64(a):
    return np.asarray(a).astype(np.float64)


def np_axes(ndim, axis):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted(a % ndim for a in axis))


def check_sum_like(op, x_np, got, axis, keepdims, dtype):
    ref_in = as_f64(x_np)
    ref = ref_in.sum(axis=axis, keepdims=keepdims)
    absum = np.abs(ref_in).sum(axis=axis, keepdims=keepdims)
    n = max(1, ref_in.size // max(1, ref.size))
    if op == "mean":
        ref = ref / n
        absum = absum / n
    g = as_f64(gk.to_numpy(got))
    assert g.shape == ref.shape
    if dtype in EPS_OUT:
        depth = math.log2(n) + 2
        tol = 2 * EPS_OUT[dtype] * np.abs(ref) + 4 * depth * EPS_ACC[dtype] * absum + 1e-300
        assert np.all(np.abs(g - ref) <= tol), f"max err {np.max(np.abs(g - ref) - tol)}"
    elif op == "sum":
        np.testing.assert_array_equal(g, ref)
    else:  # mean of integers: float32 result
        np.testing.assert_allclose(g, ref, rtol=2**-23, atol=0)


SHAPES_AXES = [
    ((1,), None),
    ((7,), 0),
    ((1023,), -1),
    ((4097,), None),
    ((3, 4097), 1),
    ((4097, 3), 0),
    ((7, 1023), -1),
    ((5, 6, 7), (0, 2)),
    ((5, 6, 7), (-1, -3)),
    ((2, 3, 4, 5), (1, 3)),
    ((2, 3, 4, 5), None),
    ((1, 1, 7), (0, 1)),
    ((6, 7), ()),
]


@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int8", "int64", "bool"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_mean(shape, axis, dtype, keepdims):
    x = rand(shape, dtype)
    a = gk.asarray(x)
    for op in ("sum", "mean"):
        got = getattr(gk, op)(a, axis=axis, keepdims=keepdims)
        want_dtype = dtype if dtype in EPS_OUT else ("int64" if op == "sum" else "float32")
        assert str(got.dtype).endswith(want_dtype)
        check_sum_like(op, x, got, np_axes(len(shape), axis) if axis != () else (), keepdims, dtype)


@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "bool"])
def test_max_min_arg(shape, axis, dtype):
    x = rand(shape, dtype)
    a = gk.asarray(x)
    ax = np_axes(len(shape), axis) if axis != () else ()
    ref = as_f64(x)
    for keepdims in (False, True):
        got = gk.max(a, axis=axis, keepdims=keepdims)
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(as_f64(gk.to_numpy(got)), ref.max(axis=ax, keepdims=keepdims) if ax != () else ref)
        got = gk.min(a, axis=axis, keepdims=keepdims)
        np.testing.assert_array_equal(as_f64(gk.to_numpy(got)), ref.min(axis=ax, keepdims=keepdims) if ax != () else ref)
    if axis is None or isinstance(axis, int):
        for keepdims in (False, True):
            for name in ("argmax", "argmin"):
                got = getattr(gk, name)(a, axis=axis, keepdims=keepdims)
                assert got.dtype == gk.int64
                want = getattr(np, name)(ref, axis=axis, keepdims=keepdims)
                np.testing.assert_array_equal(gk.to_numpy(got), want)


def test_argmax_ties_and_nan():
    x = np.array([[1, 3, 3, 2], [5, 5, 5, 5], [-1, np.nan, 7, np.nan]], dtype=np.float32)
    a = gk.asarray(x)
    np.testing.assert_array_equal(gk.argmax(a, axis=1).numpy(), [1, 0, 1])
    np.testing.assert_array_equal(gk.argmin(a, axis=1).numpy(), [0, 0, 1])
    m = gk.max(a, axis=1).numpy()
    assert m[0] == 3 and m[1] == 5 and np.isnan(m[2])
    assert np.isnan(gk.min(a, axis=1).numpy()[2])
    assert int(gk.argmax(a).numpy()) == 9  # first NaN of the flattened array
    # ties and NaN far apart in a long row (the tree must not change the answer)
    y = np.zeros(100_003, np.float32)
    y[70_000] = y[99_999] = 2.0
    assert int(gk.argmax(gk.asarray(y)).numpy()) == 70_000
    y[80_000] = np.nan
    y[90_000] = np.nan
    assert int(gk.argmax(gk.asarray(y)).numpy()) == 80_000
    assert int(gk.argmin(gk.asarray(y)).numpy()) == 80_000
    assert np.isnan(gk.max(gk.asarray(y)).numpy())
    # infinities
    z = np.array([-np.inf, -np.inf, -np.inf], np.float32)
    assert int(gk.argmax(gk.asarray(z)).numpy()) == 0
    assert gk.max(gk.asarray(z)).numpy() == -np.inf


def test_non_contiguous_views():
    x = rand((9, 1023, 4), "float32")
    a = gk.asarray(x)
    views = [
        (a.transpose(0, 2), x.swapaxes(0, 2)),
        (a[::2, ::3, 1:], x[::2, ::3, 1:]),
        (a[:, ::-1], x[:, ::-1]),
        (a.permute((2, 0, 1))[1:, 2:7], x.transpose(2, 0, 1)[1:, 2:7]),
    ]
    for v, xv in views:
        for axis in (None, 0, 1, -1, (0, 2)):
            ax = np_axes(xv.ndim, axis)
            check_sum_like("sum", xv, gk.sum(v, axis=axis), ax, False, "float32")
            check_sum_like("mean", xv, v.mean(axis=axis, keepdims=True), ax, True, "float32")
            np.testing.assert_array_equal(v.max(axis=axis).numpy(), xv.max(axis=ax))
            np.testing.assert_array_equal(v.min(axis=axis).numpy(), xv.min(axis=ax))
        for axis in (None, 0, 1, 2):
            np.testing.assert_array_equal(v.argmax(axis=axis).numpy(), xv.argmax(axis=axis))
            np.testing.assert_array_equal(v.argmin(axis=axis).numpy(), xv.argmin(axis=axis))
    # broadcast (stride 0) input
    b = gk.asarray(x[:1, :5, 0]).broadcast_to((6, 5))
    np.testing.assert_allclose(gk.sum(b, axis=0).numpy(), 6 * x[0, :5, 0], rtol=1e-6)


def test_long_row_and_determinism():
    x = rand((1 << 22,), "float32")
    a = gk.asarray(x)
    s1 = gk.sum(a).numpy()
    check_sum_like("sum", x, gk.sum(a), (0,), False, "float32")
    for _ in range(2):
        assert gk.sum(a).numpy().tobytes() == s1.tobytes()
    b = gk.asarray(rand((33, 2049), "bfloat16"))
    r1 = gk.to_numpy(gk.softmax(b, axis=0)).tobytes()
    assert gk.to_numpy(gk.softmax(b, axis=0)).tobytes() == r1
    # ones: the exact count must come out
    ones = gk.ones((1 << 20,), dtype=gk.float16)
    assert float(gk.sum(ones, dtype=gk.float32).numpy()) == float(1 << 20)


def test_integer_dtypes_and_dtype_arg():
    x = np.full((1000,), 100, np.int8)
    a = gk.asarray(x)
    s = gk.sum(a)
    assert s.dtype == gk.int64 and int(s.numpy()) == 100_000
    s32 = gk.sum(a, dtype=gk.int32)
    assert s32.dtype == gk.int32 and int(s32.numpy()) == 100_000
    big = np.array([2**62, 2**62 - 1, -(2**61)], np.int64)
    assert int(gk.sum(gk.asarray(big)).numpy()) == int(big.sum())
    m = gk.mean(gk.asarray(np.array([1, 2, 4], np.int32)))
    assert m.dtype == gk.float32 and abs(float(m.numpy()) - 7 / 3) < 1e-6
    assert gk.sum(gk.asarray(np.array([True, True, False]))).dtype == gk.int64
    assert int(gk.sum(gk.asarray(np.array([True, True, False]))).numpy()) == 2
    h = gk.asarray(rand((50,), "float16"))
    assert gk.sum(h, dtype="float32").dtype == gk.float32
    assert gk.mean(h, dtype=gk.float64).dtype == gk.float64
    assert gk.max(gk.asarray(np.array([3, 200, 7], np.uint8))).numpy() == 200
    assert bool(gk.max(gk.asarray(np.array([False, True]))).numpy()) is True


def test_empty():
    z = gk.zeros((0, 3))
    np.testing.assert_array_equal(gk.sum(z, axis=0).numpy(), np.zeros(3))
    assert gk.sum(z).numpy() == 0 and gk.sum(z).shape == ()
    assert gk.sum(gk.zeros((0,), dtype=gk.int32)).dtype == gk.int64
    mean = gk.mean(z, axis=0).numpy()
    assert mean.shape == (3,) and np.all(np.isnan(mean))
    assert gk.sum(z, axis=1).shape == (0,)
    assert gk.max(z, axis=1).shape == (0,)
    assert gk.argmax(z, axis=1).shape == (0,)
    assert gk.sum(z, axis=0, keepdims=True).shape == (1, 3)
    for name in ("max", "min", "argmax", "argmin"):
        with pytest.raises(ValueError, match=f"zero-size array to reduction operation {name} which has no identity"):
            getattr(gk, name)(z, axis=0)
        with pytest.raises(ValueError, match="zero-size"):
            getattr(gk, name)(z)
    e = gk.zeros((2, 0))
    assert gk.softmax(e, axis=1).shape == (2, 0)
    assert gk.log_softmax(e, axis=0).shape == (2, 0)


def test_zero_dim():
    s = gk.asarray(np.array(2.5, np.float32))
    assert float(gk.sum(s).numpy()) == 2.5
    assert int(gk.argmax(s).numpy()) == 0
    assert float(gk.softmax(s, axis=0).numpy()) == 1.0


def test_bad_input():
    a = gk.asarray(rand((3, 4), "float32"))
    with pytest.raises(IndexError, match="axis"):
        gk.sum(a, axis=2)
    with pytest.raises(IndexError, match="axis"):
        gk.mean(a, axis=(0, -3))
    with pytest.raises(ValueError, match="axis.*duplicate"):
        gk.sum(a, axis=(1, -1))
    with pytest.raises(ValueError, match="axis.*duplicate"):
        gk.max(a, axis=[0, 0])
    with pytest.raises(TypeError, match="axis"):
        gk.sum(a, axis=1.5)
    with pytest.raises(TypeError, match="axis"):
        gk.sum(a, axis=True)
    with pytest.raises(TypeError, match="axis"):
        gk.max(a, axis="0")
    with pytest.raises(TypeError, match="axis"):
        gk.argmax(a, axis=(0, 1))
    with pytest.raises(IndexError, match="axis"):
        gk.argmin(a, axis=-3)
    with pytest.raises(IndexError, match="axis"):
        gk.softmax(a, axis=2)
    with pytest.raises(TypeError):
        gk.sum(a, dtype="nonsense")
    with pytest.raises(TypeError):
        gk.softmax(a, axis=None)


def softmax_ref(x, axis):
    x = as_f64(x)
    m = x.max(axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True), (x - m) - np.log(e.sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("shape,axis", [((1,), 0), ((7,), -1), ((3, 1023), -1), ((4097, 2), 0), ((5, 4097), 1),
                                        ((4, 5, 6), 1), ((2, 3, 1025), -1)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_softmax(shape, axis, dtype):
    x = (rand(shape, "float32") * 4).astype(NP_DT[dtype])
    a = gk.asarray(x)
    p, lp = softmax_ref(x, axis)
    tol = {"float32": 1e-6, "float64": 1e-14, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]
    got = gk.softmax(a, axis=axis)
    assert got.dtype == a.dtype and got.shape == a.shape
    np.testing.assert_allclose(as_f64(gk.to_numpy(got)), p, rtol=tol, atol=tol * 1e-3)
    got = gk.log_softmax(a, axis=axis)
    np.testing.assert_allclose(as_f64(gk.to_numpy(got)), lp, rtol=tol, atol=tol * 10)


def test_softmax_edge_cases():
    x = np.array([[1000.0, 1001.0, 999.0], [-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0], [np.nan, 1.0, 2.0]],
                 np.float32)
    p = gk.softmax(gk.asarray(x), axis=-1).numpy()
    lp = gk.log_softmax(gk.asarray(x), axis=-1).numpy()
    ref, lref = softmax_ref(x[:1], -1)
    np.testing.assert_allclose(p[0], ref[0], rtol=1e-6)
    np.testing.assert_allclose(lp[0], lref[0], rtol=1e-6)
    assert np.all(np.isnan(p[1])) and np.all(np.isnan(lp[1]))  # all -inf: NaN, like NumPy/torch
    assert p[2, 1] == 0 and lp[2, 1] == -np.inf and abs(p[2].sum() - 1) < 1e-6
    assert np.all(np.isnan(p[3]))
    i = gk.asarray(np.array([[1, 2, 3]], np.int32))
    assert gk.softmax(i).dtype == gk.float32
    np.testing.assert_allclose(gk.softmax(i).numpy(), softmax_ref(np.array([[1, 2, 3]]), -1)[0], rtol=1e-6)
    # non-contiguous input, middle axis: contiguous output
    y = rand((6, 8, 5), "float32")
    v = gk.asarray(y)[::2, :, ::-1]
    got = gk.softmax(v, axis=1)
    np.testing.assert_allclose(got.numpy(), softmax_ref(y[::2, :, ::-1], 1)[0], rtol=1e-6, atol=1e-9)


def test_methods_and_registry():
    x = rand((4, 5), "float32")
    a = gk.asarray(x)
    np.testing.assert_allclose(a.sum(axis=1).numpy(), x.sum(1), rtol=1e-5)
    np.testing.assert_allclose(a.mean(0, True).numpy(), x.mean(0, keepdims=True), rtol=1e-5)
    assert a.max().numpy() == x.max() and a.min().numpy() == x.min()
    assert int(a.argmax().numpy()) == x.argmax() and int(a.argmin().numpy()) == x.argmin()
    np.testing.assert_allclose(gk.sum(x.tolist(), axis=0).numpy(), x.sum(0), rtol=1e-5)  # non-Array input
    np.testing.assert_allclose(gk.sum(a, axis=np.int64(1)).numpy(), x.sum(1), rtol=1e-5)  # NumPy integer axis
    np.testing.assert_array_equal(gk.argmax(a, axis=np.int32(0)).numpy(), x.argmax(0))
    np.testing.assert_allclose(gk.mean(a, axis=(np.int64(0), 1)).numpy(), x.mean(), rtol=1e-5)
    ops = {name: (cpu, cuda) for name, cpu, cuda in gk.registered_ops()}
    for name in ("sum", "mean", "max", "min", "argmax", "argmin", "softmax", "log_softmax", "matmul"):
        assert ops[name] == (True, True) or (ops[name][0] and not gk.cuda.is_available()), name
    assert "NaN" in gk.softmax.__doc__ and "int64" in gk.sum.__doc__
