#!/usr/bin/env python3
"""gpukit vs Hugging Face transformers on small random models of every supported
family (run where torch and transformers are installed).

For each case: write the config (transformers' config class) and weights drawn by
NumPy from a seed (tests/python/llm_ref.py make_weights, Hugging Face names; so
that CI can draw them again without torch), load them with transformers'
from_pretrained, save the model again with save_pretrained (safetensors), load
that directory with gk.llm, run a batch of
prompts of different lengths (prefill together, then the decode steps together,
teacher-forced with the transformers greedy tokens) and compare the logits with
transformers' logits of the same sequences (relative error = max |gk - hf| /
max |hf| over all rows of all sequences):
  - float32: gpukit float32 vs transformers float32 (limit 1e-4);
  - bfloat16: gpukit bfloat16 vs transformers bfloat16 (limit 2e-2; the error of
    gpukit bf16 against transformers float32 is printed beside it);
then greedy generation of 64 tokens must be identical at float32.

    python scripts/llm_parity.py [--device cpu|cuda] [--dtype float32|bfloat16|both]
                                 [--cases a,b] [--write-refs tests/data/llm_ref] [--markdown]

Cases: llama, llama3_scaled, smollm_tied, mistral_window, qwen2, qwen3, gpt2, and
mixtral where gpukit supports it (a mixture-of-experts case in bf16 is shown but not
judged when transformers' own bf16 run is off its fp32 run by more than the limit:
near-tied router logits then pick other experts).

--write-refs saves, per case, the config.json transformers wrote, the seed and
family of the weights (case.json), and the transformers float32 logits and greedy
tokens (reference.npz), for tests/python/test_llm_refs.py on CI (no torch).
Transformers runs on the CPU (float32 and bfloat16) whatever --device says: the
reference does not depend on the machine under test.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import gpukit as gk  # noqa: E402
from llm_ref import make_weights  # noqa: E402

BASE = dict(vocab_size=211, hidden_size=128, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
GPT2 = dict(vocab_size=211, n_embd=128, n_inner=176, n_layer=3, n_head=2, n_positions=256, layer_norm_epsilon=1e-5,
            activation_function="gelu_new", bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)

# name -> (weights family for llm_ref.make_weights, transformers config class, config)
CASES = {
    "llama": ("llama", "LlamaConfig", BASE),
    "llama3_scaled": ("llama", "LlamaConfig", dict(BASE, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "smollm_tied": ("llama", "LlamaConfig", dict(BASE, tie_word_embeddings=True, rope_theta=100000.0)),
    "mistral_window": ("llama", "MistralConfig", dict(BASE, sliding_window=16)),
    "qwen2": ("qwen2", "Qwen2Config", BASE),
    "qwen3": ("qwen3", "Qwen3Config", BASE),
    "gpt2": ("gpt2", "GPT2Config", GPT2),
    # runs where gpukit supports mixtral (the mixture-of-experts engine path)
    "mixtral": ("mixtral", "MixtralConfig", dict(BASE, num_local_experts=4, num_experts_per_tok=2,
                                                 sliding_window=None)),
}
PROMPT_LENGTHS = (17, 5, 40)


def prompts_for(vocab):
    rng = np.random.default_rng(0)
    return [rng.integers(3, vocab, n).tolist() for n in PROMPT_LENGTHS]


def weights_for(name, seed):
    fam, _, cfg = CASES[name]
    if fam == "mixtral":  # llm_ref.make_moe_weights comes with the mixture-of-experts engine path
        from llm_ref import make_moe_weights
        return make_moe_weights(dict(cfg), seed=seed)
    return make_weights(dict(cfg), fam, seed=seed)


def hf_model(name, seed, src_dir):
    """The transformers model (float32, CPU) of a case: its config and the NumPy weights
    (Hugging Face checkpoint names) written to src_dir, loaded with from_pretrained (which
    also maps older checkpoint layouts to the current modules, e.g. Mixtral experts)."""
    import transformers as tf
    from safetensors.numpy import save_file
    fam, cls, cfg = CASES[name]
    getattr(tf, cls)(**cfg).save_pretrained(src_dir)
    w = weights_for(name, seed)
    save_file({k: np.ascontiguousarray(v) for k, v in w.items()}, os.path.join(src_dir, "model.safetensors"),
              metadata={"format": "pt"})
    model, info = tf.AutoModelForCausalLM.from_pretrained(src_dir, attn_implementation="eager",
                                                          output_loading_info=True)
    model = model.float().eval()
    tied = cfg.get("tie_word_embeddings")
    missing = [k for k in info.get("missing_keys", []) if not (tied and k == "lm_head.weight")]
    bad = missing + list(info.get("unexpected_keys", [])) + list(info.get("mismatched_keys", []))
    if bad:
        raise RuntimeError(f"{name}: the weights do not fit transformers' model: {bad}")
    emb = model.get_input_embeddings().weight.detach().double().numpy()
    want = w.get("model.embed_tokens.weight", w.get("transformer.wte.weight"))
    assert np.array_equal(emb, want.astype(np.float64)), f"{name}: embeddings not loaded"
    if tied:
        assert np.array_equal(model.get_output_embeddings().weight.detach().double().numpy(), emb)
    return model


def hf_logits(model, ids):
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def hf_greedy(model, ids, n):
    """transformers' greedy generation (KV cache), n tokens, EOS ignored."""
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None, top_k=None, top_p=None, temperature=None)
    return out[0, len(ids):].tolist()


