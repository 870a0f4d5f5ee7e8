"""The CPU matmul's dot-product path gives the same bits with and without its AVX2
build (GPUKIT_CPU_NO_AVX2=1 forces the baseline build in a child process)."""
import os
import subprocess
import sys

import numpy as np

SCRIPT = r"""
import sys, numpy as np, gpukit as gk
rng = np.random.default_rng(0)
out = {}
for dt in ("float32", "bfloat16", "float16"):
    for (m, n, k) in ((1, 67, 576), (37, 130, 200), (5, 9, 13), (2, 3, 8)):
        a = gk.asarray(rng.standard_normal((m, k)).astype(np.float32)).astype(dt)
        w = gk.asarray(rng.standard_normal((n, k)).astype(np.float32)).astype(dt)
        out[f"{dt}_{m}_{n}_{k}"] = gk.to_numpy(gk.matmul(a, w.T).astype("float32"))
np.savez(sys.argv[1], **out)
"""


def test_avx2_and_baseline_builds_agree_bitwise(tmp_path):
    root = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    files = []
    for flag in ("0", "1"):
        f = str(tmp_path / f"r{flag}.npz")
        subprocess.run([sys.executable, "-c", SCRIPT, f], check=True, env=dict(env, GPUKIT_CPU_NO_AVX2=flag))
        files.append(np.load(f))
    a, b = files
    assert a.files == b.files and len(a.files) == 12
    for k in a.files:
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k
