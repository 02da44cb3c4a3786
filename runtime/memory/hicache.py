"""The storage tier under the radix cache (hierarchical cache, SGLang's HiCache).

When the radix tree evicts a node, `on_evict` copies its pages' KV out of the pool into a
staging buffer (one gather, on the scheduler thread, before the pages return to the free list:
the pool may overwrite them right after) and queues them; a writer thread stores them
(`tier_store.PageStore`, over files, `tier_files`, or Mooncake Store, `tier_mooncake`). A later
prefix match that stops at the end of what the tree holds asks `available` how many of the
following pages the tier has, and `read` brings them back (from the staging buffer while a
write is pending, else from the backend, every payload checked);
`memory.pages.PageBook.load_from_tier` puts them into fresh pool pages and the tree.

Pages are keyed by a chain of digests: the key of page i is BLAKE2b(key of page i - 1, the
page's tokens), starting from the tier fingerprint (the model's weights and shape, the KV dtype,
the page layout). A key therefore names one exact token prefix of one model's KV, which is what
lets the tier outlive the process: a restarted engine with the same fingerprint finds the pages
of every prefix the last one stored, and any other fingerprint finds none.

At shutdown `backup_tree` writes out what the tree still holds (not evicted, so never stored),
and `close` waits for the writer. Whether a found page is reloaded or recomputed is `worth_loading`:
loading must be estimated cheaper than computing the tokens again (both measured as they run).
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runtime.memory.kv_pages import page_bytes, read_pages
from runtime.memory.kv_pool import KVPool, kv_dtype_name
from runtime.memory.radix_cache import RadixCache, TreeNode
from runtime.memory.tier_files import FileBackend
from runtime.memory.tier_mooncake import MooncakeBackend, MooncakeStoreConfig
from runtime.memory.tier_store import PageStore, StorageBackend

logger = logging.getLogger(__name__)

BACKENDS = ("file", "mooncake")
LOAD_POLICIES = ("auto", "always")
STAGING_LIMIT_BYTES = 256 * 2**20  # pages queued for the writer, at most
CLOSE_TIMEOUT_S = 60.0
# steps with fewer prompt tokens say more about a step's fixed cost than about a token's
MIN_TOKENS_TO_MEASURE = 32


def tier_fingerprint(model_fingerprint: str, pool: KVPool) -> str:
    """What a stored page's KV depends on: the model, the KV storage type and scales, the page
    size and the per-layer tensors."""
    layers = len(next(iter(pool.buffers.values()), []))
    parts = (model_fingerprint, kv_dtype_name(pool.dtype), pool.page_size, layers,
             tuple(pool.layout), sorted(pool.scales.items()) if pool.quantized else ())  # fmt: skip
    return hashlib.blake2b(repr(parts).encode(), digest_size=12).hexdigest()


def parse_extra_config(value: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """`hicache_storage_backend_extra_config` as a dict: a mapping, JSON text, or `@FILE` of
    JSON (SGLang's forms); ValueError naming the field otherwise."""
    if value is None or isinstance(value, Mapping):
        return dict(value or {})
    text = str(value).strip()
    try:
        if text.startswith("@"):
            text = Path(text[1:]).expanduser().read_text(encoding="utf-8")
        parsed = json.loads(text) if text else {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"hicache_storage_backend_extra_config is not JSON (or @FILE of "
                         f"JSON): {exc}") from None  # fmt: skip
    if not isinstance(parsed, dict):
        raise ValueError(f"hicache_storage_backend_extra_config must be a JSON object, got "
                         f"{type(parsed).__name__}")  # fmt: skip
    return parsed


def open_backend(
    backend: str, fingerprint: str, storage_dir: str, extra: dict[str, Any]
) -> StorageBackend:
    """The storage backend named `backend` for pages of `fingerprint`."""
    if backend == "mooncake":
        return MooncakeBackend(MooncakeStoreConfig.resolve(extra), fingerprint)
    if extra:
        raise ValueError(f"hicache_storage_backend_extra_config: the file backend takes no "
                         f"settings, got {sorted(extra)}")  # fmt: skip
    return FileBackend(storage_dir, fingerprint)


def node_tokens(node: TreeNode) -> list[int]:
    """Every token from the root to the end of `node`."""
    keys = []
    while node.parent is not None:
        keys.append(node.key)
        node = node.parent
    return [t for key in reversed(keys) for t in key]


@dataclass(slots=True)
class _Write:
    keys: list[str]
    tokens: list[list[int]]
    data: torch.Tensor  # [pages, page_bytes] uint8, a copy owned by the tier


class HiCache:
    """The storage tier of one engine. `on_evict`, `backup_tree`, `available`, `read` and
    `worth_loading` run on the scheduler thread; the writer thread only writes."""

    def __init__(
        self,
        pool: KVPool,
        model_fingerprint: str,
        storage_dir: str,
        budget_bytes: int,
        backend: str = "file",
        load_policy: str = "auto",
        extra: dict[str, Any] | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(
                f"hicache_storage_backend must be one of {list(BACKENDS)}, got {backend!r}"
            )
        if load_policy not in LOAD_POLICIES:
            raise ValueError(
                f"hicache_load_policy must be one of {list(LOAD_POLICIES)}, got {load_policy!r}"
            )
        if not pool.buffers or not next(iter(pool.buffers.values())):
            raise ValueError("the hierarchical cache needs the KV pool in this process")
        self.pool = pool
        self.ps = pool.page_size
        self.page_bytes = page_bytes(pool)
        self.backend = backend
        self.load_policy = load_policy
        self.fingerprint = tier_fingerprint(model_fingerprint, pool)
        if budget_bytes <= 0:
            raise ValueError(f"the storage tier's budget must be positive, got {budget_bytes}")
        backing = open_backend(backend, self.fingerprint, storage_dir, extra or {})
        self.store = PageStore(backing, self.fingerprint, budget_bytes)
        self._root_key = hashlib.blake2b(self.fingerprint.encode(), digest_size=16).digest()
        # pages copied out and not yet written: key -> (payload row, tokens)
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Write | None] = queue.SimpleQueue()
        self.counters = dict.fromkeys(
            ("pages_written", "pages_loaded", "load_failures", "writes_dropped",
             "write_errors"), 0)  # fmt: skip
        # measured costs (None until seen): seconds to load one page, to compute one token
        self._load_s_per_page: float | None = None
        self._compute_s_per_token: float | None = None
        self._writer = threading.Thread(target=self._write_loop, name="sgl-hicache-writer",
                                        daemon=True)  # fmt: skip
        self._writer.start()

    # ---- keys -------------------------------------------------------------------------------
    def page_keys(self, tokens: Sequence[int], pages: int) -> list[str]:
        """The keys of the first `pages` whole pages of `tokens`."""
        raw = np.asarray(tokens[: pages * self.ps], dtype=np.int64).tobytes()
        width = 8 * self.ps
        out, prev = [], self._root_key
        for i in range(pages):
            prev = hashlib.blake2b(prev + raw[i * width : (i + 1) * width], digest_size=16).digest()
            out.append(prev.hex())
        return out

    # ---- writing ----------------------------------------------------------------------------
    def on_evict(self, node: TreeNode) -> None:
        """The tree is about to free `node`'s pages: copy the ones not stored yet and queue
        them for the writer (RadixCache's eviction hook)."""
        self._stage(node_tokens(node), len(node.pages), node.pages)

    def _stage(self, tokens: list[int], count: int, pages: list[int]) -> None:
        """Queue the last `count` pages of `tokens` (held in pool `pages`) for writing."""
        total = len(tokens) // self.ps
        keys = self.page_keys(tokens, total)[total - count :]
        with self._pending_lock:
            todo = [i for i, key in enumerate(keys)
                    if key not in self._pending and not self.store.contains(key)]  # fmt: skip
            room = STAGING_LIMIT_BYTES - len(self._pending) * self.page_bytes
            fits = max(0, min(len(todo), room // self.page_bytes))
            self.counters["writes_dropped"] += len(todo) - fits
            todo = todo[:fits]
            if not todo:
                return
            # the copy the writer owns (in host memory, whatever device the pool is on)
            data = read_pages(self.pool, [pages[i] for i in todo]).cpu()
            first = (total - count) * self.ps
            write = _Write([keys[i] for i in todo], [], data)
            for row, i in enumerate(todo):
                start = first + i * self.ps
                write.tokens.append(tokens[start : start + self.ps])
                self._pending[keys[i]] = data[row]
        self._queue.put(write)

    def backup_tree(self, tree: RadixCache) -> None:
        """Queue every page the tree holds and the tier does not (before a shutdown)."""
        stack = list(tree.root.children.values())
        while stack:
            node = stack.pop()
            self._stage(node_tokens(node), len(node.pages), node.pages)
            stack.extend(node.children.values())

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            for key, tokens, row in zip(item.keys, item.tokens, item.data, strict=True):
                ok = self.store.put(key, tokens, memoryview(row.numpy()))
                with self._pending_lock:
                    self._pending.pop(key, None)
                    self.counters["pages_written" if ok else "write_errors"] += 1

    def drain(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until every queued page is written; False if the timeout came first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._pending_lock:
                if not self._pending:
                    return True
            time.sleep(0.005)
        return False

    def close(self) -> None:
        """Write what is queued (up to a timeout), then stop the writer."""
        if not self.drain():
            logger.warning("storage tier: pages still unwritten at shutdown were dropped")
        self._queue.put(None)
        self._writer.join(timeout=5)
        self.store.close()

    # ---- reading ----------------------------------------------------------------------------
    def available(self, keys: Sequence[str]) -> int:
        """How many of `keys`, from the first on, the tier holds (pending or stored)."""
        with self._pending_lock:
            pending = [key in self._pending for key in keys]
        n = 0
        for ok in self._pending_or(pending, keys):
            if not ok:
                break
            n += 1
        return n

    def _pending_or(self, pending: list[bool], keys: Sequence[str]) -> list[bool]:
        """Whether each key is pending or stored (the store asked only about the others)."""
        rest = [key for key, p in zip(keys, pending, strict=True) if not p]
        held = iter(self.store.held(rest))
        return [p or next(held) for p in pending]

    def read(self, keys: Sequence[str], tokens: Sequence[int]) -> torch.Tensor:
        """The payloads of `keys` (pages of `tokens`, which start at the first key's page) as
        `[k, page_bytes]` uint8, stopping at the first page that is missing or fails its
        check (k may be 0)."""
        start = time.perf_counter()
        out = torch.empty((len(keys), self.page_bytes), dtype=torch.uint8)
        got = 0
        for i, key in enumerate(keys):
            with self._pending_lock:
                row = self._pending.get(key)
            if row is not None:
                out[i].copy_(row)
            else:
                payload = self.store.get(key, tokens[i * self.ps : (i + 1) * self.ps],
                                         self.page_bytes)  # fmt: skip
                if payload is None:
                    self.counters["load_failures"] += 1
                    break
                out[i].copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
            got += 1
        if got:
            self.counters["pages_loaded"] += got
            self._load_s_per_page = _ema(self._load_s_per_page,
                                         (time.perf_counter() - start) / got)  # fmt: skip
        return out[:got]

    # ---- cost -------------------------------------------------------------------------------
    def note_compute(self, tokens: int, seconds: float) -> None:
        """A forward step computed `tokens` prompt tokens in `seconds` (the recompute cost)."""
        if tokens >= MIN_TOKENS_TO_MEASURE:
            self._compute_s_per_token = _ema(self._compute_s_per_token, seconds / tokens)

    def worth_loading(self, pages: int) -> bool:
        """Whether loading `pages` is estimated cheaper than computing their tokens again
        ("always": whenever the tier has them; until both costs are measured: load)."""
        if self.load_policy == "always" or pages <= 0:
            return pages > 0
        if self._load_s_per_page is None or self._compute_s_per_token is None:
            return True
        return self._load_s_per_page * pages < self._compute_s_per_token * pages * self.ps

    def stats(self) -> dict[str, int | str | float]:
        c = self.counters
        with self._pending_lock:
            pending = len(self._pending)
        return {
            "hicache_storage_backend": self.backend,
            "hicache_storage_bytes": self.store.bytes,
            "hicache_storage_pages": len(self.store),
            "hicache_storage_budget_bytes": self.store.budget_bytes,
            "hicache_pages_written": c["pages_written"],
            "hicache_pages_pending": pending,
            "hicache_pages_loaded": c["pages_loaded"],
            "hicache_load_failures": c["load_failures"],
            "hicache_writes_dropped": c["writes_dropped"],
            "hicache_write_errors": c["write_errors"],
            "hicache_files_evicted": self.store.evicted_objects,
        }


def _ema(old: float | None, new: float, weight: float = 0.2) -> float:
    return new if old is None else (1 - weight) * old + weight * new
