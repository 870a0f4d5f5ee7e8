"""The LLM engine on tiny random models (CPU) against a float64 NumPy transformer
(tests/python/llm_ref.py): llama, qwen2, qwen3 and GPT-2 (learned positions,
LayerNorm, GELU, fused Conv1D qkv): prefill, decode steps, batches of prompts of
different lengths, greedy generation; plus bad input."""
import json
import os

import numpy as np
import pytest

import gpukit as gk
from llm_ref import TINY, make_weights, ref_greedy, ref_logits, save_model, tiny_config

FAMILIES = ["llama", "qwen2", "qwen3", "gpt2"]


def rel_err(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    fam = request.param
    cfg = tiny_config(fam)
    w = make_weights(cfg, fam, seed=FAMILIES.index(fam))
    d = save_model(str(tmp_path_factory.mktemp(f"tiny_{fam}")), cfg, w, model_type=fam)
    return fam, cfg, w, d


def test_config_and_load(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)
    c = m.config
    assert c.family == fam and c.architecture == fam and c.format == "safetensors"
    dims = (97, 128, 2, 2, 2, 64, 80) if fam == "gpt2" else (97, 96, 2, 4, 2, 64, 80)
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
            c.intermediate_size) == dims
    assert c.qk_norm == (fam == "qwen3") and c.attention_bias == (fam == "qwen2")
    assert c.layer_norm == c.learned_positions == (fam == "gpt2") and not c.tie_embeddings
    assert c.activation == ("gelu_tanh" if fam == "gpt2" else "silu") and c.max_positions == 64
    assert not c.rope_interleaved and c.eos_ids == [2] and c.bos_id == 1
    assert m.tokenizer is None


def test_prefill_logits_match_numpy(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)
    ids = [5, 17, 3, 90, 44, 44, 0, 61, 12, 7, 33]
    got = gk.to_numpy(m.forward(ids))
    want = ref_logits(cfg, w, ids, fam)
    assert got.shape == want.shape and got.dtype == np.float32
    assert rel_err(got, want) < 1e-4


def test_decode_steps_match_numpy(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)._m
    ids = [4, 8, 15, 16, 23, 42, 9]
    cache = m.make_cache([len(ids) + 40], block_size=16)
    s = cache.add_sequence()
    seq = list(ids[:3])
    last = gk.to_numpy(m.step(cache, [s], [seq]))  # prefill of 3 tokens -> logits of the last
    assert rel_err(last[0], ref_logits(cfg, w, seq, fam)[-1]) < 1e-4
    # decode the rest one token at a time, then 30 more (crossing page boundaries)
    rng = np.random.default_rng(1)
    more = ids[3:] + [int(x) for x in rng.integers(0, 97, 30)]
    for t in more:
        seq.append(t)
        got = gk.to_numpy(m.step(cache, [s], [[t]]))[0]
        assert rel_err(got, ref_logits(cfg, w, seq, fam)[-1]) < 1e-4, len(seq)
    assert cache.length(s) == len(seq)


