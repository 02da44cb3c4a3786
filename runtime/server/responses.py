"""OpenAI response objects (completions, chat completions, their stream chunks) as dicts;
`ChatAnswer` builds a chat completion or its stream, tool calls included."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from runtime.scheduling.request import GenerateResult
from runtime.server.errors import APIError
from runtime.server.generation import ChoiceStreams, sse, sse_error
from runtime.server.state import ServerState, token_counts
from runtime.server.tools import CallStream, parse_tool_calls

if TYPE_CHECKING:
    from runtime.server.chat import ChatRequest


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage_of(results: list[GenerateResult], per_prompt: int) -> dict[str, Any]:
    """Usage of `results` (`state.token_counts`: a prompt shared by n choices counts once)."""
    return usage(*token_counts(results, per_prompt))


def finish_reason(result: GenerateResult) -> str:
    """OpenAI's finish_reason; "abort" when the server cancelled the request (shutdown)."""
    return result.finish_reason if result.finish_reason in ("length", "abort") else "stop"


def _token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer: Any, result: GenerateResult, top_n: int) -> dict[str, Any] | None:
    """`choices[i].logprobs` of a chat completion: one entry per generated token."""
    if result.logprobs is None:
        return None
    content = []
    tops = result.top_logprobs or [{}] * len(result.logprobs)
    for tok, lp, top in zip(result.token_ids, result.logprobs, tops, strict=False):
        text = _token_text(tokenizer, tok)
        alternatives = sorted(top.items(), key=lambda kv: -kv[1])[:top_n]
        content.append(
            {
                "token": text,
                "logprob": lp,
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {
                        "token": _token_text(tokenizer, t),
                        "logprob": v,
                        "bytes": list(_token_text(tokenizer, t).encode()),
                    }
                    for t, v in alternatives
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    tokenizer: Any, result: GenerateResult, top_n: int, offset: int = 0
) -> dict[str, Any] | None:
    """`choices[i].logprobs` of a (legacy) completion: tokens, token_logprobs, ..."""
    if result.logprobs is None:
        return None
    tokens = [_token_text(tokenizer, t) for t in result.token_ids[: len(result.logprobs)]]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    tops = result.top_logprobs or [{}] * len(tokens)
    return {
        "tokens": tokens,
        "token_logprobs": list(result.logprobs),
        "top_logprobs": [
            {
                _token_text(tokenizer, t): v
                for t, v in sorted(top.items(), key=lambda kv: -kv[1])[:top_n]
            }
            for top in tops
        ],
        "text_offset": offsets,
    }


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    index: int,
    delta: dict[str, Any],
    finish: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        ],
    }


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    index: int,
    text: str,
    finish: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }


def usage_chunk(rid: str, model: str, created: int, obj: str, usage_: dict) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def closing_events(
    state: ServerState, results: list[Any], n: int, body: Any, head: tuple[str, str, int], obj: str
) -> list[str]:
    """The end of an OpenAI stream once every choice finished: usage recorded, the usage
    chunk if `stream_options.include_usage` asked for it, then [DONE]. `head`: (id, model,
    created) of the stream's chunks; `obj`: their `object`."""
    done = [r for r in results if r is not None]
    state.record_usage(done, n)
    events = []
    if body.include_usage_chunk():
        events.append(sse(usage_chunk(*head, obj, usage_of(done, n))))
    return [*events, sse("[DONE]")]


def with_usage(event: dict[str, Any], results: list[Any], body: Any) -> dict:
    """The last finish chunk carries the usage, unless a separate usage chunk was asked for."""
    if not body.include_usage_chunk() and all(r is not None for r in results):
        event["usage"] = usage_of(results, body.n)
    return event


class _ChoiceStream:
    """One streamed choice of a tool-mode answer: "calls" (streamed as tool_calls deltas),
    "text" (as content), or "buffer" (undecidable until the end: sent whole)."""

    def __init__(self, kind: str | None) -> None:
        self.kind = kind  # None: decided by the first character
        self.text = ""
        self.sent = 0
        self.calls = CallStream()


