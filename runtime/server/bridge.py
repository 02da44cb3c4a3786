"""`EngineBridge`: the blocking `runtime.Engine` seen from the asyncio event loop.

Every generation goes through the engine's streaming iterator, pumped by one thread per
request into an asyncio queue, so the event loop never blocks and any request (streamed or
not) can be aborted: `EngineStream.cancel()` closes the iterator, which makes the engine drop
the request and free its pages. The bridge also owns admission: at most
`max_running + max_queue` engine requests are in flight; past that the server answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio

from grammar.constraint import given_kinds
from runtime.scheduling.request import GenerateResult, StreamChunk, Usage
from runtime.server.errors import APIError

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class EngineStream:
    """One engine request, streamed into the event loop.

    Iterate it for `StreamChunk`s (the last has `finished=True` and `.result`); an error raised
    by the engine while starting the request (bad constraint, bad parameter) is raised by the
    first `__anext__`. `cancel()` may be called at any time, from the event loop.
    """

    def __init__(self, engine: Any, prompt_ids: list[int], kwargs: dict[str, Any]) -> None:
        self._engine = engine
        self._prompt_ids = prompt_ids
        self._kwargs = kwargs
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._lock = threading.Lock()
        self._iterator: Any = None
        self.cancelled = False
        self.done = False
        self._text: list[str] = []  # what has streamed so far, for `_aborted_chunk`
        self._token_ids: list[int] = []
        # in the request's context (`compile_pool.arrival`: when it arrived)
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(self._pump,), name="sgl-server-stream",
                         daemon=True).start()  # fmt: skip

    @property
    def constraint_key(self) -> str | None:
        """The constraint keyword this request carries (regex, json_schema, ...), if any."""
        given = given_kinds(self._kwargs)
        return given[0] if given else None

    def _put(self, item: tuple[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _pump(self) -> None:
        try:
            iterator = self._engine.generate(self._prompt_ids, stream=True, **self._kwargs)
            with self._lock:
                self._iterator = iterator
                cancelled = self.cancelled
            if cancelled:
                iterator.close()
            for chunk in iterator:
                self._put(("chunk", chunk))
        except BaseException as exc:  # handed to the event loop
            self._put(("error", exc))
        finally:
            self._put(("end", None))

    def cancel(self) -> None:
        """Abort the request in the engine (its pages are freed); idempotent."""
        with self._lock:
            if self.cancelled or self.done:
                return
            self.cancelled = True
            iterator = self._iterator
        if iterator is not None:
            iterator.close()

    def __aiter__(self) -> AsyncIterator[StreamChunk]:
        return self

    async def __anext__(self) -> StreamChunk:
        if self.done:
            raise StopAsyncIteration
        kind, value = await self._queue.get()
        if kind == "chunk":
            if value.finished:
                self.done = True
            else:
                self._text.append(value.text_delta)
                self._token_ids.extend(value.token_ids)
            return value
        self.done = True
        if kind == "error":
            raise value
        if self.cancelled:
            # closing the engine's iterator can end it before its final (abort) chunk
            return self._aborted_chunk()
        raise StopAsyncIteration

    def _aborted_chunk(self) -> StreamChunk:
        result = GenerateResult(
            text="".join(self._text),
            token_ids=list(self._token_ids),
            prompt_token_ids=list(self._prompt_ids),
            finish_reason="abort",
            usage=Usage(
                prompt_tokens=len(self._prompt_ids), completion_tokens=len(self._token_ids)
            ),
        )
        return StreamChunk(text_delta="", token_ids=[], finished=True, result=result)


class Admission:
    """Engine requests reserved by one HTTP request; `release()` is idempotent."""

    def __init__(self, bridge: EngineBridge, count: int) -> None:
        self._bridge = bridge
        self._count = count

    def release(self) -> None:
        self._bridge.in_flight -= self._count
        self._count = 0


class EngineBridge:
    def __init__(self, engine: Any, *, max_running: int, max_queue: int) -> None:
        self.engine = engine
        self.capacity = max_running + max_queue
        self.in_flight = 0
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the app starts
        self._streams: set[EngineStream] = set()
        cfg = engine.config
        self.context_len = min(cfg.max_position_embeddings, engine.pool.capacity_tokens)

    # ---- admission ---------------------------------------------------------------------------
    def acquire(self, count: int = 1) -> Admission:
        """Reserve `count` engine requests until `.release()`, or raise 503 when full."""
        if self.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if self.in_flight + count > self.capacity:
            raise APIError(
                503,
                f"server busy: {self.in_flight} requests in flight, queue limit reached; "
                "retry later",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.in_flight += count
        return Admission(self, count)

    # ---- prompts -----------------------------------------------------------------------------
    async def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return await anyio.to_thread.run_sync(self.engine.encode, prompt)
        try:
            return self.engine.encode(prompt)
        except ValueError as exc:  # the user's token ids: a 400 naming them, no traceback logged
            raise APIError(400, str(exc), param="prompt", code="invalid_value") from None

    async def encode_chat(self, prompt: str) -> list[int]:
        """A chat prompt's ids as `apply_chat_template(..., tokenize=True)` gives them: the
        template writes the special tokens it wants (a BOS, ...), none is added to its text."""
        tok = self.engine.tokenizer
        if not getattr(tok, "chat_template", None):
            return await self.encode(prompt)  # our plain "User: ..." text: as any prompt

        def run() -> list[int]:
            return list(tok(prompt, add_special_tokens=False).input_ids)

        return await anyio.to_thread.run_sync(run)

    def check_length(self, prompt_ids: list[int], param: str) -> None:
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param=param, code="empty_prompt")
        if len(prompt_ids) >= self.context_len:
            raise APIError(
                413,
                f"prompt of {len(prompt_ids)} tokens is longer than the model's context of "
                f"{self.context_len} tokens",
                param=param,
                code="context_length_exceeded",
            )

    def clamp_max_tokens(self, prompt_len: int, requested: int | None) -> int:
        room = self.context_len - prompt_len
        return room if requested is None else min(requested, room)

    # ---- requests ----------------------------------------------------------------------------
    def open(self, prompt_ids: list[int], kwargs: dict[str, Any]) -> EngineStream:
        stream = EngineStream(self.engine, prompt_ids, kwargs)
        self._streams.add(stream)
        return stream

    def forget(self, stream: EngineStream) -> None:
        self._streams.discard(stream)

    async def run(self, fn: Any, *args: Any) -> Any:
        """A blocking engine call (score, stats) on a worker thread."""
        return await anyio.to_thread.run_sync(fn, *args)

    def begin_drain(self, grace_s: float) -> None:
        """Refuse new requests now; cancel the running ones after `grace_s` seconds.

        Safe to call from a signal handler: the cancellation is scheduled on the event loop,
        and cancelled requests still end their streams properly (final chunk, [DONE]).
        """
        self.draining = True
        if self.loop is not None and not self.loop.is_closed():
            delay = max(0.0, grace_s)
            self.loop.call_soon_threadsafe(self.loop.call_later, delay, self.cancel_all)

    def cancel_all(self) -> int:
        streams = list(self._streams)
        for stream in streams:
            stream.cancel()
        return len(streams)
