"""A tiny random Mixtral (mixture-of-experts MLP: router, top-2 of 4 experts) through the
engine: from Hugging Face safetensors (model_type "mixtral", num_local_experts,
block_sparse_moe.gate / experts.N.w1/w2/w3) and from GGUF (llama architecture with
expert_count, ffn_gate_inp and the stacked 3-D ffn_{gate,up,down}_exps), against the
float64 NumPy transformer of llm_ref.py; prefill, decode steps, a batch; CUDA in fp32 and
bf16 when a GPU is present; bad configs and missing expert tensors."""
import json
import os

import numpy as np
import pytest

import gpukit as gk
from llm_ref import TINY, make_moe_weights, ref_logits, save_model

CUDA = gk.cuda.is_available()
CFG = dict(TINY, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
# The seed of the weights: chosen so that, for the prompts below, the 2nd and 3rd router
# logits of every token in every layer differ by more than 0.05 (test_routing_margin), far
# more than bf16 rounding moves them; a near-tie would let bf16 pick another expert and
# make the comparison meaningless rather than wrong.
SEED = 39
PROMPT = [5, 17, 3, 90, 44, 44, 0, 61, 12, 7, 33]
DECODE = [9, 1, 96]


def rel_err(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory):
    w = make_moe_weights(CFG, seed=SEED)
    d = save_model(str(tmp_path_factory.mktemp("tiny_mixtral")), CFG, w, model_type="mixtral")
    return w, d


def test_routing_margin(tiny_mixtral, monkeypatch):
    import llm_ref
    w, _ = tiny_mixtral
    margins, orig = [], llm_ref.moe_mlp_ref

    def recording(cfg, W, p, h):
        lg = -np.sort(-(h @ W[p + "block_sparse_moe.gate.weight"].T), axis=1)
        margins.append(float(np.min(lg[:, 1] - lg[:, 2])))
        return orig(cfg, W, p, h)

    monkeypatch.setattr(llm_ref, "moe_mlp_ref", recording)
    seq = PROMPT + DECODE
    for n in range(5, len(seq) + 1):
        ref_logits(CFG, w, seq[:n])
    assert min(margins) > 0.05, min(margins)


def test_config(tiny_mixtral):
    w, d = tiny_mixtral
    m = gk.llm.load(d)
    c = m.config
    assert c.architecture == "mixtral" and c.family == "llama"
    if hasattr(c, "num_experts"):
        assert (c.num_experts, c.experts_per_tok) == (4, 2)


def test_prefill_and_decode_match_numpy(tiny_mixtral):
    w, d = tiny_mixtral
    m = gk.llm.load(d)
    ids = [5, 17, 3, 90, 44, 44, 0, 61, 12, 7, 33]
    got = gk.to_numpy(m.forward(ids))
    want = ref_logits(CFG, w, ids)
    assert got.shape == want.shape
    assert rel_err(got, want) < 1e-4, rel_err(got, want)
    mm = m._m
    cache = mm.make_cache([40], block_size=16)
    s = cache.add_sequence()
    seq = ids[:4]
    mm.step(cache, [s], [seq])
    for t in [9, 1, 96, 50, 50, 2]:
        seq = seq + [t]
        got = gk.to_numpy(mm.step(cache, [s], [[t]]))[0]
        assert rel_err(got, ref_logits(CFG, w, seq)[-1]) < 1e-4, len(seq)


def test_batch_equals_solo(tiny_mixtral):
    """Routing is per token: a token's experts and result do not depend on its batch."""
    w, d = tiny_mixtral
    m = gk.llm.load(d)._m
    a, b = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1]
    cache = m.make_cache([20, 20])
    sa, sb = cache.add_sequence(), cache.add_sequence()
    both = gk.to_numpy(m.step(cache, [sa, sb], [a, b], all_logits=True))
    assert np.array_equal(both[:len(a)], gk.to_numpy(m.forward(a)))
    assert np.array_equal(both[len(a):], gk.to_numpy(m.forward(b)))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_cuda_matches_numpy(tiny_mixtral, dtype, tol):
    w, d = tiny_mixtral
    m = gk.llm.load(d, device="cuda", dtype=dtype)
    ids = PROMPT
    got = gk.to_numpy(m.forward(ids))
    want = ref_logits(CFG, w, ids)
    err = rel_err(got, want)
    print(f"mixtral cuda {dtype}: rel err {err:.3g}")
    assert err < tol
    again = gk.to_numpy(m.forward(ids))
    assert again.tobytes() == got.tobytes()
    mm = m._m
    cache = mm.make_cache([30], block_size=16)
    s = cache.add_sequence()
    seq = ids[:5]
    mm.step(cache, [s], [seq])
    for t in PROMPT[5:] + DECODE:  # every sequence a prefix of PROMPT + DECODE (test_routing_margin)
        seq = seq + [t]
        got = gk.to_numpy(mm.step(cache, [s], [[t]]))[0]
        assert rel_err(got, ref_logits(CFG, w, seq)[-1]) < tol


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_generation(tiny_mixtral, dtype):
    """Greedy generation with the decode step captured as a CUDA graph (the MoE layer has no
    host synchronization): the same tokens as eager decoding, and in fp32 as the CPU."""
    w, d = tiny_mixtral
    m = gk.llm.load(d, device="cuda", dtype=dtype)
    prompts = [PROMPT, PROMPT[:4]]
    graph = m.generate(prompts, max_new_tokens=12, ignore_eos=True, cuda_graph=True).ids
    eager = m.generate(prompts, max_new_tokens=12, ignore_eos=True, cuda_graph=False).ids
    assert graph == eager
    if dtype == "float32":
        cpu = gk.llm.load(d).generate(prompts, max_new_tokens=12, ignore_eos=True).ids
        assert graph == cpu


