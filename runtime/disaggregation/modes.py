"""What `disaggregation_mode` changes in an engine: the prefill side and the decode side.

- prefill: a request that carries a `bootstrap_room` is prefilled (radix cache, chunked
  prefill as usual), its first token sampled (through its constraint's mask), and then it ends
  here: its KV is staged for the decode server that asks for that room on the bootstrap port
  (tcp: copied out; mooncake: its pool pages held until the room ends, `Ticket.keeps_pages`).
  The request's result is returned only once the hand-off is over, as an error if it failed.
- decode: a request that carries `bootstrap_host` / `bootstrap_port` / `bootstrap_room` first
  pulls that room's KV (off the scheduler thread), then enters the queue with it: the
  scheduler writes the pages into its own pool and decodes from the first token on. With
  mooncake the request enters the queue as soon as META has come (`Landing`): the scheduler
  allocates its pages, the read fills them, and then it decodes.

A request without a room is served by either kind of server as by a plain one.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import torch

from runtime.config import ModelConfig
from runtime.disaggregation.mooncake import MooncakeTransport
from runtime.disaggregation.protocol import KVLayout
from runtime.disaggregation.receiver import KVReceiver, ReceivedKV
from runtime.disaggregation.sender import KVSender, Room
from runtime.errors import DisaggregationConfigError, KVTransferError
from runtime.memory.kv_pages import page_bytes, pool_regions, read_pages
from runtime.memory.kv_pool import KVPool
from runtime.scheduling.request import GenerateResult, Request, StreamChunk

logger = logging.getLogger(__name__)

MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("tcp", "mooncake")
BOOTSTRAP_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")
DEFAULT_BOOTSTRAP_PORT = 8998
DEFAULT_TIMEOUT_S = 120.0


def model_fingerprint(config: ModelConfig, state_dict: dict[str, torch.Tensor]) -> str:
    """A digest of the model's shape and a sample of its weights: two servers exchange KV only
    when they serve the same model."""
    h = hashlib.sha256(repr(sorted(asdict(config).items())).encode())
    for name in sorted(state_dict)[:4]:
        w = state_dict[name]
        h.update(name.encode())
        if hasattr(w, "qtype"):  # a quantized weight: its format and stored bytes
            h.update(f"ggml type {w.qtype}".encode())
            h.update(w.data.reshape(-1)[:4096].numpy().tobytes())
            continue
        t = w.detach().reshape(-1)[:4096].to(torch.float32)
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:32]


def pool_layout(pool: KVPool, fingerprint: str) -> KVLayout:
    layers = len(next(iter(pool.buffers.values()), []))
    return KVLayout(
        model=fingerprint,
        dtype=str(pool.dtype).replace("torch.", ""),
        page_size=pool.page_size,
        num_layers=layers,
        tensors=tuple(pool.layout),
        page_bytes=page_bytes(pool),
        kv_calibration=pool.calibration_digest(),
    )


def split_bootstrap(kw: dict[str, Any]) -> dict[str, Any] | None:
    """Pop the bootstrap keywords out of generate()'s keywords; None when there is no room."""
    given = {k: kw.pop(k) for k in BOOTSTRAP_KEYS if k in kw}
    if given.get("bootstrap_room") is None:
        return None
    try:
        room = int(given["bootstrap_room"])
        port = given.get("bootstrap_port")
        port = None if port is None else int(port)
    except (TypeError, ValueError):
        raise ValueError("bootstrap_room and bootstrap_port must be integers") from None
    return {"room": room, "host": given.get("bootstrap_host"), "port": port}


