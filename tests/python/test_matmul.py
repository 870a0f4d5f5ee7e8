"""matmul on the CPU backend against float64 NumPy: NumPy semantics (1-d operands,
broadcast batch dimensions), float32/float16/bfloat16/float64 and mixed dtypes,
odd sizes, transposed and strided operands, k = 0 and empty results, bad input."""
import time

import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

RNG = np.random.default_rng(99)
NP_DT = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float64": np.float64}
EPS_OUT = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "float64": 2.0**-53}
TINY = {"float32": 2.0**-149, "float16": 2.0**-24, "bfloat16": 2.0**-133, "float64": 0.0}  # subnormal spacing


def rand(shape, dtype):
    return RNG.standard_normal(shape).astype(NP_DT[dtype])


def f64(a):
    return np.asarray(a).astype(np.float64)


def check(got, a_np, b_np, dtype):
    """|got - ref| within the result rounding plus a k-term fp32 (f64) accumulation bound."""
    ref = f64(a_np) @ f64(b_np)
    bound = np.abs(f64(a_np)) @ np.abs(f64(b_np))
    k = np.shape(a_np)[-1]
    eps_acc = 2.0**-53 if dtype == "float64" else 2.0**-24
    g = f64(gk.to_numpy(got))
    assert g.shape == ref.shape, (g.shape, ref.shape)
    tol = 2 * EPS_OUT[dtype] * np.abs(ref) + 2 * (k + 2) * eps_acc * bound + TINY[dtype]
    bad = np.abs(g - ref) > tol
    assert not bad.any(), f"{bad.sum()} elements out of tolerance; worst {np.max(np.abs(g - ref) - tol)}"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 7, 7), (1, 1023, 1), (65, 17, 129), (7, 4097, 3),
                                   (1023, 7, 65), (64, 64, 64), (3, 1, 4097)])
def test_2d(dtype, m, k, n):
    a, b = rand((m, k), dtype), rand((k, n), dtype)
    got = gk.matmul(gk.asarray(a), gk.asarray(b))
    assert got.dtype == gk.asarray(a).dtype
    check(got, a, b, dtype)


@pytest.mark.parametrize("sa,sb", [
    ((5,), (5,)), ((5,), (5, 3)), ((4, 5), (5,)), ((2, 1, 3, 4), (5, 4, 6)), ((3, 4), (2, 4, 6)),
    ((2, 3, 4), (4, 6)), ((7,), (2, 3, 7, 5)), ((2, 3, 7, 5), (5,)), ((1, 1, 2, 3), (4, 1, 3, 2)),
])
def test_numpy_semantics(sa, sb):
    a, b = rand(sa, "float32"), rand(sb, "float32")
    got = gk.asarray(a) @ gk.asarray(b)
    assert got.shape == (a @ b).shape
    check(got, a, b, "float32")
    assert got.shape == np.matmul(a, b).shape


def test_strided_operands():
    a = rand((9, 40, 33), "float32")
    b = rand((33, 50), "float32")
    ga, gb = gk.asarray(a), gk.asarray(b)
    cases = [
        (ga.transpose(1, 2), gk.asarray(rand((9, 40, 8), "float32")), None),
        (ga[::2, ::3, 1::2], gb[1::2, ::-1], None),
        (ga[:, :, :33], gb.T.T, None),
        (gb.T, ga.transpose(1, 2)[:, :33, :][:, :, ::2], None),
        (ga[0].T[::-1], ga[1][:, ::2], None),
    ]
    for x, y, _ in cases:
        xn, yn = gk.to_numpy(x), gk.to_numpy(y)
        check(gk.matmul(x, y), xn, yn, "float32")
    # broadcast (stride 0) batch operand
    w = gk.asarray(rand((33, 5), "float32")).unsqueeze(0).broadcast_to((9, 33, 5))
    check(gk.matmul(ga, w), a, gk.to_numpy(w), "float32")
    # half-precision transposed views
    h = gk.asarray(rand((17, 31), "bfloat16"))
    check(gk.matmul(h.T, h), gk.to_numpy(h).T, gk.to_numpy(h), "bfloat16")


