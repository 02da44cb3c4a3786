"""The iterator `Engine.generate(..., stream=True)` returns."""

from __future__ import annotations

from collections.abc import Iterator

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
