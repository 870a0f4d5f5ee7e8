"""Tokenizers and chat templates.

    tok = gk.text.Tokenizer.from_file("tokenizer.json")
    ids = tok.encode("Hello world")          # list[int]
    tok.decode(ids)                          # 'Hello world'
    dec = tok.decoder()                      # streaming: never emits half a character
    for i in ids: print(dec.push(i), end="")
    print(dec.flush())
    tok = gk.text.Tokenizer.from_gguf("model.gguf")       # tokenizer.ggml.* metadata
    prompt = gk.text.render_chat(tok, [{"role": "user", "content": "Hi"}])

Invalid UTF-8 in `bytes` input is replaced by U+FFFD (maximal-subpart rule, like
``bytes.decode("utf-8", "replace")``) before encoding.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from . import _C

_t = _C.text
Tokenizer = _t.Tokenizer
StreamDecoder = _t.StreamDecoder

_TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """The tokenizer.* metadata of a GGUF file as a dict (uses gk.io.GGUF when built,
    else the `gguf` PyPI package)."""
    io = getattr(_C, "io", None)
    if io is not None and hasattr(io, "GGUF"):
        try:
            g = io.GGUF(path)
            md = g.metadata if not callable(getattr(g, "metadata", None)) else g.metadata()
            return {k: md[k] for k in _TOKENIZER_KEYS if k in md}
        except (AttributeError, TypeError, KeyError):  # a reader with another metadata API
            pass
    try:
        from gguf import GGUFReader  # type: ignore
    except ImportError:
        raise ImportError("reading GGUF metadata needs gk.io.GGUF or the `gguf` package") from None

    r = GGUFReader(path)
    out: dict[str, Any] = {}
    for k in _TOKENIZER_KEYS:
        f = r.fields.get(k)
        if f is None:
            continue
        out[k] = _field_value(f)
    return out


def _field_value(f):
    import numpy as np
    from gguf import GGUFValueType  # type: ignore

    t = f.types
    if t[0] == GGUFValueType.ARRAY:
        if t[-1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]) for i in f.data]
        return np.concatenate([f.parts[i] for i in f.data]).tolist() if f.data else []
    if t[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
    v = f.parts[f.data[0]][0]
    return bool(v) if t[0] == GGUFValueType.BOOL else v.item()


def _from_gguf(source) -> Tokenizer:
    """A tokenizer from a GGUF path, a gk.io.GGUF object, or a metadata dict."""
    if isinstance(source, Mapping):
        return Tokenizer.from_gguf_metadata(dict(source))
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        import os

        return Tokenizer.from_gguf_metadata(read_gguf_metadata(os.fspath(source)))
    md = getattr(source, "metadata", None)
    if md is not None:
        md = md() if callable(md) else md
        return Tokenizer.from_gguf_metadata({k: md[k] for k in _TOKENIZER_KEYS if k in md})
    raise TypeError(f"source: expected a path, a GGUF object or a dict, got {type(source).__name__}")


Tokenizer.from_gguf = staticmethod(_from_gguf)


def render_chat(template_or_tokenizer, messages: Iterable[Mapping[str, str]], add_generation_prompt: bool = True,
                bos_token: str | None = None, eos_token: str | None = None) -> str:
    """Renders a chat with a model's Jinja chat template in a sandboxed interpreter."""
    if isinstance(template_or_tokenizer, Tokenizer):
        tok = template_or_tokenizer
        template = tok.chat_template
        if template is None:
            raise ValueError("template_or_tokenizer: the tokenizer has no chat template")
        if bos_token is None and tok.bos_id is not None:
            bos_token = tok.id_to_token(tok.bos_id)
        if eos_token is None and tok.eos_id is not None:
            eos_token = tok.id_to_token(tok.eos_id)
    elif isinstance(template_or_tokenizer, str):
        template = template_or_tokenizer
    else:
        raise TypeError("template_or_tokenizer: expected a template string or a Tokenizer")
    msgs = []
    for i, m in enumerate(messages):
        try:
            role, content = m["role"], m["content"]
        except (KeyError, TypeError):
            raise ValueError(f"messages[{i}]: expected a mapping with 'role' and 'content'") from None
        if not isinstance(role, str) or not isinstance(content, str):
            raise TypeError(f"messages[{i}]: role and content must be str")
        msgs.append((role, content))
    return _t._render_chat(template, msgs, bool(add_generation_prompt), bos_token or "", eos_token or "")


__all__ = ["Tokenizer", "StreamDecoder", "render_chat", "read_gguf_metadata"]
