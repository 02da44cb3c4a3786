"""The storage tier's pages over a backend: the object format, the checks on load, and the
budget with LRU eviction, shared by every backend (`tier_files` and `tier_mooncake`).

A page is stored as one object, named by its key (a digest of the tier fingerprint and every
token up to and including the page: `hicache.page_keys`):

    MAGIC  header_len:u32  JSON header {fingerprint, key, tokens, payload_bytes, digest}  payload

where `payload` is the page's KV in wire form (`memory.kv_pages`) and `digest` its BLAKE2b.
`PageStore.get` checks all of them; an object that fails any check is deleted and reported as
missing, so a corrupt or foreign object means recompute, never wrong KV.

A backend only moves bytes (`StorageBackend`: put / get / exists / delete / scan). The index
(key -> stored bytes, least recently used first) is the store's: what the backend held at start
(`scan`), what this process wrote, and what it found and loaded. Past the budget the least
recently used objects are deleted. A backend that others write to too (Mooncake Store: other
engines, an earlier run) is not `authoritative`: a key outside the index is asked of the
backend before the tier says it lacks it.

Thread-safety: `put` runs on the tier's writer thread, everything else on the scheduler thread;
the index is guarded by one lock, never held across a backend call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence

logger = logging.getLogger(__name__)

MAGIC = b"SGHC1\n"
_LEN = struct.Struct("!I")

Buffer = bytes | bytearray | memoryview


def payload_digest(payload: Buffer) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


class StorageBackend(ABC):
    """Where page objects live. Keys are the tier's page keys; a backend keeps objects of one
    tier fingerprint apart from every other's."""

    #: True when `scan` lists every object there is (nothing else writes to the backend)
    authoritative = True
    #: where the objects are, for messages
    where = ""

    @abstractmethod
    def put(self, key: str, parts: Sequence[Buffer]) -> bool:
        """Store the concatenation of `parts` under `key` (whole or not at all; an object that
        is already there counts as stored); False if it could not be."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is none."""

    @abstractmethod
    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key has an object."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object if there is one."""

    def scan(self) -> list[tuple[str, int]]:
        """The objects left by an earlier run, least recently used first: (key, bytes)."""
        return []

    def close(self) -> None:  # noqa: B027 (most backends hold nothing to let go of)
        """Let go of connections (after the last call)."""


class PageStore:
    """Checked page objects on `backend`, at most `budget_bytes` of them (LRU)."""

    def __init__(self, backend: StorageBackend, fingerprint: str, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"the storage tier's budget must be positive, got {budget_bytes}")
        self.backend = backend
        self.fingerprint = fingerprint
        self.budget_bytes = budget_bytes
        self.authoritative = backend.authoritative
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # key -> object bytes, LRU first
        self.bytes = 0
        self.corrupt_objects = 0  # objects that failed a check on load (deleted)
        self.evicted_objects = 0  # objects removed to stay within the budget
        for key, size in backend.scan():
            self._index[key] = size
            self.bytes += size
        self._delete(self._over_budget())
        if self._index:
            logger.info("storage tier: %d pages (%.1f MiB) found in %s", len(self._index),
                        self.bytes / 2**20, backend.where)  # fmt: skip

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def keys(self) -> list[str]:
        """The indexed keys, least recently used first."""
        with self._lock:
            return list(self._index)

    def contains(self, key: str) -> bool:
        """Whether the index has `key` (no backend call)."""
        with self._lock:
            return key in self._index

    def held(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored: the index's answer, and the backend's for the keys the
        index lacks when others may have written them."""
        with self._lock:
            known = [key in self._index for key in keys]
        missing = [key for key, k in zip(keys, known, strict=True) if not k]
        if not missing or self.authoritative:
            return known
        found = iter(self.backend.exists(missing))
        return [k or next(found) for k in known]

    def put(self, key: str, tokens: Sequence[int], payload: Buffer) -> bool:
        """Store one page; False if the backend could not."""
        header = json.dumps({
            "fingerprint": self.fingerprint, "key": key, "tokens": list(tokens),
            "payload_bytes": len(payload), "digest": payload_digest(payload),
        }).encode()  # fmt: skip
        head = MAGIC + _LEN.pack(len(header)) + header
        if not self.backend.put(key, (head, payload)):
            return False
        self._note(key, len(head) + len(payload))
        return True

    def get(self, key: str, tokens: Sequence[int], payload_bytes: int) -> bytes | None:
        """The page's payload if its object exists and passes every check, else None (an
        object that fails one is deleted)."""
        raw = self.backend.get(key)
        if raw is None:
            self._forget(key)
            return None
        payload = self._checked(raw, key, tokens, payload_bytes)
        if payload is None:
            logger.warning("storage tier: page %s in %s failed its check; it is deleted", key,
                           self.backend.where)  # fmt: skip
            with self._lock:
                self.corrupt_objects += 1
            self._forget(key)
            self.backend.delete(key)
            return None
        self._note(key, len(raw))
        return payload

    def _checked(
        self, raw: bytes, key: str, tokens: Sequence[int], payload_bytes: int
    ) -> bytes | None:
        head = len(MAGIC) + _LEN.size
        if len(raw) < head or not raw.startswith(MAGIC):
            return None
        (header_len,) = _LEN.unpack_from(raw, len(MAGIC))
        try:
            header = json.loads(raw[head : head + header_len])
        except ValueError:
            return None
        payload = raw[head + header_len :]
        ok = (
            isinstance(header, dict)
            and header.get("fingerprint") == self.fingerprint
            and header.get("key") == key
            and header.get("tokens") == list(tokens)
            and header.get("payload_bytes") == payload_bytes == len(payload)
            and header.get("digest") == payload_digest(payload)
        )
        return payload if ok else None

    def _note(self, key: str, size: int) -> None:
        """`key` holds `size` bytes and was just used: index it, then keep the budget."""
        with self._lock:
            self.bytes += size - self._index.pop(key, 0)
            self._index[key] = size
            victims = self._over_budget()
        self._delete(victims)

    def _forget(self, key: str) -> None:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self.bytes -= size

    def _over_budget(self) -> list[str]:
        """Unindex the least recently used objects until the rest fit the budget (lock held,
        or no other thread yet); the caller deletes them."""
        victims = []
        while self.bytes > self.budget_bytes and self._index:
            key, size = self._index.popitem(last=False)
            self.bytes -= size
            self.evicted_objects += 1
            victims.append(key)
        return victims

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            self.backend.delete(key)

    def close(self) -> None:
        self.backend.close()
