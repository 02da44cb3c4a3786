"""The prefill side: rooms of prefilled requests, served to decode servers on the bootstrap port.

A room is opened when a request with a `bootstrap_room` arrives, staged by the scheduler once
the prefill and first token are done, and closed when a decode server has acknowledged every
page, or with an error: the prefill request failed, no decode server asked within the timeout,
the decode server disconnected, or its pool layout does not match. Whoever waits on the room
(the prefill request's caller) then sees the outcome.

Staging: with `tcp` the KV pages are copied out (the pool pages retire into the radix cache at
once) and the copy is dropped when the room closes; with `mooncake` nothing is copied: the room
names the request's pool pages, which the scheduler holds until the room closes (`when_ended`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.disaggregation.mooncake import MooncakeTransport
from runtime.disaggregation.protocol import Kind, KVLayout, expect, send, tune
from runtime.errors import KVTransferError

logger = logging.getLogger(__name__)

ACCEPT_POLL_S = 0.5


@dataclass(slots=True)
class Room:
    room: int
    opened_at: float = field(default_factory=time.monotonic)
    meta: dict[str, Any] | None = None
    data: torch.Tensor | None = None  # [num_pages, page_bytes] uint8, until sent (tcp)
    pages: list[int] | None = None  # the request's pool pages, held until the room ends (mooncake)
    error: str | None = None
    ended: bool = False
    on_end: list[Callable[[], None]] = field(default_factory=list)
    claimed: bool = False
    staged: threading.Event = field(default_factory=threading.Event)  # staged or failed
    done: threading.Event = field(default_factory=threading.Event)  # sent or failed


class KVSender:
    """The bootstrap server of a prefill engine (a listening socket and a thread per peer)."""

    def __init__(
        self,
        layout: KVLayout,
        host: str,
        port: int,
        timeout_s: float,
        mooncake: MooncakeTransport | None = None,
    ) -> None:
        """`mooncake`: pages move through Mooncake's transfer engine (mooncake.py) instead
        of PAGE frames; decode servers must use the same backend."""
        self.layout = layout
        self.timeout_s = timeout_s
        self.mooncake = mooncake
        self.transfer = "tcp" if mooncake is None else "mooncake"
        self._rooms: dict[int, Room] = {}
        # rooms that ended with an error, kept a while for a decode server that asks late
        self._failed: dict[int, tuple[str, float]] = {}
        self._cond = threading.Condition()
        self.counters = {"kv_transfer_requests": 0, "kv_transfer_bytes": 0,
                         "kv_transfer_failures": 0, "kv_transfer_s": 0.0,
                         "kv_transfer_copy_s": 0.0}  # fmt: skip
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(ACCEPT_POLL_S)
        self.port = self._sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept_loop, name="sgl-kv-bootstrap", daemon=True).start()
        threading.Thread(target=self._expire_loop, name="sgl-kv-expire", daemon=True).start()

    # ---- the prefill request's side --------------------------------------------------------
    def open_room(self, room: int) -> Room:
        with self._cond:
            if room in self._rooms:
                raise KVTransferError(f"bootstrap_room {room} is already in use on this server")
            if room in self._failed:  # its decode server came first and was refused
                raise KVTransferError(f"room {room}: {self._failed[room][0]}")
            state = self._rooms[room] = Room(room)
            self._cond.notify_all()
            return state

    def stage(
        self,
        state: Room,
        meta: dict[str, Any],
        data: torch.Tensor | None = None,
        pages: list[int] | None = None,
        copy_s: float = 0.0,
    ) -> None:
        """Called on the scheduler thread once the room's prefill and first token are done:
        with the copied pages (`data`, tcp) or the pool pages it holds (`pages`, mooncake)."""
        with self._cond:
            if state.error is None:
                state.meta, state.data, state.pages = meta, data, pages
            self.counters["kv_transfer_copy_s"] += copy_s
            state.staged.set()
            self._cond.notify_all()

    def when_ended(self, state: Room, callback: Callable[[], None]) -> None:
        """Call `callback` once the room has ended, however (at once if it has): it runs before
        the room's waiters wake, on the thread that ends the room."""
        with self._cond:
            if not state.ended:
                state.on_end.append(callback)
                return
        callback()

    def _end(self, state: Room) -> None:
        """The room is over (its fields set under the lock): run its callbacks, wake waiters."""
        with self._cond:
            callbacks, state.on_end = state.on_end, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # the scheduler is gone (shutdown): nothing is held any more
                logger.exception("room %d: releasing its pages failed", state.room)
        state.done.set()

    def fail(self, state: Room, message: str) -> None:
        """End the room with an error (if it has not ended yet); a waiting peer is told."""
        with self._cond:
            if state.ended:
                return
            state.ended = True
            state.error = state.error or message
            state.data = state.pages = None
            state.staged.set()
            self._rooms.pop(state.room, None)
            self._failed[state.room] = (state.error, time.monotonic())
            self.counters["kv_transfer_failures"] += 1
            self._cond.notify_all()
        self._end(state)

    def reject(self, room: int, message: str) -> None:
        """The server refused the request of `room` before (or while) running it: its decode
        server is told now instead of after the timeout."""
        with self._cond:
            state = self._rooms.get(room)
            if state is None:
                self._failed[room] = (message, time.monotonic())
                self._cond.notify_all()
                return
        self.fail(state, message)

    def wait(self, state: Room) -> str | None:
        """Block until the room is sent (None) or failed (its error)."""
        if not state.done.wait(timeout=3 * self.timeout_s + 10):
            self.fail(state, f"room {state.room} not finished within {3 * self.timeout_s:.0f} s")
        return state.error

    # ---- the decode servers' side ------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="sgl-kv-send").start()  # fmt: skip

    def _serve(self, conn: socket.socket) -> None:
        state: Room | None = None
        with conn:
            tune(conn)
            conn.settimeout(self.timeout_s + 5)
            try:
                reg = expect(conn, Kind.REGISTER, "registration")
                room = int(reg["room"])
                why = self.layout.mismatch(KVLayout.from_json(reg["layout"]))
                theirs = reg.get("transfer", "tcp")
                if why is None and theirs != self.transfer:
                    why = (f"transfer backend mismatch: the decode server uses {theirs!r}, this "
                           f"prefill server {self.transfer!r}")  # fmt: skip
                if why is not None:  # this room can never be handed over: end it now
                    self.reject(room, f"the decode server was refused: {why}")
                    raise KVTransferError(why)
                state = self._claim(room)
                self._send_room(conn, state)
            except (KVTransferError, OSError, KeyError, ValueError, TypeError) as exc:
                message = str(exc) or type(exc).__name__
                if isinstance(exc, OSError):
                    message = f"the decode server's connection failed ({message})"
                logger.warning("KV transfer failed: %s", message)
                try:
                    send(conn, Kind.ERROR, {"message": message})
                except OSError:
                    pass
                if state is not None:
                    self.fail(state, message)

    def _claim(self, room: int) -> Room:
        """The room, once staged; waits up to the timeout for it to arrive and be prefilled."""
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                state = self._rooms.get(room)
                if state is not None and state.staged.is_set():
                    break
                if state is None and room in self._failed:
                    raise KVTransferError(f"room {room}: {self._failed[room][0]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    if state is not None:
                        self.fail(state, f"room {room} was not prefilled within the timeout")
                    raise KVTransferError(
                        f"bootstrap room {room} did not arrive on this prefill server within "
                        f"{self.timeout_s:g} s"
                    )
                self._cond.wait(timeout=left)
            if state.error is not None:
                raise KVTransferError(f"room {room}: {state.error}")
            if state.claimed:
                raise KVTransferError(f"room {room} was already taken by another decode server")
            state.claimed = True
            return state

    def _send_room(self, conn: socket.socket, state: Room) -> None:
        start = time.perf_counter()
        data, pages = state.data, state.pages
        if (data is None and pages is None) or state.meta is None:
            raise KVTransferError(f"room {state.room} holds no staged KV")
        try:
            if self.mooncake is not None:
                if pages is None:
                    raise KVTransferError(f"room {state.room} holds no pool pages")
                moved = self._offer_pages(conn, state.meta, pages)
            else:
                assert data is not None
                send(conn, Kind.META, state.meta)
                for i in range(data.shape[0]):
                    send(conn, Kind.PAGE, {"index": i}, memoryview(data[i].numpy()))
                send(conn, Kind.DONE, {})
                expect(conn, Kind.ACK, "acknowledgement")
                moved = data.numel()
        except (OSError, KVTransferError) as exc:
            raise KVTransferError(
                f"the decode server disconnected during the transfer of room {state.room} ({exc})"
            ) from exc
        with self._cond:
            if state.ended:  # ended meanwhile (the server is shutting down): pages released
                raise KVTransferError(f"room {state.room}: {state.error}")
            state.ended = True
            state.data = state.pages = None
            self._rooms.pop(state.room, None)
            self.counters["kv_transfer_requests"] += 1
            self.counters["kv_transfer_bytes"] += moved
        if self.mooncake is not None:
            try:  # the pages were held until the ACK: the decode server may use what it read
                send(conn, Kind.DONE, {})
            except OSError:
                logger.warning("room %d: the decode server left before DONE", state.room)
        with self._cond:
            self.counters["kv_transfer_s"] += time.perf_counter() - start
        self._end(state)

    def _offer_pages(self, conn: socket.socket, meta: dict[str, Any], pages: list[int]) -> int:
        """Mooncake: META says where the room's pages lie in this pool; the decode server
        reads them and acknowledges (an ERROR frame: its read failed); `_send_room` then
        answers DONE: the pages were still held when the ACK came. Returns the bytes read."""
        assert self.mooncake is not None
        send(conn, Kind.META, {**meta, "mooncake": self.mooncake.offer(pages)})
        ack = expect(conn, Kind.ACK, "acknowledgement")
        return int(ack.get("pages", len(pages))) * self.layout.page_bytes

    def _expire_loop(self) -> None:
        """Rooms staged but never asked for: dropped after the timeout (their KV freed)."""
        while not self._stop:
            time.sleep(min(1.0, self.timeout_s / 4))
            now = time.monotonic()
            with self._cond:
                stale = [r for r in self._rooms.values()
                         if not r.claimed and now - r.opened_at > 2 * self.timeout_s]  # fmt: skip
                for room, (_, at) in list(self._failed.items()):
                    if now - at > 2 * self.timeout_s:
                        del self._failed[room]
            for state in stale:
                self.fail(state, f"no decode server asked for room {state.room} in time")

    @property
    def open_rooms(self) -> int:
        with self._cond:
            return len(self._rooms)

    def close(self) -> None:
        self._stop = True
        self._sock.close()
        with self._cond:
            rooms = list(self._rooms.values())
        for state in rooms:
            self.fail(state, "the prefill server shut down")