def test_batch_equals_solo(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)._m
    a, b = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3], [2, 7, 1, 8, 2]
    cache = m.make_cache([40, 40])
    sa, sb = cache.add_sequence(), cache.add_sequence()
    both = gk.to_numpy(m.step(cache, [sa, sb], [a, b], all_logits=True))
    solo_a, solo_b = gk.to_numpy(m.forward(a)), gk.to_numpy(m.forward(b))
    np.testing.assert_allclose(both[: len(a)], solo_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(both[len(a):], solo_b, rtol=1e-5, atol=1e-5)
    assert rel_err(both[len(a):], ref_logits(cfg, w, b, fam)) < 1e-4
    # decode both together, each at its own length
    for t in range(6):
        ta, tb = (t * 13) % 97, (t * 29 + 5) % 97
        a, b = a + [ta], b + [tb]
        got = gk.to_numpy(m.step(cache, [sa, sb], [[ta], [tb]]))
        assert rel_err(got[0], ref_logits(cfg, w, a, fam)[-1]) < 1e-4
        assert rel_err(got[1], ref_logits(cfg, w, b, fam)[-1]) < 1e-4
    # a multi-token append to a cached sequence (token by token inside) and a new one
    sc = cache.add_sequence()
    got = gk.to_numpy(m.step(cache, [sa, sc], [[1, 2, 3], [4, 5]], all_logits=True))
    assert got.shape == (5, 97)
    assert rel_err(got[:3], ref_logits(cfg, w, a + [1, 2, 3], fam)[-3:]) < 1e-4
    assert rel_err(got[3:], ref_logits(cfg, w, [4, 5], fam)) < 1e-4


def test_chunked_prefill_over_cached_prefix(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)._m
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 97, 40).tolist(), rng.integers(0, 97, 23).tolist()
    cache = m.make_cache([40, 23], block_size=16)
    sa, sb = cache.add_sequence(), cache.add_sequence()
    chunks_a, chunks_b = [(0, 5), (5, 17), (17, 18), (18, 40)], [(0, 9), (9, 10), (10, 21), (21, 23)]
    want_a, want_b = ref_logits(cfg, w, a, fam), ref_logits(cfg, w, b, fam)
    for (a0, a1), (b0, b1) in zip(chunks_a, chunks_b):
        got = gk.to_numpy(m.step(cache, [sa, sb], [a[a0:a1], b[b0:b1]], all_logits=True))
        assert rel_err(got[: a1 - a0], want_a[a0:a1]) < 1e-4
        assert rel_err(got[a1 - a0:], want_b[b0:b1]) < 1e-4
    assert (cache.length(sa), cache.length(sb)) == (40, 23)
    # releasing a sequence returns its pages
    free = cache.free_blocks
    cache.release(sa)
    assert cache.free_blocks == free + 3


def test_resume_generation_on_a_cache(tiny):
    """Generation.resume continues a cached sequence (after truncating it) like a fresh run."""
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)._m
    cache = m.make_cache([60])
    s = cache.add_sequence()
    first = [5, 6, 7, 8, 9, 10, 11, 12]
    g = gk._C.llm.Generation.resume(m, cache, [s], [first], max_new_tokens=4, ignore_eos=True)
    while not g.done:
        g.step()
    assert list(g.generated[0]) == ref_greedy(cfg, w, first, 4, fam)
    assert cache.length(s) == len(first) + 3  # the last token drawn is not fed yet
    cache.truncate(s, 5)  # keep [5..9], then continue with other tokens
    more = [40, 41, 42]
    g = gk._C.llm.Generation.resume(m, cache, [s], [more], max_new_tokens=5, ignore_eos=True)
    while not g.done:
        g.step()
    assert list(g.generated[0]) == ref_greedy(cfg, w, first[:5] + more, 5, fam)
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(s, 1000)
    with pytest.raises(ValueError, match="empty"):
        gk._C.llm.Generation.resume(m, cache, [s], [[]])
    with pytest.raises(ValueError, match="twice"):
        m.step(cache, [s, s], [[1], [2]])
    with pytest.raises(IndexError):
        m.step(cache, [s + 100], [[1]])


def test_greedy_generation_matches_numpy(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)
    prompts = [[10, 20, 30, 40, 50], [7, 7]]
    out = m.generate(prompts, max_new_tokens=10, ignore_eos=True)
    for p, got in zip(prompts, out.ids):
        assert got == ref_greedy(cfg, w, p, 10, fam)
    assert out.finish_reason == ["length", "length"]
    solo = m.generate(prompts[1], max_new_tokens=10, ignore_eos=True)
    assert solo.ids == out.ids[1]


def test_sampling_is_seeded(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)
    kw = dict(max_new_tokens=12, temperature=1.0, top_k=20, top_p=0.9, ignore_eos=True)
    a = m.generate([1, 2, 3], seed=5, **kw).ids
    b = m.generate([1, 2, 3], seed=5, **kw).ids
    c = m.generate([1, 2, 3], seed=6, **kw).ids
    assert a == b and len(a) == 12 and a != c
    assert all(0 <= t < 97 for t in a)