def gk_batch_logits(m, prompts, conts):
    """gk logits [len(prompt) + len(cont)] per sequence: batch prefill, then batched decode."""
    impl = m._m
    cache = impl.make_cache([len(p) + len(c) for p, c in zip(prompts, conts)])
    seqs = [cache.add_sequence() for _ in prompts]
    all_ = gk.to_numpy(impl.step(cache, seqs, prompts, all_logits=True)).astype(np.float64)
    rows, at = [], 0
    for p in prompts:
        rows.append([all_[at:at + len(p)]])
        at += len(p)
    for j in range(len(conts[0])):
        got = gk.to_numpy(impl.step(cache, seqs, [[c[j]] for c in conts])).astype(np.float64)
        for b in range(len(prompts)):
            rows[b].append(got[b:b + 1])
    return [np.concatenate(r) for r in rows]


def rel(got, ref):
    return max(float(np.max(np.abs(g - r)) / np.max(np.abs(r))) for g, r in zip(got, ref))


def run_case(name, seed, args, prompts):
    import torch
    res = {"case": name, "family": CASES[name][0]}
    tmp = tempfile.mkdtemp(prefix=f"gk_parity_{name}_")
    try:
        model = hf_model(name, seed, os.path.join(tmp, "src"))
        tmp = os.path.join(tmp, "saved")  # what transformers writes is what gpukit reads
        model.save_pretrained(tmp, safe_serialization=True)
        conts = [hf_greedy(model, p, args.decode_steps) for p in prompts]
        seqs = [p + c for p, c in zip(prompts, conts)]
        ref32 = [hf_logits(model, s) for s in seqs]
        if args.dtype in ("float32", "both"):
            m = gk.llm.load(tmp, device=args.device, dtype="float32")
            assert m.config.architecture == model.config.model_type, m.config
            res["float32"] = rel(gk_batch_logits(m, prompts, conts), ref32)
            greedy_hf = [hf_greedy(model, p, args.greedy_tokens) for p in prompts]
            greedy_gk = [m.generate(p, max_new_tokens=args.greedy_tokens, ignore_eos=True).ids for p in prompts]
            res["greedy"] = greedy_gk == greedy_hf
            res["greedy_ids"] = greedy_hf
            if not res["greedy"]:
                first = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None)
                         for x, y in zip(greedy_gk, greedy_hf)]
                print(f"  {name}: greedy differs at token {first} (per prompt)", file=sys.stderr)
        if args.dtype in ("bfloat16", "both"):
            m = gk.llm.load(tmp, device=args.device, dtype="bfloat16")
            got = gk_batch_logits(m, prompts, conts)
            ref16 = [hf_logits(model.to(torch.bfloat16), s) for s in seqs]
            model.float()
            res["bfloat16"] = rel(got, ref16)
            res["bfloat16_vs_fp32"] = rel(got, ref32)
            res["hf_bfloat16_vs_fp32"] = rel(ref16, ref32)
        if args.write_refs:
            d = os.path.join(args.write_refs, name)
            os.makedirs(d, exist_ok=True)
            shutil.copy(os.path.join(tmp, "config.json"), os.path.join(d, "config.json"))
            with open(os.path.join(d, "case.json"), "w") as f:
                json.dump({"family": CASES[name][0], "seed": seed, "transformers": _versions()["transformers"],
                           "decode_steps": args.decode_steps}, f, indent=1)
            greedy = res.get("greedy_ids") or [hf_greedy(model, p, args.greedy_tokens) for p in prompts]
            w = weights_for(name, seed)
            np.savez_compressed(
                os.path.join(d, "reference.npz"),
                **{f"prompt{b}": np.array(s, np.int32) for b, s in enumerate(seqs)},
                **{f"logits{b}": r.astype(np.float32) for b, r in enumerate(ref32)},
                **{f"greedy{b}": np.array(g, np.int32) for b, g in enumerate(greedy)},
                prompt_lengths=np.array([len(p) for p in prompts], np.int32),
                weights_checksum=np.array([float(np.abs(w[k].astype(np.float64)).sum()) for k in sorted(w)]))
    finally:
        shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
    return res


