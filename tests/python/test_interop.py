"""Interop: __array__, DLPack both ways, __cuda_array_interface__, data_ptr.

CPU parts (NumPy, hand-made capsules); the torch / CuPy parts are in
test_interop_gpu.py.
"""
import ctypes
import gc
import sys

import numpy as np
import pytest

import gpukit as gk

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None

HAS_CUDA = gk.cuda.is_available()

NP_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


def np_ptr(a):
    return a.__array_interface__["data"][0]


def rand_np(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return np.asarray(rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True), dtype)
    return np.asarray(rng.standard_normal(shape) * 10, dtype)


# ---- the DLPack ABI, declared independently with ctypes, to inspect capsules ----
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_api = ctypes.pythonapi
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def capsule_name(cap):
    return _api.PyCapsule_GetName(cap).decode()


def capsule_struct(cap):
    name = capsule_name(cap)
    ptr = _api.PyCapsule_GetPointer(cap, name.encode())
    return (DLManagedTensorVersioned if name == "dltensor_versioned" else DLManagedTensor).from_address(ptr)


class FakeProducer:
    """A hand-made DLPack tensor over a NumPy buffer, with a counting deleter."""

    def __init__(self, buf, shape, strides=None, code=2, bits=32, lanes=1, ndim=None, device=(1, 0),
                 byte_offset=0, null_shape=False, data=None, version=None, flags=0):
        self.buf = buf
        self.deleted = 0
        n = len(shape)
        self.shape = (ctypes.c_int64 * max(n, 1))(*shape)
        self.strides = (ctypes.c_int64 * max(n, 1))(*strides) if strides is not None else None
        self.cb = DELETER(self._delete)
        t = DLTensor(data if data is not None else np_ptr(buf), DLDevice(*device), n if ndim is None else ndim,
                     DLDataType(code, bits, lanes), None if null_shape else self.shape, self.strides, byte_offset)
        if version is None:
            self.managed = DLManagedTensor(t, None, self.cb)
            name = b"dltensor"
        else:
            self.managed = DLManagedTensorVersioned(DLPackVersion(*version), None, self.cb, flags, t)
            name = b"dltensor_versioned"
        self.capsule = _api.PyCapsule_New(ctypes.addressof(self.managed), name, None)

    def _delete(self, _ptr):
        self.deleted += 1


# ---- NumPy round trips (CPU) ----
@pytest.mark.parametrize("dtype", NP_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5), (2, 0, 3), (4, 1, 6)])
def test_numpy_to_gk_zero_copy(dtype, shape):
    a = rand_np(shape, dtype)
    x = gk.from_dlpack(a)
    assert x.shape == a.shape and str(x.dtype) == np.dtype(dtype).name
    np.testing.assert_array_equal(x.numpy(), a)
    if a.size:
        assert x.data_ptr() == np_ptr(a)
        a.reshape(-1)[0] = not a.reshape(-1)[0] if dtype == "bool" else 42
        assert x.numpy().reshape(-1)[0] == a.reshape(-1)[0]


@pytest.mark.parametrize("dtype", NP_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 0, 3)])
def test_gk_to_numpy_zero_copy(dtype, shape):
    ref = rand_np(shape, dtype, seed=1)
    x = gk.asarray(ref.copy())
    n = np.from_dlpack(x)
    assert n.dtype == np.dtype(dtype) and n.shape == shape
    np.testing.assert_array_equal(n, ref)
    if ref.size:
        assert np_ptr(n) == x.data_ptr()
        idx = (0,) * len(shape)
        x[idx] = True if dtype == "bool" and not ref[idx] else (False if dtype == "bool" else 5)
        assert n[idx] == x.numpy()[idx] and n[idx] != ref[idx]


