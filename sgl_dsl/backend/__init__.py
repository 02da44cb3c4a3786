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


class GlobalConfig:
    """SGLang's `sgl.global_config`: `default_backend` is the process-wide default backend
    (the same one `set_default_backend` sets). The other settings are SGLang's and are kept
    for programs that set them; here they change nothing (special tokens are never in the
    output, prefixes are always pre-cached, `concate_and_append` always joins by text)."""

    def __init__(self) -> None:
        self.verbosity = 0
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True

    @property
    def default_backend(self) -> Backend | None:
        return _default

    @default_backend.setter
    def default_backend(self, backend: Backend | None) -> None:
        set_default_backend(backend)


global_config = GlobalConfig()


def flush_cache(backend: Backend | None = None) -> bool:
    """SGLang's `sgl.flush_cache()`: drop the backend's unused cached prefixes (False when no
    backend is given or set)."""
    chosen = backend if backend is not None else _default
    return False if chosen is None else chosen.flush_cache()


def get_server_info(backend: Backend | None = None) -> dict | None:
    """SGLang's `sgl.get_server_info()` (None when no backend is given or set)."""
    chosen = backend if backend is not None else _default
    return None if chosen is None else chosen.get_server_info()


def resolve_backend(backend: Backend | None) -> Backend:
    chosen = backend if backend is not None else _default
    if chosen is None:
        raise NoBackendError(
            "no backend: pass backend=... or call sgl.set_default_backend(sgl.Runtime())"
        )
    return chosen


__all__ = [
    "Backend",
    "GlobalConfig",
    "flush_cache",
    "get_server_info",
    "global_config",
    "GenChunk",
    "GenOutput",
    "get_default_backend",
    "resolve_backend",
    "set_default_backend",
]
