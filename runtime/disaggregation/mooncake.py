"""The `mooncake` transfer backend: room pages move pool to pool through Mooncake's transfer
engine.

Each engine registers its whole KV pool with its transfer engine once, at start
(`kv_pages.pool_regions`: one region per layer tensor). The bootstrap exchange is the TCP
protocol's (`protocol`): the decode server registers for a room with its layout and
`transfer: "mooncake"`, the prefill server answers META. Then, instead of PAGE frames:

- prefill: META carries its Mooncake session, its regions' addresses and the room's page ids
  in its pool. No page is copied: the request's pages stay held (not freed, not evicted) until
  the room ends: the decode server's ACK, an error, or its connection failing or timing out.
- decode: the scheduler admits the request and allocates its pool pages first (`Landing`),
  then one batched read (`read_pool`) brings every layer's pages straight into them: runs of
  consecutive pages on both sides go as one piece per layer tensor. It sends ACK; the prefill
  side answers DONE, which says it still held the pages when the ACK came (after a timeout
  it answers ERROR, and the decode side drops what it read).

Mooncake's TCP transport is used here, RDMA where the cluster has it
(`disaggregation_mooncake_protocol`; RDMA pins the registered pool, untested here).
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

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


# the TCP transport queues at most 1024 transfers per peer (MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER)
# and refuses a batch beyond that: reads go in batches of at most this many pieces, and the
# pieces in flight to one peer stay under the queue's size
MAX_BATCH = 512
MAX_IN_FLIGHT = 1024


def pieces(
    local: list[tuple[int, int, int]], remote: list[int], mine: list[int], theirs: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """The (local address, remote address, length) of every piece that moves pages `theirs`
    of the peer's pool into pages `mine` of ours: per pool tensor, one piece per run of pages
    consecutive on both sides, rising or falling alike (the pool hands pages out falling).
    `local`: our regions (`pool_regions`); `remote`: the peer's region addresses, in the same
    order (equal layouts: equal strides)."""
    runs: list[list[int]] = []  # [our first page, their first page, pages, step +1 / -1]
    for a, b in zip(mine, theirs, strict=True):
        if runs:
            a0, b0, n, step = runs[-1]
            d = a - (a0 + step * (n - 1))
            if d == b - (b0 + step * (n - 1)) and d in (1, -1) and (n == 1 or d == step):
                runs[-1][2:] = [n + 1, d]
                continue
        runs.append([a, b, 1, 1])
    dst: list[int] = []
    src: list[int] = []
    lengths: list[int] = []
    for (base, stride, _), theirs_base in zip(local, remote, strict=True):
        for a, b, n, step in runs:
            low = 0 if step == 1 else n - 1  # the run's lowest page on both sides
            dst.append(base + (a - low) * stride)
            src.append(theirs_base + (b - low) * stride)
            lengths.append(n * stride)
    return dst, src, lengths


class MooncakeTransport:
    """One engine's Mooncake transfer engine, with the engine's KV pool registered (thread-safe)."""

    def __init__(self, host: str, regions: list[tuple[int, int, int]], protocol: str) -> None:
        """`regions`: the pool's tensors (`kv_pages.pool_regions`), registered until `close`."""
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
        self.regions = list(regions)
        self.bases = [r[0] for r in self.regions]
        if (
            self.regions
            and self.engine.batch_register_memory(self.bases, [r[2] for r in self.regions]) != 0
        ):
            raise DisaggregationConfigError(
                f"Mooncake could not register the KV pool ({sum(r[2] for r in regions)} bytes)"
            )
        self._flight = threading.Condition()
        self._in_flight: dict[str, int] = {}  # pieces being read, by peer session
        logger.info("mooncake transfer engine: session %s, %d pool regions registered",
                    self.session, len(self.regions))  # fmt: skip

    def close(self) -> None:
        """Stop the transfer engine now, while Python runs: left to the interpreter's exit, its
        native threads may be destroyed unjoined, which aborts the process."""
        engine, self.engine = self.engine, None
        if engine is not None:
            if self.regions:
                engine.batch_unregister_memory(self.bases)
            del engine

    def _live(self) -> Any:
        if self.engine is None:
            raise KVTransferError("the Mooncake transfer engine is closed (server shutting down)")
        return self.engine

    def offer(self, pages: list[int]) -> dict[str, Any]:
        """What META says of a room's pages in this engine's pool (`read_pool` takes it)."""
        return {"session": self.session, "bases": self.bases, "pages": list(pages)}

    # ---- moving -----------------------------------------------------------------------------
    def read_pool(self, peer: str, remote: list[int], theirs: list[int], mine: list[int]) -> int:
        """Read the peer's pool pages `theirs` (its region addresses `remote`) into our pool
        pages `mine`; returns the bytes moved."""
        if len(remote) != len(self.regions):
            raise KVTransferError(
                f"the peer's pool has {len(remote)} regions, this one {len(self.regions)}"
            )
        dst, src, lengths = pieces(self.regions, remote, mine, theirs)
        for at in range(0, len(dst), MAX_BATCH):
            end = min(at + MAX_BATCH, len(dst))
            self._take(peer, end - at)
            try:
                code = self._live().batch_transfer_sync_read(
                    peer, dst[at:end], src[at:end], lengths[at:end]
                )
            finally:
                self._give(peer, end - at)
            if code != 0:
                raise KVTransferError(f"Mooncake read from {peer} failed (code {code})")
        return sum(lengths)

    def _take(self, peer: str, count: int) -> None:
        with self._flight:
            self._flight.wait_for(lambda: self._in_flight.get(peer, 0) + count <= MAX_IN_FLIGHT)
            self._in_flight[peer] = self._in_flight.get(peer, 0) + count

    def _give(self, peer: str, count: int) -> None:
        with self._flight:
            self._in_flight[peer] -= count
            self._flight.notify_all()