@pytest.mark.parametrize("make", [
    lambda a: a.T,
    lambda a: a[:, 1::2],
    lambda a: a[::2, ::-1],
    lambda a: a[1:, :3],
    lambda a: a[::-1],
    lambda a: a[:, 2],
])
def test_numpy_strided_views(make):
    base = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    v = make(base)
    x = gk.from_dlpack(v)
    np.testing.assert_array_equal(x.numpy(), v)
    assert x.strides == tuple(s // 4 for s in v.strides)
    # zero copy: writing the base shows through
    base += 100
    np.testing.assert_array_equal(x.numpy(), v)
    # and gpukit's strided view exports back with the same strides
    back = np.from_dlpack(x)
    assert back.strides == v.strides and np_ptr(back) == np_ptr(v)


@pytest.mark.parametrize("make", [
    lambda x: x.T,
    lambda x: x[:, 1::2],
    lambda x: x[::2],
    lambda x: x[1:, 3],
    lambda x: x.broadcast_to((2, 5, 7)) if isinstance(x, gk.Array) else np.broadcast_to(x, (2, 5, 7)),
])
def test_gk_strided_views_to_numpy(make):
    ref = np.arange(5 * 7, dtype=np.float64).reshape(5, 7)
    x = gk.asarray(ref.copy())
    v = make(x)
    n = np.from_dlpack(v)
    np.testing.assert_array_equal(n, make(ref))
    assert n.strides == tuple(s * 8 for s in v.strides) and np_ptr(n) == v.data_ptr()


def test_numpy_readonly_is_copied():
    r = np.arange(4.0)
    r.flags.writeable = False
    y = gk.from_dlpack(r)
    np.testing.assert_array_equal(y.numpy(), r)
    assert y.data_ptr() != np_ptr(r)
    with pytest.raises(BufferError, match="read-only"):
        gk.from_dlpack(r, copy=False)
    b = np.broadcast_to(np.arange(3.0), (2, 3))  # read-only, stride 0
    z = gk.from_dlpack(b)
    np.testing.assert_array_equal(z.numpy(), b)


def test_copy_argument():
    a = np.arange(6, dtype=np.int32)
    x = gk.from_dlpack(a, copy=True)
    assert x.data_ptr() != np_ptr(a)
    a[0] = 99
    assert x.numpy()[0] == 0
    y = gk.from_dlpack(a, copy=False)
    assert y.data_ptr() == np_ptr(a)
    with pytest.raises(TypeError):
        gk.from_dlpack(a, copy="yes")
    # producer side: numpy asks gpukit for a copy
    g = gk.arange(4, dtype=gk.float32)
    c = np.from_dlpack(g, copy=True)
    c[0] = 7
    assert g.numpy()[0] == 0
    assert np_ptr(np.from_dlpack(g, copy=False)) == g.data_ptr()


def test_unsupported_numpy_dtypes():
    for dt in ["uint16", "uint32", "uint64", "complex64"]:
        with pytest.raises(TypeError, match="not supported"):
            gk.from_dlpack(np.zeros(3, dt))


@pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes")
@pytest.mark.parametrize("name,code", [("bfloat16", 4), ("float8_e4m3fn", 10), ("float8_e5m2", 12)])
def test_narrow_floats_through_capsules(name, code):
    mdt = np.dtype(getattr(ml_dtypes, name))
    ref = np.array([0.5, -1.25, 3.0, 0.0, -0.0, 448.0 if "e4m3" in name else 1024.0], dtype=np.float32).astype(mdt)
    x = gk.asarray(ref.copy())
    assert str(x.dtype) == name
    for mv in (None, (1, 0), (1, 1)):
        cap = x.__dlpack__(max_version=mv)
        s = capsule_struct(cap)
        assert (s.dl_tensor.dtype.code, s.dl_tensor.dtype.bits, s.dl_tensor.dtype.lanes) == (code, itemsize(mdt) * 8, 1)
        y = gk.from_dlpack(cap)
        assert y.dtype == x.dtype and y.data_ptr() == x.data_ptr()
        np.testing.assert_array_equal(y.numpy().view(np.uint8), ref.view(np.uint8))
    # NumPy itself cannot take these through DLPack: a clean error, not a crash
    with pytest.raises((BufferError, RuntimeError, TypeError)):
        np.from_dlpack(x)


def itemsize(dt):
    return np.dtype(dt).itemsize


def test_bool_codes():
    x = gk.asarray(np.array([True, False, True]))
    s = capsule_struct(x.__dlpack__())
    assert (s.dl_tensor.dtype.code, s.dl_tensor.dtype.bits) == (6, 8)
    np.testing.assert_array_equal(np.from_dlpack(x), [True, False, True])


# ---- capsule protocol details ----
def test_dlpack_device_and_capsule_layout():
    x = gk.arange(12, dtype=gk.float32).reshape(3, 4)[:, ::2]
    assert x.__dlpack_device__() == (1, 0)
    legacy = x.__dlpack__()
    assert capsule_name(legacy) == "dltensor"
    v10 = x.__dlpack__(max_version=(1, 0))
    v11 = x.__dlpack__(max_version=(1, 5))
    vcopy = x.__dlpack__(max_version=(1, 1), copy=True)
    for cap in (v10, v11, vcopy):
        assert capsule_name(cap) == "dltensor_versioned"
    s10, s11, sc = capsule_struct(v10), capsule_struct(v11), capsule_struct(vcopy)
    assert (s10.version.major, s10.version.minor) == (1, 0)
    assert (s11.version.major, s11.version.minor) == (1, 1)
    assert s11.flags == 0 and sc.flags & 2 and not sc.flags & 1
    t = s11.dl_tensor
    assert t.ndim == 2 and [t.shape[i] for i in range(2)] == [3, 2] and [t.strides[i] for i in range(2)] == [4, 2]
    assert (t.device.device_type, t.device.device_id) == (1, 0) and t.data == x.data_ptr() and t.byte_offset == 0
    st = capsule_struct(legacy).dl_tensor
    assert st.data == x.data_ptr() and st.ndim == 2
    # a copy made for copy=True is compact and has its own memory
    tc = sc.dl_tensor
    assert tc.data != x.data_ptr() and [tc.strides[i] for i in range(2)] == [2, 1]
    np.testing.assert_array_equal(gk.from_dlpack(vcopy).numpy(), x.numpy())
    assert capsule_name(vcopy) == "used_dltensor_versioned"
    gk.from_dlpack(legacy)
    assert capsule_name(legacy) == "used_dltensor"
    with pytest.raises(ValueError, match="already consumed"):
        gk.from_dlpack(legacy)
    # old-style consumers (no max_version) and the other keywords
    assert capsule_name(x.__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)) == "dltensor"
    with pytest.raises(TypeError):
        x.__dlpack__(None)  # keyword-only per the protocol
    with pytest.raises(TypeError):
        x.__dlpack__(max_version=3)
    with pytest.raises(TypeError):
        x.__dlpack__(max_version=("a", "b"))
    with pytest.raises(TypeError):
        x.__dlpack__(dl_device=(1,))
    with pytest.raises(TypeError):
        x.__dlpack__(copy=1)


