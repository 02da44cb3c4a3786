"""A thread-safe LRU cache of compiled constraints with single-flight compilation.

Two threads asking for the same key compile it once; different keys compile concurrently.
Entries are evicted least recently used first, past `max_entries` or past `max_bytes` of
their `size_of`, measured again at each insertion since an entry may grow once cached (the
newest entry always stays).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class CompileCache(Generic[T]):
    def __init__(
        self,
        max_entries: int = 256,
        max_bytes: int | None = None,
        size_of: Callable[[T], int] | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.size_of = size_of or (lambda value: 0)
        self.nbytes = 0
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
                # sizes are taken afresh: an entry may grow after it is cached (a lazy DFA)
                self.nbytes = sum(self.size_of(v) for v in self._entries.values())
                while len(self._entries) > 1 and (
                    len(self._entries) > self.max_entries
                    or (self.max_bytes is not None and self.nbytes > self.max_bytes)
                ):
                    _, old = self._entries.popitem(last=False)
                    self.nbytes -= self.size_of(old)
            return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)
