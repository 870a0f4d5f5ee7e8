"""safetensors: reading, writing, sharded checkpoints, interoperability with the
PyPI `safetensors` package (bit-exact both ways) and the CUDA upload path."""
import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest

import gpukit as gk

try:
    import safetensors.numpy as stnp
except ImportError:  # pragma: no cover
    stnp = None

needs_ref = pytest.mark.skipif(stnp is None, reason="the safetensors package is not installed")
needs_cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="no CUDA device")

DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def random_arrays(seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    shapes = [(3, 5), (7,), (), (2, 0, 3), (1, 3, 1, 2)]
    for k, (name, dt) in enumerate(DTYPES.items()):
        shape = shapes[k % len(shapes)]
        n = int(np.prod(shape))
        if dt is np.bool_:
            a = rng.integers(0, 2, n).astype(np.bool_)
        else:
            bits = rng.integers(0, 256, n * np.dtype(dt).itemsize, dtype=np.uint8)
            a = bits.view(dt)
        out[f"t.{name}"] = a.reshape(shape)
    return out


def ref_load(path):
    """The reference package's parse of a file: name -> NumPy array (raw bytes
    re-viewed with our dtype table, since safetensors.numpy lacks fp8 loading)."""
    import safetensors
    out = {}
    for name, v in safetensors.deserialize(open(path, "rb").read()):
        out[name] = np.frombuffer(bytes(v["data"]), dtype=DTYPES[v["dtype"]]).reshape(v["shape"])
    return out


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert np.ascontiguousarray(a).view(np.uint8).tobytes() == np.ascontiguousarray(b).view(np.uint8).tobytes()


def test_roundtrip_all_dtypes(tmp_path):
    arrays = random_arrays()
    p = tmp_path / "a.safetensors"
    gk.io.save_safetensors(p, arrays, metadata={"format": "np", "note": "é \"q\"\n"})
    st = gk.io.SafeTensors(p)
    assert set(st.keys()) == set(arrays)
    assert st.metadata == {"format": "np", "note": "é \"q\"\n"}
    for k, a in arrays.items():
        x = st[k]
        assert isinstance(x, gk.Array)
        assert x.shape == a.shape
        assert st.shape(k) == a.shape
        assert st.dtype(k) == x.dtype
        same_bits(gk.to_numpy(x), a)
    # The header is padded so data starts 8-aligned, and data is ordered by item size.
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    infos = sorted((st.info(k) for k in st.keys()), key=lambda t: t.data_offsets)
    sizes = [np.dtype(DTYPES[k.split(".")[1]]).itemsize for k in (t.name for t in infos)]
    assert sizes == sorted(sizes, reverse=True)


def test_zero_copy_views(tmp_path):
    p = tmp_path / "z.safetensors"
    gk.io.save_safetensors(p, {"w": np.arange(12, dtype=np.float32).reshape(3, 4)})
    st = gk.io.SafeTensors(p)
    a, b = st["w"], st["w"]
    assert a.data_ptr() == b.data_ptr()
    # A write through the view changes this process's copy, never the file.
    gk.to_numpy(a)[0, 0] = 42
    assert gk.to_numpy(b)[0, 0] == 42
    assert gk.to_numpy(gk.io.SafeTensors(p)["w"])[0, 0] == 0
    del st
    assert gk.to_numpy(a)[2, 3] == 11  # the view keeps the mapping alive


def test_writer_accepts_views_and_arrays(tmp_path):
    base = np.arange(24, dtype=np.int16).reshape(4, 6)
    x = gk.asarray(base)[:, 1::2].T  # strided view
    p = tmp_path / "v.safetensors"
    gk.io.save_safetensors(p, {"x": x, "n": base})
    st = gk.io.SafeTensors(p)
    same_bits(gk.to_numpy(st["x"]), base[:, 1::2].T)
    same_bits(gk.to_numpy(st["n"]), base)


def test_writer_rejects_bad_input(tmp_path):
    p = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError, match="reserved"):
        gk.io.save_safetensors(p, {"__metadata__": np.zeros(2)})
    with pytest.raises(TypeError):
        gk.io.save_safetensors(p, {1: np.zeros(2)})
    with pytest.raises(TypeError):
        gk.io.save_safetensors(p, {"a": np.zeros(2)}, metadata={"k": 1})
    assert not p.exists()


def test_missing_and_keyerrors(tmp_path):
    with pytest.raises(FileNotFoundError):
        gk.io.SafeTensors(tmp_path / "nope.safetensors")
    p = tmp_path / "m.safetensors"
    gk.io.save_safetensors(p, {"a": np.zeros(2, np.float32)})
    st = gk.io.SafeTensors(p)
    with pytest.raises(KeyError):
        st["b"]
    assert st.get("b") is None
    assert "a" in st and "b" not in st and len(st) == 1


