"""Triton interop: a Triton kernel takes gk.Arrays directly (they expose data_ptr()
and a dtype whose str() is the NumPy/torch name). GPU only; needs triton and torch."""
import numpy as np
import pytest

import gpukit as gk

if not gk.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
torch = pytest.importorskip("torch")


@triton.jit
def _axpby(x_ptr, y_ptr, out_ptr, a, b, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (a * x + b * y).to(out_ptr.dtype.element_ty), mask=mask)


def _run_on_gk_stream(fn):
    """Runs Triton (which launches on torch's current stream) on gpukit's current stream."""
    s = gk.cuda.current_stream()
    with torch.cuda.stream(torch.cuda.ExternalStream(s.handle)):
        fn()
    return s


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n", [1, 1023, 4097])
def test_triton_kernel_on_gk_arrays(dtype, n):
    import ml_dtypes
    npt = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(n)
    xh = rng.standard_normal(n).astype(npt)
    yh = rng.standard_normal(n).astype(npt)
    x = gk.asarray(xh, device="cuda")
    y = gk.asarray(yh, device="cuda")
    out = gk.full((n,), float("nan"), dtype=getattr(gk, dtype), device="cuda")
    assert str(out.dtype) == dtype
    block = 256
    s = _run_on_gk_stream(lambda: _axpby[(triton.cdiv(n, block),)](x, y, out, 2.0, -0.5, n, BLOCK=block))
    s.synchronize()
    ref = (2.0 * xh.astype(np.float32) - 0.5 * yh.astype(np.float32)).astype(npt)
    np.testing.assert_array_equal(out.numpy().astype(np.float32), ref.astype(np.float32))


def test_triton_then_gk_ops_are_ordered():
    n = 1 << 20
    x = gk.ones(n, device="cuda")
    y = gk.ones(n, device="cuda")
    out = gk.empty((n,), device="cuda")
    _run_on_gk_stream(lambda: _axpby[(triton.cdiv(n, 1024),)](x, y, out, 3.0, 1.0, n, BLOCK=1024))
    z = out * 2  # same stream: sees Triton's result without a host sync
    np.testing.assert_array_equal(z.numpy(), np.full(n, 8.0, np.float32))
