"""Launch overhead of a cached gk.jit kernel called from Python, against CuPy's
RawKernel with the same source, in the same run: wall time per launch of a one-thread
kernel (10,000 calls per loop, the device drained after each loop; median of loops).

Usage: python bench/jit_launch.py [--out bench/results/h200.json] [--calls N] [--rounds R]
Exits 0 with a message where CUDA, NVRTC or CuPy is missing.
Results file: {"device", "date", ..., "results": [record, ...]}, records merged by
(name, shape, dtype).
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
try:
    import gpukit as gk
except ImportError:  # running from a checkout
    sys.path.insert(0, str(REPO / "python"))
    import gpukit as gk

SRC = r"""
extern "C" __global__ void bump(float* x, int n) {
  if (threadIdx.x < n) x[threadIdx.x] += 1.0f;
}
"""


def per_call_us(fn, calls, sync, loops):
    import common  # bench/common.py: the host wall-clock loop of overhead.py too
    return common.per_call_us(fn, calls, sync, loops)


def write_results(path, records):
    import common  # bench/common.py: one results writer for every benchmark
    common.write_results(path, records)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "h200.json"))
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=20, help="timed loops (median reported)")
    a = p.parse_args()
    if not gk.cuda.is_available():
        print("CUDA is unavailable: nothing to benchmark")
        return 0
    if not gk.jit.is_available():
        print("NVRTC is unavailable: " + gk.jit.unavailable_reason())
        return 0
    try:
        import cupy
        import numpy as np
        cupy.cuda.Device(0).use()
    except Exception as e:  # ImportError, or CuPy without a usable CUDA runtime
        print(f"CuPy is unavailable ({e}): the peer cannot run, nothing written")
        return 0

    kern = gk.jit(SRC, "bump")
    x = gk.zeros(1, device="cuda")
    ours = per_call_us(lambda: kern(1, 1, x, 1), a.calls, gk.cuda.synchronize, a.rounds)
    expected = 200 + a.calls * a.rounds
    assert x.numpy()[0] == float(expected), (x.numpy()[0], expected)

    raw = cupy.RawKernel(SRC, "bump")
    cx = cupy.zeros(1, dtype=cupy.float32)
    one = np.int32(1)
    peer = per_call_us(lambda: raw((1,), (1,), (cx, one)), a.calls, cupy.cuda.Device().synchronize, a.rounds)

    g, c = statistics.median(ours), statistics.median(peer)
    print(f"gk.jit kernel launch:  {g:7.2f} us/call  (median of {a.rounds} x {a.calls})")
    print(f"cupy.RawKernel launch: {c:7.2f} us/call  ratio gk/cupy = {g / c:.2f}")
    rec = {"name": "jit_launch_overhead", "shape": "1", "dtype": "f32", "metric": "us",
           "gpukit": round(g, 4), "peer": "cupy RawKernel", "peer_value": round(c, 4),
           "rounds": [round(r, 4) for r in ours]}
    write_results(a.out, [rec])
    return 0


if __name__ == "__main__":
    sys.exit(main())
