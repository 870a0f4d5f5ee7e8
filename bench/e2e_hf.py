"""Hugging Face transformers peers of bench/e2e.py (needs torch and transformers).

Two engines, one model instance per model shape (random bf16 weights, made on the device):
- hf-eager: model.generate() as it comes (dynamic cache, no compilation, SDPA attention),
  by default with SDPA's cuDNN backend switched off (bench_hf(no_cudnn=True)): torch 2.11
  sends the decode-shaped attention to cuDNN, which builds an execution plan for every new
  K/V length (sdpa_probe measures it: ~30 ms a call on the H200 against 0.1 ms without).
- hf-compile: model.generate() with a static cache and transformers' own compilation of the
  decode step (generate(compile_config=CompileConfig(mode=...)) compiles model.__call__ for the
  decode steps; the prefill runs eager). One StaticCache object is made per batch size, passed
  as past_key_values and reset before every run, so the timed run replays the graphs (and CUDA
  graphs, mode reduce-overhead) that the warm-up run compiled and recorded (H200, 2026-11-30:
  the warm-up run, compilation included, took 16 s for Llama-3.2-1B b1, 13 s for b32 and
  26 s for Llama-3.1-8B b1).

Timing, the same definitions as gpukit's: a StoppingCriteria (generate() calls it once per
new token, after the token is appended) records a CUDA event on the stream per token. TTFT
= an event recorded just before generate() to the first token's event (prefill + first
token); decode tok/s = batch x (new - 1) / (first token's event to the last token's event);
prefill tok/s = batch x prompt / TTFT. Exactly `new` tokens are generated (min_new_tokens =
max_new_tokens, eos_token_id None), checked on the output. Peak memory:
torch.cuda.max_memory_allocated() over the timed run (weights included).
"""
from __future__ import annotations

import copy
import statistics
import time

COMPILE_FALLBACK = "default"  # inductor without CUDA graphs, used when the asked-for mode fails


def versions():
    import torch
    import transformers
    return f"transformers {transformers.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda})"


def hf_config(cfg):
    """transformers LlamaConfig from e2e.py's MODELS entry (rope scaling as transformers 5's rope_parameters)."""
    import transformers as tf
    c = copy.deepcopy(dict(cfg))
    c.pop("model_type")
    rope = c.pop("rope_scaling", None) or {"rope_type": "default"}
    rope = dict(rope, rope_theta=c.pop("rope_theta", 10000.0))
    return tf.LlamaConfig(**c, rope_parameters=rope, bos_token_id=None, eos_token_id=None, pad_token_id=0)


def build_model(cfg, device):
    """A LlamaForCausalLM with random bf16 weights made on `device` (SDPA attention)."""
    import torch
    import transformers as tf
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = tf.LlamaForCausalLM(hf_config(cfg)).eval()
    finally:
        torch.set_default_dtype(old)
    gc = model.generation_config
    gc.eos_token_id, gc.bos_token_id, gc.pad_token_id = None, None, 0
    gc.do_sample, gc.temperature, gc.top_k, gc.top_p = False, None, None, None
    dtypes = {str(p.dtype) for p in model.parameters()}
    attn = getattr(model.config, "_attn_implementation", "?")
    return model, f"dtype {','.join(sorted(dtypes))}, attention {attn}"


class _Clock:
    """Timestamps on the device stream: CUDA events on cuda, host time (after a synchronize) elsewhere."""

    def __init__(self, device):
        import torch
        self.torch = torch
        self.cuda = device != "cpu"
        self.marks = []

    def mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self):
        """Seconds from the first mark to each later one."""
        if self.cuda:
            self.torch.cuda.synchronize()
            return [self.marks[0].elapsed_time(e) * 1e-3 for e in self.marks]
        return [t - self.marks[0] for t in self.marks]


def _token_clock(clock, rows, device):
    import torch
    from transformers import StoppingCriteria
    never = torch.zeros(rows, dtype=torch.bool, device=device)

    class TokenClock(StoppingCriteria):  # marks the stream after every new token; never stops
        def __call__(self, input_ids, scores, **kwargs):
            clock.mark()
            return never

    return TokenClock()


