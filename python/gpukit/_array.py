"""Array factories, NumPy conversion and the pure-Python parts of gpukit.Array."""
from __future__ import annotations

import numpy as np

from . import _C
from ._C import Array, DType

try:
    import ml_dtypes as _mld
except ImportError:  # pragma: no cover
    _mld = None

# Element types NumPy lacks: stored bits, the ml_dtypes type that views them.
_BITS_VIEW = {
    DType.bfloat16: (np.uint16, "bfloat16"),
    DType.float8_e4m3fn: (np.uint8, "float8_e4m3fn"),
    DType.float8_e5m2: (np.uint8, "float8_e5m2"),
}
_NP_NAMES = {"bfloat16", "float8_e4m3fn", "float8_e5m2"}


def _ml(name):
    if _mld is None:
        raise TypeError(f"{name} arrays need the ml_dtypes package to convert to/from NumPy")
    return np.dtype(getattr(_mld, name))


def from_numpy(a: np.ndarray) -> Array:
    """A zero-copy view of a NumPy array (kept alive by the view)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"array: expected numpy.ndarray, got {type(a).__name__}")
    name = a.dtype.name
    if any(s % a.itemsize for s in a.strides) if a.itemsize else False:
        a = np.ascontiguousarray(a)
    if name in _NP_NAMES:
        bits = np.uint16 if a.itemsize == 2 else np.uint8
        return _C._from_numpy(a.view(bits), dtype=name)
    if a.dtype.byteorder == ">":
        raise TypeError("array: big-endian arrays are not supported")
    return _C._from_numpy(a)


def to_numpy(x: Array) -> np.ndarray:
    """The array's values as NumPy (zero-copy for CPU arrays; a copy from CUDA)."""
    if x.device.type != "cpu":
        x = x.to("cpu")
    raw = x._numpy_raw()
    if x.dtype in _BITS_VIEW:
        return raw.view(_ml(_BITS_VIEW[x.dtype][1]))
    return raw


def _dtype_of_numpy(a: np.ndarray):
    return a.dtype.name


def asarray(obj, dtype=None, device=None, copy=None, stream=None) -> Array:
    """Converts obj (Array, NumPy array, DLPack or CUDA-array-interface object, nested
    lists, scalars) to an Array, without copying when possible."""
    if isinstance(obj, Array):
        r = obj
        if device is not None and r.device != _C.Device(device):
            r = r.to(device, stream=stream)
        if dtype is not None and r.dtype != _as_dtype(dtype):
            r = r.astype(dtype, stream=stream)
        elif copy and r is obj:
            r = r.copy(stream=stream)
        return r
    if not isinstance(obj, np.ndarray) and (hasattr(obj, "__dlpack__") or hasattr(obj, "__cuda_array_interface__")):
        from . import interop
        r = interop.from_dlpack(obj) if hasattr(obj, "__dlpack__") else interop.from_cuda_array_interface(obj)
        return asarray(r, dtype=dtype, device=device, copy=copy, stream=stream)
    if isinstance(obj, np.ndarray):
        a = obj
    else:
        if isinstance(obj, (bool, int, float)) and not isinstance(obj, np.generic) and dtype is None:
            a = np.asarray(obj, dtype=np.bool_ if isinstance(obj, bool) else
                           (np.int64 if isinstance(obj, int) else np.float32))
        else:
            a = np.asarray(obj)
        if a.dtype == np.float64 and dtype is None and not isinstance(obj, np.generic):
            a = a.astype(np.float32)  # Python floats default to float32, like torch
        if a.dtype.kind in "OUSV" and a.dtype.name not in _NP_NAMES:
            raise TypeError(f"array: cannot convert object of dtype {a.dtype} to a gpukit.Array")
        copy = False
    if a.dtype.kind in "OUSVc" and a.dtype.name not in _NP_NAMES:
        raise TypeError(f"array: NumPy dtype {a.dtype} is not supported")
    r = from_numpy(a)
    if copy:
        r = r.copy()
    if dtype is not None and r.dtype != _as_dtype(dtype):
        r = r.astype(dtype)
    if device is not None and _C.Device(device).type != "cpu":
        r = r.to(device, stream=stream)
    return r


