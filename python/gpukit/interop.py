"""Zero-copy exchange with other array libraries.

gpukit arrays implement ``__dlpack__`` / ``__dlpack_device__`` (DLPack, legacy and
versioned capsules), ``__cuda_array_interface__`` (version 3, CUDA arrays) and
``__array__`` (NumPy, CPU arrays; a copy for CUDA arrays). This module holds the
importing side:

    x = gk.from_dlpack(torch_tensor)      # shares memory, ordered on gpukit's stream
    y = torch.from_dlpack(x)              # shares memory, ordered on torch's stream

Stream ordering on CUDA follows the protocols: when gpukit imports, it passes its
current stream to the producer, which makes that stream wait for the producer's
pending work; when gpukit exports, the consumer's stream waits on gpukit's current
stream. The memory is shared, not copied: keep the source alive (or at least do
not let its library reuse the memory) until gpukit's queued work on it is done,
as with any two libraries sharing CUDA memory.
"""
from __future__ import annotations

from . import _C

_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_MAX_VERSION = (1, 1)


def _is_capsule(obj) -> bool:
    return type(obj).__name__ == "PyCapsule"


def _consumer_stream(dev):
    """gpukit's current stream on the producer's device, as the protocol's int."""
    kind, index = int(dev[0]), int(dev[1])
    if kind not in (_kDLCUDA, _kDLCUDAManaged):
        return None
    if not _C.built_with_cuda():
        raise TypeError("from_dlpack: the data is on CUDA but gpukit was built without CUDA")
    if not (0 <= index < _C.cuda_device_count()):
        raise ValueError(f"from_dlpack: the data is on cuda:{index}, which is not an available CUDA device")
    return _C.Stream.current(f"cuda:{index}").handle


def _capsule_of(obj):
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(obj).__name__} does not implement __dlpack__")
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (_kDLCPU, 0)
    stream = _consumer_stream(dev)
    kwargs = {} if stream is None else {"stream": stream}
    try:
        return obj.__dlpack__(max_version=_MAX_VERSION, **kwargs)
    except TypeError:
        # A producer from before DLPack 1.0 does not know max_version (any other
        # TypeError is raised again by this second call).
        return obj.__dlpack__(**kwargs)


def from_dlpack(obj, device=None, copy=None) -> _C.Array:
    """A gpukit.Array sharing the memory of obj (any object with ``__dlpack__``, or a
    DLPack capsule).

    device: move the result there (a copy unless it is already there).
    copy: True always copies; False never copies (raises ValueError/BufferError when a
    copy would be needed, e.g. for read-only sources or another device); None copies
    only when needed.
    """
    if copy not in (None, True, False):
        raise TypeError("copy: expected True, False or None")
    capsule = obj if _is_capsule(obj) else _capsule_of(obj)
    r = _C._from_dlpack_capsule(capsule, copy=copy)  # copies when copy=True or the source is read-only
    if device is not None and r.device != _C.Device(device):
        if copy is False:
            raise ValueError(f"from_dlpack: the data is on {r.device}, moving it to {device} needs a copy, "
                             "but copy=False")
        r = r.to(device)
    return r


def from_cuda_array_interface(obj, copy=None) -> _C.Array:
    """A gpukit.Array sharing the CUDA memory described by
    ``obj.__cuda_array_interface__`` (or by a dict of that form). obj is kept alive by the
    result; if the interface names a stream, gpukit's current stream waits for it."""
    if isinstance(obj, dict):
        desc = obj
    else:
        try:
            desc = obj.__cuda_array_interface__
        except AttributeError:
            raise TypeError(f"from_cuda_array_interface: {type(obj).__name__} has no __cuda_array_interface__") \
                from None
    return _C._from_cai(desc, obj, copy=copy)


__all__ = ["from_dlpack", "from_cuda_array_interface"]