def test_eos_stops(tmp_path):
    cfg = dict(TINY)
    w = make_weights(cfg, "llama", seed=3)
    greedy = ref_greedy(cfg, w, [9, 9, 9], 6)
    cfg["eos_token_id"] = [greedy[3], 96]
    d = save_model(str(tmp_path / "m"), cfg, w)
    out = gk.llm.load(d).generate([9, 9, 9], max_new_tokens=20)
    assert out.ids == greedy[:4] and out.finish_reason == "eos"


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 32},
    {"type": "linear", "factor": 2.0},
])
def test_rope_scaling(tmp_path, scaling):
    cfg = dict(TINY, rope_scaling=scaling, rope_theta=500000.0)
    w = make_weights(cfg, seed=7)
    m = gk.llm.load(save_model(str(tmp_path / "m"), cfg, w))
    rs = m.config.rope_scaling
    assert rs["type"] == scaling.get("rope_type", scaling.get("type")) and rs["factor"] == scaling["factor"]
    ids = list(range(3, 60))
    got = gk.to_numpy(m.forward(ids))
    assert rel_err(got, ref_logits(cfg, w, ids)) < 1e-4
    # the scaling matters at these positions
    plain = dict(cfg)
    del plain["rope_scaling"]
    assert rel_err(got, ref_logits(plain, w, ids)) > 1e-3


def test_mistral_sliding_window(tmp_path):
    cfg = dict(TINY, sliding_window=6, model_type="mistral")
    w = make_weights(cfg, seed=10)
    m = gk.llm.load(save_model(str(tmp_path / "m"), cfg, w, model_type="mistral"))
    assert m.config.sliding_window == 6 and m.config.family == "llama"
    ids = list(range(5, 25))
    want = ref_logits(cfg, w, ids)
    assert rel_err(gk.to_numpy(m.forward(ids)), want) < 1e-4
    nowin = dict(cfg, sliding_window=None)
    assert rel_err(want, ref_logits(nowin, w, ids)) > 1e-3  # the window matters here
    # decode and chunked prefill respect the window too
    impl = m._m
    cache = impl.make_cache([20])
    s = cache.add_sequence()
    impl.step(cache, [s], [ids[:9]])
    got = gk.to_numpy(impl.step(cache, [s], [ids[9:15]], all_logits=True))
    assert rel_err(got, want[9:15]) < 1e-4
    for j in range(15, 20):
        got = gk.to_numpy(impl.step(cache, [s], [[ids[j]]]))[0]
        assert rel_err(got, want[j]) < 1e-4


def test_tied_embeddings(tmp_path):
    cfg = dict(TINY, tie_word_embeddings=True)
    w = make_weights(cfg, seed=8)
    assert "lm_head.weight" not in w
    m = gk.llm.load(save_model(str(tmp_path / "m"), cfg, w))
    assert m.config.tie_embeddings
    ids = [1, 2, 3, 4]
    assert rel_err(gk.to_numpy(m.forward(ids)), ref_logits(cfg, w, ids)) < 1e-4


def test_failed_load_releases_memory(tmp_path):
    cfg = dict(TINY)
    w = make_weights(cfg, seed=9)
    # the last tensor read has an unsupported dtype: everything loaded before it is freed
    w["model.layers.1.mlp.down_proj.weight"] = w["model.layers.1.mlp.down_proj.weight"].astype(np.float64)
    d = save_model(str(tmp_path / "m"), cfg, w)
    gk.empty_cache()
    before = gk.memory_stats("cpu")["allocated"]
    with pytest.raises(ValueError, match="down_proj.weight: dtype float64 is not supported"):
        gk.llm.load(d)
    assert gk.memory_stats("cpu")["allocated"] == before
    ok = gk.llm.load(save_model(str(tmp_path / "ok"), cfg, make_weights(cfg)))
    assert gk.memory_stats("cpu")["allocated"] > before
    del ok


def test_paths_and_generation_config(tmp_path):
    cfg = dict(TINY)
    w = make_weights(cfg, seed=13)
    d = save_model(str(tmp_path / "m"), cfg, w)
    (tmp_path / "m" / "generation_config.json").write_text('{"eos_token_id": [2, 7], "do_sample": false}')
    ids = [3, 4, 5]
    want = gk.to_numpy(gk.llm.load(d).forward(ids))
    for p in ("config.json", "model.safetensors"):
        m = gk.llm.load(os.path.join(d, p))
        assert m.config.eos_ids == [2, 7]
        np.testing.assert_array_equal(gk.to_numpy(m.forward(ids)), want)


