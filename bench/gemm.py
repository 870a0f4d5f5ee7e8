"""GEMM throughput against torch in the same run (GEMV: bench/gemv.py).

gemm: C = A @ B at 8192^3 (bf16, f16; f32 with TF32 asked for), TFLOP/s = 2*M*N*K / median
time, peer torch.matmul; fp8 (gk.fp8_linear, per-tensor scales, bf16 out) vs torch._scaled_mm;
fp8 with 1x128 / 128x128 block scales (gk.fp8_block_linear) vs torch._scaled_mm blockwise;
int8 -> int32 (gk.int8_linear, TOP/s) vs torch._int_mm, and gpukit's own int8 tensor-core
kernel (GPUKIT_INT8_GEMM=gpukit) beside it.
moe: the grouped GEMM (gk.moe_grouped_gemm) of a Mixtral-like prefill vs torch.matmul per expert.

Usage: python bench/gemm.py [--out F] [--rounds N] [--only gemm,moe]
             [--shape 8192x8192x8192] [--dtypes bf16,f16,fp8,fp8block,int8,tf32]
About half a minute on an H200 with torch present (inputs are drawn on the GPU).
Exits 0 without CUDA.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from common import gk, median, parse_args, print_table, record, require_cuda, time_cuda, time_torch, write_results



def tflops(m, n, k, ms):
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def rand_gk(shape, dtype, scale=1.0, seed=0, torch=None):
    """A random CUDA array: drawn on the GPU by torch when it is there (seconds saved at
    8192^2), else on the host in float32; converted to `dtype` on the device."""
    if torch is not None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        t = torch.randn(shape, device="cuda", dtype=torch.float32, generator=g) * scale
        return gk.from_dlpack(t, copy=True).astype(dtype)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape, dtype=np.float32) * scale)
    return gk.asarray(x).to("cuda").astype(dtype)


def spot_check(c, a, b, rows=(0, 4097), cols=256, rel=2.0**-7, brel=1e-5):
    """A few rows x the first `cols` columns of c against float64 products of the same inputs."""
    bn = b[:, :cols].astype("float32").numpy().astype(np.float64)
    for r in rows:
        if r >= a.shape[0]:
            continue
        ar = a[r].astype("float32").numpy().astype(np.float64)
        ref = ar @ bn
        got = c[r, :cols].astype("float32").numpy().astype(np.float64)
        bound = np.abs(ar) @ np.abs(bn)
        bad = np.abs(got - ref) > rel * np.abs(ref) + brel * bound + 1e-3
        assert not bad.any(), f"row {r}: {bad.sum()} wrong, first at column {int(np.argmax(bad))}"


def parse_shape(text):
    m, n, k = (int(v) for v in text.lower().split("x"))
    return m, n, k


def bench_gemm(args, have_torch, torch):
    """bf16 / f16 C = A @ B vs torch.matmul; f32 with TF32 allowed (per call) vs torch with
    torch.backends.cuda.matmul.allow_tf32."""
    out = []
    m, n, k = parse_shape(args.shape)
    shp = f"{m}x{n}x{k}"
    tt = torch if have_torch else None
    for short in args.dtypes.split(","):
        if short not in ("bf16", "f16", "tf32"):
            continue
        dtype = {"bf16": "bfloat16", "f16": "float16", "tf32": "float32"}[short]
        a = rand_gk((m, k), dtype, seed=1, torch=tt)
        b = rand_gk((k, n), dtype, 1 / 90.0, seed=2, torch=tt)
        tf32 = short == "tf32"
        fn = (lambda: gk.matmul(a, b, allow_tf32=True)) if tf32 else (lambda: gk.matmul(a, b))
        c = fn()
        spot_check(c, a, b, brel=2.0**-10 if tf32 else 1e-5)  # TF32 rounds the inputs to 10-bit mantissas
        ms = time_cuda(fn, args.rounds)
        peer, pv = "", None
        if have_torch:
            ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
            old = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                pms = time_torch(lambda: torch.matmul(ta, tb), args.rounds)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = old
            peer, pv = "torch.matmul" + (" (allow_tf32)" if tf32 else ""), tflops(m, n, k, median(pms))
            del ta, tb
        r = record("gemm", shp, short, "TFLOP/s", tflops(m, n, k, median(ms)), peer, pv,
                   [tflops(m, n, k, t) for t in ms])
        ratio = f" = {r['gpukit'] / pv:.2f}x torch" if pv else ""
        print(f"gemm {short} {shp}: {r['gpukit']:.1f} TFLOP/s{ratio}", flush=True)
        out.append(r)
        a = b = c = None
    return out


def _torch_fp8(t, torch):
    return torch.from_dlpack(t.view_dtype("uint8")).view(torch.float8_e4m3fn)


def bench_gemm_low(args, have_torch, torch):
    """fp8 (per-tensor scales, bf16 out) vs torch._scaled_mm; fp8 with 1x128 / 128x128 block
    scales vs torch._scaled_mm's blockwise mode when this torch has it; int8 -> int32 vs
    torch._int_mm."""
    out = []
    m, n, k = parse_shape(args.shape)
    shp = f"{m}x{n}x{k}"
    tt = torch if have_torch else None
    kinds = args.dtypes.split(",")

    def report(short, ms, peer, pv, metric="TFLOP/s"):
        r = record("gemm", shp, short, metric, tflops(m, n, k, median(ms)), peer, pv, [tflops(m, n, k, t) for t in ms])
        ratio = f" = {r['gpukit'] / pv:.2f}x {peer}" if pv else ""
        print(f"gemm {short} {shp}: {r['gpukit']:.1f} {metric}{ratio}", flush=True)
        out.append(r)

    if "fp8" in kinds or "fp8block" in kinds:
        x = rand_gk((m, k), "float32", seed=8, torch=tt).astype("float8_e4m3fn")
        w = rand_gk((n, k), "float32", seed=9, torch=tt).astype("float8_e4m3fn")
    if "fp8" in kinds:
        sx, sw = gk.full((1,), 0.5, device="cuda"), gk.full((1,), 0.25, device="cuda")
        y = gk.fp8_linear(x, w, sx, sw)
        xr = x[:2].astype("float32").numpy().astype(np.float64)
        ref = xr @ w[:256].astype("float32").numpy().astype(np.float64).T * 0.125
        np.testing.assert_allclose(y[:2, :256].astype("float32").numpy(), ref, rtol=2e-2, atol=0.5)
        ms = time_cuda(lambda: gk.fp8_linear(x, w, sx, sw), args.rounds)
        peer, pv = "", None
        if have_torch:
            try:
                tx, tw = _torch_fp8(x, torch), _torch_fp8(w, torch)
                ta, tb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
                pms = time_torch(lambda: torch._scaled_mm(tx, tw.t(), scale_a=ta, scale_b=tb,
                                                          out_dtype=torch.bfloat16), args.rounds)
                peer, pv = "torch._scaled_mm", tflops(m, n, k, median(pms))
            except Exception as e:  # noqa: BLE001 - the peer is optional
                print(f"torch._scaled_mm failed: {e}")
        report("fp8", ms, peer, pv)
        y = None
    if "fp8block" in kinds:
        L = (k + 127) // 128
        xs = rand_gk((m, L), "float32", seed=10, torch=tt)
        ws = rand_gk(((n + 127) // 128, L), "float32", seed=11, torch=tt)
        xs, ws = gk.abs(xs) * 0.01 + 0.001, gk.abs(ws) * 0.01 + 0.001
        y = gk.fp8_block_linear(x, w, xs, ws)
        info0 = gk.linalg.cublaslt_info()
        ms = time_cuda(lambda: gk.fp8_block_linear(x, w, xs, ws), args.rounds)
        info1 = gk.linalg.cublaslt_info()
        path = "cuBLASLt" if info1["fallback_calls"] == info0["fallback_calls"] else "gpukit kernel"
        print(f"fp8 block-scaled path: {path}")
        peer, pv = "", None
        if have_torch:
            try:
                tx, tw = _torch_fp8(x, torch), _torch_fp8(w, torch)
                # torch's layouts: scale_a (M, L) with M contiguous; scale_b (L, N/128) whose
                # transpose is row-major (N/128, L), i.e. gpukit's w_scale as it is
                txs = torch.from_dlpack(xs.T.contiguous()).t()
                tws = torch.from_dlpack(ws).t()
                pms = time_torch(lambda: torch._scaled_mm(tx, tw.t(), scale_a=txs, scale_b=tws,
                                                          out_dtype=torch.bfloat16), args.rounds)
                peer, pv = "torch._scaled_mm blockwise", tflops(m, n, k, median(pms))
            except Exception as e:  # noqa: BLE001
                print(f"torch._scaled_mm blockwise failed: {str(e).splitlines()[0][:200]}")
        report("fp8blk", ms, peer, pv)
        y = None
    x = w = None
    if "int8" in kinds:
        if have_torch:
            g = torch.Generator(device="cuda").manual_seed(12)
            xi = gk.from_dlpack(torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8, generator=g),
                                copy=True)
            wi = gk.from_dlpack(torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8, generator=g),
                                copy=True)
        else:
            rng = np.random.default_rng(7)
            xi = gk.asarray(rng.integers(-128, 128, size=(m, k), dtype=np.int8)).to("cuda")
            wi = gk.asarray(rng.integers(-128, 128, size=(n, k), dtype=np.int8)).to("cuda")
        yi = gk.int8_linear(xi, wi)
        refi = xi[:2].numpy().astype(np.int64) @ wi[:256].numpy().astype(np.int64).T
        assert np.array_equal(yi[:2, :256].numpy().astype(np.int64), refi), "int8 GEMM is not exact"
        ms = time_cuda(lambda: gk.int8_linear(xi, wi), args.rounds)
        peer, pv = "", None
        if have_torch:
            try:
                tx, tw = torch.from_dlpack(xi), torch.from_dlpack(wi)
                pms = time_torch(lambda: torch._int_mm(tx, tw.t()), args.rounds)
                peer, pv = "torch._int_mm", tflops(m, n, k, median(pms))
            except Exception as e:  # noqa: BLE001
                print(f"torch._int_mm failed: {e}")
        report("int8", ms, peer, pv, "TOP/s")
        # gpukit's own tensor-core int8 kernel (mma.sync), for comparison with the default path
        os.environ["GPUKIT_INT8_GEMM"] = "gpukit"
        try:
            yk = gk.int8_linear(xi, wi)
            assert np.array_equal(yk[:2, :256].numpy().astype(np.int64), refi), "gpukit int8 kernel is not exact"
            ms = time_cuda(lambda: gk.int8_linear(xi, wi), args.rounds)
        finally:
            del os.environ["GPUKIT_INT8_GEMM"]
        report("int8mma", ms, peer, pv, "TOP/s")
    return out


def bench_moe(args, have_torch, torch):
    """Grouped GEMM of a Mixtral-8x7B-like prefill (2048 tokens, top-2 of 8 experts, the gate-up
    projection [4096 rows, 28672 x 4096] bf16) in one launch vs torch.matmul per expert."""
    out = []
    T, E, k, H, N = 2048, 8, 2, 4096, 2 * 14336
    tt = torch if have_torch else None
    rng = np.random.default_rng(13)
    ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    x = rand_gk((T, H), "bfloat16", seed=14, torch=tt)
    w = rand_gk((E, N, H), "bfloat16", 1 / 64.0, seed=15, torch=tt)
    xs, offsets, _, _ = gk.moe_permute(x, gk.asarray(ids).to("cuda"), E)
    R = T * k
    fn = lambda: gk.moe_grouped_gemm(xs, w, offsets)  # noqa: E731
    y = fn()
    off = offsets.numpy()
    e0 = int(np.argmax(np.diff(off)))
    r0 = int(off[e0])
    ref = xs[r0].astype("float32").numpy().astype(np.float64) @ w[e0, :256].astype("float32").numpy().astype(np.float64).T
    np.testing.assert_allclose(y[r0, :256].astype("float32").numpy(), ref, rtol=2e-2, atol=2e-2)
    ms = time_cuda(fn, args.rounds)
    flops = 2.0 * R * N * H
    peer, pv = "", None
    if have_torch:
        tx, tw = torch.from_dlpack(xs), torch.from_dlpack(w)
        bounds = [(int(off[e]), int(off[e + 1])) for e in range(E)]
        pms = time_torch(lambda: [torch.matmul(tx[a:b], tw[e].t()) for e, (a, b) in enumerate(bounds)], args.rounds)
        peer, pv = "torch.matmul per expert", flops / (median(pms) * 1e-3) / 1e12
    r = record("moe_grouped_gemm", f"R{R}_N{N}_K{H}_E{E}", "bf16", "TFLOP/s", flops / (median(ms) * 1e-3) / 1e12,
               peer, pv, [flops / (t * 1e-3) / 1e12 for t in ms])
    ratio = f" = {r['gpukit'] / pv:.2f}x {peer}" if pv else ""
    print(f"moe grouped gemm bf16 R{R} N{N} K{H}: {r['gpukit']:.1f} TFLOP/s{ratio}", flush=True)
    out.append(r)
    return out


def _options(p):
    p.add_argument("--only", default="gemm,moe", help="comma list of gemm, moe (GEMV: bench/gemv.py)")
    p.add_argument("--shape", default="8192x8192x8192", help="GEMM M x N x K")
    p.add_argument("--dtypes", default="bf16,f16,fp8,fp8block,int8,tf32",
                   help="GEMM kinds: bf16, f16, tf32, fp8, fp8block, int8")


def main():
    args = parse_args(__doc__, _options)
    if not require_cuda():
        return 0
    try:
        import torch
        have_torch = not args.no_peer and torch.cuda.is_available()
    except ImportError:
        torch, have_torch = None, False
    only = set(args.only.split(","))
    records = []
    info = gk.linalg.cublaslt_info()
    print(f"cuBLASLt: {'found at ' + info['path'] if info['available'] else info['reason']}")
    if "gemm" in only:
        records += bench_gemm(args, have_torch, torch)
        records += bench_gemm_low(args, have_torch, torch)
    if "moe" in only:
        records += bench_moe(args, have_torch, torch)
    print_table(records)
    write_results(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
