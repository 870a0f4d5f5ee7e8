"""End-to-end LLM generation on the GPU: gpukit (CUDA graph and eager decode, bf16 and
quantized weights) beside Hugging Face transformers (eager, and static cache +
torch.compile; bench/e2e_hf.py) in the same run, with the weight-bandwidth roofline.

Llama-3.2-1B and Llama-3.1-8B shapes with random weights, a 128-token prompt and 256
new tokens by default (greedy, EOS ignored, exactly --new tokens per sequence for every
engine): prefill tokens/s (batch x prompt tokens / time to first token), decode tokens/s
(batch x (new - 1) tokens after the first / their time), time to first token, peak GPU
memory (gpukit's own allocator statistics; torch.cuda.max_memory_allocated for transformers).

    python bench/e2e.py                                   # every gpukit case (several minutes)
    python bench/e2e.py --cases 1b-b1,8b-b1 --new 64      # a selection, fewer decode tokens
    python bench/e2e.py --cases 8b-fp8-b1 --engines gk-graph --profile
    python bench/e2e.py --cases 1b-b1,8b-b1 --engines gk-graph,hf-eager,hf-compile   # the peers
    python bench/e2e.py --tiny --device cpu               # smoke test anywhere (transformers too, if installed)

Cases are <model>[-<quant>]-b<batch>: model 1b or 8b, quant fp8/int8/int4 (gpukit
only; the HF peers run bf16), e.g. 8b-int4-b1; a suffix h4/h8/hf8/hbf of the quant picks
the lm head's format (int4, int8, fp8, unquantized; default int8 for int4 models, else
the layers' format), e.g. 8b-int4h4-b1. Engines: gk-graph, gk-eager, hf-eager,
hf-compile (--compile-mode, default reduce-overhead; on failure 'default', and the
label says which ran). Asking for a transformers engine adds gk-graph, whose figure the
peer records carry. hf-eager runs with SDPA's cuDNN backend off by default: with torch
2.11 on the H200, SDPA picks cuDNN for the decode-shaped attention and cuDNN builds an
execution plan for every new K/V length, ~3 ms per layer per token (measured 2026-11-30:
Llama-3.2-1B b1 19 tok/s with it, 65 without). A probe before hf-eager prints that cost;
--hf-cudnn-off auto|yes|no also (or only) runs torch's default choice; the faster form
is the peer. Compilation (hf-compile's warm-up run) is outside the timed
run and its wall time is printed. --profile prints the GPU time of each op of one decode
step (CUDA events with the GPU queue pre-filled), summed over the layers, with the bytes
each projection reads and the bandwidth it reaches.

Random weights: gpukit draws layer 0 on the host and copies it to every layer
(share_layers; separate memory per layer, so the bytes read per step are real);
transformers initializes its model on the GPU. The roofline is the weight bytes (and,
for batch > 1, the KV cache at the mean context) read once per step at 4.8 TB/s (the
H200's HBM3e rate; measured copies reach about 4.2-4.4 TB/s).

More gpukit engines and the options a gk engine may carry after '+': bench/e2e_engines.py.
"""
from __future__ import annotations

import re
import sys
import time

from common import gk, parse_args, print_table, record, write_results
from e2e_engines import ENGINES, ENV_OPTIONS, FUSION, GK_ALIAS, GK_LABEL, engine_env, gk_engine, gk_label  # noqa: F401