def test_dl_device_argument_cpu():
    x = gk.arange(5, dtype=gk.int32)
    cap = x.__dlpack__(max_version=(1, 1), dl_device=(1, 0))
    assert capsule_struct(cap).dl_tensor.data == x.data_ptr()
    with pytest.raises(BufferError):
        x.__dlpack__(max_version=(1, 1), dl_device=(4, 0))  # OpenCL
    if not HAS_CUDA:
        with pytest.raises(BufferError):
            x.__dlpack__(max_version=(1, 1), dl_device=(2, 0))


def test_unconsumed_and_consumed_capsules_release_memory():
    base = np.arange(10, dtype=np.float32)
    before = sys.getrefcount(base)
    x = gk.from_dlpack(base)
    assert sys.getrefcount(base) > before
    cap = x.__dlpack__(max_version=(1, 1))
    cap2 = x.__dlpack__()
    del x
    assert sys.getrefcount(base) > before  # the capsules keep the memory
    del cap, cap2  # never consumed: their destructors free the tensors
    gc.collect()
    assert sys.getrefcount(base) == before
    y = gk.from_dlpack(base)
    z = gk.from_dlpack(y.__dlpack__(max_version=(1, 1)))
    del y
    assert sys.getrefcount(base) > before
    z2 = z[1:]
    del z
    np.testing.assert_array_equal(z2.numpy(), base[1:])
    del z2
    gc.collect()
    assert sys.getrefcount(base) == before


def test_hand_made_producer_deleter_called_once():
    buf = np.arange(12, dtype=np.float32)
    p = FakeProducer(buf, (3, 4), strides=None)  # null strides: compact row-major
    x = gk.from_dlpack(p.capsule)
    np.testing.assert_array_equal(x.numpy(), buf.reshape(3, 4))
    assert x.data_ptr() == np_ptr(buf) and p.deleted == 0
    assert capsule_name(p.capsule) == "used_dltensor"
    v = x[1:, ::2]
    del x
    gc.collect()
    assert p.deleted == 0
    del v
    gc.collect()
    assert p.deleted == 1