def test_mixed_dtypes():
    a32, a16, abf = rand((6, 5), "float32"), rand((5, 4), "float16"), rand((5, 4), "bfloat16")
    r = gk.matmul(gk.asarray(a32), gk.asarray(a16))
    assert r.dtype == gk.float32
    check(r, a32, a16, "float32")
    r = gk.matmul(gk.asarray(a16.T), gk.asarray(abf))
    assert r.dtype == gk.float32
    check(r, a16.T, abf, "float32")
    r = gk.matmul(gk.asarray(abf.T), gk.asarray(abf))
    assert r.dtype == gk.bfloat16


def test_fp32_accumulation_for_half_types():
    # 4096 ones: a float16 accumulator would stop at 2048.
    a = gk.ones((1, 4096), dtype=gk.float16)
    b = gk.ones((4096, 1), dtype=gk.float16)
    assert float(gk.to_numpy(gk.matmul(a, b))[0, 0]) == 4096.0
    c = gk.ones((1, 4096), dtype=gk.bfloat16)
    assert float(gk.to_numpy(gk.matmul(c, gk.ones((4096, 2), dtype=gk.bfloat16)))[0, 1]) == 4096.0


def test_empty_and_k0():
    z = gk.matmul(gk.zeros((3, 0)), gk.zeros((0, 4)))
    assert z.shape == (3, 4) and np.all(z.numpy() == 0)
    z = gk.matmul(gk.full((2, 3, 0), 7.0, dtype=gk.bfloat16), gk.full((0, 5), 7.0, dtype=gk.bfloat16))
    assert z.shape == (2, 3, 5) and np.all(f64(gk.to_numpy(z)) == 0)
    assert gk.matmul(gk.zeros((0, 3)), gk.zeros((3, 4))).shape == (0, 4)
    assert gk.matmul(gk.zeros((2, 3)), gk.zeros((3, 0))).shape == (2, 0)
    assert gk.matmul(gk.zeros((0, 2, 3)), gk.zeros((3, 4))).shape == (0, 2, 4)
    assert float(gk.matmul(gk.zeros((0,)), gk.zeros((0,))).numpy()) == 0.0


def test_bad_input():
    a = gk.zeros((3, 4))
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(5, 2\)"):
        gk.matmul(a, gk.zeros((5, 2)))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(3, 4, 2\)"):
        gk.matmul(gk.zeros((2, 3, 4)), gk.zeros((3, 4, 2)))
    with pytest.raises(ValueError, match="dimension"):
        gk.matmul(gk.zeros(()), a)
    with pytest.raises(ValueError):
        gk.matmul(gk.zeros((4,)), gk.zeros((3,)))
    with pytest.raises(TypeError, match="int32"):
        gk.matmul(a.astype(gk.int32), gk.zeros((4, 2)))
    with pytest.raises(TypeError, match="b: .*int64"):
        gk.matmul(a, gk.zeros((4, 2), dtype=gk.int64))
    with pytest.raises(TypeError):
        gk.matmul(a.astype(gk.bool_), a.T.astype(gk.bool_))
    with pytest.raises(TypeError, match="float8"):
        gk.matmul(a.astype(gk.float8_e4m3fn), gk.zeros((4, 2)))


def test_operators_and_determinism():
    x = rand((33, 65), "float32")
    g = gk.asarray(x)
    r1 = (g @ g.T).numpy()
    assert (g @ g.T).numpy().tobytes() == r1.tobytes()
    check(g @ x.T.tolist(), x, x.T, "float32")  # list on the right
    check(x[:2].tolist() @ g.T, x[:2], x.T, "float32")  # __rmatmul__
    assert "broadcast" in gk.matmul.__doc__


def test_speed_512():
    a = gk.asarray(rand((512, 512), "float32"))
    gk.matmul(a, a)
    t = time.perf_counter()
    gk.matmul(a, a)
    assert time.perf_counter() - t < 1.0
