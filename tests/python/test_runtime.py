"""Devices, streams, events, CUDA graphs and the caching allocator (GPU parts skip without CUDA).

The sticky-fault test (an illegal address marks the device failed) needs a faulting kernel and
lives with the JIT tests."""
import time

import numpy as np
import pytest

import gpukit as gk
import harness
from conftest import HAS_CUDA, needs_cuda

MiB = 1 << 20


# ---------------------------------------------------------------- devices

def test_devices_and_queries_work_everywhere():
    devs = gk.devices()
    assert str(devs[0]) == "cpu"
    assert isinstance(gk.cuda.is_available(), bool)
    assert isinstance(gk.cuda.built_with_cuda(), bool)
    assert gk.cuda.device_count() == len(devs) - 1
    assert gk.cuda.is_available() == (gk.cuda.device_count() > 0)
    if not gk.cuda.built_with_cuda():
        assert not gk.cuda.is_available()
    assert gk.Device("cpu") == "cpu" and gk.Device("cpu").type == "cpu"
    assert gk.device_properties("cpu")["name"] == "cpu"
    assert not gk.cuda.is_failed("cpu")
    assert issubclass(gk.OutOfMemoryError, MemoryError)
    assert issubclass(gk.CudaError, Exception)


def test_cpu_has_no_streams_events_or_limits():
    with pytest.raises(ValueError, match="device"):
        gk.Stream("cpu")
    with pytest.raises(ValueError, match="device"):
        gk.set_memory_limit("cpu", 1 << 20)
    s = gk.memory_stats("cpu")
    assert {"allocated", "reserved", "peak", "hits", "misses", "limit"} <= set(s)


def test_cpu_allocation_stats():
    before = gk.memory_stats("cpu")["allocated"]
    a = gk.empty((1 << 16,), dtype="float32")
    assert gk.memory_stats("cpu")["allocated"] >= before + (1 << 18)
    del a
    assert gk.memory_stats("cpu")["allocated"] == before


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-CUDA behaviour")
def test_cuda_requests_fail_cleanly_without_cuda():
    for fn in (lambda: gk.Stream(), lambda: gk.Event(), lambda: gk.Graph(), lambda: gk.zeros(2, device="cuda"),
               lambda: gk.ones(2).to("cuda")):
        with pytest.raises(ValueError):
            fn()


@needs_cuda
def test_cuda_device_properties():
    p = gk.cuda.get_device_properties("cuda:0")
    assert p["multiprocessors"] > 0 and p["total_memory"] > 0 and p["compute_capability"][0] >= 7
    assert str(gk.devices()[1]) == "cuda:0"
    assert gk.Device("cuda") == gk.Device("cuda:0")


# ---------------------------------------------------------------- streams and events

def _busy(x, n=30):
    """n dependent elementwise ops on x (keeps a stream busy for a while)."""
    for _ in range(n):
        x = gk.sqrt(gk.abs(x) + 1.0)
    return x


@needs_cuda
def test_current_stream_and_with_stream():
    default = gk.cuda.current_stream()
    s = gk.Stream("cuda")
    assert s != default
    with s:
        assert gk.cuda.current_stream() == s
        with gk.Stream() as s2:
            assert gk.cuda.current_stream() == s2
        assert gk.cuda.current_stream() == s
    assert gk.cuda.current_stream() == default
    assert default.handle != 0  # never the legacy default stream


@needs_cuda
def test_stream_ordering_with_events(rng):
    n = 1 << 22
    src = rng.standard_normal(n).astype(np.float32)
    s1, s2 = gk.Stream("cuda"), gk.Stream("cuda")
    x = gk.asarray(src, device="cuda")
    with s1:
        y = _busy(x)               # long chain on s1
        ev = s1.record_event()
    s2.wait_event(ev)              # s2 waits for y
    z = gk.mul(y, 2.0, stream=s2)
    s2.synchronize()
    want = src.astype(np.float64)
    for _ in range(30):
        want = np.sqrt(np.abs(want) + 1.0)
    np.testing.assert_allclose(z.numpy(), 2 * want, rtol=1e-5)
    assert ev.query()


