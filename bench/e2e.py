"""End-to-end LLM benchmark (the baseline the kernel issues improve).

Llama-3.2-1B and Llama-3.1-8B shapes with random bf16 weights, a 128-token prompt and
256 new tokens (greedy, EOS ignored), batch 1 and 32: prefill tokens/s, decode tokens/s,
time to first token and peak GPU memory for gpukit; Hugging Face transformers (eager,
and static cache + torch.compile) in the same run when torch is installed; the
weight-bandwidth roofline of decode beside them.

    python bench/e2e.py                       # on the GPU machine; writes bench/results/h200.json
    python bench/e2e.py --tiny --device cpu   # smoke test of the gpukit side anywhere
"""
from __future__ import annotations

import time

from common import gk, parse_args, print_table, record, write_results

MODELS = {
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "llama-3.1-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=False,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}
TINY = {"tiny": dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                     tie_word_embeddings=True)}
HBM_BYTES_PER_S = 4.8e12  # H200


def weight_bytes(cfg, itemsize=2):
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    D, Hq, Hkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    per_layer = H * (Hq * D) * 2 + H * (Hkv * D) * 2 + 3 * H * I + 2 * H
    emb = V * H * (1 if cfg.get("tie_word_embeddings") else 2)
    return (L * per_layer + emb + H) * itemsize


def bench_gpukit(model, batch, prompt_len, new_tokens, device):
    from gpukit import _C
    V = model.config.vocab_size
    prompts = [[(i * 7919 + b * 104729 + 13) % V for i in range(prompt_len)] for b in range(batch)]
    _C.llm.Generation(model._m, prompts, max_new_tokens=2, ignore_eos=True).step()  # warm-up
    if device != "cpu":
        gk.synchronize()
        gk.reset_peak_memory_stats(device)
    g = _C.llm.Generation(model._m, prompts, max_new_tokens=new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    g.step()  # prefill + first token (the token is copied to the host: synchronized)
    t1 = time.perf_counter()
    steps = 1
    while not g.done:
        g.step()
        steps += 1
    t2 = time.perf_counter()
    peak = gk.memory_stats(device)["peak"] if device != "cpu" else 0
    return dict(prefill=batch * prompt_len / (t1 - t0), decode=batch * (steps - 1) / (t2 - t1), ttft=t1 - t0, peak=peak)


def bench_hf(cfg, batch, prompt_len, new_tokens, compiled):
    import torch
    import transformers as tf
    c = dict(cfg)
    c.pop("model_type")
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**c)).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.randint(0, cfg["vocab_size"], (batch, prompt_len), device="cuda")
    kw = dict(do_sample=False, min_new_tokens=new_tokens, max_new_tokens=new_tokens, pad_token_id=0)
    if compiled:
        kw["cache_implementation"] = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        model.generate(ids, **kw)  # warm-up / compile
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, **dict(kw, max_new_tokens=1, min_new_tokens=1))
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        model.generate(ids, **kw)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    del model
    torch.cuda.empty_cache()
    ttft = t1 - t0
    return dict(prefill=batch * prompt_len / ttft, decode=batch * (new_tokens - 1) / max(t2 - t1 - ttft, 1e-9),
                ttft=ttft)


def main():
    def extra(p):
        p.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
        p.add_argument("--device", default="cuda")
        p.add_argument("--batches", default="1,32")
        p.add_argument("--prompt", type=int, default=128)
        p.add_argument("--new", type=int, default=256)

    a = parse_args("End-to-end LLM generation", extra)
    if a.device != "cpu" and not gk.cuda.is_available():
        print("CUDA is unavailable: use --device cpu --tiny for a smoke test")
        return 0
    models = TINY if a.tiny else MODELS
    records = []
    for name, cfg in models.items():
        t = time.perf_counter()
        model = gk.llm.random_model(cfg, device=a.device, dtype="bfloat16")
        print(f"{name}: random weights made in {time.perf_counter() - t:.1f} s")
        roof_steps = HBM_BYTES_PER_S / weight_bytes(cfg)
        for batch in [int(x) for x in a.batches.split(",")]:
            shape = f"{name} b{batch} p{a.prompt} n{a.new}"
            r = bench_gpukit(model, batch, a.prompt, a.new, a.device)
            hf = {}
            if not a.no_peer and a.device != "cpu":
                for label, compiled in (("hf-eager", False), ("hf-static-compile", True)):
                    try:
                        hf[label] = bench_hf(cfg, batch, a.prompt, a.new, compiled)
                    except Exception as e:  # noqa: BLE001 - report and continue
                        print(f"{label}: {type(e).__name__}: {e}")
            for metric, key in (("prefill tok/s", "prefill"), ("decode tok/s", "decode"), ("TTFT s", "ttft")):
                peer = hf.get("hf-static-compile") or hf.get("hf-eager")
                records.append(record("e2e " + metric, shape, "bfloat16", metric, r[key],
                                      peer="hf-static-compile" if "hf-static-compile" in hf else
                                      ("hf-eager" if hf else ""), peer_value=peer[key] if peer else None))
                if "hf-eager" in hf and "hf-static-compile" in hf:
                    records.append(record("e2e " + metric + " (hf eager)", shape, "bfloat16", metric, r[key],
                                          peer="hf-eager", peer_value=hf["hf-eager"][key]))
            records.append(record("e2e peak memory GiB", shape, "bfloat16", "GiB", r["peak"] / 2**30))
            records.append(record("e2e decode roofline tok/s", shape, "bfloat16", "decode tok/s (weights once per step)",
                                  roof_steps * batch))
        del model
    print_table(records)
    if not a.tiny:
        write_results(a.out, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