class ChatAnswer:
    """Builds a chat completion (or its chunks) from engine results."""

    def __init__(self, state: ServerState, body: ChatRequest, forced: bool, buffer: bool) -> None:
        self.state = state
        self.body = body
        self.tool_mode = body.tool_mode
        self.forced = forced
        self.buffer = buffer  # auto with a response_format: calls and objects look alike
        self.rid = new_id("chatcmpl")
        self.created = now()

    def _message(self, result: GenerateResult) -> tuple[dict[str, Any], str]:
        reason = finish_reason(result)
        calls = None
        if self.tool_mode and reason == "stop":
            calls = parse_tool_calls(result.text, self.body.tools or [])
        if calls:
            return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
        return {"role": "assistant", "content": result.text}, reason

    def response(self, results: list[GenerateResult]) -> dict[str, Any]:
        self.state.record_usage(results, self.body.n)
        choices = []
        for i, result in enumerate(results):
            message, reason = self._message(result)
            lp = chat_logprobs(self.state.tokenizer, result, self.body.top_logprobs)
            choices.append(
                {"index": i, "message": message, "logprobs": lp, "finish_reason": reason}
            )
        return {
            "id": self.rid,
            "object": "chat.completion",
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
            "usage": usage_of(results, self.body.n),
        }

    def _kind(self) -> str | None:
        if not self.tool_mode:
            return "text"
        if self.forced:
            return "calls"
        return "buffer" if self.buffer else None

    def _decide(self, st: _ChoiceStream) -> None:
        if st.kind is None and st.text:
            calls_start = "{[" if self.body.parallel else "{"
            st.kind = "calls" if st.text[0] in calls_start else "text"

    def _deltas(self, st: _ChoiceStream, delta: str) -> list[dict[str, Any]]:
        st.text += delta
        self._decide(st)
        if st.kind == "calls":
            return [{"tool_calls": [d]} for d in st.calls.feed(st.text)]
        if st.kind == "text" and len(st.text) > st.sent:
            piece, st.sent = st.text[st.sent :], len(st.text)
            return [{"content": piece}]
        return []

    def _last(self, st: _ChoiceStream, result: GenerateResult) -> tuple[list[dict], str]:
        """The deltas left at a choice's end, and its finish_reason."""
        reason = finish_reason(result)
        if st.kind is None:
            st.text = result.text
            self._decide(st)
        if st.kind == "calls":
            out = [{"tool_calls": [d]} for d in st.calls.feed(result.text)]
            ok = reason == "stop" and parse_tool_calls(result.text, self.body.tools or [])
            return out, "tool_calls" if ok else reason
        if st.kind == "buffer":
            message, reason = self._message(result)
            if message.get("tool_calls"):
                calls = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
                return [{"tool_calls": calls}], reason
            return ([{"content": result.text}] if result.text else []), reason
        rest = result.text[st.sent :] if len(result.text) >= st.sent else ""
        return ([{"content": rest}] if rest else []), reason

    async def events(self, streams: ChoiceStreams, release: Any) -> AsyncIterator[str]:
        model, rid, created = self.state.model_name, self.rid, self.created
        n = self.body.n
        results: list[GenerateResult | None] = [None] * n
        states = [_ChoiceStream(self._kind()) for _ in range(n)]
        started = time.perf_counter()
        try:
            for i in range(n):
                yield sse(chat_chunk(rid, model, created, i, {"role": "assistant", "content": ""}))
            async for index, chunk in streams:
                st = states[index]
                if not chunk.finished:
                    for delta in self._deltas(st, chunk.text_delta):
                        yield sse(chat_chunk(rid, model, created, index, delta))
                    continue
                result = results[index] = chunk.result
                deltas, reason = self._last(st, result)
                for delta in deltas:
                    yield sse(chat_chunk(rid, model, created, index, delta))
                lp = chat_logprobs(self.state.tokenizer, result, self.body.top_logprobs)
                event = chat_chunk(rid, model, created, index, {}, reason, lp)
                yield sse(with_usage(event, results, self.body))
            head = (rid, model, created)
            for line in closing_events(self.state, results, n, self.body, head,
                                       "chat.completion.chunk"):  # fmt: skip
                yield line
        except APIError as exc:
            yield sse_error(exc)
            yield sse("[DONE]")
        finally:
            if streams.cancelled or any(r is None for r in results):
                self.state.metrics.client_aborts += 1
            streams.close()
            release()
            self.state.metrics.record_stream_end(time.perf_counter() - started)
