"""Where the time of one captured decode step goes: the kernels of gpukit's CUDA-graph
decode step traced with torch.profiler (CUPTI; kernels inside graphs are recorded one by
one), for the cases and gk engines of bench/e2e.py.

    python bench/e2e_trace.py --cases 8b-b1 --engines gk-graph,gk-graph+pf32
    python bench/e2e_trace.py --cases 8b-b1,1b-b1,8b-fp8-b1,8b-int4-b1 --steps 6 --layer 5

Per case and engine: the step period (median over the traced steps, and the tok/s it
stands for; CUPTI adds a little per kernel), then, per kind of kernel, the time it adds
to the step's timeline: kernels sorted by start, each is charged the part of its span
that ends past every earlier kernel's end ("extends"), and the idle time between the
latest end so far and its start is charged to it as "gap before" (a launch or
dependency wait where no kernel runs). extends + gap summed over the kinds is the step.
Kernels of the L2-prefetch side branch are listed apart (they overlap the main chain).
With --layer N the kernels of layer N are printed in order (start, duration, gap), and
the fused attention's per-CTA phase stamps of that layer (Model.set_attention_stamps).
Needs torch with CUDA (CUPTI) beside gpukit.
"""
from __future__ import annotations

import contextlib
import re
import statistics
import sys

from common import gk, parse_args

import e2e

KINDS = [  # (kind, regex on the kernel name); first match wins
    ("x_prep", r"xprep"),  # the integer GEMVs' conversion of x at M > 1 (k_w4i_xprep, k_ggi_xprep), Q8_0's fp16 copy
    ("prefetch_l2", r"k_prefetch_l2"),
    ("embed_norm", r"k_embed_norm"),
    ("attn_rope", r"k_attn_rope"),
    ("proj_swiglu", r"k_project<[^,]+, *\d+, *1\b"),
    ("proj_qkv_rope", r"k_project<[^,]+, *\d+, *2\b"),
    ("proj", r"k_project"),
    ("rope_append", r"k_rope_append"),
    ("attn_merge", r"k_merge"),
    ("add_rms_norm", r"add_rms_norm"),
    ("swiglu", r"k_swiglu|gated"),
    ("advance", r"k_advance"),
    ("argmax", r"argmax"),
    ("sampling", r"sampl|topk|top_k"),
    ("embedding", r"embedding|gather"),
    ("rms_norm", r"rms_norm|norm"),
    ("attention", r"k_decode|decode_mma|attention"),
    ("gemv", r"gemv|qgemv|quant"),
    ("gemm", r"gemm|cutlass|sm90|xmma|Kernel"),
]


def kind_of(name):
    for k, rx in KINDS:
        if re.search(rx, name):
            return k
    return "other"


def kernels_of(prof):
    out = []
    for e in prof.events():
        dt = str(getattr(e, "device_type", ""))
        if "CUDA" not in dt:
            continue
        tr = e.time_range
        if tr.end <= tr.start and tr.start == 0:
            continue
        if re.search(r"Memcpy|Memset", e.name):
            continue
        out.append((float(tr.start), float(tr.end), e.name))
    out.sort()
    return out


def split_steps(ks):
    """Steps start at the embedding launch (embed_norm or embedding)."""
    starts = [i for i, (_, _, n) in enumerate(ks) if kind_of(n) in ("embed_norm", "embedding")]
    steps = []
    for a, b in zip(starts, starts[1:]):
        steps.append(ks[a:b])
    return steps, (ks[starts[-1]:] if starts else [])


def attribute(step):
    """kind -> [extends, gap before, count, sum of durations] over the main chain."""
    agg = {}
    side = []
    t_end = None
    for s, e, n in step:
        k = kind_of(n)
        if k == "prefetch_l2":
            side.append(e - s)
            continue
        a = agg.setdefault(k, [0.0, 0.0, 0, 0.0])
        if t_end is None:
            t_end = s
        gap = max(0.0, s - t_end)
        ext = max(0.0, e - max(t_end, s))
        a[0] += ext
        a[1] += gap
        a[2] += 1
        a[3] += e - s
        t_end = max(t_end, e)
    return agg, side


STAMP_PHASES = ("K/V copies issued", "PDL wait returned", "q/k/v read + RoPE + append", "K/V copies landed",
                "scores + softmax", "P V", "output / partials written")


