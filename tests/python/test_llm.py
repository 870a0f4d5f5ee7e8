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
