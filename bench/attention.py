"""attention_decode against torch SDPA (enable_gqa=True), bf16, Hq=32, Hkv=8, D=128, in one run.

    python bench/attention.py [--out bench/results/h200.json] [--rounds 30] [--splits 64,2048,32 64,2048,32,1] [--no-sweep]

Metric: TB/s of KV read (2 * B * T * Hkv * D * 2 bytes: K and V, bf16, over the median time of one call; the
query, output and split workspace are not counted). Each round
times --iters back-to-back calls with CUDA events (gpukit events on gpukit's stream, torch events
on torch's); the calls rotate over enough copies of the cache that the data read by consecutive
calls is about 3x the 60 MB L2. gpukit reads a contiguous cache [B, T, Hkv, D] (records
"attention_decode") and, for some shapes, a paged one with 16-token blocks in shuffled order
("attention_decode_paged"); torch reads [B, Hkv, T, D]. Caches are filled with random data (never
zeros). A short sweep (--splits, off with --no-sweep) also times other flash-decoding split parameters
("min,max,target") and the CUDA-core kernel (",1"; GPUKIT_DECODE_SPLIT; printed only, not recorded). Exits 0 with a message without CUDA or torch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import common  # bench/common.py

SHAPES = [(1, 512), (1, 1024), (1, 2048), (1, 4096), (1, 16384), (1, 32768), (1, 131072), (16, 4096), (16, 8192),
          (32, 1024), (32, 4096), (32, 8192), (64, 2048)]
PAGED = [(1, 16384), (32, 8192)]
# tuning sweep: "chunk_min,chunk_max,target_splits[,variant]", optionally followed by "|VAR=VALUE" (an environment
# variable set for that entry; "|GPUKIT_DECODE_PDL=0" or "env:GPUKIT_DECODE_PDL=0" alone: the default without
# PDL; "+" may replace "|"). Fold kernels
# (src/cuda/attention_decode_fold*.cu, the same bits whichever runs): 20 auto (cluster kernel when its clusters
# are all resident at once, else CTA group units in one launch for <= 64 sequence x kv-head pairs, else chunk or
# warp group units + merge kernel), 24 the cluster kernel forced, 18 CTA group units, 19 chunk or warp group
# units + merge kernel (23: with L2 evict-first K / V loads), 14 / 15 chunk / warp group units + merge kernel,
# 17: 19 without the merge kernel (timing only), 21 warp group units merged in the kernel (22: evict-first),
# 26: 19 with the warps of a CTA on consecutive units (the kv heads of a chunk together; 27: + evict-first),
# 25: 24 with two groups per CTA, 28: one CTA per sequence x kv head, warps on group units (one launch), 29: 28
# with L2 evict-first, 30 / 31: 29 spread over a thread-block cluster, one warp per group (CTAs of 4 / 8 warps),
# 32: 30 with a stage ring twice as deep (one CTA per SM), 33: 24 with CTAs of 4 warps (two per SM, so 16-CTA
# clusters are resident at B = 1 with 8 kv heads), 34: 33's CTAs without a cluster (the groups merged by counter,
# as 18), 35: 18 with one fence per CTA in its merge, 36: 34 with 2 stages (three CTAs per SM), 37: 18 merged by
# the last CTA to start polling tagged partials (no fence, no counter; 18 where units > SMs), 38: 34 with 37's
# merge, 39: 33's 4-warp CTAs with two groups each in clusters half as large (B2 / B3 T4096: 8 CTAs on 4 SMs).
# "env:GPUKIT_DECODE_ROUTE=N": auto with route bits N instead
# of the default's (src/cuda/attention_decode.cu, kRouteDefault = 62011; 0: session 6's routing; 1 B3-like to 31,
# 2 / 4 / 32 two waves of 31's CTAs to 28 / 31 / 28 or 31 by the second wave's fill, 8 the cluster kernel 24 at
# B 2..8 where it fits, 16 the cluster kernel 33 at B = 1 up to 4096 keys where 24 does not fit, 64 / 128 18 in two
# waves of its units (< 8 / >= 8 groups), 256 35 for 18, 512 34 at B >= 2 in two waves of 18's units, 1024 36 in
# three waves, 2048 37 for 18 / 35 where it runs, 4096 38 on bit 512's shapes; 8192 / 16384: B >= 2 with 2-16 groups
# per sequence in <= two waves of CTA group units (B4-B8 T1024, B16 T512) to 25 / 33 where all their clusters are
# resident: no merge in global memory); 32768 auto's 28 for two waves of 31 (B9 / B10; with 2: B9-B14) without PDL,
# 65536 bit 16384's 33 with PDL, 131072 B >= 2 with 2-16 groups in <= 3 waves of CTA group units (B2 / B3 T4096)
# to 39 where all its clusters are resident (after 33 / 25), 262144 bit 131072's 39 without PDL.
# 1: the CUDA-core kernel of src/cuda/attention_decode.cu. 16: the tensor-core kernel of attention_decode_mma.cu,
# 2-13 its tuning variants (see attention_decode_mma.cu). Variant 0 is the default (see attention_decode.cu).
SWEEP = ["32,1024,128,18", "32,1024,128,19", "32,1024,128,23", "32,1024,128,28", "32,1024,128,25", "32,1024,128,17",
         "env:GPUKIT_DECODE_PDL=0"]
Hq, Hkv, D = 32, 8, 128
L2_BYTES = 60e6


def time_events(gk, torch, fn, nargs, rounds, iters, use_torch):
    ev = (lambda: torch.cuda.Event(enable_timing=True)) if use_torch else gk.Event
    sync = torch.cuda.synchronize if use_torch else gk.cuda.synchronize
    for i in range(min(3, nargs)):
        fn(i)
    sync()
    out, k = [], 0
    for _ in range(rounds):
        a, b = ev(), ev()
        a.record()
        for _ in range(iters):
            fn(k % nargs)  # rotate over all copies, across rounds too
            k += 1
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)  # us per call
    return out


def time_graph_gk(gk, fn, nargs, rounds, iters):
    """us per call of fn, `iters` calls captured in one gpukit CUDA graph (no host overhead)."""
    g = gk.Graph()
    with g:
        for i in range(iters):
            fn(i % nargs)
    g.replay()
    gk.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = gk.Event(), gk.Event()
        a.record(g.stream)
        g.replay()
        b.record(g.stream)
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)
    return out


def time_graph_torch(torch, fn, nargs, rounds, iters):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            fn(i % nargs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(iters):
            fn(i % nargs)
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / iters)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(common.DEFAULT_OUT))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--shapes", default="", help="B:T,B:T,... (default: the issue's list)")
    p.add_argument("--splits", nargs="*", default=SWEEP,
                   help="extra GPUKIT_DECODE_SPLIT settings to time (printed only; default: a short sweep)")
    p.add_argument("--no-sweep", action="store_true", help="time the default split parameters only")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--sweep-graph", action="store_true", help="also time each sweep setting under CUDA graph replay")
    p.add_argument("--layout", action="store_true",
                   help="also time gpukit on torch's layout [B, Hkv, T, D] seen as B*Hkv sequences of one kv head")
    a = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench/attention.py: skipped (torch is not installed)")
        return 0
    gk = common.gk
    if not gk.cuda.is_available() or not torch.cuda.is_available():
        print("bench/attention.py: skipped (no CUDA device)")
        return 0
    F = torch.nn.functional
    sys.stdout.reconfigure(line_buffering=True)  # (interleaved with the path log on stderr)
    shapes = [tuple(int(v) for v in s.split(":")) for s in a.shapes.split(",") if s] or SHAPES
    t_start = time.time()
    recs = []
    print(f"attention_decode bf16 Hq={Hq} Hkv={Hkv} D={D}; TB/s of KV read (median of {a.rounds} rounds)")
    for B, T in shapes:
        nbytes = 2 * B * T * Hkv * D * 2
        ncopy = max(1, min(64, int(np.ceil(3 * L2_BYTES / nbytes))))
        gen = torch.Generator(device="cuda").manual_seed(B * 100003 + T)
        # gpukit: contiguous cache [B, T, Hkv, D] (torch memory, shared through DLPack)
        tk = [torch.randn(B, T, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(ncopy)]
        tv = [torch.randn(B, T, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(ncopy)]
        tq = [torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(ncopy)]
        gq = [gk.from_dlpack(x) for x in tq]
        gkc = [gk.from_dlpack(x) for x in tk]
        gvc = [gk.from_dlpack(x) for x in tv]
        lens = gk.asarray(np.full(B, T, np.int32)).to("cuda")
        gfn = lambda i: gk.nn.attention_decode(gq[i], gkc[i], gvc[i], lens)  # noqa: E731
        # torch: [B, Hkv, T, D] (its own contiguous layout)
        sq = [x.view(B, Hq, 1, D) for x in tq]
        sk = [x.transpose(1, 2).contiguous() for x in tk]
        sv = [x.transpose(1, 2).contiguous() for x in tv]
        tfn = lambda i: F.scaled_dot_product_attention(sq[i], sk[i], sv[i], enable_gqa=True)  # noqa: E731
        # sanity: same math (fp32 reference of copy 0, sequence 0)
        os.environ["GPUKIT_DECODE_LOG"] = "1"  # the path the default takes (stderr)
        try:
            got = torch.from_dlpack(gfn(0)).float()
            torch.cuda.synchronize()
            sys.stderr.flush()
        finally:
            del os.environ["GPUKIT_DECODE_LOG"]
        want = tfn(0).view(B, Hq, D).float()
        err = (got - want).abs().max().item()
        if not err < 2e-2:
            print(f"  WARNING B={B} T={T}: max |gpukit - torch| = {err:.3g}")
        g = time_events(gk, torch, gfn, ncopy, a.rounds, a.iters, False)
        t = time_events(gk, torch, tfn, ncopy, a.rounds, a.iters, True)
        tb = [nbytes / (us * 1e-6) / 1e12 for us in g]
        peer_tb = nbytes / (statistics.median(t) * 1e-6) / 1e12
        shape = f"B{B}_T{T}_Hq{Hq}_Hkv{Hkv}_D{D}"
        rec = common.record("attention_decode", shape, "bf16", "TB/s", statistics.median(tb),
                            "torch SDPA (enable_gqa)", peer_tb, tb)
        recs.append(rec)
        print(f"  {shape:28s} gpukit {rec['gpukit']:.2f} TB/s ({statistics.median(g):7.1f} us)  "
              f"SDPA {peer_tb:.2f} TB/s ({statistics.median(t):7.1f} us)  x{rec['gpukit'] / peer_tb:.2f}"
              f"  (max err {err:.1e})")
        try:  # GPU time alone: both sides replay a captured CUDA graph of `iters` calls
            gg = statistics.median(time_graph_gk(gk, gfn, ncopy, a.rounds, a.iters))
            tg = statistics.median(time_graph_torch(torch, tfn, ncopy, a.rounds, a.iters))
            recs.append(common.record("attention_decode_graph", shape, "bf16", "TB/s", nbytes / (gg * 1e-6) / 1e12,
                                      "torch SDPA (enable_gqa), CUDA graph", nbytes / (tg * 1e-6) / 1e12))
            print(f"      CUDA graphs: gpukit {nbytes / (gg * 1e-6) / 1e12:.2f} TB/s ({gg:7.1f} us)  "
                  f"SDPA {nbytes / (tg * 1e-6) / 1e12:.2f} TB/s ({tg:7.1f} us)  x{tg / gg:.2f}")
        except Exception as e:  # noqa: BLE001 (a diagnostic: never fail the bench over it)
            print(f"      CUDA graphs: skipped ({type(e).__name__}: {e})")
        if a.layout:  # the same bytes, each kv head's keys contiguous (as SDPA reads them)
            lq = [x.view(B * Hkv, Hq // Hkv, D) for x in tq]
            lk = [gk.from_dlpack(x.view(B * Hkv, T, 1, D)) for x in sk]
            lv = [gk.from_dlpack(x.view(B * Hkv, T, 1, D)) for x in sv]
            lqg = [gk.from_dlpack(x) for x in lq]
            llens = gk.asarray(np.full(B * Hkv, T, np.int32)).to("cuda")
            lfn = lambda i: gk.nn.attention_decode(lqg[i], lk[i], lv[i], llens)  # noqa: E731
            lerr = (torch.from_dlpack(lfn(0)).float().view(B, Hq, D) - want).abs().max().item()
            ge = statistics.median(time_events(gk, torch, lfn, ncopy, a.rounds, a.iters, False))
            gg3 = statistics.median(time_graph_gk(gk, lfn, ncopy, a.rounds, a.iters))
            print(f"      layout [B*Hkv, T, 1, D]: {nbytes / (ge * 1e-6) / 1e12:.2f} TB/s ({ge:7.1f} us)  "
                  f"graph {nbytes / (gg3 * 1e-6) / 1e12:.2f} TB/s ({gg3:7.1f} us)  (max err {lerr:.1e})")
            del lq, lk, lv, lqg
        for sp in ([] if a.no_sweep else a.splits):
            split, _, env = sp.replace("+", "|", 1).partition("|")  # ("+": the same without a shell character)
            if sp.startswith("env:"):  # (the same without a shell-special character)
                split, env = "", sp[4:]
            envs = dict([env.split("=", 1)]) if env else {}
            if split:
                envs["GPUKIT_DECODE_SPLIT"] = split
            os.environ.update(envs)
            gg2 = None
            try:
                os.environ["GPUKIT_DECODE_LOG"] = "1"  # the path this entry takes (stderr) and its error
                try:
                    e2 = (torch.from_dlpack(gfn(0)).float() - want).abs().max().item()
                    torch.cuda.synchronize()
                    sys.stderr.flush()
                finally:
                    del os.environ["GPUKIT_DECODE_LOG"]
                g2 = time_events(gk, torch, gfn, ncopy, max(10, a.rounds // 3), a.iters, False)
                if a.sweep_graph:  # the setting is read at capture time
                    gg2 = statistics.median(time_graph_gk(gk, gfn, ncopy, max(10, a.rounds // 3), a.iters))
            finally:
                for k in envs:
                    del os.environ[k]
            extra = "" if gg2 is None else f"  graph {nbytes / (gg2 * 1e-6) / 1e12:.2f} TB/s ({gg2:7.1f} us)"
            print(f"      split {sp:20s} {nbytes / (statistics.median(g2) * 1e-6) / 1e12:.2f} TB/s "
                  f"({statistics.median(g2):7.1f} us){extra}  (max err {e2:.1e})")
        if (B, T) in PAGED:
            bs = 16
            nblk = B * T // bs
            perm = np.random.default_rng(T).permutation(nblk).astype(np.int32).reshape(B, T // bs)
            bt = gk.asarray(perm).to("cuda")
            pk = [gk.from_dlpack(x.view(nblk, bs, Hkv, D)) for x in tk]
            pv = [gk.from_dlpack(x.view(nblk, bs, Hkv, D)) for x in tv]
            pfn = lambda i: gk.nn.attention_decode(gq[i], pk[i], pv[i], lens, block_table=bt)  # noqa: E731
            g = time_events(gk, torch, pfn, ncopy, a.rounds, a.iters, False)
            tb = [nbytes / (us * 1e-6) / 1e12 for us in g]
            rec = common.record("attention_decode_paged", shape + f"_bs{bs}", "bf16", "TB/s", statistics.median(tb),
                                "torch SDPA (enable_gqa, contiguous)", peer_tb, tb)
            recs.append(rec)
            print(f"  {'paged bs16':28s} gpukit {rec['gpukit']:.2f} TB/s ({statistics.median(g):7.1f} us)  "
                  f"x{rec['gpukit'] / peer_tb:.2f} vs SDPA")
            del pk, pv
        del gq, gkc, gvc, tk, tv, tq, sk, sv, sq
        gk.cuda.synchronize()
        torch.cuda.empty_cache()
    print(f"total {time.time() - t_start:.1f} s")
    if not a.no_write:
        common.write_results(a.out, recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
