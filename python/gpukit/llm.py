"""Language models: load, generate, stream, chat.

    import gpukit as gk
    model = gk.llm.load()                                  # the default SmolLM2-135M-Instruct GGUF, on the CPU
    out = model.generate("The capital of France is", max_new_tokens=16)
    print(out.text)
    for piece in model.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="", flush=True)

Families: llama (Llama 2/3/3.1/3.2, Mistral, SmolLM2, Mixtral), qwen2, qwen3, gpt2, from a Hugging
Face directory (config.json + safetensors [+ tokenizer.json]) or a GGUF file.
The engine (src/llm) runs the prefill and the decode steps over a paged KV cache;
greedy decoding when temperature <= 0. On CUDA each decode step is one replay of a
captured CUDA graph (Model.cuda_graph = False for eager steps); load(quantize="fp8" |
"int8" | "int4") converts the linear weights at load time.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Mapping, Sequence

from . import _C

_l = _C.llm
Model_ = _l.Model
supported_architectures = _l.supported_architectures


@dataclasses.dataclass
class Output:
    """Result of generate(): `ids` and `text` per prompt (lists when a batch was given)."""
    ids: list
    text: object
    finish_reason: object

    def __str__(self):
        return self.text if isinstance(self.text, str) else "\n".join(self.text)


def _number(name, v, kind):
    """float(v) / operator.index(v) with a ValueError naming the argument."""
    import operator
    try:
        if isinstance(v, (str, bytes, bool)) or v is None:
            raise TypeError
        return float(v) if kind is float else operator.index(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be {'a number' if kind is float else 'an integer'}, got {v!r}") from None


def _check_sampling(max_new_tokens, temperature, top_k, top_p, seed=0):
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: must be an integer >= 0, got {max_new_tokens!r}")
    t = _number("temperature", temperature, float)
    if t != t or t in (float("inf"), float("-inf")):
        raise ValueError(f"temperature: must be finite, got {temperature!r}")
    if _number("top_k", top_k, int) < 0:
        raise ValueError(f"top_k: must be >= 0 (0: off), got {top_k!r}")
    if not (0.0 < _number("top_p", top_p, float) <= 1.0):
        raise ValueError(f"top_p: must be in (0, 1], got {top_p!r}")
    if not 0 <= _number("seed", seed, int) < 2 ** 64:
        raise ValueError(f"seed: must be in [0, 2**64), got {seed!r}")


class Model:
    """A loaded model. Use gk.llm.load()."""

    def __init__(self, impl):
        self._m = impl

    @property
    def config(self):
        return self._m.config

    @property
    def tokenizer(self):
        return self._m.tokenizer

    @property
    def device(self):
        return self._m.device

    @property
    def dtype(self):
        return self._m.dtype

    def __repr__(self):
        return f"gk.llm.Model({self.config!r}, device={self.device}, dtype={self.dtype})"

    # ---- inputs ----
    def _encode(self, prompt):
        if isinstance(prompt, str):
            tok = self.tokenizer
            if tok is None:
                raise ValueError("prompt: this model has no tokenizer; pass token ids")
            ids = tok.encode(prompt)
        else:
            ids = [int(i) for i in prompt]
        if not ids:
            raise ValueError("prompt: empty prompt")
        return ids

    def _prompts(self, prompts):
        """([ids per prompt], batched)."""
        if isinstance(prompts, str):
            return [self._encode(prompts)], False
        seq = list(prompts)
        if not seq:
            raise ValueError("prompt: empty prompt")
        if all(isinstance(p, int) or hasattr(p, "__index__") and not isinstance(p, (str, list, tuple)) for p in seq):
            return [self._encode(seq)], False
        return [self._encode(p) for p in seq], True

    def forward(self, ids):
        """float32 logits [T, V] (a gk.Array) of a fresh sequence of token ids."""
        return self._m.forward([int(i) for i in ids])

    # ---- generation ----
    @property
    def cuda_graph(self) -> bool:
        """Decode steps replay one captured CUDA graph per batch of running sequences
        (CUDA only; default True). Set False to run each step eagerly."""
        return self._m.cuda_graph

    @cuda_graph.setter
    def cuda_graph(self, value: bool):
        self._m.cuda_graph = bool(value)

    @property
    def quantized(self) -> str:
        """"" or the load-time weight format ("fp8", "int8", "int4")."""
        return self._m.quantized

    def profile_decode(self, batch: int = 1, context: int = 128, reps: int = 3):
        """GPU time (ms) of each op of one eager decode step: [(op, layer, ms)]."""
        return self._m.profile_decode(int(batch), int(context), int(reps))

    def _start(self, prompts, max_new_tokens, temperature, top_k, top_p, seed, ignore_eos=False, cuda_graph=None):
        _check_sampling(max_new_tokens, temperature, top_k, top_p, seed)
        return _l.Generation(self._m, prompts, max_new_tokens=max_new_tokens, temperature=float(temperature),
                             top_k=int(top_k), top_p=float(top_p), seed=int(seed), ignore_eos=ignore_eos,
                             cuda_graph=cuda_graph)

    def generate(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop: str | Sequence[str] | None = None,
                 ignore_eos: bool = False, cuda_graph: bool | None = None) -> Output:
        """Generates from a prompt (text or token ids) or a batch of prompts. Stops at EOS,
        any of the `stop` strings (the text is cut before it) or max_new_tokens.
        cuda_graph: None for the model's setting (Model.cuda_graph)."""
        prompts, batched = self._prompts(prompt)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        g = self._start(prompts, max_new_tokens, temperature, top_k, top_p, seed, ignore_eos, cuda_graph)
        tok = self.tokenizer
        texts = [""] * len(prompts)
        decs = [_C.text.StreamDecoder(tok) if tok is not None and stops else None for _ in prompts]
        cut = [None] * len(prompts)
        while not g.done:
            step = g.step()
            if not stops:
                continue
            for r, t in enumerate(step):
                if t < 0 or decs[r] is None:
                    continue
                texts[r] += decs[r].push(t)
                for s in stops:
                    k = texts[r].find(s)
                    if s and k >= 0:
                        cut[r] = k if cut[r] is None else min(cut[r], k)
                if cut[r] is not None:
                    g.finish(r)
        ids = [list(x) for x in g.generated]
        reasons = list(g.finish_reasons)
        out_text = []
        for r, x in enumerate(ids):
            if tok is None:
                out_text.append(None)
            elif cut[r] is not None:
                out_text.append(texts[r][:cut[r]])
            else:
                out_text.append(self._decode(x))
        if batched:
            return Output(ids, out_text, reasons)
        return Output(ids[0], out_text[0], reasons[0])

    def _decode(self, ids):
        eos = set(self.config.eos_ids)
        return self.tokenizer.decode([i for i in ids if i not in eos])

    def stream(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, stop: str | Sequence[str] | None = None) -> Iterator[str]:
        """Yields text pieces as tokens are generated (never half a UTF-8 character)."""
        tok = self.tokenizer
        if tok is None:
            raise ValueError("stream: this model has no tokenizer")
        prompts, batched = self._prompts(prompt)
        if batched and len(prompts) != 1:
            raise ValueError("stream: one prompt at a time")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        g = self._start(prompts, max_new_tokens, temperature, top_k, top_p, seed)
        return self._pieces(g, stops)

    def _pieces(self, g, stops):
        """Text pieces of row 0 of a running Generation, cut before any stop string."""
        dec = _C.text.StreamDecoder(self.tokenizer)
        eos = set(self.config.eos_ids)
        held = ""   # text not yet yielded because it could start a stop string
        longest = max((len(s) for s in stops), default=0)
        while not g.done:
            t = g.step()[0]
            if t < 0 or t in eos:
                break
            held += dec.push(t)
            if stops:
                hits = [held.find(s) for s in stops if s and s in held]
                if hits:
                    piece = held[:min(hits)]
                    if piece:
                        yield piece
                    g.finish(0)
                    return
                safe = len(held) - (longest - 1)
                if safe > 0:
                    yield held[:safe]
                    held = held[safe:]
            elif held:
                yield held
                held = ""
        held += dec.flush()
        if held:
            yield held

    def session(self, max_tokens: int = 2048, system: str | None = None) -> "ChatSession":
        """A multi-turn chat that reuses its KV cache between turns."""
        return ChatSession(self, max_tokens, system)

    def chat(self, messages: Iterable[Mapping[str, str]], stream: bool = False, **kw):
        """Renders `messages` with the model's chat template and generates the answer
        (text; or an iterator of pieces with stream=True)."""
        from . import text as _text
        tok = self.tokenizer
        if tok is None:
            raise ValueError("chat: this model has no tokenizer")
        prompt = _text.render_chat(tok, list(messages), add_generation_prompt=True)
        ids = tok.encode(prompt, add_special_tokens=False)
        if stream:
            return self.stream(ids, **kw)
        return self.generate(ids, **kw).text


