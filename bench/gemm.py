"""GEMM throughput against torch in the same run.

gemm: C = A @ B at 8192^3 (bf16, f16), TFLOP/s = 2*M*N*K / median time, peer torch.matmul;
fp8 (gk.fp8_linear, per-tensor scales, bf16 out) vs torch._scaled_mm; int8 -> int32
(gk.int8_linear, TOP/s) vs torch._int_mm.
The decode GEMV (every weight format) is measured by bench/gemv.py.

Usage: python bench/gemm.py [--out F] [--rounds N]
Exits 0 without CUDA.
"""
from __future__ import annotations

import sys

import numpy as np

from common import gk, median, parse_args, print_table, record, require_cuda, time_cuda, time_torch, write_results

GEMM_SHAPE = (8192, 8192, 8192)
DT = {"bf16": "bfloat16", "f16": "float16"}


def tflops(m, n, k, ms):
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def rand_gk(shape, dtype, scale=1.0, seed=0):
    """A random CUDA array (generated on the host in float32, converted on the device)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape, dtype=np.float32) * scale)
    return gk.asarray(x).to("cuda").astype(dtype)


def spot_check(c, a, b, rows=(0, 4097)):
    """Rows of c against float64 products of the same bf16/f16 inputs (not timing garbage)."""
    bn = b.astype("float32").numpy().astype(np.float64)
    for r in rows:
        if r >= a.shape[0]:
            continue
        ar = a[r].astype("float32").numpy().astype(np.float64)
        ref = ar @ bn
        got = c[r].astype("float32").numpy().astype(np.float64)
        bound = np.abs(ar) @ np.abs(bn)
        assert np.all(np.abs(got - ref) <= 2.0**-7 * np.abs(ref) + 1e-5 * bound + 1e-3), f"row {r} is wrong"


def bench_gemm(args, have_torch, torch):
    out = []
    m, n, k = GEMM_SHAPE
    for short, dtype in DT.items():
        a = rand_gk((m, k), dtype, seed=1)
        b = rand_gk((k, n), dtype, 1 / 90.0, seed=2)
        c = gk.matmul(a, b)
        spot_check(c, a, b)
        ms = time_cuda(lambda: gk.matmul(a, b), args.rounds)
        peer, pv = "", None
        if have_torch:
            ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
            pms = time_torch(lambda: torch.matmul(ta, tb), args.rounds)
            peer, pv = "torch.matmul", tflops(m, n, k, median(pms))
            del ta, tb
        out.append(record("gemm", f"{m}x{n}x{k}", short, "TFLOP/s", tflops(m, n, k, median(ms)), peer, pv,
                          [tflops(m, n, k, t) for t in ms]))
        a = b = c = None
    return out


def bench_gemm_low(args, have_torch, torch):
    """fp8 (per-tensor scales, bf16 out) vs torch._scaled_mm and int8 -> int32 vs torch._int_mm at 8192^3."""
    out = []
    m, n, k = GEMM_SHAPE
    rng = np.random.default_rng(7)
    # fp8: x [M, K], w [N, K] (Linear layout), y = x @ w.T * sx * sw in bf16
    x = rand_gk((m, k), "float32", seed=8).astype("float8_e4m3fn")
    w = rand_gk((n, k), "float32", seed=9).astype("float8_e4m3fn")
    sx, sw = gk.full((1,), 0.5, device="cuda"), gk.full((1,), 0.25, device="cuda")
    y = gk.fp8_linear(x, w, sx, sw)
    xr = x[:2].astype("float32").numpy().astype(np.float64)
    ref = xr @ w.astype("float32").numpy().astype(np.float64).T * 0.125
    np.testing.assert_allclose(y[:2].astype("float32").numpy(), ref, rtol=2e-2, atol=0.5)
    ms = time_cuda(lambda: gk.fp8_linear(x, w, sx, sw), args.rounds)
    peer, pv = "", None
    if have_torch:
        try:
            tx, tw = torch.from_dlpack(x.view_dtype("uint8")).view(torch.float8_e4m3fn), \
                torch.from_dlpack(w.view_dtype("uint8")).view(torch.float8_e4m3fn)
            ta, tb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
            pms = time_torch(lambda: torch._scaled_mm(tx, tw.t(), scale_a=ta, scale_b=tb, out_dtype=torch.bfloat16),
                             args.rounds)
            peer, pv = "torch._scaled_mm", tflops(m, n, k, median(pms))
        except Exception as e:  # noqa: BLE001 - the peer is optional
            print(f"torch._scaled_mm failed: {e}")
    out.append(record("gemm", f"{m}x{n}x{k}", "fp8", "TFLOP/s", tflops(m, n, k, median(ms)), peer, pv,
                      [tflops(m, n, k, t) for t in ms]))
    x = w = y = None
    # int8 -> int32 exact
    xi = gk.asarray(rng.integers(-128, 128, size=(m, k), dtype=np.int8)).to("cuda")
    wi = gk.asarray(rng.integers(-128, 128, size=(n, k), dtype=np.int8)).to("cuda")
    yi = gk.int8_linear(xi, wi)
    refi = xi[:2].numpy().astype(np.int64) @ wi.numpy().astype(np.int64).T
    assert np.array_equal(yi[:2].numpy().astype(np.int64), refi), "int8 GEMM is not exact"
    ms = time_cuda(lambda: gk.int8_linear(xi, wi), args.rounds)
    peer, pv = "", None
    if have_torch:
        try:
            tx, tw = torch.from_dlpack(xi), torch.from_dlpack(wi)
            pms = time_torch(lambda: torch._int_mm(tx, tw.t()), args.rounds)
            peer, pv = "torch._int_mm", tflops(m, n, k, median(pms))
        except Exception as e:  # noqa: BLE001
            print(f"torch._int_mm failed: {e}")
    out.append(record("gemm", f"{m}x{n}x{k}", "int8", "TOP/s", tflops(m, n, k, median(ms)), peer, pv,
                      [tflops(m, n, k, t) for t in ms]))
    return out


def main():
    args = parse_args(__doc__)
    if not require_cuda():
        return 0
    try:
        import torch
        have_torch = not args.no_peer and torch.cuda.is_available()
    except ImportError:
        torch, have_torch = None, False
    records = []
    info = gk.linalg.cublaslt_info()
    print(f"cuBLASLt: {'found at ' + info['path'] if info['available'] else info['reason']}")
    records += bench_gemm(args, have_torch, torch)
    records += bench_gemm_low(args, have_torch, torch)
    print_table(records)
    write_results(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
