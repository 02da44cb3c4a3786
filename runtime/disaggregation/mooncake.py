"""The `mooncake` transfer backend: room pages move through Mooncake's transfer engine.

The bootstrap exchange is the TCP protocol's (`protocol`): the decode server registers for a
room with its layout and `transfer: "mooncake"`, the prefill server answers META. Then, instead
of PAGE frames, META carries the prefill engine's Mooncake session and the address of every
page of the room's staged copy; the decode server reads them straight into the tensor the room
arrives in, with one batched `transfer_sync_read` (Mooncake's TCP transport here, RDMA where the
cluster has it: `disaggregation_mooncake_protocol`), and acknowledges (ACK, or ERROR when the
read failed); the prefill side then frees the copy.

No bytes are copied for Mooncake's sake: the prefill side registers the staged copy itself (the
one the `tcp` backend sends from) for the time of the read, and the decode side registers the
tensor it returns. Pages are staged (copied out of the pool) as with TCP, because the prefill
side retires its pages into the radix cache at the first token and the decode side allocates
pool pages only when it admits the request.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import Any

import torch

from runtime.errors import DisaggregationConfigError, KVTransferError
from runtime.memory.tier_mooncake import PACKAGE, SYSTEM_LIBS

logger = logging.getLogger(__name__)

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
    """Pages of a tensor registered with the transfer engine, until `release`."""

    addrs: list[int]
    buffer: torch.Tensor  # [pages, page_bytes] uint8


class MooncakeTransport:
    """One engine's Mooncake transfer engine (thread-safe)."""

    def __init__(self, host: str, page_bytes: int, protocol: str) -> None:
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
        logger.info("mooncake transfer engine: session %s", self.session)

    def close(self) -> None:
        """Stop the transfer engine now, while Python runs: left to the interpreter's exit, its
        native threads may be destroyed unjoined, which aborts the process."""
        engine, self.engine = self.engine, None
        if engine is not None:
            del engine

    def _live(self) -> Any:
        if self.engine is None:
            raise KVTransferError("the Mooncake transfer engine is closed (server shutting down)")
        return self.engine

    def expose(self, data: torch.Tensor) -> Staged:
        """Register `data` (`[pages, page_bytes]` uint8, contiguous, not empty) where it is:
        the address of each page."""
        if not data.is_contiguous() or data.dim() != 2 or data.shape[1] != self.page_bytes:
            raise ValueError(f"pages of {self.page_bytes} bytes expected, got {tuple(data.shape)}")
        if self._live().register_memory(data.data_ptr(), data.numel()) != 0:
            raise KVTransferError(f"Mooncake could not register {data.numel()} bytes")
        base = data.data_ptr()
        return Staged([base + i * self.page_bytes for i in range(data.shape[0])], data)

    def release(self, staged: Staged) -> None:
        """Unregister (before the tensor may be freed)."""
        if self.engine is not None:
            self.engine.unregister_memory(staged.buffer.data_ptr())

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
