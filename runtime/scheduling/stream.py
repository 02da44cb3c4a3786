"""The iterators `Engine.generate(..., stream=True)` and `Engine.async_generate(...,
stream=True)` return."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from runtime.scheduling.request import Request, StreamChunk


class StreamIterator(Iterator[StreamChunk]):
    """Yields `StreamChunk`s until one has `finished=True`.

    Closing it (or dropping it) before the end aborts the request, freeing its pages.
    """

    def __init__(self, req: Request, abort) -> None:
        self._req = req
        self._abort = abort
        self._done = False

    def __next__(self) -> StreamChunk:
        if self._done:
            raise StopIteration
        chunk: StreamChunk = self._req.outbox.get()
        if chunk.finished:
            self._done = True
        return chunk

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._abort(self._req)

    def __enter__(self) -> StreamIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


class LoopOutbox:
    """A request's outbox that hands what the scheduler thread puts to an asyncio loop.

    `put` may be called from any thread; the items arrive, in order, in `queue` on `loop`
    (a loop already closed drops them: nobody is waiting there any more).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)


class AsyncStreamIterator(AsyncIterator[StreamChunk]):
    """The asyncio form of `StreamIterator`: `async for chunk in it` until `finished=True`.

    It must be iterated on the loop it was made on. `aclose()` (or a cancelled `__anext__`)
    before the end aborts the request, freeing its pages.
    """

    def __init__(self, req: Request, outbox: LoopOutbox, abort) -> None:
        self._req = req
        self._outbox = outbox
        self._abort = abort
        self._done = False

    async def __anext__(self) -> StreamChunk:
        if self._done:
            raise StopAsyncIteration
        try:
            chunk: StreamChunk = await self._outbox.queue.get()
        except asyncio.CancelledError:
            self.close()
            raise
        if chunk.finished:
            self._done = True
        return chunk

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._abort(self._req)

    async def aclose(self) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass
