"""A Responses API answer: its output items and the stream events that build them.

The chat route's answer (`chat_answer.ChatAnswer`) reads the model's text into chat deltas:
reasoning pieces, content pieces, tool calls (a call's name once, then its arguments as they
are decoded). `ResponseItems` turns those deltas into Responses output items, in order:

    reasoning      {"type": "reasoning", "content": [{"type": "reasoning_text", ...}]}
    message        {"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text", "annotations": []}]}
    function_call  {"type": "function_call", "call_id", "name", "arguments"}

and, streamed, into OpenAI's event sequence, each event with its `sequence_number`:
`response.created`, `response.in_progress`; per item `response.output_item.added`, for text
`response.content_part.added`, `response.output_text.delta` (`response.reasoning_text.delta`),
`response.output_text.done`, `response.content_part.done`, for a call
`response.function_call_arguments.delta` / `.done`, then `response.output_item.done`; last
`response.completed` (or `response.incomplete` when max_output_tokens cut the answer). A
non-streamed answer goes through the same items, its events dropped, so both agree.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from runtime.scheduling.request import GenerateResult
from runtime.server.state import token_counts


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(results: list[GenerateResult], reasoning_tokens: int) -> dict[str, Any]:
    """Responses usage: cached input tokens from the radix cache, reasoning tokens apart."""
    prompt, cached, completion = token_counts(results, 1)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion)},
        "total_tokens": prompt + completion,
    }


def status_of(reason: str) -> tuple[str, dict[str, str] | None]:
    """(status, incomplete_details) of an answer that ended with chat's `reason`."""
    if reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if reason == "abort":
        return "cancelled", None
    return "completed", None


class ResponseItems:
    """The output items of one response, built from chat deltas, and their stream events."""

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response  # the response object, `output` and `status` filled in here
        self.output: list[dict[str, Any]] = []
        self.sequence = 0
        self._open: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # chat's call index -> its item

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def snapshot(self, status: str) -> dict[str, Any]:
        return {**self.response, "status": status, "output": [dict(i) for i in self.output]}

    def start(self) -> list[dict[str, Any]]:
        snapshot = self.snapshot("in_progress")
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    # ---- deltas in, events out ----
    def feed(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if delta.get("reasoning_content"):
            events += self._text("reasoning", delta["reasoning_content"])
        if delta.get("content"):
            events += self._text("message", delta["content"])
        for call in delta.get("tool_calls") or []:
            events += self._call(call)
        return events

    def _add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close("completed")
        self.output.append(item)
        self._open = item
        added = {**item, "content": []} if "content" in item else dict(item)
        events.append(self._event("response.output_item.added", output_index=len(self.output) - 1,
                                  item=added))  # fmt: skip
        if "content" in item:
            events.append(self._part_event("response.content_part.added", item, empty=True))
        return events

    def _part_event(self, kind: str, item: dict[str, Any], empty: bool = False) -> dict[str, Any]:
        part = dict(item["content"][0])
        if empty:
            part["text"] = ""
        return self._event(kind, item_id=item["id"], output_index=self.output.index(item),
                           content_index=0, part=part)  # fmt: skip

    def _text(self, kind: str, piece: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        item = self._open
        if item is None or item["type"] != kind:
            if kind == "reasoning":
                part = {"type": "reasoning_text", "text": ""}
                item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [part]}
            else:
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                item = {"id": new_id("msg"), "type": "message", "role": "assistant",
                        "content": [part]}  # fmt: skip
            item["status"] = "in_progress"
            events += self._add(item)
        if not piece:
            return events
        item["content"][0]["text"] += piece
        name = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        extra = {} if kind == "reasoning" else {"logprobs": []}
        events.append(self._event(name, item_id=item["id"], output_index=self.output.index(item),
                                  content_index=0, delta=piece, **extra))  # fmt: skip
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        index = call.get("index", len(self._calls))
        fn = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": call.get("id") or new_id("call"), "name": fn.get("name", ""),
                    "arguments": ""}  # fmt: skip
            self._calls[index] = item
            events += self._add(item)
        piece = fn.get("arguments") or ""
        if piece:
            item["arguments"] += piece
            events.append(self._event("response.function_call_arguments.delta",
                                      item_id=item["id"], output_index=self.output.index(item),
                                      delta=piece))  # fmt: skip
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        at = self.output.index(item)
        events: list[dict[str, Any]] = []
        if item["type"] == "function_call":
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=at, name=item["name"],
                                      arguments=item["arguments"]))  # fmt: skip
        else:
            text = item["content"][0]["text"]
            if item["type"] == "reasoning":
                events.append(self._event("response.reasoning_text.done", item_id=item["id"],
                                          output_index=at, content_index=0, text=text))  # fmt: skip
            else:
                events.append(self._event("response.output_text.done", item_id=item["id"],
                                          output_index=at, content_index=0, text=text,
                                          logprobs=[]))  # fmt: skip
            events.append(self._part_event("response.content_part.done", item))
        events.append(self._event("response.output_item.done", output_index=at, item=dict(item)))
        return events

    def finish(self, reason: str, usage_: dict[str, Any]) -> list[dict[str, Any]]:
        """The closing events; the response object is complete after them."""
        status, details = status_of(reason)
        events: list[dict[str, Any]] = []
        if not any(i["type"] == "message" for i in self.output) and not self._calls:
            events += self._text("message", "")  # an answer always has its message
        events += self._close("incomplete" if status == "incomplete" else "completed")
        self.response.update(
            status=status, incomplete_details=details, usage=usage_, output=self.output,
            completed_at=int(time.time()) if status == "completed" else None,
        )  # fmt: skip
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        events.append(self._event(kind, response=dict(self.response)))
        return events
