"""Tiny llama / qwen2 / qwen3 models written as GGUF files with the `gguf` package
(llama.cpp's conventions: llama Q/K rows permuted for adjacent-pair rope, GGUF tensor
names and metadata keys; F32, F16 and Q8_0 tensors), loaded with gk.llm and compared
with the float64 NumPy transformer over the dequantized weights."""
import numpy as np
import pytest

import gpukit as gk
from llm_ref import TINY, make_weights, ref_logits

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402

ROLES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def permute(w, heads):
    """llama.cpp's converter: HF half-split rows -> adjacent pairs, per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, cfg, weights, arch, fmt):
    """Returns the weights as the model will see them (after quantization)."""
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_uint32(f"{arch}.block_count", cfg["num_hidden_layers"])
    w.add_uint32(f"{arch}.embedding_length", cfg["hidden_size"])
    w.add_uint32(f"{arch}.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32(f"{arch}.attention.head_count", cfg["num_attention_heads"])
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg["num_key_value_heads"])
    w.add_uint32(f"{arch}.attention.key_length", cfg["head_dim"])
    w.add_uint32(f"{arch}.attention.value_length", cfg["head_dim"])
    w.add_uint32(f"{arch}.context_length", cfg["max_position_embeddings"])
    w.add_uint32(f"{arch}.vocab_size", cfg["vocab_size"])
    w.add_float32(f"{arch}.rope.freq_base", cfg["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    seen = {}
    for name, arr in weights.items():
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            _, _, l, *rest = name.split(".")
            role, kind = ".".join(rest[:-1]), rest[-1]
            g = f"blk.{l}.{ROLES[role]}.{kind}"
        stored = arr
        if arch == "llama" and name.endswith("q_proj.weight"):
            stored = permute(arr, cfg["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            stored = permute(arr, cfg["num_key_value_heads"])
        if arr.ndim == 2 and fmt == "Q8_0" and arr.shape[1] % 32 == 0:
            q = gguf.quants.quantize(stored, Q.Q8_0)
            w.add_tensor(g, q, raw_dtype=Q.Q8_0)
            deq = gguf.quants.dequantize(q, Q.Q8_0).reshape(arr.shape).astype(np.float32)
        elif arr.ndim == 2 and fmt == "F16":
            w.add_tensor(g, stored.astype(np.float16))
            deq = stored.astype(np.float16).astype(np.float32)
        else:
            w.add_tensor(g, stored.astype(np.float32))
            deq = stored.astype(np.float32)
        if arch == "llama" and name.endswith("q_proj.weight"):  # back to HF row order for the reference
            deq = permute_inv(deq, cfg["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            deq = permute_inv(deq, cfg["num_key_value_heads"])
        seen[name] = deq
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return seen


def permute_inv(w, heads):
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("fmt", ["F32", "F16", "Q8_0"])
def test_gguf_models_match_numpy(tmp_path, arch, fmt):
    cfg = dict(TINY, intermediate_size=96, tie_word_embeddings=arch == "qwen2")
    w = make_weights(cfg, arch, seed=11)
    path = tmp_path / f"{arch}.gguf"
    seen = write_gguf(path, cfg, w, arch, fmt)
    m = gk.llm.load(str(path))
    c = m.config
    assert (c.family, c.format, c.head_dim, c.num_kv_heads) == (arch, "gguf", 64, 2)
    assert c.rope_interleaved == (arch == "llama")
    assert c.tie_embeddings == (arch == "qwen2") and c.eos_ids == [2] and m.tokenizer is None
    ids = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46]
    want = ref_logits(cfg, seen, ids, arch)
    got = gk.to_numpy(m.forward(ids))
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-4
    # the permutation matters: reading llama's permuted rows with NeoX rope would be wrong
    if arch == "llama":
        wrong = dict(seen)
        for k in wrong:
            if k.endswith("q_proj.weight"):
                wrong[k] = permute(seen[k], cfg["num_attention_heads"])
            elif k.endswith("k_proj.weight"):
                wrong[k] = permute(seen[k], cfg["num_key_value_heads"])
        bad = ref_logits(cfg, wrong, ids, arch)
        assert np.max(np.abs(got - bad)) / np.max(np.abs(want)) > 1e-3


def test_gguf_shape_mismatch_is_named(tmp_path):
    cfg = dict(TINY, intermediate_size=96)
    w = make_weights(cfg, "qwen3", seed=12)
    w["model.layers.1.self_attn.k_norm.weight"] = w["model.layers.1.self_attn.k_norm.weight"][:32]
    path = tmp_path / "bad.gguf"
    write_gguf(path, cfg, w, "qwen3", "F32")
    with pytest.raises(ValueError, match=r"blk.1.attn_k_norm.weight has shape \(32,\), expected \(64,\)"):
        gk.llm.load(str(path))