def _progress_bar(done, total):
    import sys
    width = 30
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\rloading weights [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


class ChatSession:
    """A multi-turn chat that keeps its KV cache between turns: each turn renders the
    whole conversation with the chat template, keeps the cached tokens that still
    match, and prefills only the rest (chunked prefill over the cached prefix).

        s = model.session()
        s.chat("Hi! Who are you?")
        for piece in s.chat("And what can you do?", stream=True): print(piece, end="")
    """

    def __init__(self, model: Model, max_tokens: int = 2048, system: str | None = None):
        if model.tokenizer is None:
            raise ValueError("session: this model has no tokenizer")
        self.model = model
        self.max_tokens = min(int(max_tokens), model.config.max_positions)
        self._cache = model._m.make_cache([self.max_tokens])
        self._seq = self._cache.add_sequence()
        self._ids = []          # the tokens held by the cache
        self.system = system
        self.messages = []
        self.reused_tokens = 0  # cached tokens reused by the last turn (for tests and curiosity)

    def reset(self):
        self.messages = []
        self._ids = []
        self._cache.truncate(self._seq, 0)

    def chat(self, message: str, stream: bool = False, max_new_tokens: int = 256, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0):
        from . import text as _text
        _check_sampling(max_new_tokens, temperature, top_k, top_p, seed)
        tok = self.model.tokenizer
        msgs = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages + [
            {"role": "user", "content": message}]
        ids = tok.encode(_text.render_chat(tok, msgs, add_generation_prompt=True), add_special_tokens=False)
        if len(ids) + max_new_tokens > self.max_tokens:
            raise ValueError(f"session: the conversation ({len(ids)} tokens + {max_new_tokens} new) exceeds "
                             f"max_tokens={self.max_tokens}; call reset()")
        keep = 0
        while keep < min(len(ids) - 1, len(self._ids)) and ids[keep] == self._ids[keep]:
            keep += 1
        self._cache.truncate(self._seq, keep)
        self.reused_tokens = keep
        self._ids = list(ids)
        g = _l.Generation.resume(self.model._m, self._cache, [self._seq], [ids[keep:]],
                                 max_new_tokens=max_new_tokens, temperature=float(temperature), top_k=int(top_k),
                                 top_p=float(top_p), seed=int(seed))
        self.messages.append({"role": "user", "content": message})

        def run():
            answer = ""
            for piece in self.model._pieces(g, []):
                answer += piece
                yield piece
            # the cache holds the prompt and every generated token but the last
            self._ids = ids + list(g.generated[0])[:-1]
            self.messages.append({"role": "assistant", "content": answer})

        if stream:
            return run()
        return "".join(run())


def _check_quantize(quantize):
    """None, "fp8", "int8", "int4", or "<format>:head=<fp8|int8|int4|none>" (the lm head's
    format; none keeps it unquantized; default: int8 for int4, else the layers' format)."""
    q = "" if quantize is None else str(quantize)
    fmt, _, head = q.partition(":")
    if fmt not in ("", "fp8", "int8", "int4") or (head and (not fmt or head not in (
            "head=fp8", "head=int8", "head=int4", "head=none"))):
        raise ValueError(f'quantize: expected None, "fp8", "int8" or "int4" (optionally ":head=fp8|int8|int4|none"), '
                         f'got {quantize!r}')
    return q


def load(path: str | None = None, device="cpu", dtype="float32", progress=None, quantize: str | None = None,
         cuda_graph: bool = True) -> Model:
    """Loads a model from a GGUF file or a Hugging Face directory (config.json and
    safetensors); without `path`, the default model (gk.io.default_model_path()).
    Tensors are converted to `dtype` and moved to `device` one at a time.
    progress: True for a progress bar on stderr, or a callable(done, total) called
    after each tensor. quantize: "fp8", "int8" (per output channel) or "int4" (groups
    of 128, or 64/32 where K needs it) converts the linear weights of the layers at
    load time (gk.quantize_weight); decode reads them with gk.gemv_quantized.
    cuda_graph: see Model.cuda_graph."""
    if path is None:
        from . import io as _io
        path = _io.default_model_path()
    if progress is True:
        progress = _progress_bar
    elif progress is False:
        progress = None
    m = Model(Model_.load(str(path), device, dtype, progress, _check_quantize(quantize)))
    m.cuda_graph = cuda_graph
    return m


def random_model(config: Mapping, device="cpu", dtype="float32", seed: int = 0, quantize: str | None = None,
                 share_layers: bool = False, cuda_graph: bool = True) -> Model:
    """A model with random weights from a Hugging Face style config dict (needs
    "model_type"; benchmarks and tests; no tokenizer). share_layers: every layer holds
    a copy of layer 0's draw (fast set-up of large benchmark models)."""
    import json
    m = Model(Model_.random(json.dumps(dict(config)), device, dtype, int(seed), _check_quantize(quantize),
                            bool(share_layers)))
    m.cuda_graph = cuda_graph
    return m


__all__ = ["load", "random_model", "ChatSession", "Model", "Output", "supported_architectures"]
