"""Interop on the GPU: zero-copy and stream-ordered exchange with torch and CuPy
(DLPack both ways, __cuda_array_interface__ both ways). Skips cleanly without CUDA,
torch or CuPy; run on the GPU machine (torch 2.11 cu130, cupy-cuda13x 14.2).
"""
import gc
import os
import sys

import numpy as np
import pytest

import gpukit as gk
sys.path.insert(0, os.path.dirname(__file__))
from test_interop import capsule_name, capsule_struct  # noqa: E402

HAS_CUDA = gk.cuda.is_available()
need_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")

SLEEP_CYCLES = 400_000_000  # ~0.2 s on an H200: far longer than the host-side hand-off


def _torch():
    torch = pytest.importorskip("torch")
    if not HAS_CUDA or not torch.cuda.is_available():
        pytest.skip("needs CUDA for gpukit and torch")
    return torch


def _cupy():
    cupy = pytest.importorskip("cupy")
    if not HAS_CUDA:
        pytest.skip("needs CUDA")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy sees no GPU")
    except Exception:  # pragma: no cover
        pytest.skip("CuPy cannot use the GPU")
    return cupy


TORCH_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


@need_cuda
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_from_gk_zero_copy(dtype):
    torch = _torch()
    ref = torch.arange(24, device="cpu").reshape(4, 6)
    ref = (ref % 2 == 0) if dtype == "bool" else ref.to(getattr(torch, dtype))
    x = gk.asarray(ref.to(torch.float32).numpy(), device="cuda").astype(dtype)
    t = torch.from_dlpack(x)
    assert t.device.type == "cuda" and t.dtype == getattr(torch, dtype)
    assert t.data_ptr() == x.data_ptr() and tuple(t.shape) == x.shape
    assert torch.equal(t.cpu(), ref)
    # torch writes, gpukit sees
    t[0, 0] = True if dtype == "bool" else 7
    torch.cuda.synchronize()
    assert bool(x[0, 0].numpy() == (True if dtype == "bool" else 7))
    # gpukit writes, torch sees
    x[1, 1] = False if dtype == "bool" else 3
    gk.synchronize("cuda:0")
    assert t[1, 1].item() == (False if dtype == "bool" else 3)


@need_cuda
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_gk_from_torch_zero_copy(dtype):
    torch = _torch()
    t = torch.arange(35, device="cuda").reshape(5, 7)
    t = (t % 3 == 0) if dtype == "bool" else t.to(getattr(torch, dtype))
    x = gk.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr() and x.shape == (5, 7) and str(x.dtype) == dtype
    tf = t.to(torch.float32).cpu().numpy()
    np.testing.assert_array_equal(x.astype(gk.float32).numpy(), tf)
    t.zero_()
    torch.cuda.synchronize()
    assert not x.astype(gk.float32).numpy().any()
    # strided views keep their strides
    for v in (t.t(), t[:, 1::2], t[1:4, 2]):
        y = gk.from_dlpack(v)
        assert y.strides == tuple(v.stride()) and y.data_ptr() == v.data_ptr()


@need_cuda
def test_torch_values_strided_and_edge_shapes():
    torch = _torch()
    t = torch.randn(6, 9, device="cuda")
    for v in (t.t(), t[::2, 1::3], t[2], t[0, 0], t[:0], t.reshape(3, 2, 9)[:, 1]):
        x = gk.from_dlpack(v)
        np.testing.assert_array_equal(x.numpy(), v.cpu().numpy())
        back = torch.from_dlpack(x)
        assert back.shape == v.shape and torch.equal(back.cpu(), v.cpu())
        if v.numel():
            assert back.data_ptr() == v.data_ptr()
    # gpukit views, broadcast included, go to torch without copies
    g = gk.asarray(np.arange(12, dtype=np.float32), device="cuda")
    b = torch.from_dlpack(g.reshape(3, 4).T)
    assert b.stride() == (1, 4) and b.data_ptr() == g.data_ptr()
    bc = torch.from_dlpack(g[:4].broadcast_to((3, 4)))
    assert bc.stride() == (0, 1)
    assert torch.equal(bc.cpu(), torch.arange(4.0).expand(3, 4))


@need_cuda
def test_torch_bf16_values():
    torch = _torch()
    t = torch.randn(257, device="cuda").to(torch.bfloat16)
    x = gk.from_dlpack(t)
    assert x.dtype == gk.bfloat16
    np.testing.assert_array_equal(x.astype(gk.float32).numpy(), t.float().cpu().numpy())
    y = gk.asarray(np.linspace(-3, 3, 101, dtype=np.float32), device="cuda").astype(gk.bfloat16)
    u = torch.from_dlpack(y)
    assert u.dtype == torch.bfloat16
    np.testing.assert_array_equal(u.float().cpu().numpy(), y.astype(gk.float32).numpy())


