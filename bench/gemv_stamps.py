"""Per-CTA timelines of the staged 8-bit decode GEMVs inside the captured decode step (session 11, a
diagnostic of the short projections; docs/notes/short-s11.md).

    python bench/gemv_stamps.py --cases 8b-fp8-b1 --engines gk-graph,gk-graph+w8s8-2-16-1-3-0-0+w8o4-2-16-1-3-0-0

gk._C._gemv_w8_stamps(True) makes the launches of k_w8's default kinds that follow write %globaltimer
stamps per CTA (thread 0): entry, its copies before the PDL wait issued, the wait returned, its first
stage landed, the loop left, the warps' sums added, the outputs stored, and the SM. The graph of the
decode step is captured while they are on, so its replays write them; after a few replays the slots of
the last captured step are read. For each GEMV of --layer (and the one before it): times in us from the
first "wait returned" of that GEMV (~ the end of the kernel it waits for: the norm or the attention),
min / median / max over its CTAs; the CTAs that became resident only after that moment ("late"); SMs used
and the most CTAs on one SM; and the GEMV's span from its first wait return to its last store.
Needs CUDA; fp8 / int8 weights (the 8-bit kernel).
"""
from __future__ import annotations

import sys

import numpy as np

from common import gk, parse_args

import e2e
from e2e_trace import engine_applied, for_each_case

PHASES = ["entry", "copies issued", "wait returned", "first stage landed", "loop left", "sums added", "stored"]
SLOTS, CTAS = 512, 2048


def run(model, batch, prompt, engine, layer, nlayers):
    from gpukit import _C
    with engine_applied(model, engine) as opt:
        prompts = e2e.prompts_for(batch, prompt, model.config.vocab_size)
        _C._gemv_w8_stamps(True)
        try:
            g = _C.llm.Generation(model._m, prompts, max_new_tokens=40, ignore_eos=True, cuda_graph=opt["graph"])
            for _ in range(10):  # prefill, capture, replays
                g.step()
            gk.synchronize()
            meta, raw = _C._gemv_w8_stamps_read()
        finally:
            _C._gemv_w8_stamps(False)
    st = np.frombuffer(raw, dtype=np.uint64).reshape(SLOTS, CTAS, 8).astype(np.int64)
    used = sorted((m[0], i) for i, m in enumerate(meta) if m[0] >= 0)
    if not used:
        print(f"  {engine}: no stamped launches (not fp8 / int8 weights, or another kernel kind)")
        return
    per_step = 4 * nlayers + 1
    last = [i for _, i in used[-per_step:]]
    shapes = [(meta[i][1], meta[i][2]) for i in last]
    print(f"  {engine}: {len(used)} stamped launches; the last step's {len(last)}: first shapes {shapes[:5]}")
    if layer is None or 4 * layer + 4 > len(last):
        return
    prev_end = None
    for j in range(4 * layer - 1, 4 * layer + 4):
        if j < 0:
            continue
        slot = last[j]
        _, n, k, ctas, split, nw = meta[slot]
        c = min(ctas * split, CTAS)
        s = st[slot, :c]
        ok = s[:, 0] > 0
        if not ok.any():
            print(f"    launch {j} ({n} x {k}): no stamps")
            continue
        s = s[ok]
        t0 = s[:, 2].min()
        sms, cnt = np.unique(s[:, 7], return_counts=True)
        late = int((s[:, 0] > t0).sum())
        print(f"    launch {j}: N {n} K {k}, {c} CTAs of {nw} warps (split {split}), {len(sms)} SMs, at most "
              f"{cnt.max()} CTAs on one SM; {late} CTAs entered after the first wait returned; span first wait -> "
              f"last store {(s[:, 6].max() - t0) / 1e3:.2f} us" +
              (f"; first wait - previous GEMV's last store {(t0 - prev_end) / 1e3:.2f} us" if prev_end else ""))
        for i, name in enumerate(PHASES):
            d = (s[:, i] - t0) / 1e3
            print(f"      {i} {name:<20}{d.min():9.2f}{np.median(d):9.2f}{d.max():9.2f}")
        stream = (s[:, 4] - s[:, 2]) / 1e3
        print(f"        per CTA, wait returned -> loop left: {stream.min():.2f} / {np.median(stream):.2f} / "
              f"{stream.max():.2f} us")
        prev_end = s[:, 6].max()


def main():
    def extra(p):
        p.add_argument("--cases", default="8b-fp8-b1")
        p.add_argument("--engines", default="gk-graph")
        p.add_argument("--prompt", type=int, default=128)
        p.add_argument("--layer", type=int, default=5)

    a = parse_args("Per-CTA stamps of the staged 8-bit decode GEMVs", extra)
    sys.stdout.reconfigure(line_buffering=True)
    if not gk.cuda.is_available():
        print("CUDA is unavailable")
        return 0
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for_each_case(a.cases, engines, a.prompt,
                  lambda model, batch, eng, cfg: run(model, batch, a.prompt, eng, a.layer, cfg["num_hidden_layers"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