@needs_cuda
def test_freed_memory_is_not_reused_while_another_stream_reads_it(rng):
    """A block used on s2 and freed must not be handed out on s1 before s2's work is done."""
    n = 1 << 22
    src = rng.standard_normal(n).astype(np.float32)
    s1, s2 = gk.Stream("cuda"), gk.Stream("cuda")
    with s1:
        x = gk.asarray(src, device="cuda", stream=s1)
        s1.synchronize()
    s2.wait_stream(s1)
    with s2:
        r = _busy(x, 40)           # s2 reads x for a while
    del x                          # freed while s2 may still read it
    with s1:
        junk = gk.full((n,), 1e30, dtype="float32", device="cuda")  # same size class on s1
    s2.synchronize()
    want = src.astype(np.float64)
    for _ in range(40):
        want = np.sqrt(np.abs(want) + 1.0)
    np.testing.assert_allclose(r.numpy(), want, rtol=1e-5)
    del junk


@needs_cuda
def test_events_time_and_synchronize():
    a = gk.ones((1 << 24,), device="cuda")
    start, end = gk.Event(), gk.Event()
    start.record()
    b = _busy(a, 10)
    end.record()
    end.synchronize()
    assert end.query()
    ms = start.elapsed_time(end)
    assert 0 < ms < 10_000
    with pytest.raises(ValueError):
        gk.Event(timing=False).elapsed_time(end)
    del b


@needs_cuda
def test_stream_mismatch_errors():
    with pytest.raises(TypeError, match="stream"):
        gk.add(gk.ones(2, device="cuda"), 1.0, stream=3)
    if gk.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="stream"):
            gk.add(gk.ones(2, device="cuda:0"), 1.0, stream=gk.Stream("cuda:1"))


# ---------------------------------------------------------------- graphs

def _sequence(x, y):
    a = gk.mul(x, y)
    b = gk.add(a, 1.5)
    c = gk.gelu(b)
    d = gk.where(c > 0.5, c, gk.neg(y))
    return gk.exp(gk.clamp(d, -4.0, 4.0)).astype("bfloat16")


@needs_cuda
def test_graph_replay_equals_eager_bit_for_bit(rng):
    shape = (513, 257)
    s = gk.Stream("cuda")
    x = gk.asarray(rng.standard_normal(shape).astype(np.float32), device="cuda")
    y = gk.asarray(rng.standard_normal(shape).astype(np.float32), device="cuda")
    with s:
        eager = harness.bits(_sequence(x, y))
    g = gk.Graph(s)
    with g:
        out = _sequence(x, y)
    assert g.captured
    g.replay()
    s.synchronize()
    assert np.array_equal(harness.bits(out), eager)
    # new inputs written in place, replayed again: equal to eager on the new inputs
    gk.copy_into(x, gk.asarray(rng.standard_normal(shape).astype(np.float32), device="cuda"), stream=s)
    with s:
        eager2 = harness.bits(_sequence(x, y))
    g.replay(s)
    s.synchronize()
    assert np.array_equal(harness.bits(out), eager2)
    assert not np.array_equal(eager, eager2)
    for _ in range(3):  # deterministic across replays
        g.replay()
    s.synchronize()
    assert np.array_equal(harness.bits(out), eager2)


@needs_cuda
def test_graph_errors():
    g = gk.Graph(gk.Stream("cuda"))
    with pytest.raises(ValueError):
        g.replay()  # nothing captured
    with pytest.raises(ValueError):
        g.end()
    x = gk.ones(4, device="cuda")
    with g:
        y = x + 1
    with pytest.raises(ValueError):
        g.begin()  # already captured
    g.replay()
    g.stream.synchronize()
    assert y.numpy().tolist() == [2, 2, 2, 2]


# ---------------------------------------------------------------- allocator