@need_cuda
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_torch_fp8(name):
    torch = _torch()
    tdt = getattr(torch, name, None)
    if tdt is None:
        pytest.skip(f"torch has no {name}")
    x = gk.asarray(np.linspace(-4, 4, 33, dtype=np.float32), device="cuda").astype(name)
    try:
        t = torch.from_dlpack(x)
    except (BufferError, RuntimeError, TypeError) as e:
        pytest.skip(f"this torch cannot import {name} through DLPack: {e}")
    assert t.dtype == tdt and t.data_ptr() == x.data_ptr()
    np.testing.assert_array_equal(t.float().cpu().numpy(), x.astype(gk.float32).numpy())
    back = gk.from_dlpack(t)
    assert back.dtype == x.dtype


@need_cuda
def test_dlpack_stream_arguments():
    x = gk.arange(8, dtype=gk.float32, device="cuda")
    assert x.__dlpack_device__() == (2, 0)
    other = gk.Stream("cuda:0")  # kept alive while the export makes it wait
    for s in (None, 1, 2, -1, other.handle):
        cap = x.__dlpack__(stream=s, max_version=(1, 1))
        assert capsule_name(cap) == "dltensor_versioned"
        assert capsule_struct(cap).dl_tensor.device.device_type == 2
    with pytest.raises(ValueError, match="ambiguous"):
        x.__dlpack__(stream=0)
    with pytest.raises(TypeError):
        x.__dlpack__(stream="1")
    # dl_device=(CPU): a host copy, flagged as a copy
    cap = x.__dlpack__(max_version=(1, 1), dl_device=(1, 0))
    s = capsule_struct(cap)
    assert s.dl_tensor.device.device_type == 1 and s.flags & 2
    np.testing.assert_array_equal(gk.from_dlpack(cap).numpy(), np.arange(8, dtype=np.float32))
    with pytest.raises(BufferError):
        x.__dlpack__(max_version=(1, 1), dl_device=(1, 0), copy=False)
    n = np.from_dlpack(x, device="cpu")
    np.testing.assert_array_equal(n, np.arange(8, dtype=np.float32))


@need_cuda
def test_cuda_array_interface_export():
    x = gk.asarray(np.arange(12, dtype=np.float32).reshape(3, 4), device="cuda")
    d = x.__cuda_array_interface__
    assert d["version"] == 3 and d["shape"] == (3, 4) and d["typestr"] == "<f4"
    assert d["data"] == (x.data_ptr(), False) and d["strides"] is None
    assert d["stream"] == gk.Stream.current("cuda:0").handle and d["stream"] not in (0, None)
    v = x.T[1:]
    dv = v.__cuda_array_interface__
    assert dv["strides"] == (4, 16) and dv["data"][0] == v.data_ptr()
    for t, ts in [("bool", "|b1"), ("uint8", "|u1"), ("int8", "|i1"), ("int16", "<i2"), ("int32", "<i4"),
                  ("int64", "<i8"), ("float16", "<f2"), ("float64", "<f8")]:
        assert x.astype(t).__cuda_array_interface__["typestr"] == ts
    for t in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        with pytest.raises(TypeError, match=t):
            x.astype(t).__cuda_array_interface__
        # ... and hasattr() is False, so consumers (torch.as_tensor, cupy.asarray) use DLPack
        assert not hasattr(x.astype(t), "__cuda_array_interface__")
    # gpukit reads its own interface back
    y = gk.from_cuda_array_interface(v)
    assert y.data_ptr() == v.data_ptr() and y.strides == v.strides
    np.testing.assert_array_equal(y.numpy(), v.numpy())


@need_cuda
def test_torch_stream_ordering_torch_to_gk():
    """torch fills a tensor on a side stream after a long kernel; gpukit, on its own
    stream, must see the finished values."""
    torch = _torch()
    n = 1 << 20
    t = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    gs = gk.Stream("cuda:0")
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        t.fill_(3.0)
        with gs:
            x = gk.from_dlpack(t)  # torch's current stream is `side`
    with gs:
        r = (x * 2).numpy()
    assert (r == 6).all(), f"gpukit read unfinished torch data ({np.unique(r)[:4]})"


@need_cuda
def test_torch_stream_ordering_gk_to_torch():
    """gpukit writes on its stream behind a long wait; torch, on its stream, must see the result."""
    torch = _torch()
    n = 1 << 20
    gs = gk.Stream("cuda:0")
    with gs:
        y = gk.zeros((n,), dtype=gk.float32, device="cuda")
    gs.synchronize()
    blocker = torch.cuda.Stream()
    with torch.cuda.stream(blocker):
        torch.cuda._sleep(SLEEP_CYCLES)
    gs.wait_stream(gk.Stream("cuda:0", handle=blocker.cuda_stream))  # gpukit's stream is now busy
    with gs:
        gk.copy_into(y, gk.full((n,), 5.0, dtype=gk.float32, device="cuda"))
        t = torch.from_dlpack(y)  # torch's current (default) stream waits on gs
    s = (t * 1).sum().item()
    assert s == 5.0 * n, f"torch read unfinished gpukit data (sum {s})"