def print_stamps(engine, layer, st):
    """The fused attention's per-CTA %globaltimer stamps of the last step (layer `layer`):
    each phase's end after the CTA's entry, and the CTAs' entries after the first's."""
    import numpy as np
    st = np.asarray(st, dtype=np.int64).reshape(-1, 8)
    st = st[st[:, 0] > 0]
    if not len(st):
        print(f"    {engine}: no fused attention stamps for layer {layer} (the fused attention did not run there)")
        return
    print(f"    fused attention stamps, layer {layer}, last step: {len(st)} CTAs; us after each CTA's entry "
          f"(min / median / max over CTAs); entries span {(st[:, 0].max() - st[:, 0].min()) / 1e3:.2f} us")
    for i, name in enumerate(STAMP_PHASES, start=1):
        ok = st[:, i] > 0
        if not ok.any():
            continue
        d = (st[ok, i] - st[ok, 0]) / 1e3
        print(f"      {i} {name:<28}{d.min():8.2f}{np.median(d):8.2f}{d.max():8.2f}")


@contextlib.contextmanager
def engine_applied(model, engine):
    """The model's options set for the gk engine `engine` (its attributes, fusion, rope_in_qkv, norm_in_tail, PDL
    and other areas' environment knobs such as w8a or dec<N>), restored afterwards; yields the engine's options."""
    from gpukit import _C
    _, opt = e2e.gk_engine(engine)
    attrs = opt.get("attrs", {})
    saved = {k: getattr(model._m, k) for k in attrs}
    for k, v in attrs.items():
        setattr(model._m, k, v)
    model._m.fusion = opt["fusion"]
    if opt["rope_in_qkv"] is not None:
        saved["rope_in_qkv"] = model._m.rope_in_qkv
        model._m.rope_in_qkv = opt["rope_in_qkv"]
    if opt["norm_in_tail"] is not None:
        saved["norm_in_tail"] = model._m.norm_in_tail
        model._m.norm_in_tail = opt["norm_in_tail"]
    _C.llm.set_pdl(opt["pdl"])
    env = e2e.engine_env(opt.get("env"))
    env.__enter__()
    try:
        yield opt
    finally:
        env.__exit__(None, None, None)
        for k, v in saved.items():
            setattr(model._m, k, v)
        model._m.fusion = 2
        _C.llm.set_pdl(None)


def for_each_case(cases, engines, prompt, fn):
    """fn(model, batch, engine, cfg) for every case of bench/e2e.py in `cases` (comma-separated; one random model
    each, layers shared) and every gk engine; an engine's exception is printed and the next one runs."""
    for e in engines:
        if not e2e.gk_engine(e):
            raise SystemExit(f"--engines: {e!r} is not a gk engine")
    for c in cases.split(","):
        key, quant, batch = e2e.parse_case(c)
        name, cfg = e2e.MODELS[key]
        model = gk.llm.random_model(cfg, device="cuda", dtype="bfloat16", quantize=quant or None, share_layers=True)
        print(f"== {name}{'-' + quant if quant else ''} b{batch} p{prompt}")
        for eng in engines:
            try:
                fn(model, batch, eng, cfg)
            except Exception as ex:  # noqa: BLE001 - report and go on
                print(f"  {eng}: {type(ex).__name__}: {str(ex)[:300]}")
        del model
        gk.synchronize()


def trace_case(model, batch, prompt, engine, steps, layer, nlayers):
    with engine_applied(model, engine) as opt:
        ks = _trace(model, batch, prompt, engine, steps, layer, opt)
    _report(ks, batch, engine, layer, nlayers)