class Ticket:
    """A prefill request's room, as the scheduler sees it (`req.handoff`)."""

    def __init__(self, sender: KVSender, room: Room) -> None:
        self.sender = sender
        self.room = room
        self.keeps_pages = False  # its pool pages are read in place: held until the room ends

    def stage(self, pool: KVPool, req: Request) -> None:
        """On the scheduler thread: hand the request's KV to the room (tcp: a copy; mooncake:
        the pool pages, which the scheduler then holds, see `when_sent`)."""
        try:
            tokens = req.computed
            pages = req.pages[: -(-tokens // pool.page_size)]
            meta = {
                "prompt_ids": req.prompt_ids,
                "output_ids": req.output_ids,
                "logprobs": req.logprobs,
                "top_logprobs": None
                if req.top_logprobs is None
                else [{str(k): v for k, v in d.items()} for d in req.top_logprobs],
                "kv_tokens": tokens,
                "num_pages": len(pages),
            }
            if self.sender.mooncake is not None:
                self.keeps_pages = True
                self.sender.stage(self.room, meta, pages=list(pages))
                return
            start = time.perf_counter()
            data = read_pages(pool, pages) if pages else torch.empty((0, 0), dtype=torch.uint8)
            self.sender.stage(self.room, meta, data, copy_s=time.perf_counter() - start)
        except Exception as exc:  # only this room fails; the scheduler goes on
            logger.exception("staging room %d failed", self.room.room)
            self.sender.fail(self.room, f"staging the KV failed: {exc}")

    def when_sent(self, callback: Callable[[], None]) -> None:
        """`callback()` once the room has ended (read, failed or timed out): the held pages
        may go then."""
        self.sender.when_ended(self.room, callback)


class Landing:
    """Decode side, mooncake: where a room's pages land in this pool. The fetch thread submits
    the request once META has come and waits (`wait_placed`); the scheduler admits it,
    allocates its pages and says which (`place`); the fetch thread reads into them and ends
    it (`end`); the scheduler then lets it decode, or frees the pages. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.state = "waiting"  # -> placed -> landed | failed; or waiting -> failed
        self.first = 0  # the room's first page read (the ones before it: this radix cache's)
        self.pages: list[int] = []
        self.error: KVTransferError | None = None

    def place(self, first: int, pages: list[int]) -> bool:
        """Scheduler: the request holds `pages` for the room's pages `first`, ...; False when
        the fetch gave up meanwhile (the scheduler frees them)."""
        with self._cond:
            if self.state != "waiting":
                return False
            self.state, self.first, self.pages = "placed", first, list(pages)
            self._cond.notify_all()
            return True

    def wait_placed(self, timeout_s: float) -> tuple[int, list[int]]:
        with self._cond:
            self._cond.wait_for(lambda: self.state != "waiting", timeout_s)
            if self.state == "waiting":
                self.state = "failed"
                self.error = KVTransferError(
                    f"no room in this decode server's KV pool for the transfer within "
                    f"{timeout_s:g} s"
                )
            if self.state != "placed":
                raise self.error or KVTransferError("the request ended before its KV arrived")
            return self.first, self.pages

    def end(self, error: KVTransferError | None) -> None:
        """Fetch thread: the read is over (None: the pages hold the room's KV)."""
        with self._cond:
            if self.state in ("waiting", "placed"):
                self.state = "landed" if error is None else "failed"
                self.error = error
                self._cond.notify_all()

    @property
    def pending(self) -> bool:
        return self.state in ("waiting", "placed")


class HandoffStream(Iterator[StreamChunk]):
    """A prefill request's stream: its last chunk comes once the room is handed off, and says
    so (finish_reason "abort" with the error) when the hand-off failed."""

    def __init__(self, inner: Iterator[StreamChunk], ticket: Ticket) -> None:
        self._inner = inner
        self._ticket = ticket

    def __next__(self) -> StreamChunk:
        chunk = next(self._inner)
        if chunk.finished and chunk.result is not None:
            finish_room(self._ticket, chunk.result)
        return chunk

    def close(self) -> None:
        self._inner.close()  # type: ignore[attr-defined]
        if not self._ticket.room.staged.is_set():
            self._ticket.sender.fail(self._ticket.room, "the prefill request was cancelled")

    def __del__(self) -> None:  # dropped unfinished, as StreamIterator: end the room too
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __enter__(self) -> HandoffStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def finish_room(ticket: Ticket, result: GenerateResult) -> None:
    """Wait for the room's hand-off; a failed one turns the result into an abort."""
    sender, room = ticket.sender, ticket.room
    if not room.staged.is_set():  # the prefill itself ended without a first token
        sender.fail(room, f"the prefill request ended ({result.finish_reason}): {result.error}")
    error = sender.wait(room)
    if error is not None:
        result.finish_reason = "abort"
        result.error = f"KVTransferError: {error}"


class Disaggregation:
    """An engine's prefill or decode role (`mode` "null": neither)."""

    def __init__(
        self,
        mode: str,
        pool: KVPool | None,
        fingerprint: str,
        *,
        bootstrap_host: str = "0.0.0.0",
        bootstrap_port: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transfer_backend: str = "tcp",
        mooncake_protocol: str = "tcp",
    ) -> None:
        """`pool`: the engine's KV pool (None: it lives on worker ranks). `transfer_backend`:
        how pages move ("tcp": PAGE frames on the bootstrap connection; "mooncake": pool to
        pool through Mooncake's transfer engine over `mooncake_protocol`)."""
        if mode not in MODES:
            raise DisaggregationConfigError(
                f"disaggregation_mode must be one of {MODES}, got {mode!r}"
            )
        if transfer_backend not in TRANSFER_BACKENDS:
            raise DisaggregationConfigError(
                f"disaggregation_transfer_backend must be one of {TRANSFER_BACKENDS}, got "
                f"{transfer_backend!r}"
            )
        self.mode = mode
        self.transfer_backend = transfer_backend
        self.timeout_s = timeout_s
        self.sender: KVSender | None = None
        self.receiver: KVReceiver | None = None
        self.mooncake: MooncakeTransport | None = None
        if mode == "null":
            return
        if pool is None:
            raise DisaggregationConfigError(
                f"disaggregation_mode {mode!r} needs the pool in this process (tp/pp/ep > 1 "
                "keeps it on the worker ranks, which is not supported yet)"
            )
        layout = pool_layout(pool, fingerprint)
        if transfer_backend == "mooncake":
            if pool.device.type != "cpu":
                raise DisaggregationConfigError(
                    "disaggregation_transfer_backend 'mooncake' reads host-memory pools only "
                    f"(this pool is on {pool.device}; the non-CUDA Mooncake build is installed)"
                )
            self.mooncake = MooncakeTransport(bootstrap_host, pool_regions(pool),
                                              mooncake_protocol)  # fmt: skip
        mooncake = self.mooncake
        if mode == "prefill":
            port = DEFAULT_BOOTSTRAP_PORT if bootstrap_port is None else bootstrap_port
            try:
                self.sender = KVSender(layout, bootstrap_host, port, timeout_s, mooncake)
            except OSError as exc:
                self.close()
                raise DisaggregationConfigError(
                    f"cannot listen on the bootstrap port {bootstrap_host}:{port}: {exc}"
                ) from exc
            logger.info("prefill server: KV bootstrap on %s:%d", bootstrap_host, self.sender.port)
        else:
            self.receiver = KVReceiver(layout, timeout_s, mooncake)

    @property
    def bootstrap_port(self) -> int | None:
        return self.sender.port if self.sender is not None else None

    def counters(self) -> dict[str, Any]:
        side = self.sender or self.receiver
        base = {"kv_transfer_requests": 0, "kv_transfer_bytes": 0, "kv_transfer_failures": 0,
                "kv_transfer_s": 0.0}  # fmt: skip
        return {"disaggregation_mode": self.mode,
                "disaggregation_transfer_backend": self.transfer_backend,
                **(side.counters if side else base)}  # fmt: skip

    # ---- prefill ---------------------------------------------------------------------------
    def attach_prefill(self, req: Request, boot: dict[str, Any]) -> Ticket | None:
        if self.sender is None:
            return None
        ticket = Ticket(self.sender, self.sender.open_room(boot["room"]))
        req.handoff = ticket
        return ticket

    def reject(self, room: int, message: str) -> None:
        """A prefill server refused the request of `room` (an HTTP error before or while it
        ran): the decode server that asks for the room gets `message` at once."""
        if self.sender is not None:
            self.sender.reject(room, message)

    # ---- decode ----------------------------------------------------------------------------
    def submit_decode(
        self,
        req: Request,
        boot: dict[str, Any],
        submit: Callable[[Request], None],
        wake: Callable[[], None] = lambda: None,
    ) -> bool:
        """Fetch the room on a thread, then `submit(req)` with its KV (or with the error); with
        mooncake, `submit(req)` once META has come, with `req.imported.landing` to place, and
        `wake()` the scheduler when the read has ended. False (nothing done) on a server that
        is not a decode server."""
        if self.receiver is None:
            return False
        if boot["host"] is None or boot["port"] is None:
            raise ValueError("bootstrap_room needs bootstrap_host and bootstrap_port")
        receiver = self.receiver
        submitted = False

        def accept(got: ReceivedKV) -> None:
            if got.prompt_ids != req.prompt_ids:
                raise KVTransferError(
                    f"room {boot['room']}: the prefill server's prompt has "
                    f"{len(got.prompt_ids)} tokens, this one {len(req.prompt_ids)} (or "
                    "they differ): the two servers tokenise differently"
                )
            req.output_ids = list(got.output_ids)
            req.imported = got

        def place(got: ReceivedKV) -> tuple[int, list[int]]:
            """mooncake: the request enters the queue now; its pages are read once placed."""
            nonlocal submitted
            accept(got)
            got.landing = Landing()
            submitted = True
            submit(req)
            return got.landing.wait_placed(self.timeout_s)

        def fetch() -> None:
            try:
                got = receiver.fetch(boot["host"], boot["port"], boot["room"], place)
                if got.landing is not None:
                    got.landing.end(None)
                else:
                    accept(got)
            except Exception as exc:  # whatever went wrong, the request ends (never hangs)
                error = (
                    exc
                    if isinstance(exc, KVTransferError)
                    else KVTransferError(
                        f"room {boot['room']}: receiving the KV failed: {type(exc).__name__}: {exc}"
                    )
                )
                if submitted:  # the scheduler has it: it frees the pages and ends it
                    req.imported.landing.end(error)
                    wake()
                    return
                req.error = error
                req.finish_reason = "abort"
            if submitted:
                wake()
            else:
                submit(req)

        threading.Thread(target=fetch, name="sgl-kv-fetch", daemon=True).start()
        return True

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        if self.mooncake is not None:
            self.mooncake.close()
