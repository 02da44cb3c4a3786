"""A thread-safe LRU cache of compiled constraints with single-flight compilation.

Two threads asking for the same key compile it once; different keys compile concurrently.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class CompileCache(Generic[T]):
    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, T] = OrderedDict()
        self._pending: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_build(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                return self._entries[key]
            key_lock = self._pending.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._entries:  # built by another thread while we waited
                    self.hits += 1
                    return self._entries[key]
                self.misses += 1
            try:
                value = build()
            except BaseException:
                with self._lock:
                    self._pending.pop(key, None)
                raise
            with self._lock:
                self._entries[key] = value
                self._pending.pop(key, None)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
            return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
