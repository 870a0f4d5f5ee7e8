"""gk.jit on the GPU: elementwise, reduction and shared-memory kernels, streams, graphs,
torch/CuPy tensors and the sticky-fault path (skipped without a CUDA device)."""
import numpy as np
import pytest

import gpukit as gk
from test_jit import AXPY, _private_cache, needs_gpu, run_py, unique  # noqa: F401


def cuda(a):
    return gk.asarray(np.ascontiguousarray(a), device="cuda")


@needs_gpu
@pytest.mark.parametrize("n", [1, 7, 1023, 4097])
def test_elementwise_axpy(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    k = gk.jit(AXPY, "axpy<float>")
    assert k.arch == "sm_%d%d%s" % (*gk.cuda.get_device_properties()["compute_capability"],
                                    "a" if gk.cuda.get_device_properties()["compute_capability"][0] >= 9 else "")
    gx, gy = cuda(x), cuda(y)
    k((n + 127) // 128, 128, 1.5, gx, gy, n)
    ref = 1.5 * x.astype(np.float64) + y
    np.testing.assert_allclose(gy.numpy(), ref, rtol=1e-6, atol=1e-6)
    kd = gk.jit(AXPY, "axpy<double>")
    xd, yd = cuda(x.astype(np.float64)), cuda(y.astype(np.float64))
    kd(((n + 63) // 64, 1, 1), (64,), -2, xd, yd, n)
    np.testing.assert_allclose(yd.numpy(), -2 * x.astype(np.float64) + y, rtol=1e-14)


@needs_gpu
def test_bf16_and_strided_view():
    src = r"""
    #include <cuda_bf16.h>
    extern "C" __global__ void dbl(const __nv_bfloat16* x, __nv_bfloat16* y, int n, __nv_bfloat16 add) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] = __float2bfloat16(2.0f * __bfloat162float(x[i]) + __bfloat162float(add));
    }"""
    import ml_dtypes
    k = gk.jit(src, "dbl")
    n = 1000
    x = (np.arange(n) / 8.0).astype(ml_dtypes.bfloat16)
    gx = cuda(x)
    gy = gk.full((n,), float("nan"), dtype=gk.bfloat16, device="cuda")
    k(4, 256, gx, gy, n, 0.5)
    want = (2 * x.astype(np.float32) + 0.5).astype(ml_dtypes.bfloat16).astype(np.float32)  # rounded to bf16
    np.testing.assert_array_equal(gy.numpy().astype(np.float32), want)
    with pytest.raises(TypeError, match="float32"):
        k(4, 256, gk.zeros(n, device="cuda"), gy, n, 0.5)
    # a view passes the pointer of its first element
    big = cuda(np.arange(20, dtype=np.float32))
    inc = gk.jit('extern "C" __global__ void inc(float* p) { p[threadIdx.x] += 1.0f; }', "inc")
    inc(1, 4, big[8:12])
    expected = np.arange(20, dtype=np.float32)
    expected[8:12] += 1
    np.testing.assert_array_equal(big.numpy(), expected)


REDUCE = r"""
extern "C" __global__ void block_sum(const float* x, double* out, long long n) {
  extern __shared__ double buf[];
  double acc = 0.0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];  // fixed order per thread
  buf[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = buf[0];
}
"""


@needs_gpu
@pytest.mark.parametrize("n", [1, 1023, 100003])
def test_reduction_deterministic(n):
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    k = gk.jit(REDUCE, "block_sum")
    gx = cuda(x)
    results = []
    for _ in range(3):
        out = gk.full((1,), 12345.0, dtype=gk.float64, device="cuda")
        k(1, 256, gx, out, n, shared_mem=256 * 8)
        results.append(out.numpy()[0])
    assert results[0] == results[1] == results[2]
    np.testing.assert_allclose(results[0], x.astype(np.float64).sum(), rtol=1e-10, atol=1e-9)


@needs_gpu
def test_large_dynamic_shared_memory():
    src = r"""
    extern "C" __global__ void reverse(const float* x, float* y, int per_block) {
      extern __shared__ float tile[];
      const float* xb = x + (long long)blockIdx.x * per_block;
      float* yb = y + (long long)blockIdx.x * per_block;
      for (int i = threadIdx.x; i < per_block; i += blockDim.x) tile[i] = xb[i];
      __syncthreads();
      for (int i = threadIdx.x; i < per_block; i += blockDim.x) yb[i] = tile[per_block - 1 - i];
    }"""
    k = gk.jit(src, "reverse")
    per_block = 24 * 1024  # 96 KiB of dynamic shared memory: above the 48 KiB default
    blocks = 3
    x = np.random.default_rng(0).standard_normal(per_block * blocks).astype(np.float32)
    gy = gk.full((x.size,), -1.0, device="cuda")
    k(blocks, 256, cuda(x), gy, per_block, shared_mem=per_block * 4)
    np.testing.assert_array_equal(gy.numpy(), x.reshape(blocks, per_block)[:, ::-1].reshape(-1))
    # 40 KiB static + 16 KiB dynamic: over 48 KiB in total although the dynamic part is not
    mix = gk.jit(r"""
    extern "C" __global__ void mix(float* out) {
      __shared__ float s[10240];
      extern __shared__ float d[];
      s[threadIdx.x] = 1.0f + threadIdx.x;
      d[4095 - threadIdx.x] = 2.0f;
      __syncthreads();
      out[threadIdx.x] = s[threadIdx.x] + d[4095 - threadIdx.x];
    }""", "mix")
    o = gk.zeros(32, device="cuda")
    mix(1, 32, o, shared_mem=16 * 1024)
    np.testing.assert_array_equal(o.numpy(), np.arange(32, dtype=np.float32) + 3)
    optin = gk.cuda.get_device_properties()["shared_memory_per_block_optin"]
    with pytest.raises(ValueError, match="shared_mem"):
        k(1, 256, cuda(x), gy, 1, shared_mem=optin + 4)


@needs_gpu
def test_wrong_arguments_do_not_launch():
    k = gk.jit(AXPY, "axpy<float>")
    y = gk.full((8,), 3.0, device="cuda")
    x = gk.ones(8, device="cuda")
    gk.cuda.synchronize()
    before = gk.jit.stats()["launches"]
    with pytest.raises(TypeError):
        k(1, 8, 1.0, x, y)
    with pytest.raises(TypeError):
        k(1, 8, 1.0, x, gk.zeros(8, dtype=gk.int32, device="cuda"), 8)
    with pytest.raises(ValueError, match="on cpu"):
        k(1, 8, 1.0, gk.ones(8), y, 8)
    with pytest.raises(ValueError, match="block"):
        k(1, 2048, 1.0, x, y, 8)
    with pytest.raises(ValueError, match="grid"):
        k(0, 8, 1.0, x, y, 8)
    assert gk.jit.stats()["launches"] == before
    np.testing.assert_array_equal(y.numpy(), np.full(8, 3.0, np.float32))
    k(1, 8, 1.0, x, y, 8)
    assert gk.jit.stats()["launches"] == before + 1
    np.testing.assert_array_equal(y.numpy(), np.full(8, 4.0, np.float32))


@needs_gpu
def test_cached_kernel_reuses_loaded_library():
    src = unique(AXPY)
    gk.jit(src, "axpy<float>")
    s0 = gk.jit.stats()
    gk.jit(src, "axpy<float>")
    s1 = gk.jit.stats()
    assert s1["nvrtc_compiles"] == s0["nvrtc_compiles"]
    assert s1["library_loads"] == s0["library_loads"]


@needs_gpu
def test_stream_ordering():
    k = gk.jit(AXPY, "axpy<float>")
    s = gk.Stream()
    n = 1 << 20
    x = gk.ones(n, device="cuda", stream=s)
    y = gk.zeros(n, device="cuda", stream=s)
    for _ in range(10):
        k(n // 256, 256, 1.0, x, y, n, stream=s)
    with s:
        k(n // 256, 256, 1.0, x, y, n)  # the current stream
    s.synchronize()
    np.testing.assert_array_equal(y.numpy(), np.full(n, 11.0, np.float32))


@needs_gpu
def test_graph_capture_and_replay():
    k = gk.jit(AXPY, "axpy<float>")
    n = 4097
    x = cuda(np.arange(n, dtype=np.float32))
    y = gk.zeros(n, device="cuda")
    s = gk.Stream()
    gk.cuda.synchronize()
    with gk.Graph(s) as g:
        k((n + 255) // 256, 256, 2.0, x, y, n)
        k((n + 255) // 256, 256, 1.0, x, y, n)
    s.synchronize()
    np.testing.assert_array_equal(y.numpy(), np.zeros(n, np.float32))  # capture does not run
    g.replay()
    s.synchronize()
    np.testing.assert_array_equal(y.numpy(), 3 * np.arange(n, dtype=np.float32))
    g.replay()
    g.replay()
    s.synchronize()
    np.testing.assert_array_equal(y.numpy(), 9 * np.arange(n, dtype=np.float32))


@needs_gpu
def test_torch_and_cupy_tensors():
    k = gk.jit(AXPY, "axpy<float>")
    done = 0
    try:
        import torch
        x = torch.arange(100, dtype=torch.float32, device="cuda")
        y = torch.ones(100, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        k(1, 128, 2.0, x, y, 100, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        assert torch.equal(y, 2 * torch.arange(100, dtype=torch.float32, device="cuda") + 1)
        with pytest.raises(TypeError, match="float16"):
            k(1, 128, 2.0, x.half(), y, 100)
        with pytest.raises(ValueError, match="cpu"):
            k(1, 128, 2.0, x.cpu(), y, 100)
        done += 1
    except ImportError:
        pass
    try:
        import cupy
        x = cupy.arange(100, dtype=cupy.float32)
        y = cupy.ones(100, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()
        k(1, 128, 2.0, x, y, 100, stream=cupy.cuda.get_current_stream())
        cupy.cuda.Device().synchronize()
        assert bool((y == 2 * cupy.arange(100, dtype=cupy.float32) + 1).all())
        with pytest.raises(TypeError, match="float64"):
            k(1, 128, 2.0, x.astype(cupy.float64), y, 100)
        done += 1
    except ImportError:
        pass
    if not done:
        pytest.skip("neither torch nor CuPy installed")


@needs_gpu
def test_fault_marks_device_failed(tmp_path):
    r = run_py("""
    import gpukit as gk
    k = gk.jit('extern "C" __global__ void boom(float* p) { p[threadIdx.x] = 1.0f; }', "boom")
    ok = gk.zeros(4, device="cuda") + 1
    gk.cuda.synchronize()
    k(1, 32, None)                     # writes through a null pointer
    try:
        gk.cuda.synchronize()
    except gk.CudaError as e:
        print("sync raised:", e)
    else:
        raise SystemExit("synchronize did not raise")
    assert gk.cuda.is_failed(), "device not marked failed"
    for op in (lambda: gk.zeros(4, device="cuda") + 1, lambda: k(1, 32, None), lambda: ok.numpy()):
        try:
            op()
        except gk.CudaError as e:
            assert "failed" in str(e), str(e)
        else:
            raise SystemExit("a call on the failed device did not raise CudaError")
    print("FAULT-OK")
    """, {"GPUKIT_CACHE_DIR": str(tmp_path)}, timeout=120)
    assert r.returncode == 0 and "FAULT-OK" in r.stdout, r.stdout + r.stderr