def generate_timed(model, ids, new, device, extra):
    """One timed generate() of exactly `new` tokens per row. Returns (ttft s, decode s, step seconds, wall s)."""
    import torch
    from transformers import StoppingCriteriaList
    clock = _Clock(device)
    tc = _token_clock(clock, ids.shape[0], ids.device)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new, min_new_tokens=new,
              eos_token_id=None, pad_token_id=0, stopping_criteria=StoppingCriteriaList([tc]))
    kw.update(extra)
    with torch.no_grad():
        if device != "cpu":
            torch.cuda.synchronize()
        w0 = time.perf_counter()
        clock.mark()
        out = model.generate(ids, **kw)
        if device != "cpu":
            torch.cuda.synchronize()
        wall = time.perf_counter() - w0
    got = out.shape[1] - ids.shape[1]
    if got != new or len(clock.marks) != new + 1:
        raise RuntimeError(f"transformers generated {got} tokens per row ({len(clock.marks) - 1} steps), not {new}")
    s = clock.seconds()
    steps = [b - a for a, b in zip(s[1:], s[2:])]
    return s[1], s[-1] - s[1], steps, wall


def step_summary(steps):
    if not steps:
        return "no decode steps"
    ms = sorted(x * 1e3 for x in steps)
    q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]  # noqa: E731
    head = statistics.mean(x * 1e3 for x in steps[:5])
    tail = statistics.mean(x * 1e3 for x in steps[-5:])
    return (f"decode step ms: median {statistics.median(ms):.2f}, p10 {q(0.1):.2f}, p90 {q(0.9):.2f}, "
            f"max {ms[-1]:.2f}; first 5 {head:.2f}, last 5 {tail:.2f}")


def _dynamo_counts():
    try:
        from torch._dynamo.utils import counters
        return (dict(counters["stats"]).get("unique_graphs", 0), dict(counters["inductor"]).get("cudagraph_skips", 0))
    except Exception:  # noqa: BLE001 - a diagnostic only
        return (0, 0)


def bench_hf(model, batch, prompt_ids, new, device, engine, compile_mode="reduce-overhead", no_cudnn=False,
             log=print):
    """Runs one engine on `model`; returns e2e.py's result dict plus a label and notes (None when
    every compile mode failed). no_cudnn: SDPA's cuDNN backend switched off for this run."""
    import torch
    was = torch.backends.cuda.cudnn_sdp_enabled()
    if no_cudnn:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        res = _bench_hf(model, batch, prompt_ids, new, device, engine, compile_mode, log)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
    if res and no_cudnn:
        res["label"] += " [cuDNN SDPA off]"
    return res


def _bench_hf(model, batch, prompt_ids, new, device, engine, compile_mode, log):
    import torch
    from transformers import CompileConfig, StaticCache
    ids = torch.tensor(prompt_ids, device=device)
    cuda = device != "cpu"
    if engine == "hf-eager":
        generate_timed(model, ids, 8, device, {})  # warm-up: cuBLAS handles and plans, the prefill shape
        label, extra, modes = "hf-eager", {}, [None]
    else:
        cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + new)
        modes = [compile_mode] + ([COMPILE_FALLBACK] if compile_mode != COMPILE_FALLBACK else [])
        extra = None
    res = None
    for mode in modes:
        if engine != "hf-eager":
            cc = CompileConfig(mode=mode, dynamic=False)  # one graph per batch size, as in a fresh process
            if not cuda:
                cc._compile_all_devices = True  # transformers compiles on CUDA only unless told (smoke tests)
            label = f"hf-compile {mode}"
            extra = dict(past_key_values=cache, compile_config=cc)
            try:
                c0 = _dynamo_counts()
                t = time.perf_counter()
                cache.reset()
                generate_timed(model, ids, new, device, extra)  # compiles (and records CUDA graphs)
                c1 = _dynamo_counts()
                log(f"  {label}: warm-up run (compilation included) {time.perf_counter() - t:.1f} s; "
                    f"graphs compiled {c1[0] - c0[0]}, CUDA graph skips {c1[1] - c0[1]}")
            except Exception as e:  # noqa: BLE001 - report, then the fallback mode
                log(f"  {label}: failed in the warm-up: {type(e).__name__}: {str(e)[:400]}")
                torch._dynamo.reset()
                continue
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        c0 = _dynamo_counts()
        try:
            if engine != "hf-eager":
                cache.reset()
            ttft, dec, steps, wall = generate_timed(model, ids, new, device, extra)
        except Exception as e:  # noqa: BLE001
            log(f"  {label}: failed in the timed run: {type(e).__name__}: {str(e)[:400]}")
            if engine != "hf-eager":
                torch._dynamo.reset()
                continue
            raise
        c1 = _dynamo_counts()
        peak = torch.cuda.max_memory_allocated() if cuda else 0
        note = f"{step_summary(steps)}; generate() wall {wall * 1e3:.1f} ms vs events {(ttft + dec) * 1e3:.1f} ms"
        if engine != "hf-eager":
            note += f"; graphs compiled during the timed run: {c1[0] - c0[0]}"
        res = dict(prefill=batch * ids.shape[1] / ttft, decode=batch * (new - 1) / dec if dec > 0 else float("nan"),
                   ttft=ttft, peak=peak, label=label, note=note)
        break
    return res


