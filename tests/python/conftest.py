"""Shared pytest setup: the in-place package, the harness on sys.path, the CUDA marker."""
import os
import pathlib
import sys

import pytest

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
try:
    import gpukit  # noqa: F401
except ImportError:  # running from a checkout without PYTHONPATH=python
    sys.path.insert(0, str(_HERE.parents[1] / "python"))
    import gpukit  # noqa: F401

import gpukit as gk  # noqa: E402
import harness  # noqa: E402

HAS_CUDA = gk.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (gk.cuda.is_available() is False)")


def pytest_report_header(config):
    return [f"gpukit: built_with_cuda={gk.cuda.built_with_cuda()} cuda_available={HAS_CUDA} "
            f"devices={[str(d) for d in gk.devices()]}",
            f"op harness seed: GPUKIT_TEST_SEED={harness.seed()}"]


@pytest.fixture
def rng(request):
    """A NumPy generator seeded by the session seed and the test id (fresh per run, replayable)."""
    import zlib

    import numpy as np
    return np.random.default_rng([harness.seed(), zlib.crc32(request.node.nodeid.encode())])


@pytest.fixture(autouse=True)
def _no_poison_leak():
    """The allocator poison hook is always off outside the harness's own calls."""
    yield
    gk._C._debug_alloc_poison(-1)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device")
    os.environ.setdefault("GPUKIT_TEST_SEED", str(harness.seed()))
