"""Context managers for streams and graphs."""
from . import _C

_stack = {}


def _stream_enter(self):
    key = self.device.index
    prev = _C.Stream.current(self.device)
    _stack.setdefault(key, []).append(prev)
    _C.Stream.set_current(self)
    return self


def _stream_exit(self, *exc):
    prev = _stack[self.device.index].pop()
    _C.Stream.set_current(prev)
    return False


_C.Stream.__enter__ = _stream_enter
_C.Stream.__exit__ = _stream_exit


def _graph_enter(self):
    """Captures the ops issued on the graph's stream (made current while capturing)."""
    _stream_enter(self.stream)
    try:
        self.begin()
    except BaseException:
        _stream_exit(self.stream)
        raise
    return self


def _graph_exit(self, exc_type, exc, tb):
    try:
        self.end()
    finally:
        _stream_exit(self.stream)
    return False


_C.Graph.__enter__ = _graph_enter
_C.Graph.__exit__ = _graph_exit
