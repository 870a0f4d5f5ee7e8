"""Shared helpers of the benchmarks: device info, CUDA-event timing, and the results file.

Results file (bench/results/<gpu>.json): one object
    {"device", "driver", "cuda", "commit", "date", "results": [record, ...]}
with records {"name", "shape", "dtype", "metric", "gpukit", "peer", "peer_value", "rounds"};
a new record replaces the one with the same (name, shape, dtype).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "h200.json"

try:
    import gpukit as gk
except ImportError:  # running from a checkout
    sys.path.insert(0, str(REPO / "python"))
    import gpukit as gk


def parse_args(description, extra=None):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results JSON file (merged by name, shape, dtype)")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds (median reported; at least 20)")
    p.add_argument("--no-peer", action="store_true", help="skip torch/CuPy")
    if extra:
        extra(p)
    a = p.parse_args()
    a.rounds = max(a.rounds, 20)
    return a


def require_cuda() -> bool:
    """False (after printing why) when there is no GPU; the caller then exits 0."""
    if not gk.cuda.is_available():
        print("CUDA is unavailable (gk.cuda.is_available() is False): nothing to benchmark")
        return False
    return True


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def device_info() -> dict:
    name = gk.cuda.get_device_properties("cuda:0")["name"] if gk.cuda.is_available() else "cpu"
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]).splitlines()
    driver = smi[0].split(",")[1].strip() if smi and "," in smi[0] else ""
    cuda = ""
    for line in _run(["nvidia-smi"]).splitlines():
        if "CUDA Version" in line:
            cuda = line.split("CUDA Version:")[1].split()[0]
    return {"device": name, "driver": driver, "cuda": cuda,
            "commit": os.environ.get("GPUKIT_COMMIT") or _run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def time_cuda(fn, rounds, warmup=3, stream=None):
    """Per-round milliseconds of fn() measured with gk.Event on the current (or given) stream."""
    for _ in range(warmup):
        fn()
    gk.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = gk.Event(), gk.Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def time_torch(fn, rounds, warmup=3):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def median(v):
    return statistics.median(v)


def per_call_us(fn, calls, sync, repeats):
    """Wall time per call (us) of `repeats` loops of `calls` calls each (host overhead), after 200
    warm-up calls; sync() drains the device after each loop."""
    for _ in range(200):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return out


def record(name, shape, dtype, metric, gpukit, peer="", peer_value=None, rounds=()):
    return {"name": name, "shape": str(shape), "dtype": dtype, "metric": metric,
            "gpukit": round(float(gpukit), 4), "peer": peer,
            "peer_value": None if peer_value is None else round(float(peer_value), 4),
            "rounds": [round(float(r), 4) for r in rounds]}


def write_results(path, records):
    """Merges `records` into the JSON file at `path` by (name, shape, dtype)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {}
    if path.exists():
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = {}
    key = lambda r: (r["name"], r["shape"], r["dtype"])  # noqa: E731
    merged = {key(r): r for r in doc.get("results", [])}
    for r in records:
        merged[key(r)] = r
    doc.update(device_info())
    doc["results"] = sorted(merged.values(), key=key)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    print(f"wrote {len(records)} records to {path}")


def print_table(records):
    print(f"{'name':<22} {'shape':<12} {'dtype':<6} {'gpukit':>10} {'peer':>10}  metric  peer")
    for r in records:
        pv = "" if r["peer_value"] is None else f"{r['peer_value']:10.3f}"
        print(f"{r['name']:<22} {r['shape']:<12} {r['dtype']:<6} {r['gpukit']:10.3f} {pv:>10}  {r['metric']:<6}  {r['peer']}")
