"""The `file` backend of the storage tier: one file per KV page in a folder.

A page's file is named by its key and lives in a folder named by the tier fingerprint
(`DIR/<fingerprint>/<key>.kv`), so a different model, dtype or page layout never even looks at
it. Files are written to a temporary name and renamed, so a crash leaves whole files or
temporary ones (removed at the next start). The folder belongs to one engine at a time: the
index `tier_store.PageStore` builds from `scan` (least recently modified first) is complete.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from runtime.memory.tier_store import Buffer, StorageBackend

logger = logging.getLogger(__name__)

SUFFIX = ".kv"


class FileBackend(StorageBackend):
    """Page objects as files under `root / fingerprint`."""

    authoritative = True

    def __init__(self, root: str | Path, fingerprint: str) -> None:
        self.folder = Path(root).expanduser() / fingerprint
        self.folder.mkdir(parents=True, exist_ok=True)
        self.where = str(self.folder)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def put(self, key: str, parts: Sequence[Buffer]) -> bool:
        path = self.path(key)
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as f:
                for part in parts:
                    f.write(part)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            logger.warning("storage tier: cannot write %s: %s", path, exc)
            return False
        return True

    def get(self, key: str) -> bytes | None:
        try:
            with open(self.path(key), "rb") as f:
                return f.read()
        except OSError:
            return None

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return [self.path(key).exists() for key in keys]

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def scan(self) -> list[tuple[str, int]]:
        found = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((st.st_mtime, path.stem, st.st_size))
        for path in self.folder.glob("*.tmp"):  # a write cut short by a crash
            path.unlink(missing_ok=True)
        return [(key, size) for _, key, size in sorted(found)]