def test_hand_made_producer_offsets_and_negative_strides():
    buf = np.arange(20, dtype=np.int64)
    p = FakeProducer(buf, (2, 3), strides=(-5, 2), code=0, bits=64, byte_offset=8 * 10)
    x = gk.from_dlpack(p.capsule)
    ref = np.lib.stride_tricks.as_strided(buf[10:], (2, 3), (-40, 16))
    np.testing.assert_array_equal(x.numpy(), ref)
    del x
    gc.collect()
    assert p.deleted == 1


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(shape=(2, 3), ndim=-1), ValueError, "ndim"),
    (dict(shape=(2, 3), ndim=1000), ValueError, "ndim"),
    (dict(shape=(2, -3)), ValueError, "negative"),
    (dict(shape=(2, 3), null_shape=True), ValueError, "shape"),
    (dict(shape=(4,), code=5, bits=64), TypeError, "complex"),
    (dict(shape=(4,), code=2, bits=32, lanes=4), TypeError, "lanes"),
    (dict(shape=(4,), code=2, bits=24), TypeError, "not supported"),
    (dict(shape=(4,), code=99, bits=8), TypeError, "not supported"),
    (dict(shape=(4,), device=(4, 0)), TypeError, "device type"),
    (dict(shape=(4,), device=(10, 0)), TypeError, "device type"),
    (dict(shape=(2 ** 62, 2 ** 62)), ValueError, None),
    (dict(shape=(3,), strides=(2 ** 62,)), ValueError, "overflow"),
    (dict(shape=(3,), data=0), ValueError, "null"),
])
def test_bad_capsules_raise_and_leave_ownership(kwargs, exc, match):
    buf = np.zeros(64, dtype=np.float32)
    p = FakeProducer(buf, **kwargs)
    with pytest.raises(exc, match=match):
        gk.from_dlpack(p.capsule)
    assert p.deleted == 0 and capsule_name(p.capsule) == "dltensor"


def test_hand_made_versioned_producer():
    buf = np.arange(8, dtype=np.float32)
    p = FakeProducer(buf, (2, 4), strides=(4, 1), version=(1, 3), flags=2)  # newer minor, IS_COPIED
    x = gk.from_dlpack(p.capsule)
    assert x.data_ptr() == np_ptr(buf) and capsule_name(p.capsule) == "used_dltensor_versioned"
    np.testing.assert_array_equal(x.numpy(), buf.reshape(2, 4))
    del x
    gc.collect()
    assert p.deleted == 1
    # read-only: gpukit copies (its arrays are writable) and releases the source at once
    r = FakeProducer(buf, (8,), version=(1, 0), flags=1)
    y = gk.from_dlpack(r.capsule)
    assert y.data_ptr() != np_ptr(buf) and r.deleted == 1
    np.testing.assert_array_equal(y.numpy(), buf)
    r2 = FakeProducer(buf, (8,), version=(1, 0), flags=1)
    with pytest.raises(BufferError, match="read-only"):
        gk.from_dlpack(r2.capsule, copy=False)
    gc.collect()
    assert r2.deleted == 1
    # another major version: only the deleter may be used
    q = FakeProducer(buf, (8,), version=(2, 0))
    with pytest.raises(BufferError, match="major version 2"):
        gk.from_dlpack(q.capsule)
    assert q.deleted == 1 and capsule_name(q.capsule) == "used_dltensor_versioned"


def test_misaligned_pointer_rejected():
    buf = np.zeros(16, dtype=np.float32)
    p = FakeProducer(buf, (3,), byte_offset=2)
    with pytest.raises(ValueError, match="aligned"):
        gk.from_dlpack(p.capsule)
    assert p.deleted == 0 and capsule_name(p.capsule) == "dltensor"


def test_foreign_capsule_and_non_dlpack_objects():
    other = _api.PyCapsule_New(ctypes.addressof(ctypes.c_int(0)), b"not_dlpack", None)
    with pytest.raises(TypeError, match="not_dlpack"):
        gk.from_dlpack(other)
    with pytest.raises(TypeError, match="__dlpack__"):
        gk.from_dlpack([1, 2, 3])