def _trace(model, batch, prompt, engine, steps, layer, opt):
    """The CUPTI kernel records of steps + 2 replayed decode steps (and the fused attention's stamps of `layer`)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from gpukit import _C
    stamps = layer is not None and hasattr(model._m, "set_attention_stamps")
    if stamps:  # the fused attention of `layer` writes per-CTA %globaltimer stamps
        model._m.set_attention_stamps(layer)
    try:
        prompts = e2e.prompts_for(batch, prompt, model.config.vocab_size)
        g = _C.llm.Generation(model._m, prompts, max_new_tokens=steps + 24, ignore_eos=True,
                              cuda_graph=opt["graph"])
        for _ in range(8):  # prefill, capture, warm replays
            g.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps + 2):
                g.step()
            gk.synchronize()
        ks = kernels_of(prof)
        if stamps:
            print_stamps(engine, layer, gk.to_numpy(model._m.attention_stamps()))
    finally:
        if stamps:
            model._m.set_attention_stamps(-1)
    return ks


def _report(ks, batch, engine, layer, nlayers):
    full, _ = split_steps(ks)
    if len(full) < 2:
        print(f"  {engine}: {len(ks)} kernels traced, {len(full)} steps found (no CUPTI kernel records?)")
        if ks:
            print("   first names:", sorted({n[:60] for _, _, n in ks})[:12])
        return
    full = full[1:]  # the first traced step may include the profiler's start
    periods = [b[0][0] - a[0][0] for a, b in zip(full, full[1:])]
    period = statistics.median(periods) if periods else full[0][-1][1] - full[0][0][0]
    spans = [st[-1][1] - st[0][0] for st in full]
    print(f"  {engine}: {len(full)} steps traced, {sum(len(s) for s in full) / len(full):.0f} kernels per step; "
          f"step period {period:.1f} us ({batch * 1e6 / period:.1f} tok/s under the tracer), "
          f"first kernel start to last kernel end {statistics.median(spans):.1f} us")
    tot = {}
    sides = []
    for st in full:
        agg, side = attribute(st)
        sides += side
        for k, v in agg.items():
            t = tot.setdefault(k, [0.0, 0.0, 0, 0.0])
            for i in range(4):
                t[i] += v[i]
    n = len(full)
    print(f"    {'kind':<14}{'calls':>6}{'extends us':>12}{'gap us':>9}{'sum dur us':>12}{'dur/call':>10}")
    for k, v in sorted(tot.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
        print(f"    {k:<14}{v[2] / n:6.0f}{v[0] / n:12.1f}{v[1] / n:9.1f}{v[3] / n:12.1f}{v[3] / max(v[2], 1):10.2f}")
    all_ext = sum(v[0] + v[1] for v in tot.values()) / n
    print(f"    {'(sum)':<14}{'':6}{all_ext:12.1f}   (= extends + gaps per step)")
    if sides:
        print(f"    side branch: {len(sides) / n:.0f} prefetch kernels per step, {statistics.median(sides):.2f} us each")
    if layer is not None:
        st = full[len(full) // 2]
        # the kernels of layer `layer`: attention launches mark the layers
        att = [i for i, (_, _, nm) in enumerate(st) if kind_of(nm) in ("attention", "attn_rope")]
        if len(att) >= nlayers and 0 <= layer < nlayers:
            lo = att[layer - 1] + 1 if layer > 0 else 0
            hi = att[layer + 1] if layer + 1 < len(att) else len(st)
            t0 = st[lo][0]
            prev_end = None
            print(f"    kernels from after layer {layer - 1}'s attention to layer {layer + 1}'s (us from the first):")
            for s, e, nm in st[lo:hi]:
                gap = "" if prev_end is None else f"{s - prev_end:+8.2f}"
                print(f"      {s - t0:9.2f} {e - s:8.2f} {gap:>8}  {kind_of(nm):<14}{nm[:90]}")
                if kind_of(nm) != "prefetch_l2":
                    prev_end = e if prev_end is None else max(prev_end, e)
            tail = [x for x in st if st.index(x) > att[-1]]
            print("    after the last attention:")
            prev_end = None
            for s, e, nm in tail:
                gap = "" if prev_end is None else f"{s - prev_end:+8.2f}"
                print(f"      {e - s:8.2f} {gap:>8}  {kind_of(nm):<14}{nm[:90]}")
                prev_end = e if prev_end is None else max(prev_end, e)


def main():
    def extra(p):
        p.add_argument("--cases", default="8b-b1")
        p.add_argument("--engines", default="gk-graph")
        p.add_argument("--prompt", type=int, default=128)
        p.add_argument("--steps", type=int, default=6, help="traced decode steps per engine")
        p.add_argument("--layer", type=int, default=None, help="print the kernels of this layer in order")

    a = parse_args("Trace of the decode step's kernels", extra)
    sys.stdout.reconfigure(line_buffering=True)
    if not gk.cuda.is_available():
        print("CUDA is unavailable")
        return 0
    try:
        import torch  # noqa: F401
        from torch.profiler import profile  # noqa: F401
    except ImportError as e:
        print(f"torch.profiler is unavailable: {e}")
        return 0
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for_each_case(a.cases, engines, a.prompt, lambda model, batch, eng, cfg: trace_case(
        model, batch, a.prompt, eng, a.steps, a.layer, cfg["num_hidden_layers"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
