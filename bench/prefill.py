"""Prefill attention benchmark: gpukit's attention_prefill against torch SDPA (flash backend), same run.

    python bench/prefill.py [--out bench/results/h200.json] [--rounds 20] [--no-peer] [--sizes 1024,4096,16384]

Causal bf16, batch 1, H=32, D=128 at S = 1024, 4096, 16384, plus GQA (Hq=32, Hkv=8) at S=4096.
Both libraries read the same memory (torch tensors [S, H, D] shared with gpukit through DLPack;
SDPA gets the [1, H, S, D] transposed view). TFLOP/s counts 4 * S^2 * D * Hq / 2 (causal half).
Each size also prints the max |gpukit - torch| of the outputs and, in brackets, the TFLOP/s of the
other sm_90 kernels (GPUKIT_PREFILL_SM90=1: cp.async, =3: warp-specialized with ping-pong); the
record holds the default kernel. Records: name attention_prefill,
shape S{S}_H32_D128_causal (GQA: S{S}_Hq32_Hkv8_D128_causal), metric TFLOP/s, peer torch SDPA.
Exits 0 with a message without CUDA or torch.
"""
from __future__ import annotations

import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import common  # noqa: E402
from common import gk  # noqa: E402


def main():
    def extra(p):
        p.add_argument("--sizes", default="1024,4096,16384", help="comma-separated sequence lengths (MHA cases)")
        p.add_argument("--no-other", action="store_true", help="skip timing the other sm_90 kernels")

    a = common.parse_args(__doc__.splitlines()[0], extra)
    a.rounds = max(a.rounds, 20)
    if not common.require_cuda():
        return 0
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print("torch is not installed: nothing to compare against")
        return 0
    if not torch.cuda.is_available():
        print("torch sees no CUDA device")
        return 0
    F = torch.nn.functional
    t_start = time.time()
    cases = [(int(s), 32, 32) for s in a.sizes.split(",") if s] + [(4096, 32, 8)]
    records = []
    D = 128
    for S, Hq, Hkv in cases:
        torch.manual_seed(S + Hkv)
        q = torch.randn(S, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(S, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(S, Hkv, D, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        gq, gk_, gv = gk.from_dlpack(q), gk.from_dlpack(k), gk.from_dlpack(v)
        flops = 4.0 * S * S * D * Hq / 2
        # The other sm_90 kernels for comparison (GPUKIT_PREFILL_SM90=1: cp.async, =3: ping-pong),
        # then the default one.
        other = ""
        if not a.no_other:
            for env, what in (("1", "cp.async"), ("3", "ping-pong")):
                os.environ["GPUKIT_PREFILL_SM90"] = env
                if S == cases[0][0]:  # name the kernel that runs (stderr), once
                    os.environ["GPUKIT_PREFILL_SM90_LOG"] = "1"
                    gk.nn.attention_prefill(gq, gk_, gv, causal=True)
                    gk.cuda.synchronize()
                    os.environ.pop("GPUKIT_PREFILL_SM90_LOG")
                oms = common.time_cuda(lambda: gk.nn.attention_prefill(gq, gk_, gv, causal=True), 20)
                other += f"   [{what} {flops / (common.median(oms) * 1e-3) / 1e12:6.1f}]"
            os.environ.pop("GPUKIT_PREFILL_SM90")
        if S == cases[0][0]:
            os.environ["GPUKIT_PREFILL_SM90_LOG"] = "1"
            gk.nn.attention_prefill(gq, gk_, gv, causal=True)
            gk.cuda.synchronize()
            os.environ.pop("GPUKIT_PREFILL_SM90_LOG")
        gms = common.time_cuda(lambda: gk.nn.attention_prefill(gq, gk_, gv, causal=True), a.rounds)
        g_tf = flops / (common.median(gms) * 1e-3) / 1e12
        label = f"S{S}_H{Hq}_D{D}_causal" if Hq == Hkv else f"S{S}_Hq{Hq}_Hkv{Hkv}_D{D}_causal"
        peer_tf, peer, err = None, "", float("nan")
        if not a.no_peer:
            tq, tk, tv = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))
            gqa = Hq != Hkv

            def sdpa():
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=gqa)

            peer = "torch SDPA flash"
            try:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    tms = common.time_torch(sdpa, a.rounds)
                    ref = sdpa()
            except RuntimeError as e:  # e.g. no flash kernel for this case: whatever SDPA picks
                print(f"  flash backend refused {label} ({str(e).splitlines()[0][:80]}); default SDPA")
                peer = "torch SDPA default"
                tms = common.time_torch(sdpa, a.rounds)
                ref = sdpa()
            peer_tf = flops / (common.median(tms) * 1e-3) / 1e12
            out = gk.nn.attention_prefill(gq, gk_, gv, causal=True)
            gk.cuda.synchronize()
            got = torch.from_dlpack(out).float()
            err = (got - ref[0].transpose(0, 1).float()).abs().max().item()
        print(f"attention_prefill {label:<28} gpukit {g_tf:7.1f} TFLOP/s ({common.median(gms):8.3f} ms)"
              + (f"   {peer} {peer_tf:7.1f} TFLOP/s   ratio {g_tf / peer_tf:5.2f}   max|diff| {err:.3g}"
                 if peer_tf else "") + other, flush=True)
        records.append(common.record("attention_prefill", label, "bf16", "TFLOP/s", g_tf, peer, peer_tf, [
            flops / (t * 1e-3) / 1e12 for t in gms]))
        q = k = v = gq = gk_ = gv = None  # free before the next size
        torch.cuda.empty_cache()
    common.write_results(a.out, records)
    print(f"total {time.time() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
