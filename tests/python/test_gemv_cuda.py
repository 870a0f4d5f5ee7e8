"""CUDA decode GEMV against the CPU reference and float64 NumPy: every M template
(1, 2, 4, 8 and the rows between), the 16-byte vector path and the scalar path
(misaligned x/w, odd strides), K % 8 != 0 tails, split-K shapes (small N, large K),
odd N (a warp's second row missing), bitwise determinism. Skipped without a GPU."""
import math

import numpy as np
import pytest

import gpukit as gk
from test_gemv import check_gemv, f64, rand

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")


def cu(x):
    return gk.asarray(x).to("cuda")


def bits(x):
    return gk.to_numpy(x).tobytes()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("k,n", [(8, 1), (64, 3), (1000, 17), (4096, 33), (4104, 257), (14336, 64),
                                 (4096, 4097), (37, 5), (2049, 31)])
def test_gemv_matches(dtype, m, k, n):
    x, w = rand((m, k), dtype), rand((n, k), dtype, 1 / math.sqrt(k))
    got = gk.gemv(cu(x), cu(w))
    check_gemv(got, x, w, dtype)
    cpu = gk.gemv(gk.asarray(x), gk.asarray(w))
    np.testing.assert_allclose(f64(got), f64(cpu), rtol=4 * 2.0**-8, atol=1e-3)
    assert bits(gk.gemv(cu(x), cu(w))) == bits(got)


def test_gemv_scalar_path_misaligned():
    wb, xb = rand((33, 1001), "bfloat16"), rand((3, 1001), "bfloat16")
    w = cu(wb)[:, 1:]       # rows 1001 apart, offset by one element: no 16-byte loads
    x = cu(xb)[:, 1:]
    check_gemv(gk.gemv(x, w), xb[:, 1:], wb[:, 1:], "bfloat16")
    w2 = cu(rand((20, 2048), "float16"))[1::2, 8:]   # aligned rows, stride 4096
    x2 = rand((2, 2040), "float16")
    check_gemv(gk.gemv(cu(x2), w2), x2, f64(w2), "float16")


def test_gemv_split_k_deterministic_and_out_f32():
    x, w = rand((4, 14336), "bfloat16"), rand((512, 14336), "bfloat16", 0.01)
    got = gk.gemv(cu(x), cu(w), out_dtype="float32")
    assert got.dtype == gk.float32
    check_gemv(got, x, w, "float32")
    for _ in range(3):
        assert bits(gk.gemv(cu(x), cu(w), out_dtype="float32")) == bits(got)
    # the split depends on (N, K) only: one row of a 4-row batch gives the same bits
    one = gk.gemv(cu(x[2]), cu(w), out_dtype="float32")
    assert bits(one) == gk.to_numpy(got)[2].tobytes()


def test_gemv_large_shapes():
    for k, n in [(4096, 14336), (14336, 4096)]:
        x, w = rand((1, k), "bfloat16"), rand((n, k), "bfloat16", 1 / 64)
        got = gk.gemv(cu(x), cu(w))
        check_gemv(got, x, w, "bfloat16")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("k,n", [(32, 5), (4096, 33), (14336, 257), (1024, 4097)])
def test_gemv_tensor_core_path(dtype, m, k, n):
    """The tensor-core kernel for bf16/fp16 weights (selected with the benchmarking switch)."""
    x, w = rand((m, k), dtype), rand((n, k), dtype, 1 / math.sqrt(k))
    gk._C._gemv_set_dense_path(1)
    try:
        got = gk.gemv(cu(x), cu(w), out_dtype="float32")
        check_gemv(got, x, w, "float32")
        assert bits(gk.gemv(cu(x), cu(w), out_dtype="float32")) == bits(got)
        one = gk.gemv(cu(x[m - 1]), cu(w), out_dtype="float32")
        assert bits(one) == gk.to_numpy(got)[m - 1].tobytes()
    finally:
        gk._C._gemv_set_dense_path(-1)