@needs_ref
def test_reference_reads_ours(tmp_path):
    arrays = random_arrays(1)
    p = tmp_path / "ours.safetensors"
    gk.io.save_safetensors(p, arrays, metadata={"k": "v"})
    ref = ref_load(p)
    assert set(ref) == set(arrays)
    for k, a in arrays.items():
        same_bits(ref[k], a)


@needs_ref
def test_we_read_reference(tmp_path):
    arrays = random_arrays(2)
    p = tmp_path / "ref.safetensors"
    stnp.save_file(arrays, str(p), metadata={"format": "pt", "ü": "ß"})
    st = gk.io.SafeTensors(p)
    assert st.metadata == {"format": "pt", "ü": "ß"}
    for k, a in arrays.items():
        same_bits(gk.to_numpy(st[k]), a)
    # And our re-save of it is read identically by the reference.
    p2 = tmp_path / "again.safetensors"
    gk.io.save_safetensors(p2, {k: st[k] for k in st.keys()}, metadata=st.metadata)
    ref = ref_load(p2)
    for k, a in arrays.items():
        same_bits(ref[k], a)


def write_shards(d, arrays, nshards=2, index_name="model.safetensors.index.json"):
    names = sorted(arrays)
    weight_map = {}
    for s in range(nshards):
        fname = f"model-{s + 1:05d}-of-{nshards:05d}.safetensors"
        part = {k: arrays[k] for k in names[s::nshards]}
        gk.io.save_safetensors(d / fname, part)
        weight_map.update({k: fname for k in part})
    (d / index_name).write_text(json.dumps({"metadata": {"total_size": 123}, "weight_map": weight_map}))
    return weight_map


def test_sharded_checkpoint(tmp_path):
    arrays = random_arrays(3)
    write_shards(tmp_path, arrays)
    for src in (tmp_path, tmp_path / "model.safetensors.index.json"):
        st = gk.io.load_safetensors_dir(src) if src == tmp_path else gk.io.SafeTensors(src)
        assert st.num_shards == 2
        assert sorted(st.keys()) == sorted(arrays)
        for k, a in arrays.items():
            same_bits(gk.to_numpy(st[k]), a)
    d = gk.io.load_safetensors(tmp_path)
    assert set(d) == set(arrays)


def test_sharded_rejects_bad_index(tmp_path):
    arrays = {"a": np.zeros(2, np.float32), "b": np.ones(3, np.int8)}
    wm = write_shards(tmp_path, arrays)
    idx = tmp_path / "model.safetensors.index.json"
    for bad, msg in [
        ({"weight_map": {"a": "../x.safetensors"}}, "plain file name"),
        ({"weight_map": {"a": "/etc/passwd"}}, "plain file name"),
        ({"weight_map": {"zz": wm["a"]}}, "not in shard"),
        ({"metadata": {}}, "weight_map"),
    ]:
        idx.write_text(json.dumps(bad))
        with pytest.raises(gk.io.FormatError, match=msg):
            gk.io.SafeTensors(tmp_path)
    idx.write_text('{"weight_map": {"a": "x", "a": "y"}}')
    with pytest.raises(gk.io.FormatError, match="duplicate"):
        gk.io.SafeTensors(tmp_path)


def test_directory_of_single_files(tmp_path):
    gk.io.save_safetensors(tmp_path / "model.safetensors", {"w": np.ones(4, np.float32)})
    assert gk.to_numpy(gk.io.SafeTensors(tmp_path)["w"]).tolist() == [1, 1, 1, 1]


def test_unaligned_tensor_is_copied(tmp_path):
    # A header length that is not a multiple of 8 (legal) leaves f32 data unaligned.
    hdr = b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    assert (8 + len(hdr)) % 4 != 0
    p = tmp_path / "u.safetensors"
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + np.array([1.5, -2], np.float32).tobytes())
    w = gk.io.SafeTensors(p)["w"]
    assert w.data_ptr() % 4 == 0
    assert gk.to_numpy(w).tolist() == [1.5, -2.0]


@needs_cuda
def test_get_uploads_to_cuda(tmp_path):
    arrays = random_arrays(4)
    p = tmp_path / "c.safetensors"
    gk.io.save_safetensors(p, arrays)
    st = gk.io.SafeTensors(p)
    for k, a in arrays.items():
        x = st.get(k, device="cuda")
        assert x.device.type == "cuda"
        same_bits(gk.to_numpy(x), a)
    # Writing CUDA arrays goes through the host.
    p2 = tmp_path / "c2.safetensors"
    gk.io.save_safetensors(p2, {k: st.get(k, device="cuda") for k in arrays})
    for k, a in arrays.items():
        same_bits(gk.to_numpy(gk.io.SafeTensors(p2)[k]), a)
