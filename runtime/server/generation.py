"""Running one HTTP request's engine jobs (n choices, several prompts) and ending them.

`collect` waits for every job's result; `ChoiceStreams` merges the jobs' chunks for SSE. Both
abort every job when the client goes away (polled for plain requests; Starlette cancels a
streaming body on disconnect) and when the request fails part-way.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from runtime.scheduling.request import GenerateResult, StreamChunk, Usage
from runtime.server.bridge import EngineBridge, EngineStream
from runtime.server.errors import APIError, constraint_limit, constraint_refusal, from_exception
from runtime.server.tools.phases import PhasedStream

DISCONNECT_POLL_S = 0.25


@dataclass(slots=True)
class Job:
    prompt_ids: list[int]
    kwargs: dict[str, Any]
    # SGLang's `stop_regex`: the engine has no regex stops, so the server watches the text
    stop_regex: tuple[re.Pattern[str], ...] = ()
    # the request field that gave the constraint (`guided_json`, ...), for errors naming it
    constraint_field: str | None = None
    # a fresh `phases.Plan` per call: the answer runs as phases (tool calls, reasoning)
    plan: Callable[[], Any] | None = None


def open_job(bridge: EngineBridge, job: Job) -> Any:
    if job.plan is not None:
        stream: Any = PhasedStream(bridge, job.prompt_ids, job.kwargs, job.plan())
    else:
        stream = bridge.open(job.prompt_ids, job.kwargs)
    if job.constraint_field is not None:
        stream.constraint_field = job.constraint_field
    return RegexStopStream(stream, job.stop_regex) if job.stop_regex else stream


def _constraint_param(stream: Any) -> str | None:
    return getattr(stream, "constraint_field", None) or stream.constraint_key


def _forget(bridge: EngineBridge, stream: Any) -> None:
    bridge.forget(getattr(stream, "inner", stream))


class RegexStopStream:
    """An `EngineStream` that ends (aborting the engine request) where a stop regex matches.

    As SGLang does, the text is cut before the match (`no_stop_trim` keeps it, applied by the
    endpoint from `matched`), finish_reason is "stop" and `matched` is the matched text. Text
    already streamed past the cut (a match that began in an earlier chunk) is not taken back.
    """

    def __init__(self, inner: EngineStream, patterns: tuple[re.Pattern[str], ...]) -> None:
        self.inner = inner
        self._patterns = patterns
        self._text = ""
        self._ids: list[int] = []
        self._done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # cancel, cancelled, constraint_key

    def __aiter__(self) -> RegexStopStream:
        return self

    def _search(self, text: str) -> re.Match[str] | None:
        found = [m for m in (p.search(text) for p in self._patterns) if m is not None]
        return min(found, key=lambda m: m.start()) if found else None

    async def __anext__(self) -> StreamChunk:
        if self._done:
            raise StopAsyncIteration
        chunk = await anext(self.inner)
        if chunk.finished:
            self._done = True
            result = chunk.result
            match = self._search(result.text) if result.finish_reason != "abort" else None
            if match is not None:
                result.text, result.finish_reason = result.text[: match.start()], "stop"
                result.matched_stop = match.group(0)
            return chunk
        emitted = len(self._text)
        self._text += chunk.text_delta
        self._ids.extend(chunk.token_ids)
        match = self._search(self._text)
        if match is None:
            return chunk
        self._done = True
        self.inner.cancel()
        text = self._text[: match.start()]
        result = GenerateResult(
            text=text,
            token_ids=list(self._ids),
            prompt_token_ids=list(self.inner._prompt_ids),
            finish_reason="stop",
            matched_stop=match.group(0),
            usage=Usage(
                prompt_tokens=len(self.inner._prompt_ids), completion_tokens=len(self._ids)
            ),
        )
        return StreamChunk(text[emitted:], chunk.token_ids, finished=True, result=result)


def _check(result: GenerateResult, stream: EngineStream, param: str | None) -> GenerateResult:
    """Raise the APIError for a request the engine aborted on its own."""
    if result.finish_reason == "abort" and result.error and not stream.cancelled:
        if "does not fit" in result.error:
            raise APIError(413, result.error, param=param, code="context_length_exceeded")
        param = _constraint_param(stream)
        if result.error_kind == "CompileWorkerError":  # the compile pool's failure: retry
            raise APIError(503, result.error, param=param, code="compile_worker_unavailable")
        # (a KV hand-off that failed, its prefill server gone: the server's failure, a 500)
        server_side = result.error_kind == "KVTransferError"
        if (
            param is not None
            and not server_side
            and (not result.token_ids or constraint_limit(result.error))
        ):
            # the engine compiles constraints off its loop and reports a bad one as an abort
            # carrying only the message: a request whose constraint failed before any token,
            # or reached a limit of the constraint's (its automaton's state budget) later
            raise constraint_refusal(result.error, param)
        raise APIError(500, f"the engine aborted the request: {result.error}", code="engine_abort")
    return result


async def _final(stream: EngineStream, param: str | None) -> GenerateResult:
    try:
        async for chunk in stream:
            if chunk.finished:
                return _check(chunk.result, stream, param)
    except APIError:
        raise
    except Exception as exc:
        raise from_exception(exc, _constraint_param(stream)) from exc
    raise APIError(500, "the engine ended a request without a result", code="engine_abort")


async def _watch_disconnect(request: Request, on_disconnect: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(DISCONNECT_POLL_S)
        if await request.is_disconnected():
            on_disconnect()
            return


async def collect(
    bridge: EngineBridge,
    jobs: list[Job],
    request: Request,
    param: str | None = None,
    on_disconnect: Callable[[], None] | None = None,
) -> list[GenerateResult]:
    """Every job's result, in order; all jobs are aborted if the client disconnects."""
    streams = [open_job(bridge, j) for j in jobs]

    def abort_all() -> None:
        for s in streams:
            s.cancel()
        if on_disconnect is not None:
            on_disconnect()

    watcher = asyncio.create_task(_watch_disconnect(request, abort_all))
    try:
        return list(await asyncio.gather(*(_final(s, param) for s in streams)))
    finally:
        watcher.cancel()
        for s in streams:
            s.cancel()
            _forget(bridge, s)