def write_moe_gguf(path, cfg, weights):
    gguf = pytest.importorskip("gguf")
    from test_llm_gguf import ROLES, permute
    arch = "llama"
    g = gguf.GGUFWriter(str(path), arch=arch)
    for key, val in [("block_count", cfg["num_hidden_layers"]), ("embedding_length", cfg["hidden_size"]),
                     ("feed_forward_length", cfg["intermediate_size"]),
                     ("attention.head_count", cfg["num_attention_heads"]),
                     ("attention.head_count_kv", cfg["num_key_value_heads"]), ("attention.key_length", cfg["head_dim"]),
                     ("attention.value_length", cfg["head_dim"]), ("context_length", cfg["max_position_embeddings"]),
                     ("vocab_size", cfg["vocab_size"]), ("expert_count", cfg["num_local_experts"]),
                     ("expert_used_count", cfg["num_experts_per_tok"])]:
        g.add_uint32(f"{arch}.{key}", val)
    g.add_float32(f"{arch}.rope.freq_base", cfg["rope_theta"])
    g.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    E = cfg["num_local_experts"]
    for name, arr in weights.items():
        if "block_sparse_moe.experts" in name:
            continue
        if name == "model.embed_tokens.weight":
            n = "token_embd.weight"
        elif name == "model.norm.weight":
            n = "output_norm.weight"
        elif name == "lm_head.weight":
            n = "output.weight"
        elif "block_sparse_moe.gate" in name:
            n = f"blk.{name.split('.')[2]}.ffn_gate_inp.weight"
        else:
            _, _, l, *rest = name.split(".")
            n = f"blk.{l}.{ROLES['.'.join(rest[:-1])]}.{rest[-1]}"
        stored = arr
        if name.endswith("q_proj.weight"):
            stored = permute(arr, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            stored = permute(arr, cfg["num_key_value_heads"])
        g.add_tensor(n, stored.astype(np.float32))
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}.block_sparse_moe.experts."
        for kind, src in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
            stacked = np.stack([weights[p + f"{e}.{src}.weight"] for e in range(E)]).astype(np.float32)
            g.add_tensor(f"blk.{l}.ffn_{kind}_exps.weight", stacked)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def test_gguf_mixtral_matches_numpy(tiny_mixtral, tmp_path):
    w, _ = tiny_mixtral
    path = tmp_path / "tiny_mixtral.gguf"
    write_moe_gguf(path, CFG, w)
    m = gk.llm.load(str(path))
    ids = [5, 17, 3, 90, 44, 44, 0, 61]
    assert rel_err(gk.to_numpy(m.forward(ids)), ref_logits(CFG, w, ids)) < 1e-4


def test_bad_moe_models(tiny_mixtral, tmp_path):
    w, d = tiny_mixtral
    cfg = dict(CFG, num_experts_per_tok=5)
    bad = save_model(str(tmp_path / "too_many"), cfg, w, model_type="mixtral")
    with pytest.raises(ValueError, match="experts"):
        gk.llm.load(bad)
    w2 = dict(w)
    del w2["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    missing = save_model(str(tmp_path / "missing"), CFG, w2, model_type="mixtral")
    with pytest.raises(ValueError, match=r"experts\.3\.w2"):
        gk.llm.load(missing)
    w3 = dict(w)
    w3["model.layers.0.block_sparse_moe.gate.weight"] = np.zeros((3, CFG["hidden_size"]), np.float32)
    wrong = save_model(str(tmp_path / "wrong"), CFG, w3, model_type="mixtral")
    with pytest.raises(ValueError, match="block_sparse_moe.gate"):
        gk.llm.load(wrong)


def test_random_mixtral_runs():
    """Model.random with experts (the benchmark path): finite logits."""
    m = gk.llm.random_model(dict(CFG, model_type="mixtral"), seed=3)
    out = gk.to_numpy(m.forward([1, 2, 3]))
    assert out.shape == (3, CFG["vocab_size"]) and np.all(np.isfinite(out))
