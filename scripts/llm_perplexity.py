#!/usr/bin/env python3
"""Perplexity of the default model (SmolLM2-135M-Instruct Q4_1 GGUF) on a short fixed
English text: gpukit, and, where torch + transformers are installed, transformers
running the same dequantized weights (Q/K rows un-permuted to the Hugging Face
layout). The issue asks for gpukit within 2% of transformers.

    python scripts/llm_perplexity.py [--device cuda] [--model PATH]
    python scripts/llm_perplexity.py --quantize fp8,int8,int4 [--dtype bfloat16]

--quantize: the perplexity of the same model loaded with its linear weights quantized
at load time (gk.llm.load(quantize=...)), and the delta against the unquantized load
(the reference comparisons are skipped).

    python scripts/llm_perplexity.py [--device cuda] [--model PATH] [--write-hf DIR]

The transformers figure comes from a Hugging Face llama checkpoint written from the
dequantized GGUF (config.json + model.safetensors, Q/K rows un-permuted; --write-hf
keeps it) and loaded with LlamaForCausalLM.from_pretrained; gpukit also runs that
checkpoint (gpukit_hf_ppl: the same weights through the safetensors path).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import gpukit as gk  # noqa: E402

TEXT = ("The history of the city begins with a small settlement on an island in the river. Over the centuries it "
        "grew into a centre of trade and learning, and its bridges, markets and churches drew merchants and "
        "scholars from across the continent. Today the old town is known for its narrow streets, its museums and "
        "its cafes, where visitors sit for hours watching the boats pass along the water. In the evening the lights "
        "of the cathedral are reflected in the river, and music can be heard from the open windows of the houses.")


def perplexity(logits, ids):
    lp = logits.astype(np.float64)
    lp = lp - lp.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    return float(np.exp(-np.mean(lp[np.arange(len(ids) - 1), ids[1:]])))


def hf_state_dict(model, path):
    """The GGUF weights dequantized to float32 with Hugging Face names and row order."""
    c = model.config
    D, H = c.head_dim, c.hidden_size
    g = gk.io.GGUF(path)

    def unpermute(w, heads):
        return w.reshape(heads, D // 2, 2, H).swapaxes(1, 2).reshape(heads * D, H)

    roles = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    sd = {}
    for t in g.tensors:
        name = t if isinstance(t, str) else t.name
        w = gk.to_numpy(g.dequantize(name))
        if name == "token_embd.weight":
            sd["model.embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            sd["model.norm.weight"] = w
        elif name == "output.weight":
            sd["lm_head.weight"] = w
        else:
            _, l, role, _ = name.split(".")
            if role == "attn_q":
                w = unpermute(w, c.num_heads)
            elif role == "attn_k":
                w = unpermute(w, c.num_kv_heads)
            sd[f"model.layers.{l}.{roles[role]}.weight"] = w
    return sd


def numpy_perplexity(model, sd, ids):
    """float64 NumPy transformer (tests/python/llm_ref.py) over the same weights."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
    from llm_ref import ref_logits
    c = model.config
    cfg = dict(hidden_size=c.hidden_size, head_dim=c.head_dim, num_attention_heads=c.num_heads,
               num_key_value_heads=c.num_kv_heads, num_hidden_layers=c.num_layers, rms_norm_eps=c.norm_eps,
               rope_theta=c.rope_theta)
    return perplexity(ref_logits(cfg, sd, ids), ids)


def write_hf_checkpoint(model, sd, out_dir):
    """A Hugging Face llama directory (config.json + model.safetensors, float32) of the
    dequantized GGUF weights in HF layout."""
    c = model.config
    os.makedirs(out_dir, exist_ok=True)
    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=c.vocab_size,
               hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
               num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
               max_position_embeddings=c.max_positions, rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps,
               tie_word_embeddings=c.tie_embeddings, hidden_act="silu", attention_bias=False,
               bos_token_id=c.bos_id, eos_token_id=list(c.eos_ids), torch_dtype="float32")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    gk.io.save_safetensors(os.path.join(out_dir, "model.safetensors"),
                           {k: gk.asarray(np.ascontiguousarray(v, np.float32)) for k, v in sd.items()})
    return out_dir


def hf_perplexity(ckpt, ids, device):
    """transformers (LlamaForCausalLM.from_pretrained of the written checkpoint)."""
    import torch
    import transformers as tf
    hf = tf.LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32).eval()
    hf = hf.to("cuda" if device.startswith("cuda") else "cpu")
    with torch.no_grad():
        logits = hf(torch.tensor([ids], device=hf.device)).logits[0].float().cpu().numpy()
    return perplexity(logits, ids)


def quantized_deltas(path, args):
    base = gk.llm.load(path, device=args.device, dtype=args.dtype)
    ids = base.tokenizer.encode(TEXT)
    ref = perplexity(gk.to_numpy(base.forward(ids)), ids)
    res = {"model": os.path.basename(path), "tokens": len(ids), "device": args.device, "dtype": args.dtype,
           "unquantized_ppl": ref}
    for q in [x.strip() for x in args.quantize.split(",") if x.strip()]:
        m = gk.llm.load(path, device=args.device, dtype=args.dtype, quantize=q)
        ppl = perplexity(gk.to_numpy(m.forward(ids)), ids)
        res[f"{q}_ppl"] = ppl
        res[f"{q}_relative_delta"] = (ppl - ref) / ref
        res[f"{q}_weight_bytes"] = m._m.nbytes
    res["unquantized_weight_bytes"] = base._m.nbytes
    print(json.dumps(res, indent=2))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quantize", default="", help="comma-separated formats: fp8, int8, int4")

    ap.add_argument("--write-hf", default=None, help="keep the HF llama checkpoint of the dequantized GGUF here")
    args = ap.parse_args()
    path = args.model or str(gk.io.default_model_path())
    if args.quantize:
        return quantized_deltas(path, args)
    model = gk.llm.load(path, device=args.device)
    ids = model.tokenizer.encode(TEXT)
    ours = perplexity(gk.to_numpy(model.forward(ids)), ids)
    res = {"model": os.path.basename(path), "tokens": len(ids), "device": args.device, "gpukit_ppl": ours}
    sd = hf_state_dict(model, path)
    res["numpy_float64_ppl"] = numpy_perplexity(model, sd, ids)
    import shutil
    import tempfile
    ckpt = write_hf_checkpoint(model, sd, args.write_hf or tempfile.mkdtemp(prefix="gk_ppl_hf_"))
    try:
        hf_dir = gk.llm.load(ckpt, device=args.device)
        res["gpukit_hf_ppl"] = perplexity(gk.to_numpy(hf_dir.forward(ids)), ids)
        del hf_dir
        try:
            import transformers
            theirs = hf_perplexity(ckpt, ids, args.device)
            res["transformers_ppl"] = theirs
            res["transformers_version"] = transformers.__version__
            res["relative_difference"] = abs(ours - theirs) / theirs
            res["within_2_percent"] = res["relative_difference"] < 0.02
        except ImportError as e:
            res["transformers_ppl"] = f"not measured ({e})"
    finally:
        if not args.write_hf:
            shutil.rmtree(ckpt, ignore_errors=True)
    print(json.dumps(res, indent=2))
    return 0 if res.get("within_2_percent", True) else 1


if __name__ == "__main__":
    sys.exit(main())
