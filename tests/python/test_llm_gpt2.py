"""GPT-2 in the LLM engine (learned absolute positions, LayerNorm with bias, GELU MLP
with biases, fused Conv1D qkv) beyond the shared tests of test_llm.py: the original
hub layout (no "transformer." prefix, tied head, mask buffers), learned positions up
to the end of the context, tanh vs erf GELU, bad configs and shapes, GGUF files in
llama.cpp's layout (F32, F16, Q8_0), and CUDA at fp32 and bf16 (skipped without a GPU)."""
import numpy as np
import pytest

import gpukit as gk
from llm_ref import make_weights, ref_greedy, ref_logits, save_model, tiny_config, write_gpt2_gguf


def rel_err(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def test_gpt2_tied_unprefixed_with_buffers(tmp_path):
    """The original hub layout: no "transformer." prefix, no lm_head (tied by default),
    and the old attention-mask buffers (h.N.attn.bias), which are ignored."""
    cfg = tiny_config("gpt2")
    del cfg["tie_word_embeddings"]
    w = make_weights(cfg, "gpt2", seed=21)
    assert "lm_head.weight" not in w
    flat = {k.replace("transformer.", ""): v for k, v in w.items()}
    for l in range(cfg["n_layer"]):
        flat[f"h.{l}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
    m = gk.llm.load(save_model(str(tmp_path / "m"), cfg, flat, model_type="gpt2"))
    assert m.config.tie_embeddings
    ids = [4, 9, 16, 25, 36, 49, 64, 81, 3]
    assert rel_err(gk.to_numpy(m.forward(ids)), ref_logits(cfg, w, ids, "gpt2")) < 1e-4
    assert "learned positions" in repr(m.config) and "layer norm" in repr(m.config)


def test_gpt2_positions_matter(tmp_path):
    """Learned positions: the same token at two positions gives different logits, and
    the position table really is read (zeroing it changes the result)."""
    cfg = tiny_config("gpt2")
    w = make_weights(cfg, "gpt2", seed=22)
    m = gk.llm.load(save_model(str(tmp_path / "m"), cfg, w, model_type="gpt2"))
    got = gk.to_numpy(m.forward([7, 7, 7, 7]))
    assert rel_err(got[0], got[3]) > 1e-3
    w0 = dict(w, **{"transformer.wpe.weight": np.zeros_like(w["transformer.wpe.weight"])})
    assert rel_err(got, ref_logits(cfg, w0, [7, 7, 7, 7], "gpt2")) > 1e-3
    # the last position of the context is usable, one more is not
    ids = list(range(1, 65))
    assert rel_err(gk.to_numpy(m.forward(ids))[-1], ref_logits(cfg, w, ids, "gpt2")[-1]) < 1e-4
    with pytest.raises(ValueError, match="context of 64"):
        m.forward(ids + [1])


@pytest.mark.parametrize("act", ["gelu_new", "gelu"])
def test_gpt2_gelu_variant(tmp_path, act):
    """tanh (gelu_new) and erf (gelu) GELU differ by ~1e-3 at most: each model must be
    far closer to its own reference than to the other one's."""
    cfg = dict(tiny_config("gpt2"), activation_function=act)
    w = make_weights(cfg, "gpt2", seed=23)
    m = gk.llm.load(save_model(str(tmp_path / "m"), cfg, w, model_type="gpt2"))
    assert m.config.activation == ("gelu" if act == "gelu" else "gelu_tanh")
    ids = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89]
    got = gk.to_numpy(m.forward(ids))
    right = rel_err(got, ref_logits(cfg, w, ids, "gpt2"))
    other = dict(cfg, activation_function="gelu_new" if act == "gelu" else "gelu")
    wrong = rel_err(got, ref_logits(other, w, ids, "gpt2"))
    assert right < 1e-4 and wrong > 20 * right, (right, wrong)


def test_gpt2_bad_configs_and_shapes(tmp_path):
    cfg = tiny_config("gpt2")
    w = make_weights(cfg, "gpt2", seed=24)
    for bad, msg in [(dict(activation_function="relu"), "activation_function 'relu'"),
                     (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
                     (dict(n_head=3), "not a multiple of the 3 attention heads"),
                     (dict(n_embd=96, n_head=3), "hidden size 96 .*does not|head_dim 32"),
                     (dict(n_layer=None), "n_layer")]:
        d = save_model(str(tmp_path / "c"), dict(cfg, **bad), w, model_type="gpt2")
        with pytest.raises(ValueError, match=msg):
            gk.llm.load(d)
    # a Conv1D weight written the other way round ([out, in]) is named with the expected [in, out]
    bad = dict(w)
    bad["transformer.h.1.mlp.c_fc.weight"] = np.ascontiguousarray(w["transformer.h.1.mlp.c_fc.weight"].T)
    d = save_model(str(tmp_path / "s"), cfg, bad, model_type="gpt2")
    with pytest.raises(ValueError, match=r"transformer.h.1.mlp.c_fc.weight has shape \(80, 128\), expected \(128, 80\)"):
        gk.llm.load(d)
    bad = dict(w)
    bad["transformer.wpe.weight"] = w["transformer.wpe.weight"][:32]
    d = save_model(str(tmp_path / "p"), cfg, bad, model_type="gpt2")
    with pytest.raises(ValueError, match=r"transformer.wpe.weight has shape \(32, 128\), expected \(64, 128\)"):
        gk.llm.load(d)
    bad = dict(w)
    del bad["transformer.h.0.ln_2.bias"]
    d = save_model(str(tmp_path / "b"), cfg, bad, model_type="gpt2")
    with pytest.raises(ValueError, match="transformer.h.0.ln_2.bias is missing"):
        gk.llm.load(d)


def test_gpt2_quantize_is_refused(tmp_path):
    """Load-time quantization covers the llama-style layouts only: a clear error, and the
    weights read before it are freed."""
    cfg = tiny_config("gpt2")
    d = save_model(str(tmp_path / "m"), cfg, make_weights(cfg, "gpt2", seed=32), model_type="gpt2")
    gk.empty_cache()
    before = gk.memory_stats("cpu")["allocated"]
    with pytest.raises(ValueError, match="quantize: .*not for layer 0 of this gpt2 model"):
        gk.llm.load(d, quantize="int8")
    assert gk.memory_stats("cpu")["allocated"] == before


def test_gpt2_with_a_tokenizer(tmp_path):
    """A GPT-2 directory with a byte-level BPE tokenizer.json: text in, text out, the same
    ids as the tokenizers library, greedy tokens equal to the NumPy reference's."""
    tk = pytest.importorskip("tokenizers")
    corpus = ["the quick brown fox jumps over the lazy dog", "a small model writes a few words",
              "hello world, hello there; numbers 123 and 456"] * 10
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    tok.train_from_iterator(corpus, tk.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    V = tok.get_vocab_size()
    eos = tok.token_to_id("<|endoftext|>")
    cfg = dict(tiny_config("gpt2"), vocab_size=V, bos_token_id=eos, eos_token_id=eos)
    w = make_weights(cfg, "gpt2", seed=33)
    d = save_model(str(tmp_path / "m"), cfg, w, model_type="gpt2")
    tok.save(str(tmp_path / "m" / "tokenizer.json"))
    m = gk.llm.load(d)
    assert m.tokenizer is not None and m.config.vocab_size == V
    text = "the quick brown fox says hello"
    ids = tok.encode(text).ids
    assert m.tokenizer.encode(text) == ids
    out = m.generate(text, max_new_tokens=8, ignore_eos=True)
    assert out.ids == ref_greedy(cfg, w, ids, 8, "gpt2")
    assert out.text == tok.decode(out.ids)
    assert "".join(m.stream(text, max_new_tokens=8)) == \
        tok.decode(m.generate(text, max_new_tokens=8).ids, skip_special_tokens=True)


def test_gpt2_random_model():
    cfg = dict(tiny_config("gpt2"), model_type="gpt2")
    m = gk.llm.random_model(cfg, seed=3)
    assert m.config.family == "gpt2" and m.config.format == "random"
    out = m.generate([1, 2, 3], max_new_tokens=5, ignore_eos=True)
    assert len(out.ids) == 5 and all(0 <= t < 97 for t in out.ids)


@pytest.mark.parametrize("fmt", ["F32", "F16", "Q8_0"])
def test_gpt2_gguf(tmp_path, fmt):
    pytest.importorskip("gguf")
    cfg = dict(tiny_config("gpt2"), n_inner=96)
    tie = fmt == "F16"
    cfg["tie_word_embeddings"] = tie
    w = make_weights(cfg, "gpt2", seed=25)
    seen = write_gpt2_gguf(tmp_path / "g.gguf", cfg, w, fmt, tie=tie)
    m = gk.llm.load(str(tmp_path / "g.gguf"))
    c = m.config
    assert (c.family, c.format, c.hidden_size, c.num_heads, c.head_dim, c.intermediate_size, c.max_positions) == \
        ("gpt2", "gguf", 128, 2, 64, 96, 64)
    assert c.tie_embeddings == tie and c.learned_positions and c.layer_norm and c.eos_ids == [2]
    ids = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46]
    want = ref_logits(cfg, seen, ids, "gpt2")
    assert rel_err(gk.to_numpy(m.forward(ids)), want) < 1e-4
    # decode over the cache agrees with the full forward
    out = m.generate(ids[:4], max_new_tokens=6, ignore_eos=True)
    assert out.ids == ref_greedy(cfg, seen, ids[:4], 6, "gpt2")


def test_gpt2_gguf_untransposed_projection_is_named(tmp_path):
    """A GGUF whose converter left the Conv1D projections [in, out]: the first one is named."""
    pytest.importorskip("gguf")
    cfg = tiny_config("gpt2")
    write_gpt2_gguf(tmp_path / "g.gguf", cfg, make_weights(cfg, "gpt2", seed=34), transpose=False)
    with pytest.raises(ValueError, match=r"blk.0.attn_qkv.weight has shape \(128, 384\), expected \(384, 128\)"):
        gk.llm.load(str(tmp_path / "g.gguf"))


# ---- GPT-2 on CUDA (skipped without a GPU) ----

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="no CUDA device")


@cuda
@pytest.mark.parametrize("dtype,limit", [("float32", 1e-4), ("bfloat16", 5e-2)])
def test_gpt2_cuda(tmp_path, dtype, limit):
    cfg = tiny_config("gpt2")
    w = make_weights(cfg, "gpt2", seed=30)
    d = save_model(str(tmp_path / "m"), cfg, w, model_type="gpt2")
    m = gk.llm.load(d, device="cuda", dtype=dtype)
    ids = [5, 17, 3, 90, 44, 44, 0, 61, 12, 7, 33]
    err = rel_err(gk.to_numpy(m.forward(ids)), ref_logits(cfg, w, ids, "gpt2"))
    print(f"\ngpt2 cuda {dtype}: prefill rel err {err:.2e}")
    assert err < limit
    # two sequences: batch prefill, then batched decode across a page boundary
    impl = m._m
    a, b = list(range(3, 21)), [9, 8, 7]
    cache = impl.make_cache([40, 40])
    sa, sb = cache.add_sequence(), cache.add_sequence()
    impl.step(cache, [sa, sb], [a, b])
    worst = 0.0
    for t in range(16):
        ta, tb = (t * 13) % 97, (t * 29 + 5) % 97
        a, b = a + [ta], b + [tb]
        got = gk.to_numpy(impl.step(cache, [sa, sb], [[ta], [tb]]))
        worst = max(worst, rel_err(got[0], ref_logits(cfg, w, a, "gpt2")[-1]),
                    rel_err(got[1], ref_logits(cfg, w, b, "gpt2")[-1]))
    print(f"gpt2 cuda {dtype}: decode rel err {worst:.2e}")
    assert worst < limit
    if dtype == "float32":
        out = m.generate([[10, 20, 30], [7, 7]], max_new_tokens=12, ignore_eos=True)
        assert out.ids == [ref_greedy(cfg, w, p, 12, "gpt2") for p in ([10, 20, 30], [7, 7])]
