"""A driver for Nsight Compute: runs one decode GEMV (M = 1, the default kernel) a few times so that
`ncu -k regex:k_w --launch-skip N --launch-count 1 ...` can read its counters (session 13: what limits the
staged 4-bit GEMV against the 8-bit one at the same shape).

    ncu --clock-control none -k regex:k_w --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        python3 bench/gemv_ncu.py --fmt int4 --n 28672 --k 4096

Formats: int4 (groups of 128, bf16 x), fp8, int8 (bf16 x). Needs CUDA."""
from __future__ import annotations

import argparse
import math

import numpy as np

import gpukit as gk


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", choices=["int4", "fp8", "int8"], default="int4")
    ap.add_argument("--n", type=int, default=28672)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    w = gk.asarray((rng.standard_normal((a.n, a.k)) / math.sqrt(a.k)).astype(np.float32))
    x = gk.asarray(rng.standard_normal((1, a.k)).astype(np.float32)).astype("bfloat16").to("cuda")
    if a.fmt == "int4":
        q, s, z = (t.to("cuda") for t in gk.quantize_int4(w, group=128))
        run = lambda: gk.gemv_int4(x, q, s, z, group=128)  # noqa: E731
    else:
        q, s = (t.to("cuda") for t in getattr(gk, f"quantize_{a.fmt}")(w))
        fn = getattr(gk, f"gemv_{a.fmt}")
        run = lambda: fn(x, q, s)  # noqa: E731
    for _ in range(a.reps):
        y = run()
    gk.synchronize()
    print(f"{a.fmt} ({a.n}, {a.k}): {a.reps} launches, y[0, :4] = {gk.to_numpy(y.astype('float32'))[0, :4]}")


if __name__ == "__main__":
    main()
