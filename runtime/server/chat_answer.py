"""A chat completion (or its stream) from engine results: reasoning apart, tool calls parsed.

The answer's text is read in two steps: the reasoning parser (if the server has one and the
request separates reasoning) takes the thinking out into `reasoning_content`, and in tool
mode the tool-call parser turns the rest into `content` and `tool_calls`. Streamed, the same
steps run on the growing text: reasoning deltas, content deltas, then per call its name once
and its arguments as they are decoded (each call with its own `index`). `finish_reason` is
"tool_calls" when the answer holds calls that parse.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from runtime.scheduling.request import GenerateResult
from runtime.server import responses as R
from runtime.server.errors import APIError
from runtime.server.generation import ChoiceStreams, sse, sse_error
from runtime.server.tools.parser import CallStreamer
from runtime.server.tools.reasoning import ReasoningStream

if TYPE_CHECKING:
    from runtime.server.chat import ChatRequest, ChatSetup
    from runtime.server.state import ServerState


class ChoiceText:
    """One streamed choice: its text so far and the readers of it."""

    def __init__(self, answer: ChatAnswer) -> None:
        self.text = ""
        spec = answer.setup.reasoning
        self.reasoning = ReasoningStream(spec.parser, spec.open_at_start) if spec else None
        self.calls = CallStreamer(answer.setup.parser) if answer.tool_mode else None
        self.sent = 0


class ChatAnswer:
    """Builds a chat completion (or its chunks) from engine results."""

    def __init__(self, state: ServerState, body: ChatRequest, setup: ChatSetup) -> None:
        self.state = state
        self.body = body
        self.setup = setup
        self.tool_mode = body.tool_mode
        self.rid = R.new_id("chatcmpl")
        self.created = R.now()

    def _split(self, text: str) -> tuple[str | None, str]:
        spec = self.setup.reasoning
        if spec is None:
            return None, text
        reasoning, answer = spec.parser.split(text, spec.open_at_start)
        return (reasoning.strip() if reasoning is not None else None), answer

    def message(self, result: GenerateResult) -> tuple[dict[str, Any], str]:
        reason = R.finish_reason(result)
        reasoning, answer = self._split(result.text)
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        if self.setup.reasoning is not None:
            message["reasoning_content"] = reasoning
        if self.tool_mode and reason != "abort":
            content, calls = self.setup.parser.parse(answer, self.body.tools or [])
            if calls:
                message.update(content=content, tool_calls=calls)
                if not self.setup.parser.cut_in_a_call(answer):
                    reason = "tool_calls"
        return message, reason

    def response(self, results: list[GenerateResult]) -> dict[str, Any]:
        self.state.record_usage(results, self.body.n)
        choices = []
        for i, result in enumerate(results):
            message, reason = self.message(result)
            lp = R.chat_logprobs(self.state.tokenizer, result, self.body.top_logprobs)
            choices.append(
                {"index": i, "message": message, "logprobs": lp, "finish_reason": reason}
            )
        return {
            "id": self.rid,
            "object": "chat.completion",
            "created": self.created,
            "model": self.state.model_name,
            "choices": choices,
            "usage": R.usage_of(results, self.body.n),
        }

    def deltas(self, st: ChoiceText, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        answer = st.text
        if st.reasoning is not None:
            piece, answer, _ = st.reasoning.feed(st.text, final)
            if piece:
                out.append({"reasoning_content": piece})
        if self.setup.buffer:
            return out
        if st.calls is not None:
            return out + st.calls.feed(answer, final)
        if len(answer) > st.sent:
            out.append({"content": answer[st.sent :]})
            st.sent = len(answer)
        return out

    def last(self, st: ChoiceText, result: GenerateResult) -> tuple[list[dict[str, Any]], str]:
        """The deltas left at a choice's end, and its finish_reason."""
        if result.text.startswith(st.text):
            st.text = result.text
        out = self.deltas(st, final=True)
        message, reason = self.message(result)
        if self.setup.buffer:
            if message.get("tool_calls"):
                calls = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
                out.append({"tool_calls": calls})
            elif message["content"]:
                out.append({"content": message["content"]})
        return out, reason

    async def events(self, streams: ChoiceStreams, release: Any) -> AsyncIterator[str]:
        model, rid, created = self.state.model_name, self.rid, self.created
        n = self.body.n
        results: list[GenerateResult | None] = [None] * n
        states = [ChoiceText(self) for _ in range(n)]
        started = time.perf_counter()
        try:
            for i in range(n):
                first = {"role": "assistant", "content": ""}
                yield sse(R.chat_chunk(rid, model, created, i, first))
            async for index, chunk in streams:
                st = states[index]
                if not chunk.finished:
                    st.text += chunk.text_delta
                    for delta in self.deltas(st, final=False):
                        yield sse(R.chat_chunk(rid, model, created, index, delta))
                    continue
                result = results[index] = chunk.result
                deltas, reason = self.last(st, result)
                for delta in deltas:
                    yield sse(R.chat_chunk(rid, model, created, index, delta))
                lp = R.chat_logprobs(self.state.tokenizer, result, self.body.top_logprobs)
                event = R.chat_chunk(rid, model, created, index, {}, reason, lp)
                yield sse(R.with_usage(event, results, self.body))
            head = (rid, model, created)
            for line in R.closing_events(self.state, results, n, self.body, head,
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
