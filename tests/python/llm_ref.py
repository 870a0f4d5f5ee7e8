"""Tiny random Llama/Qwen2/Qwen3/GPT-2-style models in NumPy: writing them as Hugging
Face safetensors + config.json, and a float64 reference forward pass (NeoX rope, GQA,
rms_norm, SwiGLU; GPT-2: learned positions, LayerNorm, GELU tanh, Conv1D weights)
written independently of gpukit."""
from __future__ import annotations

import json
import os

import numpy as np

import gpukit as gk

TINY = dict(vocab_size=97, hidden_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, intermediate_size=80, max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


# GPT-2 keeps its own config.json key names (n_embd, n_layer, ...); head_dim = n_embd / n_head
TINY_GPT2 = dict(vocab_size=97, n_embd=128, n_layer=2, n_head=2, n_inner=80, n_positions=64, layer_norm_epsilon=1e-5,
                 activation_function="gelu_new", tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def tiny_config(family="llama"):
    return dict(TINY_GPT2 if family == "gpt2" else TINY)


def make_weights(cfg, family="llama", seed=0):
    if family == "gpt2":
        return make_gpt2_weights(cfg, seed)
    rng = np.random.default_rng(seed)
    H, D, Hq, Hkv = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    I, V = cfg["intermediate_size"], cfg["vocab_size"]

    def r(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": r(V, H, scale=1.0), "model.norm.weight": norm_w(H)}
    if not cfg.get("tie_word_embeddings"):
        w["lm_head.weight"] = r(V, H)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm_w(H)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
        w[p + "self_attn.q_proj.weight"] = r(Hq * D, H)
        w[p + "self_attn.k_proj.weight"] = r(Hkv * D, H)
        w[p + "self_attn.v_proj.weight"] = r(Hkv * D, H)
        w[p + "self_attn.o_proj.weight"] = r(H, Hq * D)
        if family == "qwen2":
            w[p + "self_attn.q_proj.bias"] = r(Hq * D, scale=0.1)
            w[p + "self_attn.k_proj.bias"] = r(Hkv * D, scale=0.1)
            w[p + "self_attn.v_proj.bias"] = r(Hkv * D, scale=0.1)
        if family == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm_w(D)
            w[p + "self_attn.k_norm.weight"] = norm_w(D)
        w[p + "mlp.gate_proj.weight"] = r(I, H)
        w[p + "mlp.up_proj.weight"] = r(I, H)
        w[p + "mlp.down_proj.weight"] = r(H, I)
    return w


def make_gpt2_weights(cfg, seed=0):
    """HF GPT2LMHeadModel names; projections are Conv1D, stored [in, out]."""
    rng = np.random.default_rng(seed)
    H, V, P = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    I = cfg.get("n_inner") or 4 * H

    def r(*shape, scale=None):
        scale = scale if scale is not None else 1.0 / np.sqrt(shape[0])  # fan-in is the first dim of Conv1D
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ln(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32), r(n, scale=0.1)

    w = {"transformer.wte.weight": r(V, H, scale=1.0), "transformer.wpe.weight": r(P, H, scale=0.5)}
    w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = ln(H)
    if not cfg.get("tie_word_embeddings", True):
        w["lm_head.weight"] = r(V, H, scale=1.0 / np.sqrt(H))
    for l in range(cfg["n_layer"]):
        p = f"transformer.h.{l}."
        w[p + "ln_1.weight"], w[p + "ln_1.bias"] = ln(H)
        w[p + "ln_2.weight"], w[p + "ln_2.bias"] = ln(H)
        w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = r(H, 3 * H), r(3 * H, scale=0.1)
        w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = r(H, H), r(H, scale=0.1)
        w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = r(H, I), r(I, scale=0.1)
        w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = r(I, H), r(H, scale=0.1)
    return w


def save_model(dirpath, cfg, weights, model_type="llama"):
    os.makedirs(dirpath, exist_ok=True)
    c = dict(cfg)
    c["model_type"] = model_type
    with open(os.path.join(dirpath, "config.json"), "w") as f:
        json.dump(c, f)
    gk.io.save_safetensors(os.path.join(dirpath, "model.safetensors"),
                           {k: gk.asarray(v) for k, v in weights.items()})
    return dirpath


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def inv_freq(D, theta, scaling=None):
    """Hugging Face's rotary inverse frequencies (default, linear, llama3)."""
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    if not scaling:
        return inv
    kind, f = scaling.get("rope_type", scaling.get("type")), scaling["factor"]
    if kind == "linear":
        return inv / f
    assert kind == "llama3"
    old, lo, hi = scaling["original_max_position_embeddings"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * np.pi / inv
    out = np.where(wavelen > old / lo, inv / f, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
    return np.where(medium, (1 - smooth) * out / f + smooth * out, out)


def _rope_neox(x, pos, theta, scaling=None):
    D = x.shape[-1]
    inv = inv_freq(D, theta, scaling)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def ref_logits_gpt2(cfg, weights, ids):
    """float64 GPT-2 logits [T, V] of one sequence (HF names, Conv1D [in, out] weights)."""
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    pre = "transformer." if "transformer.wte.weight" in W else ""
    H, Hq, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    D = H // Hq
    ids = np.asarray(ids)
    T = len(ids)
    x = W[pre + "wte.weight"][ids] + W[pre + "wpe.weight"][np.arange(T)]
    mask = np.tril(np.ones((T, T), dtype=bool))
    act = gelu_tanh
    if cfg.get("activation_function") == "gelu":
        from math import erf
        act = np.vectorize(lambda v: 0.5 * v * (1.0 + erf(v / np.sqrt(2.0))))
    for l in range(cfg["n_layer"]):
        p = f"{pre}h.{l}."
        h = _layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, i * H:(i + 1) * H].reshape(T, Hq, D) for i in range(3))
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
        s = np.where(mask[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H)
        x = x + o @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = _layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        u = act(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + u @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = _layer_norm(x, W[pre + "ln_f.weight"], W[pre + "ln_f.bias"], eps)
    head = W.get("lm_head.weight", W[pre + "wte.weight"])
    return x @ head.T


def ref_logits(cfg, weights, ids, family="llama"):
    """float64 logits [T, V] of one sequence."""
    if family == "gpt2":
        return ref_logits_gpt2(cfg, weights, ids)
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    D, Hq, Hkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    ids = np.asarray(ids)
    T = len(ids)
    pos = np.arange(T)
    x = W["model.embed_tokens.weight"][ids]
    mask = np.tril(np.ones((T, T), dtype=bool))
    win = cfg.get("sliding_window") if cfg.get("model_type", "llama") == "mistral" else None
    if win:
        mask &= np.arange(T)[None, :] > np.arange(T)[:, None] - win
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = _rms(x, W[p + "input_layernorm.weight"], eps)
        q = h @ W[p + "self_attn.q_proj.weight"].T
        k = h @ W[p + "self_attn.k_proj.weight"].T
        v = h @ W[p + "self_attn.v_proj.weight"].T
        if family == "qwen2":
            q = q + W[p + "self_attn.q_proj.bias"]
            k = k + W[p + "self_attn.k_proj.bias"]
            v = v + W[p + "self_attn.v_proj.bias"]
        q, k, v = q.reshape(T, Hq, D), k.reshape(T, Hkv, D), v.reshape(T, Hkv, D)
        if family == "qwen3":
            q = _rms(q, W[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, W[p + "self_attn.k_norm.weight"], eps)
        sc = cfg.get("rope_scaling")
        q, k = _rope_neox(q, pos, theta, sc), _rope_neox(k, pos, theta, sc)
        k, v = np.repeat(k, Hq // Hkv, axis=1), np.repeat(v, Hq // Hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
        s = np.where(mask[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, Hq * D)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = _rms(x, W[p + "post_attention_layernorm.weight"], eps)
        if cfg.get("num_local_experts"):  # Mixtral: sparse MLP (moe_mlp_ref below)
            x = x + moe_mlp_ref(cfg, W, p, h)
            continue
        g, u = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
    x = _rms(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T


def ref_greedy(cfg, weights, ids, n, family="llama"):
    ids = list(ids)
    out = []
    for _ in range(n):
        t = int(np.argmax(ref_logits(cfg, weights, ids, family)[-1]))
        out.append(t)
        ids.append(t)
    return out


def write_gpt2_gguf(path, cfg, weights, fmt="F32", tie=False, transpose=True):
    """llama.cpp's GPT-2 layout: projections transposed to [out, in]; returns the HF-layout
    weights as the model sees them after quantization."""
    import gguf
    Q = gguf.GGMLQuantizationType
    wr = gguf.GGUFWriter(str(path), arch="gpt2")
    wr.add_uint32("gpt2.block_count", cfg["n_layer"])
    wr.add_uint32("gpt2.embedding_length", cfg["n_embd"])
    wr.add_uint32("gpt2.feed_forward_length", cfg["n_inner"])
    wr.add_uint32("gpt2.attention.head_count", cfg["n_head"])
    wr.add_uint32("gpt2.context_length", cfg["n_positions"])
    wr.add_float32("gpt2.attention.layer_norm_epsilon", cfg["layer_norm_epsilon"])
    wr.add_uint32("tokenizer.ggml.eos_token_id", 2)
    wr.add_uint32("tokenizer.ggml.bos_token_id", 1)
    wr.add_uint32("gpt2.vocab_size", cfg["vocab_size"])
    names = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
             "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias", "lm_head.weight": "output.weight"}
    roles = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    seen = {}
    for name, arr in weights.items():
        if tie and name == "lm_head.weight":
            continue
        short = name.replace("transformer.", "")
        conv = short.startswith("h.") and short.endswith(".weight") and "ln_" not in short
        if short in names:
            g = names[short]
        else:
            _, l, *rest = short.split(".")
            g = f"blk.{l}.{roles['.'.join(rest[:-1])]}.{rest[-1]}"
        stored = np.ascontiguousarray(arr.T) if conv and transpose else arr  # transpose=False: a broken converter
        if stored.ndim == 2 and fmt == "Q8_0" and stored.shape[1] % 32 == 0:
            q = gguf.quants.quantize(stored, Q.Q8_0)
            wr.add_tensor(g, q, raw_dtype=Q.Q8_0)
            deq = gguf.quants.dequantize(q, Q.Q8_0).reshape(stored.shape).astype(np.float32)
        elif stored.ndim == 2 and fmt == "F16":
            wr.add_tensor(g, stored.astype(np.float16))
            deq = stored.astype(np.float16).astype(np.float32)
        else:
            wr.add_tensor(g, stored.astype(np.float32))
            deq = stored.astype(np.float32)
        seen[name] = np.ascontiguousarray(deq.T) if conv and transpose else deq
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return seen


# ---------------------------------------------------------------- mixture of experts (Mixtral)

def make_moe_weights(cfg, seed=0):
    """A tiny random Mixtral: the dense weights of make_weights with each layer's MLP replaced by
    a router (block_sparse_moe.gate [E, H]) and E experts (w1, w3 [I, H], w2 [H, I])."""
    w = make_weights(cfg, "llama", seed)
    rng = np.random.default_rng(seed + 1000)
    H, I, E = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        for n in ("gate_proj", "up_proj", "down_proj"):
            del w[p + f"mlp.{n}.weight"]
        w[p + "block_sparse_moe.gate.weight"] = (rng.standard_normal((E, H)) / np.sqrt(H)).astype(np.float32)
        for e in range(E):
            q = p + f"block_sparse_moe.experts.{e}."
            w[q + "w1.weight"] = (rng.standard_normal((I, H)) / np.sqrt(H)).astype(np.float32)
            w[q + "w3.weight"] = (rng.standard_normal((I, H)) / np.sqrt(H)).astype(np.float32)
            w[q + "w2.weight"] = (rng.standard_normal((H, I)) / np.sqrt(I)).astype(np.float32)
    return w


def moe_mlp_ref(cfg, W, p, h):
    """Mixtral's sparse MLP in float64 (as transformers' MixtralSparseMoeBlock): softmax over the
    router logits, the top num_experts_per_tok experts (ties to the lower expert), their
    probabilities renormalized to sum 1, sum of weight * w2(silu(w1 h) * w3 h)."""
    E, k = cfg["num_local_experts"], cfg.get("num_experts_per_tok", 2)
    logits = h @ W[p + "block_sparse_moe.gate.weight"].T
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = sorted(range(E), key=lambda i: (-logits[t, i], i))[:k]
        wts = prob[t, top] / prob[t, top].sum()
        for e, wt in zip(top, wts):
            q = p + f"block_sparse_moe.experts.{e}."
            g, u = W[q + "w1.weight"] @ h[t], W[q + "w3.weight"] @ h[t]
            out[t] += wt * (W[q + "w2.weight"] @ (g / (1.0 + np.exp(-g)) * u))
    return out
