"""Static check of the Python sources: no undefined names.

The CUDA tests skip on a machine without a GPU, so a name error inside one (a variable pasted from
another test) would only show on the device machine. pyflakes finds those without running them.
"""
import pathlib

import pytest

pyflakes_api = pytest.importorskip("pyflakes.api")
from pyflakes import messages, reporter  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIRS = ["tests/python", "python/gpukit", "scripts"]
ERRORS = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect(reporter.Reporter):
    def __init__(self):
        self.found = []

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: syntax error: {msg}")

    def flake(self, message):
        if isinstance(message, ERRORS):
            self.found.append(str(message))


def _files():
    for d in DIRS:
        yield from sorted((ROOT / d).rglob("*.py"))


def test_sources_exist():
    assert len(list(_files())) > 50


def test_no_undefined_names():
    rep = _Collect()
    for f in _files():
        pyflakes_api.check(f.read_text(), str(f.relative_to(ROOT)), rep)
    assert not rep.found, "\n".join(rep.found)


def test_checker_catches_an_undefined_name():
    rep = _Collect()
    pyflakes_api.check("def f():\n    return knob\n", "probe.py", rep)
    assert len(rep.found) == 1 and "knob" in rep.found[0]


def test_sanitize_selection_collects():
    """Every test id of scripts/sanitize.sh's selection exists (a renamed test would otherwise
    only show as a failed sanitizer run on the device machine)."""
    import re
    import subprocess
    import sys

    text = (ROOT / "scripts/sanitize.sh").read_text()
    block = text[text.index("SEL=("):]
    block = block[:block.index("\n)")]
    ids = [s.replace("$T", "tests/python") for s in re.findall(r'"([^"]+)"', block)]
    assert len(ids) > 20
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
