"""The file backend of the storage tier: one file per KV page in a directory, under a byte
budget with LRU eviction.

A page's file is named by its key (a digest of the model fingerprint and every token up to and
including the page: `hicache.page_keys`) and lives in a folder named by the tier fingerprint, so
a different model, dtype or page layout never even looks at it. The file holds

    MAGIC  header_len:u32  JSON header {fingerprint, key, tokens, payload_bytes, digest}  payload

where `payload` is the page's KV in wire form (`memory.kv_pages`) and `digest` its BLAKE2b.
`get` checks all of them; a file that fails any check is deleted and reported as missing, so a
corrupt or foreign file means recompute, never wrong KV.

Thread-safety: `put` runs on the tier's writer thread, `get` / `contains` on the scheduler
thread; the index (key -> bytes on disk, least recently used first) is guarded by one lock. A
file deleted under a reader (the budget, another process) reads as missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

MAGIC = b"SGHC1\n"
_LEN = struct.Struct("!I")
SUFFIX = ".kv"


def payload_digest(payload: bytes | memoryview) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


class FileStore:
    """Pages on disk under `root / fingerprint`, at most `budget_bytes` of them."""

    def __init__(self, root: str | Path, fingerprint: str, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"the storage tier's budget must be positive, got {budget_bytes}")
        self.fingerprint = fingerprint
        self.folder = Path(root).expanduser() / fingerprint
        self.folder.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # key -> file bytes, LRU first
        self.bytes = 0
        self.corrupt_files = 0  # files that failed a check on load (deleted)
        self.evicted_files = 0  # files removed to stay within the budget
        self._scan()

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def _scan(self) -> None:
        """Index the files a previous run left, oldest use first (their modification time)."""
        found = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((st.st_mtime, path.stem, st.st_size))
        for _, key, size in sorted(found):
            self._index[key] = size
            self.bytes += size
        for path in self.folder.glob("*.tmp"):  # a write cut short by a crash
            path.unlink(missing_ok=True)
        self._enforce_budget()
        if found:
            logger.info("storage tier: %d pages (%.1f MiB) found in %s", len(self._index),
                        self.bytes / 2**20, self.folder)  # fmt: skip

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._index

    def put(self, key: str, tokens: Sequence[int], payload: bytes | memoryview) -> bool:
        """Write one page (atomically: a temporary file renamed); False if it could not be."""
        header = json.dumps({
            "fingerprint": self.fingerprint, "key": key, "tokens": list(tokens),
            "payload_bytes": len(payload), "digest": payload_digest(payload),
        }).encode()  # fmt: skip
        path = self._path(key)
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + _LEN.pack(len(header)) + header)
                f.write(payload)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            logger.warning("storage tier: cannot write %s: %s", path, exc)
            return False
        size = len(MAGIC) + _LEN.size + len(header) + len(payload)
        with self._lock:
            self.bytes += size - self._index.pop(key, 0)
            self._index[key] = size
            self._enforce_budget()
        return True

    def get(self, key: str, tokens: Sequence[int], payload_bytes: int) -> bytes | None:
        """The page's payload if its file exists and passes every check, else None (a file
        that fails one is deleted)."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            self._forget(key, delete=False)
            return None
        payload = self._checked(raw, key, tokens, payload_bytes)
        if payload is None:
            logger.warning("storage tier: %s failed its check; it is deleted", path.name)
            with self._lock:
                self.corrupt_files += 1
            self._forget(key, delete=True)
            return None
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
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

    def _forget(self, key: str, delete: bool) -> None:
        with self._lock:
            size = self._index.pop(key, None)
            if size is not None:
                self.bytes -= size
        if delete:
            self._path(key).unlink(missing_ok=True)

    def _enforce_budget(self) -> None:
        """Drop least recently used files until the folder fits the budget (lock held)."""
        while self.bytes > self.budget_bytes and self._index:
            key, size = self._index.popitem(last=False)
            self.bytes -= size
            self.evicted_files += 1
            self._path(key).unlink(missing_ok=True)