def sdpa_probe(cfg, batch, start_len, device, n=4, log=print):
    """Times single decode-shaped SDPA calls (q length 1, a K/V length not seen before each call),
    as transformers' eager path makes them, with torch's default backend choice and without cuDNN:
    per-shape set-up cost (e.g. cuDNN building an execution plan for every new length) shows
    as a gap between the two."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if device == "cpu":
        return {}
    hq, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    dt = torch.bfloat16
    q = torch.randn(batch, 1, hq, d, device=device, dtype=dt).transpose(1, 2)  # as the model's view
    kmax = start_len + 4 * n + 8
    k = torch.randn(batch, hkv, kmax, d, device=device, dtype=dt)
    v = torch.randn_like(k)
    no_cudnn = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    out, med = [], {}
    for name, backends in (("default", None), ("no cuDNN", no_cudnn)):
        for form in ("gqa", "mask"):
            times = []
            for i in range(n):
                t_len = start_len + 1 + i + (0 if name == "default" else 2 * n)  # fresh lengths each
                kk, vv = k[:, :, :t_len].contiguous(), v[:, :, :t_len].contiguous()
                kw = {}
                if form == "gqa":
                    kw["enable_gqa"] = True
                else:
                    kk = kk.repeat_interleave(hq // hkv, dim=1)
                    vv = vv.repeat_interleave(hq // hkv, dim=1)
                    kw["attn_mask"] = torch.ones(batch, 1, 1, t_len, dtype=torch.bool, device=device)
                torch.cuda.synchronize()
                t = time.perf_counter()
                try:
                    if backends is None:
                        F.scaled_dot_product_attention(q, kk, vv, **kw)
                    else:
                        with sdpa_kernel(backends):
                            F.scaled_dot_product_attention(q, kk, vv, **kw)
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001
                    times = [f"error {type(e).__name__}"]
                    break
                times.append((time.perf_counter() - t) * 1e3)
            fmt = ", ".join(x if isinstance(x, str) else f"{x:.2f}" for x in times)
            if times and not isinstance(times[0], str):
                med[(name, form)] = statistics.median(times)
            out.append(f"{name}/{form}: {fmt}")
    cudnn = torch.backends.cuda.cudnn_sdp_enabled()
    log(f"  SDPA decode probe b{batch} (ms per call, each at a new K/V length; cudnn_sdp_enabled={cudnn}): "
        + "; ".join(out))
    return med


def cudnn_suspect(med):
    """True when the default SDPA choice costs much more per new length than the same call without cuDNN."""
    for form in ("gqa", "mask"):
        a, b = med.get(("default", form)), med.get(("no cuDNN", form))
        if a is not None and b is not None and a > 3 * b and a - b > 0.3:
            return True
    return False


def profile_generate(model, prompt_ids, new, device, no_cudnn=False, top=10, log=print):
    """torch.profiler over one eager generate() of `new` tokens (the prefill is one forward among
    them): the ops with the most host time and the most device time, per generated token."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    ids = torch.tensor(prompt_ids, device=device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    was = torch.backends.cuda.cudnn_sdp_enabled()
    if no_cudnn:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        with profile(activities=acts) as prof:
            generate_timed(model, ids, new, device, {})
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
    ka = prof.key_averages()
    dev = lambda e: getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))  # noqa: E731
    tables = (("host", lambda e: e.self_cpu_time_total),) + ((("device", dev),) if device != "cpu" else ())
    for what, key in tables:
        rows = sorted(ka, key=key, reverse=True)[:top]
        total = sum(key(e) for e in ka)
        log(f"  profile of hf-eager{' [cuDNN SDPA off]' if no_cudnn else ''}, {new} tokens: self {what} time "
            f"{total / 1e3 / new:.2f} ms per token; top ops (ms per token, calls per token):")
        for e in rows:
            log(f"    {e.key[:60]:<60} {key(e) / 1e3 / new:8.3f} {e.count / new:7.1f}")