def _versions():
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="both", choices=["float32", "bfloat16", "both"])
    ap.add_argument("--cases", default=None, help="comma-separated subset of " + ",".join(CASES) +
                    " (default: all that gpukit supports)")
    ap.add_argument("--write-refs", default=None)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = ap.parse_args()
    try:
        import torch
        torch.manual_seed(0)
        torch.set_num_threads(1)  # tiny models: threads only add overhead
    except ImportError:
        print("scripts/llm_parity.py needs torch and transformers (not installed here)")
        return 2
    supported = set(gk.llm.supported_architectures())
    if args.cases:
        names = [n.strip() for n in args.cases.split(",") if n.strip()]
    else:
        names = [n for n in CASES if CASES[n][0] != "mixtral" or "mixtral" in supported]
        if "mixtral" not in names:
            print("mixtral: skipped (gpukit has no mixture-of-experts support in this build)")
    for n in names:
        if n not in CASES:
            ap.error(f"unknown case {n!r} (known: {', '.join(CASES)})")
    prompts = prompts_for(BASE["vocab_size"])
    t0 = time.time()
    rows = [run_case(n, list(CASES).index(n), args, prompts) for n in names]
    ok = True
    notes = []
    for r in rows:
        # Mixture of experts in bf16: when transformers' own bf16 run is further than the limit
        # from its fp32 run, bf16 rounding flips top-k expert choices (near-tied router logits)
        # and the bf16 comparison measures those flips, not gpukit: shown, not judged.
        judge16 = not (r["family"] == "mixtral" and r.get("hf_bfloat16_vs_fp32", 0) >= 2e-2)
        if not judge16:
            r["case"] += " *"
            notes.append(f"* {r['case'][:-2]}: bf16 not judged: transformers bf16 vs its own fp32 is "
                         f"{r['hf_bfloat16_vs_fp32']:.2e} (expert choices flip under bf16 rounding)")
        ok &= r.get("float32", 0) < 1e-4 and (not judge16 or r.get("bfloat16", 0) < 2e-2) and r.get("greedy", True)
    v = _versions()
    head = (f"gk device {args.device}; transformers {v['transformers']} / torch {v['torch']} on the CPU; "
            f"{len(prompts)} prompts (lengths {list(PROMPT_LENGTHS)}) prefilled as one batch, then "
            f"{args.decode_steps} batched decode steps; greedy {args.greedy_tokens} tokens; {time.time() - t0:.0f} s")
    print(head)

    def f(x):
        return "-" if x is None else f"{x:.2e}"
    cols = ["case", "family", "fp32 rel err", "bf16 rel err (vs HF bf16)", "bf16 vs HF fp32", "HF bf16 vs HF fp32",
            f"greedy {args.greedy_tokens} identical"]
    table = [[r["case"], r["family"], f(r.get("float32")), f(r.get("bfloat16")), f(r.get("bfloat16_vs_fp32")),
              f(r.get("hf_bfloat16_vs_fp32")), str(r.get("greedy", "-"))] for r in rows]
    if args.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for t in table:
            print("| " + " | ".join(t) + " |")
    else:
        w = [max(len(c), *(len(t[i]) for t in table)) + 2 for i, c in enumerate(cols)]
        print("".join(c.ljust(w[i]) for i, c in enumerate(cols)))
        for t in table:
            print("".join(x.ljust(w[i]) for i, x in enumerate(t)))
    for n in notes:
        print(n)
    print("PASS" if ok else "FAIL (limits: fp32 < 1e-4, bf16 < 2e-2, greedy identical)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