def array(obj, dtype=None, device=None, stream=None) -> Array:
    """Like asarray, but always returns a new buffer."""
    return asarray(obj, dtype=dtype, device=device, copy=True, stream=stream)


def _as_dtype(t):
    return t if isinstance(t, DType) else getattr(DType, _C.dtype_name(t))


def empty(shape, dtype=None, device=None, stream=None) -> Array:
    return _C.empty(shape, dtype, device, stream)


def full(shape, fill_value, dtype=None, device=None, stream=None) -> Array:
    return _C.full(shape, fill_value, dtype, device, stream)


def zeros(shape, dtype=None, device=None, stream=None) -> Array:
    return _C.full(shape, 0, dtype if dtype is not None else DType.float32, device, stream)


def ones(shape, dtype=None, device=None, stream=None) -> Array:
    return _C.full(shape, 1, dtype if dtype is not None else DType.float32, device, stream)


def arange(start, stop=None, step=1, dtype=None, device=None, stream=None) -> Array:
    all_int = all(isinstance(v, int) for v in (start, stop, step) if v is not None)
    return _C.arange(float(start), None if stop is None else float(stop), float(step), dtype, device, stream,
                     all_int)


def empty_like(a, dtype=None, device=None):
    return empty(a.shape, dtype or a.dtype, device or a.device)


def zeros_like(a, dtype=None, device=None):
    return zeros(a.shape, dtype or a.dtype, device or a.device)


def ones_like(a, dtype=None, device=None):
    return ones(a.shape, dtype or a.dtype, device or a.device)


def full_like(a, fill_value, dtype=None, device=None):
    return full(a.shape, fill_value, dtype or a.dtype, device or a.device)


# ---- methods of Array written in Python ----

def _numpy(self):
    return to_numpy(self)


def _array_protocol(self, dtype=None, copy=None):
    a = to_numpy(self)
    if dtype is not None:
        a = a.astype(dtype, copy=False)
    if copy:
        a = a.copy()
    return a


def _repr(self):
    dev = "" if self.device.type == "cpu" else f", device='{self.device}'"
    try:
        body = np.array2string(to_numpy(self), separator=", ", prefix="gk.array(")
    except Exception as e:  # a failed device still prints something
        body = f"<unavailable: {e}>"
    return f"gk.array({body}, dtype={_C.dtype_name(self.dtype)}{dev})"


def _str(self):
    return str(to_numpy(self))


def _item(self):
    if self.size != 1:
        raise ValueError(f"item: only arrays of one element can be converted to a Python scalar (size {self.size})")
    return to_numpy(self).reshape(()).item()


def _tolist(self):
    return to_numpy(self).tolist()


def _bool(self):
    if self.size != 1:
        raise ValueError("The truth value of an array with more than one element is ambiguous; use .any() or .all()")
    return bool(_item(self))


def _setitem(self, key, value):
    _C._setitem(self, key, value)


def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d array")
    for i in range(self.shape[0]):
        yield self[i]


def _dtype_repr(self):
    return f"gpukit.{_C.dtype_name(self)}"


Array.numpy = _numpy
Array.__array__ = _array_protocol
Array.__repr__ = _repr
Array.__str__ = _str
Array.item = _item
Array.tolist = _tolist
Array.__bool__ = _bool
Array.__float__ = lambda self: float(_item(self))
Array.__int__ = lambda self: int(_item(self))
Array.__index__ = lambda self: int(_item(self)) if self.dtype in (
    DType.int8, DType.int16, DType.int32, DType.int64, DType.uint8) else (_ for _ in ()).throw(
        TypeError("only integer arrays can be used as an index"))
Array.__setitem__ = _setitem
Array.__iter__ = _iter
DType.__repr__ = _dtype_repr
DType.__str__ = lambda self: _C.dtype_name(self)
DType.itemsize = property(lambda self: _C.dtype_itemsize(self))