@needs_cuda
def test_allocator_reuse_and_stats():
    gk.cuda.synchronize()
    gk.empty_cache()
    s0 = gk.memory_stats("cuda:0")
    a = gk.empty((3 * MiB,), dtype="uint8", device="cuda")
    s1 = gk.memory_stats("cuda:0")
    assert s1["allocated"] >= s0["allocated"] + 3 * MiB
    assert s1["reserved"] >= s1["allocated"]
    assert s1["misses"] == s0["misses"] + 1
    ptr = a.data_ptr()
    del a
    assert gk.memory_stats("cuda:0")["allocated"] == s0["allocated"]
    b = gk.empty((3 * MiB,), dtype="uint8", device="cuda")
    s2 = gk.memory_stats("cuda:0")
    assert b.data_ptr() == ptr and s2["hits"] == s1["hits"] + 1  # same stream: reused
    assert s2["peak"] >= 3 * MiB
    with gk.Stream():
        c = gk.empty((3 * MiB,), dtype="uint8", device="cuda")
    assert c.data_ptr() != ptr  # b is live; c comes from elsewhere
    del b, c
    gk.cuda.synchronize()
    gk.empty_cache()
    assert gk.memory_stats("cuda:0")["reserved"] < s2["reserved"]
    gk.reset_peak_memory_stats("cuda:0")
    assert gk.memory_stats("cuda:0")["peak"] == gk.memory_stats("cuda:0")["allocated"]


@needs_cuda
def test_memory_limit_oom_then_recovery():
    gk.cuda.synchronize()
    gk.empty_cache()
    base = gk.memory_stats("cuda:0")["reserved"]
    gk.set_memory_limit("cuda:0", base + 64 * MiB)
    try:
        keep = gk.empty((32 * MiB,), dtype="uint8", device="cuda")
        with pytest.raises(gk.OutOfMemoryError) as ei:
            gk.empty((48 * MiB,), dtype="uint8", device="cuda")
        msg = str(ei.value)
        assert str(48 * MiB) in msg and "limit" in msg and "in use" in msg
        assert isinstance(ei.value, MemoryError)
        # cached (freed) blocks are released to satisfy a request under the limit
        del keep
        big = gk.empty((56 * MiB,), dtype="uint8", device="cuda")
        big2 = gk.full((4,), 1.0, device="cuda")
        assert big2.numpy().tolist() == [1, 1, 1, 1]
        del big, big2
    finally:
        gk.set_memory_limit("cuda:0", 0)
    assert gk.memory_stats("cuda:0")["limit"] == 0
    x = gk.ones((8 * MiB,), device="cuda")
    assert float(gk.add(x, 1.0)[-1]) == 2.0


@needs_cuda
def test_oom_from_the_driver_then_recovery():
    total = gk.cuda.get_device_properties("cuda:0")["total_memory"]
    with pytest.raises(gk.OutOfMemoryError) as ei:
        gk.empty((total * 4,), dtype="uint8", device="cuda")
    assert str(total * 4) in str(ei.value)
    x = gk.arange(10, dtype="float32", device="cuda") * 2
    assert x.numpy().tolist() == [2.0 * i for i in range(10)]


@needs_cuda
def test_host_device_round_trip_is_exact(rng):
    for dtype in ("float32", "bfloat16", "int8", "float64", "bool"):
        src = gk.asarray(rng.uniform(-100, 100, size=(1 << 20) + 3)).astype(dtype)
        back = src.to("cuda").to("cpu")
        assert np.array_equal(harness.bits(back), harness.bits(src)), dtype
        nb = src.to("cuda", non_blocking=True)
        gk.cuda.synchronize()
        assert np.array_equal(harness.bits(nb), harness.bits(src)), dtype
    # strided device view -> host
    g = gk.arange(1000, dtype="int32", device="cuda")[::-7]
    assert g.to("cpu").numpy().tolist() == list(range(999, -1, -7))


@needs_cuda
def test_small_op_host_overhead_is_reasonable():
    """Not a benchmark (see bench/overhead.py): catches a pathological slowdown only."""
    a = gk.ones(16, device="cuda")
    for _ in range(100):
        gk.add(a, a)
    t = time.perf_counter()
    for _ in range(2000):
        gk.add(a, a)
    per_call = (time.perf_counter() - t) / 2000
    gk.cuda.synchronize()
    assert per_call < 200e-6
