"""Bad input to the LLM engine beyond test_llm.py: a load that fails part way frees
what it made (CPU; CUDA when a GPU is present), tensor types checked before any read,
truncated and foreign GGUF files, model paths and config.json errors."""
import json

import numpy as np
import pytest

import gpukit as gk
from llm_ref import TINY, make_weights, save_model, tiny_config, write_gpt2_gguf

cuda = pytest.mark.skipif(not gk.cuda.is_available(), reason="no CUDA device")


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