class OnlyDlpack:
    """Exposes just the protocol of a wrapped NumPy array (like a foreign library)."""

    def __init__(self, a, legacy=False):
        self.a, self.legacy, self.calls = a, legacy, []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        if self.legacy and "max_version" in kw:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_asarray_takes_dlpack_objects_and_old_producers():
    a = np.arange(6, dtype=np.float32)
    w = OnlyDlpack(a)
    x = gk.asarray(w)
    assert x.data_ptr() == np_ptr(a) and w.calls == [{"max_version": (1, 1)}]
    old = OnlyDlpack(a, legacy=True)
    y = gk.from_dlpack(old)
    assert y.data_ptr() == np_ptr(a) and old.calls == [{"max_version": (1, 1)}, {}]
    z = gk.from_dlpack(x, device="cpu")
    assert z.data_ptr() == np_ptr(a)


def test_gk_to_gk_through_protocol():
    x = gk.arange(10, dtype=gk.int64)[2:8:2]
    y = gk.from_dlpack(x)
    assert y.data_ptr() == x.data_ptr() and y.strides == x.strides
    np.testing.assert_array_equal(y.numpy(), [2, 4, 6])


# ---- __array__ and data_ptr ----
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_array_protocol_zero_copy(dtype):
    ref = rand_np((4, 3), dtype, seed=3)
    x = gk.asarray(ref.copy())
    n = np.asarray(x)
    assert np_ptr(n) == x.data_ptr()
    np.testing.assert_array_equal(n, ref)
    x[0, 0] = not ref[0, 0] if dtype == "bool" else 9
    assert n[0, 0] == x.numpy()[0, 0]
    c = np.array(x, copy=True)
    assert np_ptr(c) != x.data_ptr()
    f = np.asarray(x, dtype=np.float64)
    np.testing.assert_array_equal(f, n.astype(np.float64))


def test_array_protocol_views_and_data_ptr():
    x = gk.asarray(np.arange(20, dtype=np.float32).reshape(4, 5))
    v = x[1:, ::2]
    n = np.asarray(v)
    assert np_ptr(n) == v.data_ptr() == x.data_ptr() + (5 * 1) * 4
    assert n.strides == (20, 8)
    np.testing.assert_array_equal(n, np.arange(20, dtype=np.float32).reshape(4, 5)[1:, ::2])


def test_cuda_array_interface_absent_on_cpu():
    x = gk.arange(3, dtype=gk.float32)
    assert not hasattr(x, "__cuda_array_interface__")
    with pytest.raises(TypeError):
        gk.from_cuda_array_interface(np.arange(3))


def test_no_typestr_error_is_type_and_attribute_error():
    e = gk._C.CudaArrayInterfaceTypeError
    assert issubclass(e, TypeError) and issubclass(e, AttributeError)


def test_cuda_array_interface_bad_dicts():
    base = {"shape": (3,), "typestr": "<f4", "data": (0, False), "version": 3}
    for bad, exc in [
        ({"typestr": "<c8"}, TypeError),
        ({"typestr": ">f4"}, TypeError),
        ({"typestr": "<u2"}, TypeError),
        ({"typestr": "f"}, TypeError),
        ({"version": 7}, ValueError),
        ({"mask": object()}, ValueError),
        ({"shape": (-1,)}, ValueError),
        ({"data": 5}, TypeError),
        ({"data": ("a", False)}, TypeError),
        ({"data": (-5, False)}, ValueError),
        ({"data": (2 ** 70, False)}, ValueError),
        ({"version": "3"}, TypeError),
        ({"typestr": 5}, TypeError),
        ({"shape": "abc"}, TypeError),
        ({"strides": (4, 4)}, ValueError),
        ({"strides": (3,)}, ValueError),
        ({"data": (2, False)}, ValueError),  # misaligned for float32
    ]:
        d = dict(base, **bad)
        with pytest.raises(exc):
            gk.from_cuda_array_interface(d)
    d = dict(base)
    del d["typestr"]
    with pytest.raises(ValueError, match="typestr"):
        gk.from_cuda_array_interface(d)
    # empty arrays need no pointer
    e = gk.from_cuda_array_interface(dict(base, shape=(0, 4)))
    assert e.shape == (0, 4)
