"""GEMM throughput against torch in the same run (GEMV: bench/gemv.py).

gemm: C = A @ B at 8192^3 (bf16, f16; f32 with TF32 asked for), TFLOP/s = 2*M*N*K / median
time, peer torch.matmul; fp8 (gk.fp8_linear, per-tensor scales, bf16 out) vs torch._scaled_mm;
fp8 with 1x128 / 128x128 block scales (gk.fp8_block_linear) vs torch._scaled_mm blockwise;
int8 -> int32 (gk.int8_linear, TOP/s) vs torch._int_mm, and gpukit's own int8 tensor-core
kernel (GPUKIT_INT8_GEMM=gpukit) beside it.
moe: the grouped GEMMs (gk.moe_grouped_gemm, gate-up and down) of a Mixtral-8x7B-like layer for
1, 32, 512 and 4096 tokens routed top-2 of 8, vs torch.matmul per expert and a dense torch.matmul
of the same size; moe_mlp; kernel variants (the older mma.sync kernel, tile widths, clusters).

Usage: python bench/gemm.py [--out F] [--rounds N] [--only gemm,moe] [--moe-tokens 1,32,512,4096]
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


def _moe_spot_check(y, xin, w, off, what):
    """The first and last row of each non-empty expert, first and last 128 columns, against float64."""
    n = w.shape[1]
    for e in range(len(off) - 1):
        for r in sorted({int(off[e]), int(off[e + 1]) - 1}):
            if r < off[e] or r >= off[e + 1]:
                continue
            xr = xin[r].astype("float32").numpy().astype(np.float64)
            for c0 in (0, max(0, n - 128)):
                wb = w[e, c0:c0 + 128].astype("float32").numpy().astype(np.float64)
                ref, bound = wb @ xr, np.abs(wb) @ np.abs(xr)
                got = y[r, c0:c0 + 128].astype("float32").numpy().astype(np.float64)
                err = np.abs(got - ref)
                ok = err <= 2.0**-7 * np.abs(ref) + 1e-4 * bound + 1e-3  # bf16 output rounding + fp32 sums
                assert ok.all(), (f"{what}: expert {e} row {r} col {c0 + int(np.argmin(ok))}: got "
                                  f"{got[~ok][0]}, want {ref[~ok][0]}; max err {err.max():.3g}")


def bench_moe(args, have_torch, torch):
    """Grouped GEMMs of a Mixtral-8x7B-like layer (8 experts, top-2, hidden 4096, ffn 14336) for T
    tokens (R = 2T rows sorted by expert, random routing): gate-up [R x 28672 x 4096] and down
    [R x 4096 x 14336], bf16, one launch each (offsets on the device; validate=False: no host copy,
    as in moe_mlp) against torch.matmul per expert and one dense torch.matmul of the same R x N x K
    (the ceiling: one weight instead of eight); then moe_mlp with SwiGLU fused or not; last, the
    kernel variants (the mma.sync kernel, GPUKIT_MOE_SM90=0; clusters of 1 or 2 CTAs)."""
    out = []
    E, k, H, I = 8, 2, 4096, 14336
    tt = torch if have_torch else None
    w13 = rand_gk((E, 2 * I, H), "bfloat16", 1 / 64.0, seed=15, torch=tt)
    w2 = rand_gk((E, H, I), "bfloat16", 1 / 120.0, seed=16, torch=tt)
    gate_w = rand_gk((E, H), "bfloat16", 1 / 64.0, seed=18, torch=tt)
    cases = []
    for T in (int(v) for v in args.moe_tokens.split(",")):
        R = T * k
        rng = np.random.default_rng(13 + T)
        ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
        x = rand_gk((T, H), "bfloat16", seed=14, torch=tt)
        xs, offsets, _, _ = gk.moe_permute(x, gk.asarray(ids).to("cuda"), E)
        hmid = rand_gk((R, I), "bfloat16", seed=17, torch=tt)
        off = offsets.numpy()
        print(f"moe T={T}: rows per expert {np.diff(off).tolist()}", flush=True)
        for part, xin, w in (("gate_up", xs, w13), ("down", hmid, w2)):
            N, K = w.shape[1], w.shape[2]
            flops = 2.0 * R * N * K
            tf = lambda t, f=flops: f / (t * 1e-3) / 1e12  # noqa: E731
            fn = lambda xin=xin, w=w, offsets=offsets: gk.moe_grouped_gemm(xin, w, offsets, validate=False)  # noqa
            cases.append((T, part, xin, w, off, fn, tf))
            _moe_spot_check(fn(), xin, w, off, f"T={T} {part}")
            ms = time_cuda(fn, args.rounds)
            g = tf(median(ms))
            shp = f"T{T}_{part}_R{R}_N{N}_K{K}_E{E}"
            line = f"moe {part:7s} T={T:<5d} R={R:<5d} N={N:<5d} K={K:<5d}: gpukit {g:6.1f} TFLOP/s " \
                   f"({median(ms):.3f} ms)"
            if have_torch:
                tx, tw = torch.from_dlpack(xin), torch.from_dlpack(w)
                bounds = [(int(off[e]), int(off[e + 1])) for e in range(E)]
                loop = tf(median(time_torch(
                    lambda: [torch.matmul(tx[a:b], tw[e].t()) for e, (a, b) in enumerate(bounds) if b > a],
                    args.rounds)))
                dense = tf(median(time_torch(lambda: torch.matmul(tx, tw[0].t()), args.rounds)))
                line += f"; torch per expert {loop:6.1f} ({g / loop:.2f}x); dense torch.matmul {dense:6.1f} " \
                        f"({g / dense:.2f}x)"
                out.append(record("moe_grouped_gemm", shp, "bf16", "TFLOP/s", g, "torch.matmul per expert", loop,
                                  [tf(t) for t in ms]))
                out.append(record("moe_grouped_gemm_dense", shp, "bf16", "TFLOP/s", g, "dense torch.matmul", dense,
                                  [tf(t) for t in ms]))
            else:
                out.append(record("moe_grouped_gemm", shp, "bf16", "TFLOP/s", g, "", None, [tf(t) for t in ms]))
            print(line, flush=True)
        # the whole sparse MLP (router, gating, permute, gate-up with SwiGLU fused on Hopper,
        # down, un-permute); GPUKIT_MOE_FUSED_SWIGLU=0: gate-up to fp32, then the epilogue kernel
        mlp = lambda: gk.moe_mlp(x, gate_w, w13, w2, k)  # noqa: E731
        flops = 2.0 * R * 3 * H * I
        ms = time_cuda(mlp, args.rounds)
        os.environ["GPUKIT_MOE_FUSED_SWIGLU"] = "0"
        try:
            ms_apart = time_cuda(mlp, args.rounds)
        finally:
            del os.environ["GPUKIT_MOE_FUSED_SWIGLU"]
        tf = lambda t: flops / (t * 1e-3) / 1e12  # noqa: E731
        out.append(record("moe_mlp", f"T{T}_H{H}_I{I}_E{E}_k{k}", "bf16", "TFLOP/s", tf(median(ms)),
                          "gpukit, SwiGLU not fused", tf(median(ms_apart)), [tf(t) for t in ms]))
        print(f"moe_mlp T={T}: {median(ms):.3f} ms = {tf(median(ms)):.1f} TFLOP/s (SwiGLU fused); "
              f"{median(ms_apart):.3f} ms not fused", flush=True)
    for T, part, xin, w, off, fn, tf in cases:  # kernel variants, each checked, then timed
        for var, val, name in (("GPUKIT_MOE_SM90", "0", "mma.sync kernel"),
                               ("GPUKIT_MOE_SM90", "1", "sm90, default again"),
                               ("GPUKIT_MOE_SM90_BN", "64", "sm90, BN 64"),
                               ("GPUKIT_MOE_SM90_BN", "128", "sm90, BN 128"),
                               ("GPUKIT_MOE_SM90_BN", "256", "sm90, BN 256"),
                               ("GPUKIT_MOE_SM90_CLUSTER", "1", "sm90, cluster 1"),
                               ("GPUKIT_MOE_SM90_CLUSTER", "2", "sm90, cluster 2"),
                               ("GPUKIT_MOE_SM90_PREFETCH", "4", "sm90, L2 prefetch 4"),
                               ("GPUKIT_MOE_SM90_PREFETCH", "8", "sm90, L2 prefetch 8"),
                               ("GPUKIT_MOE_SM90_PREFETCH", "8,4", "sm90, L2 prefetch 8 in 4s"),
                               ("GPUKIT_MOE_SM90_PREFETCH", "16,8", "sm90, L2 prefetch 16 in 8s")):
            env = {var: val.split(",")[0]}
            if "," in val:
                env["GPUKIT_MOE_SM90_PREFETCH_GROUP"] = val.split(",")[1]
            os.environ.update(env)
            try:
                _moe_spot_check(fn(), xin, w, off, f"T={T} {part} {name}")
                v = tf(median(time_cuda(fn, max(5, args.rounds // 3))))
            finally:
                for key in env:
                    del os.environ[key]
            print(f"moe {part:7s} T={T:<5d} variant {name}: {v:6.1f} TFLOP/s", flush=True)
            out.append(record("moe_grouped_gemm_" + name.replace(".", "").replace(", ", "_").replace(" ", ""),
                              f"T{T}_{part}_N{w.shape[1]}_K{w.shape[2]}_E{E}", "bf16", "TFLOP/s", v))
    return out


def _options(p):
    p.add_argument("--only", default="gemm,moe", help="comma list of gemm, moe (GEMV: bench/gemv.py)")
    p.add_argument("--moe-tokens", default="1,32,512,4096",
                   help="MoE: tokens routed (top-2 of 8 experts), comma list")
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
