"""Prefill attention benchmark: gpukit's attention_prefill against torch SDPA (its fastest form), same run.

    python bench/prefill.py [--out bench/results/h200.json] [--rounds 20] [--no-peer] [--sizes 1024,4096,16384]
                            [--no-other] [--prof 1024,9760,58912,75296] [--experiments [4096,16384]]
    python bench/prefill.py --sanitize racecheck|memcheck|synccheck

Causal bf16, batch 1, H=32, D=128 at S = 1024, 4096, 16384, plus GQA (Hq=32, Hkv=8) at S=4096.
gpukit reads torch tensors [S, H, D] through DLPack (zero-copy); torch SDPA is timed in several forms
(contiguous [1, H, S, D] with the default backend choice, forced flash / cuDNN / memory-efficient, and
flash on the [1, H, S, D] view of the shared tensors) and the fastest is the peer. TFLOP/s counts
4 * S^2 * D * Hq / 2 (causal half).
The recorded figures come from alternating rounds (a batch of back-to-back calls of each per round,
about 2 ms; medians). Because the clock a kernel gets depends on what ran before it (power limit),
each size also prints gpukit and torch timed in three orders (all gpukit batches first, all torch
batches first, alternating; median / max TFLOP/s and the worst ratio of medians), and at S >= 4096
steady blocks of ~0.25 s of back-to-back calls (gpukit, torch, gpukit, torch) with the SM clock,
power, temperature and power-cap share read through NVML while each runs. --prof: one call each of
the cycle-profile builds (GPUKIT_PREFILL_SM90_OPT with bit 1024), whose per-phase cycles per key
tile and SM clock go to stderr. Other sm_90 kernels in brackets (GPUKIT_PREFILL_SM90=1: cp.async,
=2: warp-specialized without ping-pong, =3: ping-pong, one CTA per tile, =4: the same with 3 K/V
stages, =6: persistent with 3 stages; the default is =5, ping-pong in a persistent grid).
Records: name attention_prefill, shape S{S}_H32_D128_causal (GQA: S{S}_Hq32_Hkv8_D128_causal),
metric TFLOP/s, peer torch SDPA.
--experiments: afterwards, times the default kernel under the run-time settings of EXPERIMENTS at the
given sizes (alternating rounds, medians and the ratio to the default; "default again" shows the noise).
--sanitize TOOL: runs sanitize_cases() (small shapes, every sm_90 kernel) under compute-sanitizer.
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


def sdpa_forms(torch, F, SDPBackend, sdpa_kernel, q, k, v, flops, rounds):
    """Times torch SDPA (causal) in its usual forms: contiguous [1, H, S, D] inputs with the default
    backend choice, forced flash / cuDNN / memory-efficient backends, and flash on the [1, H, S, D]
    view of the [S, H, D] tensors gpukit reads. Returns (best TFLOP/s, its name, all, its output)."""
    gqa = q.shape[1] != k.shape[1]
    bhsd = [x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v)]
    view = [x.unsqueeze(0).transpose(1, 2) for x in (q, k, v)]
    forms = [("default", None, bhsd), ("flash", SDPBackend.FLASH_ATTENTION, bhsd),
             ("cudnn", SDPBackend.CUDNN_ATTENTION, bhsd), ("efficient", SDPBackend.EFFICIENT_ATTENTION, bhsd),
             ("flash on BSHD view", SDPBackend.FLASH_ATTENTION, view)]
    best, best_name, best_out, best_fn, shown = None, "", None, None, []
    for name, backend, (tq, tk, tv) in forms:
        def run(tq=tq, tk=tk, tv=tv):
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=gqa)
        try:
            if backend is None:
                ms = common.time_torch(run, rounds)
                out = run()
            else:
                with sdpa_kernel(backend):
                    ms = common.time_torch(run, rounds)
                    out = run()
        except RuntimeError as e:  # backend not available for this case
            shown.append(f"{name}: n/a ({str(e).splitlines()[0][:60]})")
            continue
        tf = flops / (common.median(ms) * 1e-3) / 1e12
        shown.append(f"{name} {tf:.1f}")
        if best is None or tf > best:
            best, best_name, best_out = tf, f"torch SDPA {name}", out
            if backend is None:
                best_fn = run
            else:
                def best_fn(run=run, backend=backend):
                    with sdpa_kernel(backend):
                        return run()
    torch.cuda.synchronize()
    return best, best_name, "; ".join(shown), best_out, best_fn


def interleaved(fns, rounds, reps=1):
    """Times fns ((kind, fn) with kind "gk" or "torch": events of that library's stream) in
    interleaved rounds, reps back-to-back calls of each per round (so that short kernels are
    timed without the host's per-call work in between), so that clock and temperature drift
    over the run falls on all of them alike. Returns the per-call milliseconds of each round."""
    import torch
    for _, f in fns:  # warm-up
        f()
    gk.cuda.synchronize()
    torch.cuda.synchronize()
    out = [[] for _ in fns]
    for _ in range(rounds):
        for i, (kind, f) in enumerate(fns):
            if kind == "gk":
                a, b = gk.Event(), gk.Event()
            else:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                f()
            b.record()
            b.synchronize()
            out[i].append(a.elapsed_time(b) / reps)
    return out


def orders(gfn, tfn, flops, n, reps):
    """Times gpukit and torch (each a batch of reps calls per event pair, n batches) in three orders:
    all gpukit batches then all torch ones, the reverse, and alternating batches. Returns
    {order: (gpukit TFLOP/s list, torch TFLOP/s list)}."""
    def block(kind, f):
        return interleaved([(kind, f)], n, reps)[0]
    tf = lambda ms: [flops / (m * 1e-3) / 1e12 for m in ms]  # noqa: E731
    out = {}
    g = block("gk", gfn)
    t = block("torch", tfn)
    out["gpukit first"] = (tf(g), tf(t))
    t = block("torch", tfn)
    g = block("gk", gfn)
    out["torch first"] = (tf(g), tf(t))
    g, t = interleaved([("gk", gfn), ("torch", tfn)], n, reps)
    out["alternating"] = (tf(g), tf(t))
    return out


def order_line(res):
    """One line of orders(): median / max TFLOP/s of each, and the worst ratio of medians."""
    cells, worst = [], None
    for name, (g, t) in res.items():
        r = common.median(g) / common.median(t)
        worst = r if worst is None else min(worst, r)
        cells.append(f"{name}: gpukit {common.median(g):.1f} / {max(g):.1f}, torch {common.median(t):.1f} / "
                     f"{max(t):.1f} ({r:.3f})")
    return f"    orders (median / max TFLOP/s): {'; '.join(cells)}; worst ratio {worst:.3f}", worst


class Nvml:
    """SM clock, power and clock-event reasons through libnvidia-ml (ctypes), sampled by a thread."""
    def __init__(self):
        import ctypes
        self.c = ctypes
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        self.h = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.h)) != 0:
            raise OSError("no NVML device 0")
        self.reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.lib.nvmlDeviceGetCurrentClocksThrottleReasons

    def sample(self):
        c = self.c
        clk, mw, t, r = c.c_uint(), c.c_uint(), c.c_uint(), c.c_ulonglong()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, c.byref(clk))  # NVML_CLOCK_SM
        self.lib.nvmlDeviceGetPowerUsage(self.h, c.byref(mw))
        self.lib.nvmlDeviceGetTemperature(self.h, 0, c.byref(t))
        self.reasons(self.h, c.byref(r))
        return clk.value, mw.value / 1000.0, t.value, r.value

    def during(self, fn):
        """Runs fn() while a thread samples every 5 ms; returns (fn's value, samples)."""
        import threading
        samples, stop = [], threading.Event()

        def loop():
            while not stop.is_set():
                samples.append(self.sample())
                time.sleep(0.005)
        th = threading.Thread(target=loop)
        th.start()
        try:
            v = fn()
        finally:
            stop.set()
            th.join()
        return v, samples


def steady(nv, gfn, tfn, flops, per_call_ms, secs=0.25):
    """Back-to-back calls for about secs per block, blocks gpukit, torch, gpukit, torch: per block the
    TFLOP/s (events around the block) and, from NVML, the median SM clock, power, temperature and the
    share of samples with the software power cap (reason 0x4) or a thermal slowdown (0x20 | 0x40) on."""
    import torch
    n = max(5, int(secs * 1e3 / max(per_call_ms, 1e-3)))
    cells = []
    for kind, f in (("gpukit", gfn), ("torch", tfn), ("gpukit", gfn), ("torch", tfn)):
        def run(kind=kind, f=f):
            if kind == "gpukit":
                a, b = gk.Event(), gk.Event()
            else:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n):
                f()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / n
        ms, smp = nv.during(run)
        smp = smp[len(smp) // 5:] or smp  # the first fifth: clocks still settling
        med = lambda i: common.median([x[i] for x in smp]) if smp else float("nan")  # noqa: E731
        cap = sum(1 for x in smp if x[3] & 0x4) / max(len(smp), 1)
        hot = sum(1 for x in smp if x[3] & 0x60) / max(len(smp), 1)
        cells.append(f"{kind} {flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s at {med(0):.0f} MHz {med(1):.0f} W "
                     f"{med(2):.0f} C (power-capped {cap:.0%}, thermal {hot:.0%})")
    return "    steady blocks of ~%.2f s: " % secs + " | ".join(cells)


def reps_for(ms):
    """Back-to-back calls per timed batch: about 2 ms of work."""
    return max(1, min(50, int(2.0 / max(ms, 1e-3))))


def sanitize(tool):
    """Runs the small prefill cases of sanitize_cases() (each sm_90 kernel once or twice, small shapes)
    under compute-sanitizer --tool TOOL in a child process; prints its verdict and summary lines."""
    import shutil
    import subprocess
    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(exe):
        print("compute-sanitizer not found")
        return 0
    repo = pathlib.Path(__file__).resolve().parents[1]
    extra = ["--racecheck-report", "all"] if tool == "racecheck" else []
    cmd = [exe, "--tool", tool, "--error-exitcode", "7", *extra, sys.executable, str(pathlib.Path(__file__).resolve()),
           "--sanitize-cases"]
    env = dict(os.environ, PYTHONPATH=str(repo / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=55, env=env, cwd=repo)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(f"compute-sanitizer --tool {tool}: timed out after 55 s; last output:\n{out[-3000:]}")
        return 1
    lines = (r.stdout + r.stderr).splitlines()
    keep = [ln for ln in lines if "=====" in ln or ln.startswith("case ") or "cases" in ln or "rror" in ln]
    verdict = "CLEAN" if r.returncode == 0 else f"NOT CLEAN (exit {r.returncode})"
    print(f"compute-sanitizer --tool {tool}: {verdict} in {time.time() - t0:.1f} s")
    print("\n".join(keep[-80:]))
    return 0 if r.returncode == 0 else 1


def sanitize_cases():
    """Small prefill calls, one per kernel and path (persistent default, its experiment builds with the
    thresholded maximum, ping-pong with varlen and poisoned neighbours, no ping-pong, 3 stages, the
    cp.async kernel; GQA, head_dim 64 / 128 / 256, causal and bidirectional, a cached prefix), each
    checked against float64 NumPy. Exit status 1 on a wrong result (run under compute-sanitizer)."""
    import numpy as np
    rng = np.random.default_rng(0)

    def ref(q, k, v, cuq, cuk, causal):
        out = np.zeros(q.shape, np.float64)
        G = q.shape[1] // k.shape[1]
        for b in range(len(cuq) - 1):
            q0, q1, k0, k1 = int(cuq[b]), int(cuq[b + 1]), int(cuk[b]), int(cuk[b + 1])
            if q1 == q0 or k1 == k0:
                continue
            K = np.repeat(k[k0:k1], G, axis=1).transpose(1, 2, 0)
            V = np.repeat(v[k0:k1], G, axis=1).transpose(1, 0, 2)
            s = np.matmul(q[q0:q1].transpose(1, 0, 2), K) / np.sqrt(q.shape[2])
            if causal:
                i = np.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)
                s = np.where(np.arange(k1 - k0)[None, :] <= i, s, -np.inf)
            m = s.max(axis=2, keepdims=True)
            w = np.exp(s - np.where(np.isfinite(m), m, 0))
            out[q0:q1] = (np.matmul(w, V) / np.maximum(w.sum(axis=2, keepdims=True), 1e-300)).transpose(1, 0, 2)
        return out

    cases = [  # (label, GPUKIT_PREFILL_SM90, _OPT, lq list, prefix list, Hq, Hkv, D, causal)
        ("persistent default", "5", "", [300], [0], 4, 2, 128, True),
        ("persistent thresholded max", "5", "512", [300], [0], 4, 2, 128, True),
        ("persistent thresholded max + early rescale", "5", "2560", [260], [40], 2, 2, 128, True),
        ("persistent Q in registers", "5", "4608", [333], [0], 2, 2, 128, True),
        ("persistent speculative softmax", "5", "8736", [700], [0], 2, 1, 128, True),
        ("persistent spec + K ahead + sleeping waits", "5", "57888", [520], [90], 2, 2, 128, True),
        ("persistent, no OPT bits (before B)", "5", "1048576", [300], [0], 2, 2, 128, True),
        ("persistent spec + turn after S + K ahead", "5", "90656", [640], [0], 2, 2, 128, True),
        ("persistent spec + turn after P V", "5", "139808", [333], [17], 2, 1, 128, True),
        ("ping-pong varlen poisoned", "3", "", [100, 0, 37, 20], [0, 28, 5, 0], 4, 2, 128, True),
        ("ping-pong varlen D=64 bidirectional", "3", "", [70, 130], [10, 0], 2, 1, 64, False),
        ("no ping-pong D=256", "2", "", [150], [0], 2, 2, 256, True),
        ("3 stages", "4", "", [200], [90], 2, 2, 128, True),
        ("cp.async varlen", "1", "", [90, 50], [0, 30], 2, 1, 128, True),
    ]
    bad = 0
    for label, variant, opt, lq, prefix, Hq, Hkv, D, causal in cases:
        cuq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
        cuk = np.concatenate([[0], np.cumsum(np.add(lq, prefix))]).astype(np.int32)
        qn = rng.standard_normal((int(cuq[-1]), Hq, D)).astype(np.float32)
        kn = rng.standard_normal((int(cuk[-1]), Hkv, D)).astype(np.float32)
        vn = rng.standard_normal((int(cuk[-1]), Hkv, D)).astype(np.float32)
        if "poisoned" in label:  # sequence 1 has keys only: NaN / Inf there must not leak
            kn[cuk[1]:cuk[2]] = np.nan
            vn[cuk[1]:cuk[2]] = np.inf
        dev = "cuda" if gk.cuda.is_available() else "cpu"
        q, k, v = (gk.asarray(x).astype("bfloat16").to(dev) for x in (qn, kn, vn))
        os.environ["GPUKIT_PREFILL_SM90"] = variant
        if opt:
            os.environ["GPUKIT_PREFILL_SM90_OPT"] = opt
        else:
            os.environ.pop("GPUKIT_PREFILL_SM90_OPT", None)
        if len(lq) > 1:
            out = gk.nn.attention_prefill(q, k, v, gk.asarray(cuq), gk.asarray(cuk), causal=causal)
        else:
            out = gk.nn.attention_prefill(q, k, v, causal=causal)
        f = lambda x: np.asarray(gk.to_numpy(x), np.float64)  # noqa: E731
        got = f(out)
        want = ref(f(q), f(k), f(v), cuq, cuk, causal)
        rows = np.concatenate([np.arange(cuq[b], cuq[b + 1]) for b in range(len(lq)) if lq[b]])
        err = float(np.max(np.abs(got[rows] - want[rows]))) if rows.size else 0.0
        ok = err <= 2e-2
        bad += not ok
        print(f"case {label}: max err {err:.3g} {'ok' if ok else 'WRONG'}", flush=True)
    os.environ.pop("GPUKIT_PREFILL_SM90", None)
    os.environ.pop("GPUKIT_PREFILL_SM90_OPT", None)
    print(f"sanitize cases: {len(cases) - bad} of {len(cases)} right", flush=True)
    return 1 if bad else 0


# (label, environment) of the --experiments table; "OPT" runs are timing experiments only.
EXPERIMENTS = [  # (default since checkpoint B: speculative softmax, OPT 8736, for head_dim 128)
    ("default", {}),
    ("default before B (no OPT bits)", {"GPUKIT_PREFILL_SM90_OPT": "1048576"}),
    ("thresholded max + early rescale", {"GPUKIT_PREFILL_SM90_OPT": "2560"}),
    ("thresholded max + K ahead + sleeping waits", {"GPUKIT_PREFILL_SM90_OPT": "49664"}),
    ("spec + K ahead of V", {"GPUKIT_PREFILL_SM90_OPT": "25120"}),
    ("spec + sleeping waits", {"GPUKIT_PREFILL_SM90_OPT": "41504"}),
    ("spec + K ahead + sleeping waits", {"GPUKIT_PREFILL_SM90_OPT": "57888"}),
    ("spec + turn passed after S", {"GPUKIT_PREFILL_SM90_OPT": "74272"}),
    ("spec + turn passed after P V", {"GPUKIT_PREFILL_SM90_OPT": "139808"}),
    ("spec + turn after S + K ahead", {"GPUKIT_PREFILL_SM90_OPT": "90656"}),
    ("Q in registers + thresholded max", {"GPUKIT_PREFILL_SM90_OPT": "4608"}),
    ("bn=160 (no OPT bits)", {"GPUKIT_PREFILL_SM90_BN": "160"}),
    ("no K/V loads (wrong results)", {"GPUKIT_PREFILL_SM90_OPT": "1"}),
    ("no softmax (wrong results)", {"GPUKIT_PREFILL_SM90_OPT": "2"}),
    ("default again (noise)", {}),
]


def experiments(sizes, rounds):
    """Times the default kernel under each EXPERIMENTS setting (environment set per call), interleaved:
    each round runs every setting once. Prints the median TFLOP/s of each and its ratio to the default."""
    keys = {k for _, env in EXPERIMENTS for k in env}
    D, H = 128, 32

    def with_env(env, q, k, v):
        def f():
            for key in keys:
                os.environ.pop(key, None)
            os.environ.update(env)
            return gk.nn.attention_prefill(q, k, v, causal=True)
        return f

    for S in sizes:
        rng = __import__("numpy").random.default_rng(S)
        mk = lambda: gk.asarray(rng.standard_normal((S, H, D)).astype("float32")).astype("bfloat16").to("cuda")
        q, k, v = mk(), mk(), mk()
        flops = 4.0 * S * S * D * H / 2
        ms = interleaved([("gk", with_env(env, q, k, v)) for _, env in EXPERIMENTS], rounds,
                         reps_for(flops / 500e12 * 1e3))
        for key in keys:
            os.environ.pop(key, None)
        tf = [flops / (common.median(m) * 1e-3) / 1e12 for m in ms]
        cells = [f"{label} {t:.1f} ({t / tf[0]:.3f})" for (label, _), t in zip(EXPERIMENTS, tf)]
        print(f"experiments S{S}_H{H}_D{D}_causal, interleaved, median TFLOP/s (ratio to default): "
              + " | ".join(cells), flush=True)
        q = k = v = None


def argparse_suppress():
    import argparse
    return argparse.SUPPRESS


def main():
    def extra(p):
        p.add_argument("--sizes", default="1024,4096,16384", help="comma-separated sequence lengths (MHA cases)")
        p.add_argument("--sanitize", default="", metavar="TOOL",
                       help="instead of timing: run a few GPU prefill tests under compute-sanitizer --tool TOOL "
                            "(memcheck, racecheck, synccheck) and print its summary")
        p.add_argument("--sanitize-cases", action="store_true", help=argparse_suppress())
        p.add_argument("--prof", default="1024,9760,58912,75296", metavar="OPTS",
                       help="at S >= 4096 (MHA), one call each with these GPUKIT_PREFILL_SM90_OPT cycle-profile "
                            "builds (1024: no other bits (the default before B), 1026: no softmax (wrong results), 1536: "
                            "thresholded max, 3584: + early rescale, 5632: Q in registers + thresholded max, 9760: "
                            "speculative softmax (the default since B), 58912: + K ahead of V + sleeping waits, 75296: "
                            "spec + turn passed after S); '' for none")
        p.add_argument("--no-other", action="store_true", help="skip timing the other sm_90 kernels")
        p.add_argument("--experiments", nargs="?", const="4096,16384", default="", metavar="SIZES",
                       help="afterwards, time the default kernel under the EXPERIMENTS settings at these sizes")

    a = common.parse_args(__doc__.splitlines()[0], extra)
    a.rounds = max(a.rounds, 20)
    if a.sanitize_cases:  # (without CUDA: the same cases on the CPU reference kernel)
        return sanitize_cases()
    if not common.require_cuda():
        return 0
    if a.sanitize:
        return sanitize(a.sanitize)
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
    nv = None
    try:
        nv = Nvml()
    except (OSError, AttributeError) as e:
        print(f"NVML unavailable ({e}): no clock / power readings")
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
        # The other sm_90 kernels for comparison (GPUKIT_PREFILL_SM90=1: cp.async, =2: warp-specialized
        # without ping-pong, =3: ping-pong, =4: 3 K/V stages, =6: persistent, 3 stages), then the
        # default one (=5: ping-pong in a persistent grid).
        other = ""
        if not a.no_other:
            for env, what in (("1", "cp.async"), ("2", "no ping-pong"), ("3", "not persistent"), ("4", "3-stage"),
                              ("6", "persistent 3-stage")):
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
        peer_tf, peer, err, forms, h2h, extra_lines, order_rec = None, "", float("nan"), "", "", [], {}
        if not a.no_peer:
            seq_tf, peer, forms, ref, peer_fn = sdpa_forms(torch, F, SDPBackend, sdpa_kernel, q, k, v, flops,
                                                           a.rounds)
            out = gk.nn.attention_prefill(gq, gk_, gv, causal=True)
            gk.cuda.synchronize()
            got = torch.from_dlpack(out).float()
            err = (got - ref[0].transpose(0, 1).float()).abs().max().item()
            # The record: gpukit and the fastest torch form timed in interleaved rounds (drift-fair).
            seq_g = g_tf
            gms, pms = interleaved([("gk", lambda: gk.nn.attention_prefill(gq, gk_, gv, causal=True)),
                                    ("torch", peer_fn)], a.rounds, reps_for(common.median(gms)))
            g_tf = flops / (common.median(gms) * 1e-3) / 1e12
            peer_tf = flops / (common.median(pms) * 1e-3) / 1e12
            h2h = f"   (timed one after the other: gpukit {seq_g:.1f}, torch {seq_tf:.1f})"
            gfn = lambda: gk.nn.attention_prefill(gq, gk_, gv, causal=True)  # noqa: E731
            ores = orders(gfn, peer_fn, flops, a.rounds, reps_for(common.median(gms)))
            oline, worst = order_line(ores)
            extra_lines.append(oline)
            order_rec = {"orders": {name: [round(common.median(g), 1), round(common.median(t), 1)]
                                    for name, (g, t) in ores.items()}, "worst_order_ratio": round(worst, 4)}
            if nv is not None and S >= 4096:
                extra_lines.append(steady(nv, gfn, peer_fn, flops, common.median(gms)))
            if S >= 4096 and Hq == Hkv:  # cycle profiles of the consumer loop (stderr)
                for opt in a.prof.split(","):
                    if not opt:
                        continue
                    os.environ["GPUKIT_PREFILL_SM90_OPT"] = opt
                    print(f"    cycle profile, GPUKIT_PREFILL_SM90_OPT={opt}:", flush=True)
                    sys.stdout.flush()
                    gfn()
                    gk.cuda.synchronize()
                    sys.stderr.flush()
                    os.environ.pop("GPUKIT_PREFILL_SM90_OPT")
        print(f"attention_prefill {label:<28} gpukit {g_tf:7.1f} TFLOP/s ({common.median(gms):8.3f} ms)"
              + (f"   best torch: {peer} {peer_tf:7.1f} TFLOP/s   ratio {g_tf / peer_tf:5.2f}   max|diff| {err:.3g}"
                 if peer_tf else "") + other, flush=True)
        if forms:
            print(f"    interleaved rounds{h2h}; torch SDPA forms (TFLOP/s): {forms}", flush=True)
        for line in extra_lines:
            print(line, flush=True)
        records.append(common.record("attention_prefill", label, "bf16", "TFLOP/s", g_tf, peer, peer_tf, [
            flops / (t * 1e-3) / 1e12 for t in gms]))
        records[-1].update(order_rec)  # medians [gpukit, torch] per timing order, and the worst ratio
        q = k = v = gq = gk_ = gv = None  # free before the next size
        torch.cuda.empty_cache()
    common.write_results(a.out, records)
    if a.experiments:
        experiments([int(x) for x in a.experiments.split(",") if x], a.rounds)
    print(f"total {time.time() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