class ChoiceStreams:
    """The chunks of several jobs, merged as (job index, chunk) in arrival order.

    `start()` waits for every job's first chunk, so that a request the engine refuses is
    answered with an error status before any byte of the stream is sent.
    """

    def __init__(self, bridge: EngineBridge, jobs: list[Job], param: str | None = None) -> None:
        self._bridge = bridge
        self._param = param
        self._streams = [open_job(bridge, j) for j in jobs]
        self._first: list[StreamChunk] = []
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._opened = time.perf_counter()
        self.ttft_s = 0.0  # until every job's first chunk (or end) arrived

    async def start(self) -> None:
        try:
            firsts = await asyncio.gather(*(anext(s) for s in self._streams))
            self.ttft_s = time.perf_counter() - self._opened
            for s, chunk in zip(self._streams, firsts, strict=True):
                if chunk.finished:
                    _check(chunk.result, s, self._param)
            self._first = list(firsts)
        except BaseException as exc:
            self.close()
            if isinstance(exc, Exception) and not isinstance(exc, APIError):
                raise from_exception(exc) from exc
            raise

    async def _forward(self, index: int, stream: EngineStream) -> None:
        try:
            async for chunk in stream:
                await self._queue.put((index, chunk))
        except Exception as exc:
            await self._queue.put((index, exc))

    async def __aiter__(self) -> AsyncIterator[tuple[int, StreamChunk]]:
        pending = 0
        for i, (stream, chunk) in enumerate(zip(self._streams, self._first, strict=True)):
            yield i, chunk
            if not chunk.finished:
                pending += 1
                self._tasks.append(asyncio.create_task(self._forward(i, stream)))
        while pending:
            index, item = await self._queue.get()
            if isinstance(item, Exception):
                raise from_exception(item)
            if item.finished:
                pending -= 1
                _check(item.result, self._streams[index], self._param)
            yield index, item

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for s in self._streams:
            s.cancel()
            _forget(self._bridge, s)

    @property
    def cancelled(self) -> bool:
        return any(s.cancelled for s in self._streams)


class SSEResponse(StreamingResponse):
    """A server-sent-event stream that runs `on_close` however it ends.

    The events generator's own `finally` does not run if the response is dropped before its
    first iteration (a client gone before the headers went out); this does.
    """

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def sse(data: Any) -> str:
    """One server-sent event carrying `data` as JSON (or the literal [DONE])."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


def sse_error(exc: BaseException) -> str:
    err = from_exception(exc) if not isinstance(exc, APIError) else exc
    return sse(err.body())
