"""Custom CUDA kernels compiled at run time with NVRTC.

    import gpukit as gk
    axpy = gk.jit(r'''
    extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) y[i] = a * x[i] + y[i];
    }''', "axpy")
    axpy((n + 255) // 256, 256, 2.0, x, y, n)          # stream-ordered, on the current stream

``gk.jit`` is this module, made callable: ``gk.jit(source, name, ...)`` compiles and
returns a :class:`gpukit.JitKernel`; ``gk.jit.is_available()`` says whether NVRTC was
found (GPUKIT_NVRTC_PATH, the loader path, the CUDA toolkit, or the PyPI
``nvidia-cuda-nvrtc`` wheel). Compiled code is cached in memory and on disk
(``$GPUKIT_CACHE_DIR/jit``, default ``~/.cache/gpukit/jit``). Compile errors raise
:class:`gpukit.JitError` with the full log (``.log``) and the offending line
(``.line``, ``.source_line``).
"""
from __future__ import annotations

import os
import sys
import types as _types

from . import _C

JitError = _C.JitError
JitKernel = _C.JitKernel

_paths_registered = False


def _wheel_paths():
    """Library and include directories of the PyPI NVRTC wheels, if installed."""
    libs, incs = [], []
    roots = []
    try:
        import nvidia  # namespace package of the NVIDIA wheels
        roots = [p for p in getattr(nvidia, "__path__", [])]
    except ImportError:
        pass
    for root in roots:
        for sub in ("cu13", "cuda_nvrtc", "cuda_runtime"):
            lib, inc = os.path.join(root, sub, "lib"), os.path.join(root, sub, "include")
            if os.path.isdir(lib):
                libs.append(lib)
            if os.path.isdir(inc):
                incs.append(inc)
    return libs, incs


def _register_paths():
    global _paths_registered
    if not _paths_registered:
        _paths_registered = True
        libs, incs = _wheel_paths()
        if libs or incs:
            _C._jit_add_search_paths(libs, incs)


def is_available() -> bool:
    """True when NVRTC could be loaded (compiling needs no GPU; launching does)."""
    _register_paths()
    return _C._jit_available()


def unavailable_reason() -> str:
    """Why NVRTC could not be loaded ('' when it was): the places searched."""
    _register_paths()
    return _C._jit_unavailable_reason()


def nvrtc_version():
    """(major, minor) of the loaded NVRTC."""
    _register_paths()
    if not _C._jit_available():
        raise RuntimeError("gk.jit: NVRTC is not available. " + _C._jit_unavailable_reason())
    return tuple(_C._jit_nvrtc_version())


def nvrtc_path() -> str:
    _register_paths()
    return _C._jit_nvrtc_path()


def supported_archs():
    _register_paths()
    return list(_C._jit_supported_archs())


def cache_dir() -> str:
    """The on-disk cache: $GPUKIT_CACHE_DIR/jit, else $XDG_CACHE_HOME/gpukit/jit, else ~/.cache/gpukit/jit."""
    return _C._jit_cache_dir()


def stats() -> dict:
    """Counters: nvrtc_compiles, memory_hits, disk_hits, disk_writes, disk_errors, library_loads, launches."""
    return dict(_C._jit_stats())


def reset_stats() -> None:
    _C._jit_reset_stats()


def clear_memory_cache() -> None:
    """Forgets compiled programs held in memory (the disk cache is kept)."""
    _C._jit_clear_memory_cache()


def compile(source: str, name: str, options=(), *, arch=None, types=None, device=None, cache=True) -> JitKernel:
    """Compiles `source` with NVRTC and returns the kernel `name`.

    name:    the kernel, or a name expression for a template instance ("axpy<float>").
    options: extra NVRTC options ("-DN=4", "--use_fast_math", "-I/path").
    arch:    target ("sm_90a", "sm_80", "compute_90"); default: the device's own
             architecture (sm_90a on Hopper). Needed to compile without a GPU.
    types:   parameter types overriding the ones parsed from the source, as C++ type
             names ("float*", "const __nv_bfloat16*", "int64_t") or gpukit dtypes (scalars).
    device:  the device to compile for and launch on by default (cuda:0).
    cache:   use the memory and disk caches.
    """
    if not isinstance(source, str):
        raise TypeError(f"source: expected str, got {type(source).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"name: expected str, got {type(name).__name__}")
    if arch is not None and not isinstance(arch, str):
        raise TypeError(f"arch: expected str, got {type(arch).__name__}")
    _register_paths()
    if not _C._jit_available():
        raise RuntimeError("gk.jit: NVRTC is not available. " + _C._jit_unavailable_reason())
    opts = [options] if isinstance(options, str) else list(options or ())
    return JitKernel(source, name, options=opts, arch=arch, types=types, device=device, cache=bool(cache))


class _JitModule(_types.ModuleType):
    """gk.jit is callable: gk.jit(source, name, ...) == gk.jit.compile(source, name, ...)."""

    def __call__(self, source, name, options=(), **kwargs):
        return compile(source, name, options, **kwargs)


sys.modules[__name__].__class__ = _JitModule
