"""CUDA device queries (all safe on machines without a GPU or driver)."""
from . import _C


def is_available() -> bool:
    """True when a CUDA device and driver are present and gpukit was built with CUDA."""
    return _C.cuda_is_available()


def device_count() -> int:
    return _C.cuda_device_count()


def built_with_cuda() -> bool:
    return _C.built_with_cuda()


def get_device_properties(device="cuda:0") -> dict:
    return _C.device_properties(device)


def synchronize(device="cuda:0") -> None:
    _C.synchronize(device)


def current_stream(device="cuda:0"):
    return _C.Stream.current(device)


def is_failed(device="cuda:0") -> bool:
    """True once a sticky fault (illegal address, ...) has made the device unusable."""
    return _C.device_failed(device)