MODELS = {
    "1b": ("llama-3.2-1b", dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                                tie_word_embeddings=True,
                                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "8b": ("llama-3.1-8b", dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                                tie_word_embeddings=False,
                                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "tiny": ("tiny", dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          max_position_embeddings=1024, tie_word_embeddings=True)),
}
DEFAULT_CASES = "1b-b1,1b-b32,8b-b1,8b-b32,8b-fp8-b1,8b-int4-b1"
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e
TARGETS = {("8b", "", 1): 240, ("1b", "", 1): 1000, ("8b", "fp8", 1): 400, ("8b", "int4", 1): 600,
           ("8b", "", 32): 4000}  # decode tok/s, issue 7


HEAD_SUFFIX = {"h4": "int4", "h8": "int8", "hf8": "fp8", "hbf": "none"}


def parse_case(c):
    """(model, quantize string, batch); a quant suffix h4 / h8 / hf8 / hbf sets the lm head's
    format (int4, int8, fp8, or unquantized), e.g. 8b-int4h4-b1 -> "int4:head=int4"."""
    m = re.fullmatch(r"(1b|8b|tiny)(?:-(fp8|int8|int4)(h4|h8|hf8|hbf)?)?-b(\d+)", c.strip())
    if not m:
        raise SystemExit(f"--cases: bad case {c!r} (expected e.g. 1b-b1, 8b-int4-b1, 8b-int4h4-b1, 8b-b32)")
    q = m.group(2) or ""
    if m.group(3):
        q += ":head=" + HEAD_SUFFIX[m.group(3)]
    return m.group(1), q, int(m.group(4))


def base_quant(q):
    return q.partition(":")[0]


def kv_bytes_per_token(cfg, itemsize=2):
    return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * itemsize


def prompts_for(batch, prompt_len, vocab):
    return [[(i * 7919 + b * 104729 + 13) % vocab for i in range(prompt_len)] for b in range(batch)]


def bench_gpukit(model, batch, prompt_len, new_tokens, device, graph, lookahead=True, fusion=2, pdl=None,
                 rope_in_qkv=None, norm_in_tail=None, attrs=None, env=None):
    from gpukit import _C
    saved = {k: getattr(model._m, k) for k in (attrs or {})}
    for k, v in (attrs or {}).items():
        setattr(model._m, k, v)
    model._m.fusion = fusion
    default_rope_in_qkv, default_tail = model._m.rope_in_qkv, model._m.norm_in_tail
    if rope_in_qkv is not None:
        model._m.rope_in_qkv = rope_in_qkv
    if norm_in_tail is not None:
        model._m.norm_in_tail = norm_in_tail
    _C.llm.set_pdl(pdl)
    try:
        with engine_env(env):
            r = _bench_gpukit(model, batch, prompt_len, new_tokens, device, graph, lookahead)
        if r["nodes"][0]:
            print(f"  (fusion {fusion}: decode graph of {r['nodes'][0]} nodes, {r['nodes'][1]} kernels, "
                  f"{r['nodes'][2]} copies, {r['nodes'][3]} memsets; {r['decode']:.1f} tok/s)")
        return r
    finally:
        for k, v in saved.items():
            setattr(model._m, k, v)
        model._m.fusion = 2
        model._m.rope_in_qkv = default_rope_in_qkv
        model._m.norm_in_tail = default_tail
        _C.llm.set_pdl(None)


# --sample TEMP,TOP_P: every gpukit Generation draws with these (seeded) instead of greedy,
# so the step ends in gk::sampling::decode_step rather than argmax.
SAMPLING = {}


def _bench_gpukit(model, batch, prompt_len, new_tokens, device, graph, lookahead):
    from gpukit import _C
    prompts = prompts_for(batch, prompt_len, model.config.vocab_size)
    w = _C.llm.Generation(model._m, prompts, max_new_tokens=3, ignore_eos=True, cuda_graph=graph,
                          lookahead=lookahead, **SAMPLING)
    while not w.done:  # warm-up: cuBLASLt plans, one capture
        w.step()
    del w
    if device != "cpu":
        gk.synchronize()
        gk.reset_peak_memory_stats(device)
    g = _C.llm.Generation(model._m, prompts, max_new_tokens=new_tokens, ignore_eos=True, cuda_graph=graph,
                          lookahead=lookahead, **SAMPLING)
    t0 = time.perf_counter()
    g.step()  # prefill + first token (copied to the host: synchronized)
    t1 = time.perf_counter()
    steps = 1
    t_first = None
    while not g.done:
        g.step()
        steps += 1
        if t_first is None:
            t_first = time.perf_counter()  # the first decode step (it captures the graph)
    t2 = time.perf_counter()
    peak = gk.memory_stats(device)["peak"] if device != "cpu" else 0
    assert all(len(x) == new_tokens for x in g.generated)
    steady = batch * (steps - 2) / (t2 - t_first) if steps > 2 else float("nan")
    return dict(prefill=batch * prompt_len / (t1 - t0), decode=batch * (steps - 1) / (t2 - t1), ttft=t1 - t0,
                peak=peak, captures=g.captures, steady=steady, first_ms=(t_first - t1) * 1e3 if t_first else 0.0,
                nodes=list(g.graph_nodes))


def print_profile(model, cfg, batch, context, quant):
    prof = model.profile_decode(batch=batch, context=context, reps=3)
    gaps = [ms for n, _, ms in prof if n == "(event)"]
    prof = [p for p in prof if p[0] != "(event)"]
    total = sum(ms for _, _, ms in prof)
    gap = sorted(gaps)[len(gaps) // 2] if gaps else 0.0
    H, I, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    Q, KV, V = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D, cfg["vocab_size"]
    L = cfg["num_hidden_layers"]
    head = quant.partition(":head=")[2] or {"int4": "int8"}.get(base_quant(quant), base_quant(quant))
    quant = base_quant(quant)
    per_elem = {"": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 5.0 / 128}[quant]
    head_elem = {"": 2.0, "none": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 5.0 / 128}[head]
    wbytes = {"qkv": (Q + 2 * KV) * H * per_elem * L, "o_proj": Q * H * per_elem * L,
              "gate_up": 2 * I * H * per_elem * L, "down": I * H * per_elem * L,
              "lm_head": V * H * head_elem,
              "attention": kv_bytes_per_token(cfg) * batch * context}
    agg, cnt = {}, {}
    for name, _, ms in prof:
        agg[name] = agg.get(name, 0.0) + ms
        cnt[name] = cnt.get(name, 0) + 1
    print(f"  profile of one eager decode step (b{batch}, context {context}): sum of ops {total * 1e3:.0f} us "
          f"over {len(prof)} ops; an empty event interval takes {gap * 1e3:.1f} us (included in each op)")
    print(f"  {'op':<11}{'us/step':>9}{'share':>8}{'calls':>6}{'us/call':>8}{'GB read':>9}{'TB/s':>7}")
    for name, ms in sorted(agg.items(), key=lambda kv: -kv[1]):
        b = wbytes.get(name)
        tbs = f"{b / (ms * 1e-3) / 1e12:7.2f}" if b and ms > 0 else "       "
        gb = f"{b / 1e9:9.3f}" if b else "         "
        print(f"  {name:<11}{ms * 1e3:9.1f}{100 * ms / total:7.1f}%{cnt[name]:6d}{ms * 1e3 / cnt[name]:8.1f}{gb}{tbs}")


def run_hf(a, key, cfg, batch, engines, hf, res):
    """The transformers engines of one case into res (label -> result); hf caches one model."""
    import e2e_hf
    t = time.perf_counter()
    if hf.get("key") != key:
        hf.clear()
        _free_torch()
        hf["model"], desc = e2e_hf.build_model(cfg, a.device)
        hf["key"] = key
        print(f"  transformers model made in {time.perf_counter() - t:.1f} s ({e2e_hf.versions()}; {desc})")
    prompts = prompts_for(batch, a.prompt, cfg["vocab_size"])
    for eng in engines:
        runs = [False]
        if eng == "hf-eager":
            probe = e2e_hf.sdpa_probe(cfg, batch, a.prompt, a.device)
            suspect = e2e_hf.cudnn_suspect(probe)
            if suspect:
                print("  SDPA's default choice pays a set-up per new K/V length here (cuDNN execution plans)")
            if a.hf_profile:
                e2e_hf.profile_generate(hf["model"], prompts, a.hf_profile, a.device, no_cudnn=a.hf_cudnn_off == "only")
            if a.hf_cudnn_off == "only":
                runs = [True]
            elif a.hf_cudnn_off == "yes" or (a.hf_cudnn_off == "auto" and suspect):
                runs.append(True)
        for no_cudnn in runs:
            t = time.perf_counter()
            try:
                r = e2e_hf.bench_hf(hf["model"], batch, prompts, a.new, a.device, eng, compile_mode=a.compile_mode,
                                    no_cudnn=no_cudnn)
            except Exception as e:  # noqa: BLE001 - report and continue with the other engines
                print(f"  {eng}: {type(e).__name__}: {str(e)[:400]}")
                continue
            if r is None:
                print(f"  {eng}: no compile mode worked")
                continue
            print(f"  {r['label']}: {time.perf_counter() - t:.1f} s in all; {r['note']}")
            res[r["label"]] = r


def _free_torch():
    """Drops what torch holds of a previous transformers model (compiled graphs and their CUDA
    graph pools keep its weights alive), so that the next model's peak memory is its own."""
    import sys
    if "torch" not in sys.modules:
        return
    import gc
    torch = sys.modules["torch"]
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def best_peer(res, prefix):
    cands = [(r["decode"], lab) for lab, r in res.items() if lab.startswith(prefix)]
    return max(cands)[1] if cands else ""


def main():
    def extra(p):
        p.add_argument("--tiny", action="store_true", help="a tiny model (smoke test; cases tiny-b1,tiny-b4)")
        p.add_argument("--device", default="cuda")
        p.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated (default {DEFAULT_CASES})")
        p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {ENGINES}")
        p.add_argument("--prompt", type=int, default=128)
        p.add_argument("--new", type=int, default=256, help="new tokens per sequence (default 256)")
        p.add_argument("--eager-new", type=int, default=0, help="new tokens for gk-eager (default --new)")
        p.add_argument("--sample", default="", metavar="TEMP,TOP_P",
                       help="gpukit engines sample (temperature, top-p, seed 1234) instead of greedy decoding; "
                            "records get a [sampled ...] suffix")
        p.add_argument("--profile", action="store_true", help="per-op GPU time of one decode step per case")
        p.add_argument("--no-gemv", action="store_true",
                       help="gpukit decode projections through matmul (cuBLASLt) instead of gk.gemv")
        p.add_argument("--gemv-min-elems", type=int, default=0,
                       help="decode weights smaller than this go through cuBLASLt instead of gk.gemv")
        p.add_argument("--no-lookahead", action="store_true",
                       help="gpukit waits for each token before launching the next step")
        p.add_argument("--compile-mode", default="reduce-overhead",
                       help="torch.compile mode of hf-compile (CompileConfig(mode=...)); on failure it falls back "
                            "to 'default' (no CUDA graphs), and the label says which ran")
        p.add_argument("--hf-profile", type=int, default=0, metavar="N",
                       help="torch.profiler over an eager generate() of N tokens: the ops that cost host and "
                            "device time (diagnosis of hf-eager)")
        p.add_argument("--hf-cudnn-off", choices=("only", "auto", "yes", "no"), default="only",
                       help="SDPA's cuDNN backend in hf-eager: only = off (default); yes = a run with torch's "
                            "default choice and one with cuDNN off; auto = both when the probe shows a per-shape "
                            "set-up cost; no = torch's default choice only")

    a = parse_args("End-to-end LLM generation", extra)
    sys.stdout.reconfigure(line_buffering=True)  # a run stopped by a time limit keeps what it printed
    if a.device != "cpu" and not gk.cuda.is_available():
        print("CUDA is unavailable: use --device cpu --tiny for a smoke test")
        return 0
    cases = [parse_case(c) for c in ("tiny-b1,tiny-b4" if a.tiny else a.cases).split(",") if c.strip()]
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"--engines: unknown {e!r} (choose from {ENGINES})")
    if a.no_peer or (a.device == "cpu" and not a.tiny):
        engines = [e for e in engines if not e.startswith("hf")]
    hf_engines = [e for e in engines if e.startswith("hf")]
    if hf_engines:
        try:
            import e2e_hf
            print(e2e_hf.versions())
        except ImportError as e:
            print(f"transformers engines skipped: {e}")
            engines = [e for e in engines if not e.startswith("hf")]
            hf_engines = []
    if hf_engines and "gk-graph" not in engines:
        engines.insert(0, "gk-graph")  # the records of the peers carry gpukit's figure of the same run
        print("gk-graph added: the records of the transformers figures carry gpukit's figure of the same run")
    print(f"prompt {a.prompt} tokens, {a.new} new tokens per sequence (gk-eager: {a.eager_new or a.new}); "
          f"greedy, EOS ignored; engines {engines}; gpukit lookahead {'off' if a.no_lookahead else 'on'}, "
          f"decode projections through {'matmul' if a.no_gemv else 'gemv'}")
    records = []
    written = 0
    loaded = {}
    hf = {}
    # variants get their own record names (the results file merges by name, shape, dtype)
    variant = ((" [matmul decode]" if a.no_gemv else "") + (" [no lookahead]" if a.no_lookahead else "")
               + (f" [gemv >= {a.gemv_min_elems}]" if a.gemv_min_elems else ""))
    if a.sample:
        try:
            temp, top_p = (float(v) for v in a.sample.split(","))
        except ValueError:
            raise SystemExit(f"--sample: expected TEMP,TOP_P (e.g. 0.8,0.9), got {a.sample!r}")
        if not temp > 0 or not 0 < top_p <= 1:
            raise SystemExit(f"--sample: need TEMP > 0 and 0 < TOP_P <= 1, got {a.sample!r}")
        SAMPLING.update(temperature=temp, top_p=top_p, seed=1234)
        variant += f" [sampled t{temp:g} p{top_p:g}]"
    for key, quant, batch in cases:
        name, cfg = MODELS[key]
        if (key, quant) not in loaded:
            loaded.clear()  # one model on the GPU at a time
            t = time.perf_counter()
            loaded[(key, quant)] = gk.llm.random_model(cfg, device=a.device, dtype="bfloat16", quantize=quant or None,
                                                       share_layers=True)
            print(f"{name}{'-' + quant if quant else ''}: random weights made in {time.perf_counter() - t:.1f} s")
        model = loaded[(key, quant)]
        model._m.use_gemv = not a.no_gemv
        model._m.gemv_min_elems = a.gemv_min_elems
        dtype = quant or "bfloat16"
        shape = f"{name} b{batch} p{a.prompt} n{a.new}"
        # bytes read per step: every weight but the embedding table (one row per token is
        # gathered), which the lm head reads when tied (and not quantized)
        emb_read = cfg.get("tie_word_embeddings") and (not quant or quant.endswith("head=none"))
        wbytes = model._m.nbytes - (0 if emb_read else cfg["vocab_size"] * cfg["hidden_size"] * 2)
        kv = kv_bytes_per_token(cfg) * batch * (a.prompt + a.new / 2)
        roof = batch * HBM_BYTES_PER_S / (wbytes + kv)
        res = {}
        for eng in engines:
            if gk_engine(eng):
                base, opt = gk_engine(eng)
                n = (a.eager_new or a.new) if base == "gk-eager" else a.new
                res[eng] = bench_gpukit(model, batch, a.prompt, n, a.device, lookahead=not a.no_lookahead, **opt)
        if a.profile:
            print_profile(model, cfg, batch, a.prompt + a.new // 2, quant)
        if hf_engines and not quant:
            run_hf(a, key, cfg, batch, hf_engines, hf, res)
        target = TARGETS.get((key, base_quant(quant), batch))
        print(f"== {shape} {dtype}: weights {wbytes / 1e9:.2f} GB, weight-bandwidth roofline {roof:.0f} tok/s"
              + (f", target {target} tok/s" if target else ""))
        for eng, r in res.items():
            extra_s = ""
            if "steady" in r:
                extra_s = (f"; after the first decode step ({r['first_ms']:.1f} ms"
                           f"{', graph capture included' if eng == 'gk-graph' else ''}): {r['steady']:.1f} tok/s")
            print(f"  {eng:<34} prefill {r['prefill']:9.0f} tok/s  decode {r['decode']:8.1f} tok/s "
                  f"({100 * r['decode'] / roof:5.1f}% of roofline)  TTFT {r['ttft'] * 1e3:8.1f} ms  "
                  f"peak {r['peak'] / 2**30:6.2f} GiB{extra_s}")
        peer_name = best_peer(res, "hf-compile") or best_peer(res, "hf-eager")
        peer = res.get(peer_name)
        for eng in res:
            if not gk_engine(eng):
                continue
            r = res[eng]
            label = gk_label(eng) + variant
            for metric, k in (("prefill tok/s", "prefill"), ("decode tok/s", "decode"), ("TTFT s", "ttft")):
                records.append(record(f"e2e {metric}{label}", shape, dtype, metric, r[k], peer=peer_name,
                                      peer_value=peer[k] if peer else None))
            records.append(record(f"e2e decode tok/s after the first step{label}", shape, dtype, "decode tok/s",
                                  r["steady"]))
            records.append(record(f"e2e peak memory GiB{label}", shape, dtype, "GiB", r["peak"] / 2**30,
                                  peer=peer_name, peer_value=peer["peak"] / 2**30 if peer else None))
        gkr = res.get("gk-graph")
        if gkr and not variant:
            # each transformers figure in its own record (not overwritten by a later gpukit-only run)
            for lab, r in res.items():
                if not lab.startswith("hf"):
                    continue
                for metric, k, scale in (("prefill tok/s", "prefill", 1), ("decode tok/s", "decode", 1),
                                         ("TTFT s", "ttft", 1), ("peak memory GiB", "peak", 2**-30)):
                    unit = "GiB" if k == "peak" else metric
                    records.append(record(f"e2e {metric} vs {lab}", shape, dtype, unit, gkr[k] * scale,
                                          peer=lab, peer_value=r[k] * scale))
            eager = best_peer(res, "hf-eager")
            if eager and best_peer(res, "hf-compile"):
                records.append(record("e2e decode tok/s (vs hf eager)", shape, dtype, "decode tok/s",
                                      gkr["decode"], peer=eager, peer_value=res[eager]["decode"]))
        records.append(record("e2e decode roofline tok/s", shape, dtype, "decode tok/s (bytes once per step)", roof))
        if not a.tiny and a.device != "cpu":
            write_results(a.out, records[written:])  # after every case: a later case that fails loses only itself
            written = len(records)
    loaded.clear()
    print_table(records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
