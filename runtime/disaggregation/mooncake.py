"""The `mooncake` transfer backend: room pages move through Mooncake's transfer engine.

The bootstrap exchange is the TCP protocol's (`protocol`): the decode server registers for a
room with its layout and `transfer: "mooncake"`, the prefill server answers META. Then, instead
of PAGE frames, META carries the prefill engine's Mooncake session and the address of every
page in its staging arena; the decode server reads them into its own arena with one batched
`transfer_sync_read` (Mooncake's TCP transport here, RDMA where the cluster has it:
`disaggregation_mooncake_protocol`), copies them out and acknowledges (ACK, or ERROR when the
read failed), and the prefill side frees the slots.

Each engine registers one arena with Mooncake when it starts (a staging area of whole pages,
`ARENA_BYTES` at most, never more pages than the pool): a room larger than the free part of the
arena registers a buffer of its own for the transfer. Pages are staged (copied out of the pool)
as with TCP, because the prefill side retires its pages into the radix cache at the first token
and the decode side allocates pool pages only when it admits the request.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any

import torch

from runtime.errors import DisaggregationConfigError, KVTransferError
from runtime.memory.tier_mooncake import PACKAGE, SYSTEM_LIBS

logger = logging.getLogger(__name__)

ARENA_BYTES = 256 * 2**20
PROTOCOLS = ("tcp", "rdma")


def load_transfer_engine() -> Any:
    """Mooncake's `TransferEngine` class, or a DisaggregationConfigError naming what is
    missing (the pip package, or the system libraries its build links)."""
    try:
        from mooncake.engine import TransferEngine
    except ModuleNotFoundError as exc:
        raise DisaggregationConfigError(
            f"disaggregation_transfer_backend 'mooncake' needs Mooncake's transfer engine: pip "
            f"install {PACKAGE} (scripts/install.sh installs it); {exc}"
        ) from exc
    except (ImportError, OSError) as exc:  # the package is there, a shared library is not
        raise DisaggregationConfigError(
            f"disaggregation_transfer_backend 'mooncake': the {PACKAGE} package is installed "
            f"but a system library it links is missing ({exc}); on Debian / Ubuntu: apt-get "
            f"install {SYSTEM_LIBS} (scripts/install.sh does)"
        ) from exc
    return TransferEngine


def reachable_host(host: str) -> str:
    """The address peers reach this engine at: the bootstrap host, or this machine's."""
    if host and host not in ("0.0.0.0", "::"):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass(slots=True)
class Staged:
    """Pages placed in registered memory: where each page is, and how to give it back."""

    addrs: list[int]
    buffer: torch.Tensor  # the arena, or a buffer registered for this room alone
    slots: list[int] | None  # arena slots (None: an own buffer, unregistered on release)


class MooncakeTransport:
    """One engine's Mooncake transfer engine and registered staging arena (thread-safe)."""

    def __init__(self, host: str, page_bytes: int, max_pages: int, protocol: str) -> None:
        if protocol not in PROTOCOLS:
            raise DisaggregationConfigError(
                f"disaggregation_mooncake_protocol must be one of {list(PROTOCOLS)}, got "
                f"{protocol!r}"
            )
        engine_class = load_transfer_engine()
        self.engine = engine_class()
        self.host = reachable_host(host)
        if self.engine.initialize(self.host, "P2PHANDSHAKE", protocol, "") != 0:
            raise DisaggregationConfigError(
                f"Mooncake's transfer engine did not start on {self.host} ({protocol})"
            )
        self.session = f"{self.host}:{self.engine.get_rpc_port()}"
        self.page_bytes = page_bytes
        slots = max(1, min(max_pages, ARENA_BYTES // max(page_bytes, 1)))
        self.arena = torch.zeros((slots, page_bytes), dtype=torch.uint8)
        self._register(self.arena)
        self._free = list(range(slots - 1, -1, -1))
        self._lock = threading.Lock()
        logger.info("mooncake transfer engine: session %s, %d arena pages (%.1f MiB)",
                    self.session, slots, self.arena.numel() / 2**20)  # fmt: skip

    def close(self) -> None:
        """Stop the transfer engine now, while Python runs: left to the interpreter's exit, its
        native threads may be destroyed unjoined, which aborts the process."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.unregister_memory(self.arena.data_ptr())
            del engine

    def _live(self) -> Any:
        if self.engine is None:
            raise KVTransferError("the Mooncake transfer engine is closed (server shutting down)")
        return self.engine

    def _register(self, buffer: torch.Tensor) -> None:
        if self._live().register_memory(buffer.data_ptr(), buffer.numel()) != 0:
            raise KVTransferError(f"Mooncake could not register {buffer.numel()} bytes")

    # ---- staging ------------------------------------------------------------------------------
    def reserve(self, pages: int) -> Staged:
        """Registered room for `pages` pages: arena slots, or a buffer of its own."""
        with self._lock:
            if pages <= len(self._free):
                slots = [self._free.pop() for _ in range(pages)]
                base, width = self.arena.data_ptr(), self.page_bytes
                return Staged([base + s * width for s in slots], self.arena, slots)
        own = torch.empty((max(pages, 1), self.page_bytes), dtype=torch.uint8)
        self._register(own)
        return Staged([own.data_ptr() + i * self.page_bytes for i in range(pages)], own, None)

    def release(self, staged: Staged) -> None:
        if staged.slots is None:
            if self.engine is not None:
                self.engine.unregister_memory(staged.buffer.data_ptr())
            return
        with self._lock:
            self._free.extend(staged.slots)
            staged.slots = []

    def place(self, data: torch.Tensor) -> Staged:
        """Copy `data` ([pages, page_bytes] uint8) into registered memory."""
        staged = self.reserve(data.shape[0])
        for i, addr in enumerate(staged.addrs):
            ctypes.memmove(addr, data[i].data_ptr(), self.page_bytes)
        return staged

    def copy_out(self, staged: Staged) -> torch.Tensor:
        out = torch.empty((len(staged.addrs), self.page_bytes), dtype=torch.uint8)
        for i, addr in enumerate(staged.addrs):
            ctypes.memmove(out[i].data_ptr(), addr, self.page_bytes)
        return out

    # ---- moving -----------------------------------------------------------------------------
    def read(self, peer: str, remote: list[int], local: list[int]) -> None:
        """Read the peer's pages at `remote` into ours at `local` (one batched call; runs of
        consecutive pages on both sides go as one piece)."""
        runs: list[list[int]] = []  # [local, remote, length]
        for mine, theirs in zip(local, remote, strict=True):
            last = runs[-1] if runs else None
            if last and last[0] + last[2] == mine and last[1] + last[2] == theirs:
                last[2] += self.page_bytes
            else:
                runs.append([mine, theirs, self.page_bytes])
        if not runs:
            return
        code = self._live().batch_transfer_sync_read(
            peer, [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]
        )
        if code != 0:
            raise KVTransferError(f"Mooncake read from {peer} failed (code {code})")