SPIN_SRC = r"""
extern "C" __global__ void spin_fill(float* x, long long n, long long cycles, float v) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    x[i] = v;
}
"""


def _spin_fill(cupy, arr, value, cycles=SLEEP_CYCLES):
    """On CuPy's current stream: spin for `cycles` clocks, then fill arr with value."""
    try:
        k = cupy.RawKernel(SPIN_SRC, "spin_fill")
        k.compile()
    except Exception as e:  # pragma: no cover - no NVRTC for CuPy on this machine
        pytest.skip(f"CuPy cannot compile kernels here: {e}")
    k((32,), (256,), (arr, cupy.int64(arr.size), cupy.int64(cycles), cupy.float32(value)))


@need_cuda
def test_cupy_dlpack_both_ways():
    cupy = _cupy()
    a = cupy.arange(30, dtype=cupy.float32).reshape(5, 6)
    x = gk.from_dlpack(a)
    assert x.data_ptr() == a.data.ptr
    np.testing.assert_array_equal(x.numpy(), cupy.asnumpy(a))
    a[0, 0] = 100
    cupy.cuda.Device().synchronize()
    assert x[0, 0].numpy() == 100
    y = gk.asarray(np.arange(12, dtype=np.int32).reshape(3, 4), device="cuda")[:, ::2]
    c = cupy.from_dlpack(y)
    assert c.data.ptr == y.data_ptr() and c.strides == (16, 8)
    np.testing.assert_array_equal(cupy.asnumpy(c), y.numpy())
    y[0, 0] = -1
    gk.synchronize("cuda:0")
    assert int(c[0, 0]) == -1
    b = cupy.from_dlpack(gk.asarray(np.array([True, False]), device="cuda"))
    assert b.dtype == cupy.bool_ and cupy.asnumpy(b).tolist() == [True, False]


class CAIOnly:
    def __init__(self, desc, keep):
        self.__cuda_array_interface__ = desc
        self.keep = keep


@need_cuda
def test_cupy_cuda_array_interface_both_ways():
    cupy = _cupy()
    a = cupy.arange(20, dtype=cupy.float64).reshape(4, 5)[:, 1::2]
    x = gk.from_cuda_array_interface(a)
    assert x.data_ptr() == a.data.ptr and x.strides == (5, 2)
    np.testing.assert_array_equal(x.numpy(), cupy.asnumpy(a))
    x[0, 0] = 42
    gk.synchronize("cuda:0")
    assert float(a[0, 0]) == 42
    g = gk.asarray(np.arange(8, dtype=np.float16), device="cuda")
    c = cupy.asarray(CAIOnly(g.__cuda_array_interface__, g))
    assert c.data.ptr == g.data_ptr() and c.dtype == cupy.float16
    np.testing.assert_array_equal(cupy.asnumpy(c), g.numpy())
    # the import keeps the CuPy array alive
    tmp = cupy.full((7,), 2.5, dtype=cupy.float32)
    z = gk.from_cuda_array_interface(tmp)
    del tmp
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    np.testing.assert_array_equal(z.numpy(), np.full(7, 2.5, np.float32))


@need_cuda
def test_cupy_stream_ordering_both_protocols():
    cupy = _cupy()
    n = 1 << 20
    for protocol in ("dlpack", "cai"):
        a = cupy.zeros(n, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        s = cupy.cuda.Stream(non_blocking=True)
        gs = gk.Stream("cuda:0")
        with s:
            _spin_fill(cupy, a, 4.0)
            with gs:
                x = gk.from_dlpack(a) if protocol == "dlpack" else gk.from_cuda_array_interface(a)
        with gs:
            r = (x + 1).numpy()
        assert (r == 5).all(), f"{protocol}: gpukit read unfinished CuPy data"
        s.synchronize()


@need_cuda
def test_gk_to_cupy_stream_ordering():
    cupy = _cupy()
    n = 1 << 20
    for protocol in ("dlpack", "cai"):
        gs = gk.Stream("cuda:0")
        with gs:
            y = gk.zeros((n,), dtype=gk.float32, device="cuda")
        gs.synchronize()
        blocker = cupy.cuda.Stream(non_blocking=True)
        dummy = cupy.zeros(1, dtype=cupy.float32)
        with blocker:
            _spin_fill(cupy, dummy, 1.0)
        gs.wait_stream(gk.Stream("cuda:0", handle=blocker.ptr))
        cs = cupy.cuda.Stream(non_blocking=True)
        with gs:
            gk.copy_into(y, gk.full((n,), 7.0, dtype=gk.float32, device="cuda"))
            with cs:
                c = cupy.from_dlpack(y) if protocol == "dlpack" else cupy.asarray(
                    CAIOnly(y.__cuda_array_interface__, y))
                total = float(c.sum())
        assert total == 7.0 * n, f"{protocol}: CuPy read unfinished gpukit data"
