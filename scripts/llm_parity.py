#!/usr/bin/env python3
"""gpukit vs Hugging Face transformers on small random models of every supported
family (run where torch and transformers are installed, e.g. the GPU machine).

For each family: build a random model with transformers, save it as safetensors,
load it with gk.llm, run a batch of prompts of different lengths (prefill together,
then 32 decode steps together, teacher-forced with the transformers greedy tokens)
and compare the logits with transformers' logits of the same sequences (relative
error = max |gk - hf| / max |hf|) at float32 and bfloat16; then greedy generation
of 64 tokens must be identical at float32.

    python scripts/llm_parity.py [--device cuda] [--write-refs tests/data/llm_ref]

--write-refs saves each tiny model (safetensors + config.json) and the transformers
float32 logits (reference.npz) so that CI without torch can compare
(tests/python/test_llm_refs.py).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import gpukit as gk  # noqa: E402

BASE = dict(vocab_size=211, hidden_size=128, intermediate_size=176, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
            bos_token_id=1, eos_token_id=2)


def families():
    import transformers as tf
    out = [
        ("llama", tf.LlamaConfig, dict(tie_word_embeddings=False)),
        ("llama3_scaled", tf.LlamaConfig, dict(rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})),
        ("smollm_tied", tf.LlamaConfig, dict(tie_word_embeddings=True, rope_theta=100000.0)),
        ("mistral_window", tf.MistralConfig, dict(sliding_window=16)),
        ("qwen2", tf.Qwen2Config, dict(tie_word_embeddings=False)),
    ]
    if hasattr(tf, "Qwen3Config"):
        out.append(("qwen3", tf.Qwen3Config, dict(tie_word_embeddings=False)))
    return out


def hf_model(cfg_cls, extra, seed):
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    cfg = cfg_cls(**{**BASE, **extra})
    model = tf.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
    with torch.no_grad():  # larger-than-default init so that errors show
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):
                p.normal_(0.0, 0.1)
            elif p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
    return model


def hf_logits(model, ids):
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def hf_greedy(model, ids, n):
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             pad_token_id=0, eos_token_id=None)
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


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if gk.cuda.is_available() else "cpu")
    ap.add_argument("--write-refs", default=None)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--greedy-tokens", type=int, default=64)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, BASE["vocab_size"], n).tolist() for n in (17, 5, 40)]
    rows, ok = [], True
    for i, (name, cls, extra) in enumerate(families()):
        model = hf_model(cls, extra, seed=i)
        tmp = tempfile.mkdtemp(prefix=f"gk_parity_{name}_")
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            conts = [hf_greedy(model, p, args.decode_steps) for p in prompts]
            ref = [hf_logits(model, p + c) for p, c in zip(prompts, conts)]
            res = {"family": name}
            for dtype, limit in (("float32", 1e-4), ("bfloat16", 2e-2)):
                m = gk.llm.load(tmp, device=args.device, dtype=dtype)
                got = gk_batch_logits(m, prompts, conts)
                err = max(rel(g, r) for g, r in zip(got, ref))
                res[dtype] = err
                ok &= err < limit
            m = gk.llm.load(tmp, device=args.device, dtype="float32")
            same = all(m.generate(p, max_new_tokens=args.greedy_tokens, ignore_eos=True).ids
                       == hf_greedy(model, p, args.greedy_tokens) for p in prompts)
            res["greedy_identical"] = same
            ok &= same
            rows.append(res)
            if args.write_refs:
                d = os.path.join(args.write_refs, name)
                os.makedirs(d, exist_ok=True)
                for f in ("config.json", "model.safetensors"):
                    shutil.copy(os.path.join(tmp, f), os.path.join(d, f))
                np.savez_compressed(os.path.join(d, "reference.npz"),
                                    **{f"prompt{b}": np.array(p + c, np.int32) for b, (p, c) in
                                       enumerate(zip(prompts, conts))},
                                    **{f"logits{b}": r.astype(np.float32) for b, r in enumerate(ref)},
                                    prompt_lengths=np.array([len(p) for p in prompts], np.int32))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"device {args.device}; {len(prompts)} prompts (lengths {[len(p) for p in prompts]}), "
          f"{args.decode_steps} decode steps, greedy {args.greedy_tokens} tokens")
    print(f"{'family':<16}{'fp32 rel err':>14}{'bf16 rel err':>14}{'greedy':>9}")
    for r in rows:
        print(f"{r['family']:<16}{r['float32']:>14.2e}{r['bfloat16']:>14.2e}{str(r['greedy_identical']):>9}")
    print("PASS" if ok else "FAIL (limits: fp32 < 1e-4, bf16 < 2e-2, greedy identical)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