def test_embedding_op():
    table = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    ids = np.array([[4, 0], [2, 2]], dtype=np.int32)
    got = gk.to_numpy(gk.embedding(gk.asarray(ids), gk.asarray(table)))
    np.testing.assert_array_equal(got, table[ids])
    got = gk.to_numpy(gk.embedding(gk.asarray(ids.astype(np.int64)), gk.asarray(table).astype("bfloat16"))
                      .astype("float32"))
    np.testing.assert_array_equal(got, table[ids])
    with pytest.raises(IndexError, match="token id 5"):
        gk.embedding(gk.asarray(np.array([5], np.int32)), gk.asarray(table))
    with pytest.raises(TypeError, match="int32 or int64"):
        gk.embedding(gk.asarray(np.array([1.0], np.float32)), gk.asarray(table))


# ---- bad input ----

def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        gk.llm.load(str(tmp_path / "nope.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(ValueError):
        gk.llm.load(str(bad))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        gk.llm.load(str(tmp_path / "empty"))
    d = tmp_path / "trunc"
    cfg = dict(TINY)
    save_model(str(d), cfg, make_weights(cfg))
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError):
        gk.llm.load(str(d))


def test_unknown_architecture(tmp_path):
    cfg = dict(TINY)
    d = save_model(str(tmp_path / "m"), cfg, make_weights(cfg), model_type="gpt_neox")
    with pytest.raises(ValueError, match=r"unsupported model architecture 'gpt_neox'.*llama.*qwen2.*qwen3"):
        gk.llm.load(d)
    assert "llama" in gk.llm.supported_architectures()


def test_wrong_shape_and_missing_tensor(tmp_path):
    cfg = dict(TINY)
    w = make_weights(cfg)
    w["model.layers.1.mlp.up_proj.weight"] = w["model.layers.1.mlp.up_proj.weight"][:-1]
    d = save_model(str(tmp_path / "a"), cfg, w)
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.up_proj.weight has shape \(79, 96\), expected \(80, 96\)"):
        gk.llm.load(d)
    w = make_weights(cfg)
    del w["model.layers.0.self_attn.k_proj.weight"]
    d = save_model(str(tmp_path / "b"), cfg, w)
    with pytest.raises(ValueError, match="model.layers.0.self_attn.k_proj.weight is missing"):
        gk.llm.load(d)
    bad = dict(cfg, num_attention_heads=3)
    d = save_model(str(tmp_path / "c"), bad, make_weights(cfg))
    with pytest.raises(ValueError, match="num_key_value_heads"):
        gk.llm.load(d)


def test_bad_prompts_and_sampling(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)
    with pytest.raises(ValueError, match="empty"):
        m.generate([])
    with pytest.raises(ValueError, match="empty"):
        m.generate([[1, 2], []])
    with pytest.raises(ValueError, match="context of 64"):
        m.generate(list(range(65)))
    with pytest.raises(ValueError, match="context of 64"):
        m.forward([1] * 65)
    with pytest.raises(ValueError, match="vocabulary"):
        m.generate([1, 200])
    with pytest.raises(ValueError, match="no tokenizer"):
        m.generate("hello")
    for kw, msg in [(dict(temperature=float("nan")), "temperature"), (dict(top_k=-1), "top_k"),
                    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(max_new_tokens=-1), "max_new_tokens")]:
        with pytest.raises(ValueError, match=msg):
            m.generate([1, 2], **kw)
    # the C++ layer checks too
    with pytest.raises(ValueError, match="top_p"):
        gk._C.llm.Generation(m._m, [[1]], top_p=2.0)
    # generation stops at the context: prompt 60 + up to 10 new tokens in a 64-token context
    out = m.generate(list(range(60)), max_new_tokens=10, ignore_eos=True)
    assert len(out.ids) == 4 and out.finish_reason == "length"


def test_bf16_close_to_fp32(tiny):
    fam, cfg, w, d = tiny
    ids = [5, 6, 7, 8, 9]
    a = gk.to_numpy(gk.llm.load(d, dtype="bfloat16").forward(ids))
    want = ref_logits(cfg, w, ids, fam)
    assert rel_err(a, want) < 5e-2


