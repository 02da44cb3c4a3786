"""Backends a program runs on, and the process-wide default one."""

from __future__ import annotations

import threading

from ..errors import NoBackendError
from .base import Backend, GenChunk, GenOutput

_default: Backend | None = None
_lock = threading.Lock()


def set_default_backend(backend: Backend | None) -> None:
    global _default
    with _lock:
        _default = backend


def get_default_backend() -> Backend | None:
    return _default


def resolve_backend(backend: Backend | None) -> Backend:
    chosen = backend if backend is not None else _default
    if chosen is None:
        raise NoBackendError(
            "no backend: pass backend=... or call sgl.set_default_backend(sgl.Runtime())"
        )
    return chosen


__all__ = [
    "Backend",
    "GenChunk",
    "GenOutput",
    "get_default_backend",
    "resolve_backend",
    "set_default_backend",
]
