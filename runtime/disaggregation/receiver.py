"""The decode side: pull one room's KV pages from a prefill server's bootstrap port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.disaggregation.mooncake import MooncakeTransport
from runtime.disaggregation.protocol import Kind, KVLayout, expect, receive, send, tune
from runtime.errors import KVTransferError

CONNECT_TIMEOUT_S = 5.0


@dataclass(slots=True)
class ReceivedKV:
    """A room as it arrived: the prefill side's tokens and its pages (in wire form)."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[dict[int, float]] | None
    kv_tokens: int  # positions 0 .. kv_tokens - 1 have K/V in `data` (or in the pool)
    data: torch.Tensor | None  # [num_pages, page_bytes] uint8; None: read into the pool
    transfer_s: float = 0.0  # from the first page to the acknowledgement
    bytes: int = 0  # moved over the wire
    landing: Any = None  # mooncake: where the pages land (modes.Landing)
    note_copy: Callable[[float], None] | None = field(default=None, repr=False)


class KVReceiver:
    def __init__(
        self, layout: KVLayout, timeout_s: float, mooncake: MooncakeTransport | None = None
    ) -> None:
        """`mooncake`: read the pages through Mooncake's transfer engine (mooncake.py)."""
        self.layout = layout
        self.timeout_s = timeout_s
        self.mooncake = mooncake
        self._lock = threading.Lock()
        self.counters = {"kv_transfer_requests": 0, "kv_transfer_bytes": 0,
                         "kv_transfer_failures": 0, "kv_transfer_s": 0.0,
                         "kv_transfer_copy_s": 0.0}  # fmt: skip

    def note_copy(self, seconds: float) -> None:
        """The scheduler copied a room's pages into the pool (tcp) in `seconds`."""
        with self._lock:
            self.counters["kv_transfer_copy_s"] += seconds

    def fetch(
        self, host: str, port: int, room: int,
        place: Callable[[ReceivedKV], tuple[int, list[int]]] | None = None,
    ) -> ReceivedKV:  # fmt: skip
        """The room's KV, or KVTransferError naming what went wrong (nothing is kept).

        mooncake: `place(kv)` is called once META has come (`kv.data` None) and returns where
        the pages go: the room's first page to read and this pool's pages for it and the
        following ones; they are read straight there."""
        try:
            got = self._fetch(host, port, room, place)
        except (KVTransferError, OSError, ValueError, KeyError, TypeError) as exc:
            with self._lock:
                self.counters["kv_transfer_failures"] += 1
            if isinstance(exc, KVTransferError):
                raise
            if isinstance(exc, TimeoutError | socket.timeout):
                raise KVTransferError(
                    f"prefill server {host}:{port} sent nothing for room {room} within "
                    f"{self.timeout_s:g} s"
                ) from exc
            raise KVTransferError(
                f"KV transfer of room {room} from {host}:{port} failed: {exc}"
            ) from exc
        with self._lock:
            self.counters["kv_transfer_requests"] += 1
            self.counters["kv_transfer_bytes"] += got.bytes
            self.counters["kv_transfer_s"] += got.transfer_s
        return got

    def _fetch(
        self, host: str, port: int, room: int,
        place: Callable[[ReceivedKV], tuple[int, list[int]]] | None,
    ) -> ReceivedKV:  # fmt: skip
        try:
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise KVTransferError(
                f"cannot reach the prefill server's bootstrap port {host}:{port}: {exc}"
            ) from exc
        with sock:
            tune(sock)
            # the prefill side answers within its own timeout; this is the backstop
            sock.settimeout(self.timeout_s + 10)
            transfer = "tcp" if self.mooncake is None else "mooncake"
            send(sock, Kind.REGISTER, {"room": room, "layout": self.layout.to_json(),
                                       "transfer": transfer})  # fmt: skip
            meta = expect(sock, Kind.META, f"room {room}")
            moving = time.perf_counter()  # the pages move from here (the prefill is done)
            num_pages, tokens = int(meta["num_pages"]), int(meta["kv_tokens"])
            if num_pages != -(-tokens // self.layout.page_size):
                raise KVTransferError(f"room {room}: {num_pages} pages for {tokens} tokens")
            top = meta.get("top_logprobs")
            got = ReceivedKV(
                prompt_ids=[int(t) for t in meta["prompt_ids"]],
                output_ids=[int(t) for t in meta["output_ids"]],
                logprobs=meta.get("logprobs"),
                top_logprobs=None
                if top is None
                else [{int(k): float(v) for k, v in d.items()} for d in top],
                kv_tokens=tokens,
                data=None,
                note_copy=self.note_copy,
            )
            if self.mooncake is None:
                got.data = self._receive_pages(sock, room, num_pages)
                got.bytes = got.data.numel()
                send(sock, Kind.ACK, {})
            else:
                if place is None:
                    raise KVTransferError("a mooncake transfer needs the pages to read into")
                where = meta.get("mooncake") or {}
                theirs = self._offered_pages(room, num_pages, where)
                first, mine = place(got)  # the scheduler allocates them (the wait not timed)
                moving = time.perf_counter()
                got.bytes = self._read_pages(sock, room, where, theirs[first:first + len(mine)],
                                             mine)  # fmt: skip
                send(sock, Kind.ACK, {"pages": len(mine)})
                # the prefill side held its pages until our ACK (else: ERROR, the read is void)
                expect(sock, Kind.DONE, f"room {room}")
            got.transfer_s = time.perf_counter() - moving
        return got

    def _receive_pages(self, sock: socket.socket, room: int, num_pages: int) -> torch.Tensor:
        """TCP: `num_pages` PAGE frames, then DONE."""
        data = torch.empty((num_pages, self.layout.page_bytes), dtype=torch.uint8)
        view = memoryview(data.numpy()).cast("B")
        width = self.layout.page_bytes
        for i in range(num_pages):
            kind, header, _ = receive(sock, view[i * width : (i + 1) * width])
            if kind is Kind.ERROR:
                raise KVTransferError(f"room {room}: {header.get('message')}")
            if kind is not Kind.PAGE or header.get("index") != i:
                raise KVTransferError(f"room {room}: expected page {i}, got {kind.name}")
        expect(sock, Kind.DONE, f"room {room}")
        return data

    def _offered_pages(self, room: int, num_pages: int, where: dict) -> list[int]:
        """The prefill pool's pages META offers for Mooncake reads."""
        theirs = [int(p) for p in where.get("pages", [])]
        if len(theirs) != num_pages or not where.get("session") or "bases" not in where:
            raise KVTransferError(
                f"room {room}: the prefill server offered {len(theirs)} Mooncake pages for "
                f"{num_pages} (is it using the tcp transfer backend?)"
            )
        return theirs

    def _read_pages(
        self, sock: socket.socket, room: int, where: dict, theirs: list[int], mine: list[int]
    ) -> int:
        """Mooncake: read the prefill pool's pages `theirs` into this pool's `mine`; a failed
        read is reported to the prefill side (ERROR) before it is raised here."""
        assert self.mooncake is not None
        try:
            bases = [int(b) for b in where["bases"]]
            return self.mooncake.read_pool(str(where["session"]), bases, theirs, mine)
        except KVTransferError as exc:
            try:
                send(sock, Kind.ERROR, {"message": f"the decode server's read failed: {exc}"})
            except OSError:
                pass
            raise KVTransferError(f"room {room}: {exc}") from exc