def test_hostile_configs(tmp_path):
    cfg = dict(TINY)
    w = make_weights(cfg)
    for bad, msg in [(dict(num_hidden_layers=1 << 40), "num_hidden_layers"), (dict(vocab_size=-1), "vocab_size"),
                     (dict(head_dim=48), "head_dim 48"), (dict(rope_theta=-1.0), "rope_theta"),
                     (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "dynamic"),
                     (dict(hidden_size="x"), "hidden_size")]:
        d = save_model(str(tmp_path / "m"), dict(cfg, **bad), w)
        with pytest.raises(ValueError, match=msg):
            gk.llm.load(d)
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "config.json").write_text("{not json")
    with pytest.raises(ValueError):
        gk.llm.load(str(tmp_path / "j"))


# ---- GPT-2 specifics ----

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


def test_gpt2_random_model():
    cfg = dict(tiny_config("gpt2"), model_type="gpt2")
    m = gk.llm.random_model(cfg, seed=3)
    assert m.config.family == "gpt2" and m.config.format == "random"
    out = m.generate([1, 2, 3], max_new_tokens=5, ignore_eos=True)
    assert len(out.ids) == 5 and all(0 <= t < 97 for t in out.ids)


def write_gpt2_gguf(path, cfg, weights, fmt="F32", tie=False):
    """llama.cpp's GPT-2 layout: projections transposed to [out, in]; returns the HF-layout
    weights as the model sees them after quantization."""
    gguf = pytest.importorskip("gguf")
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
        stored = np.ascontiguousarray(arr.T) if conv else arr
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
        seen[name] = np.ascontiguousarray(deq.T) if conv else deq
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return seen


@pytest.mark.parametrize("fmt", ["F32", "F16", "Q8_0"])
def test_gpt2_gguf(tmp_path, fmt):
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


# ---- more bad input ----

def test_sampling_argument_types(tiny):
    fam, cfg, w, d = tiny
    m = gk.llm.load(d)
    for kw, msg in [(dict(seed=-1), "seed: must be in"), (dict(seed=2 ** 64), "seed: must be in"),
                    (dict(top_k="a"), "top_k: must be an integer"), (dict(top_k=2.5), "top_k: must be an integer"),
                    (dict(temperature="hot"), "temperature: must be a number"),
                    (dict(temperature=None), "temperature: must be a number"),
                    (dict(top_p=float("nan")), "top_p"), (dict(max_new_tokens=2.0), "max_new_tokens"),
                    (dict(max_new_tokens=True), "max_new_tokens"), (dict(temperature=float("-inf")), "temperature")]:
        with pytest.raises(ValueError, match=msg):
            m.generate([1, 2], **kw)
    with pytest.raises(ValueError, match="top_k"):
        list(m.stream([1, 2], top_k=-3)) if m.tokenizer else m.generate([1, 2], top_k=-3)
    # a top_k beyond the vocabulary keeps every token (as top_k = 0), numpy scalars are numbers
    kw = dict(max_new_tokens=6, temperature=np.float32(0.8), seed=np.int64(3), ignore_eos=True)
    assert m.generate([1, 2], top_k=10 ** 12, **kw).ids == m.generate([1, 2], top_k=0, **kw).ids
    # negative temperature means greedy
    assert m.generate([1, 2], temperature=-1.0, max_new_tokens=4, ignore_eos=True).ids == \
        m.generate([1, 2], max_new_tokens=4, ignore_eos=True).ids


def test_failed_load_midway_releases_memory(tmp_path):
    """A load that fails after some tensors were read and converted (here: the progress
    callback raises) frees them all; the error reaches the caller unchanged."""
    cfg = tiny_config("gpt2")
    d = save_model(str(tmp_path / "m"), cfg, make_weights(cfg, "gpt2", seed=27), model_type="gpt2")
    gk.empty_cache()
    before = gk.memory_stats("cpu")["allocated"]
    seen = []

    def progress(done, total):
        seen.append(done)
        if done == total - 2:
            raise KeyboardInterrupt("stop loading")

    with pytest.raises(KeyboardInterrupt, match="stop loading"):
        gk.llm.load(d, progress=progress)
    assert len(seen) > 10
    assert gk.memory_stats("cpu")["allocated"] == before


def test_unsupported_tensor_type_fails_before_reading(tmp_path):
    """Types are checked for every tensor before any is read: nothing is allocated."""
    cfg = dict(TINY)
    w = make_weights(cfg, seed=28)
    w["model.layers.1.mlp.down_proj.weight"] = w["model.layers.1.mlp.down_proj.weight"].astype(np.int32)
    d = save_model(str(tmp_path / "m"), cfg, w)
    calls = []
    with pytest.raises(ValueError, match="down_proj.weight: dtype int32 is not supported"):
        gk.llm.load(d, progress=lambda done, total: calls.append(done))
    assert calls == []


def test_bad_gguf_files(tmp_path):
    gguf = pytest.importorskip("gguf")
    cfg = tiny_config("gpt2")
    w = make_weights(cfg, "gpt2", seed=29)
    path = tmp_path / "g.gguf"
    write_gpt2_gguf(path, cfg, w)
    data = path.read_bytes()
    # truncated inside the tensor data, and inside the header
    for cut, name in [(len(data) - 1000, "t1.gguf"), (200, "t2.gguf")]:
        (tmp_path / name).write_bytes(data[:cut])
        with pytest.raises(ValueError):
            gk.llm.load(str(tmp_path / name))
    # an unknown architecture in GGUF metadata
    wr = gguf.GGUFWriter(str(tmp_path / "x.gguf"), arch="gptneox")
    wr.add_uint32("gptneox.block_count", 1)
    wr.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    with pytest.raises(ValueError, match=r"unsupported model architecture 'gptneox' \(supported: .*gpt2"):
        gk.llm.load(str(tmp_path / "x.gguf"))
    # a GGUF whose block count promises a layer that is not there
    wr = gguf.GGUFWriter(str(tmp_path / "y.gguf"), arch="gpt2")
    for k, v in [("block_count", 3), ("embedding_length", 128), ("feed_forward_length", 80),
                 ("attention.head_count", 2), ("context_length", 64)]:
        wr.add_uint32(f"gpt2.{k}", v)
    wr.add_uint32("gpt2.vocab_size", 97)
    for k, v in w.items():
        if not k.startswith("transformer.h."):
            name = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
                    "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias",
                    "lm_head.weight": "output.weight"}[k]
            wr.add_tensor(name, v)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    with pytest.raises(ValueError, match=r"tensor blk.0.attn_norm.weight is missing"):
        gk.llm.load(str(tmp_path / "y.gguf"))


def test_model_path_errors(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="neither a GGUF file nor a directory"):
        gk.llm.load(str(tmp_path / "notes.txt"))
    d = tmp_path / "noweights"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(TINY, model_type="llama")))
    with pytest.raises(ValueError, match="no .safetensors"):
        gk.llm.load(str(d))
    (d / "config.json").write_text(json.dumps({"vocab_size": 97}))
    with pytest.raises(ValueError, match="missing \"model_type\""):
        gk.llm.load(str(d))
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        gk.llm.load(str(d))
    (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    (d / "config.json").write_text(json.dumps(dict(TINY, model_type="llama")))
    with pytest.raises(ValueError, match="safetensors"):
        gk.llm.load(str(d))


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


@cuda
def test_failed_cuda_load_releases_device_memory(tmp_path):
    cfg = tiny_config("gpt2")
    d = save_model(str(tmp_path / "m"), cfg, make_weights(cfg, "gpt2", seed=31), model_type="gpt2")
    gk.synchronize()
    gk.empty_cache()
    before = gk.memory_stats("cuda")["allocated"]

    def progress(done, total):
        if done == total - 1:
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError, match="abort"):
        gk.llm.load(d, device="cuda", progress=progress)
    gk.synchronize()
    assert gk.memory_stats("cuda")["allocated"] == before


def test_transformers5_rope_parameters():
    """transformers >= 5 writes rope_theta and the scaling inside "rope_parameters"."""
    base = dict(TINY, model_type="llama")
    del base["rope_theta"]
    c = gk._C.llm.config_from_hf_json(json.dumps(dict(base, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})))
    assert c.rope_theta == 500000.0 and c.rope_scaling["type"] == "llama3" and c.rope_scaling["factor"] == 8.0
    c = gk._C.llm.config_from_hf_json(json.dumps(dict(base, rope_parameters={"rope_type": "default",
                                                                             "rope_theta": 100000.0})))
    assert c.rope_theta == 100000.0 and c.rope_scaling["type"] == "none"
    with pytest.raises(ValueError, match="rope_parameters"):
        gk._C.llm.config_from_hf_json(json.dumps(dict(base, rope_parameters=[1])))
