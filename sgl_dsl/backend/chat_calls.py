"""A gen with tools through an OpenAI-compatible chat API (`RuntimeEndpoint`, `OpenAI`).

The request is `/v1/chat/completions` with the program's messages, the tools and `tool_choice`:
the server renders the conversation with the tools through its chat template, constrains the
answer to its format's strict calls and parses them back (our server: `runtime.server.tools`),
so nothing of a model's call format is repeated here. The reply's `message.content` and
`tool_calls` become `GenOutput.content` / `tool_calls`.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import BackendError
from .base import GenOutput

# gen() keyword -> chat completion field: OpenAI's own, then the engines' extras
CHAT_FIELDS = ("max_tokens", "temperature", "top_p", "stop", "frequency_penalty",
               "presence_penalty", "seed")  # fmt: skip
EXTRA_FIELDS = ("top_k", "min_p", "min_tokens", "stop_token_ids", "ignore_eos")
# the params of a tool gen that are not sampling fields (or are answered by these fields)
_TOOL_KEYS = ("tools", "tool_choice", "return_logprob", "top_logprobs_num",
              "return_text_in_logprobs", "json_schema_mode")  # fmt: skip


def chat_tools_body(
    model: Any,
    messages: list[dict[str, Any]],
    params: dict[str, Any],
    *,
    extras: bool,
    backend: str,
    ours: bool = False,
) -> dict[str, Any]:
    """The chat request of a tool gen. `extras`: the server takes the engines' sampling extras
    (`top_k`, ...); `ours`: it is this project's server (takes `json_schema_mode`). A keyword
    the server cannot take is a `BackendError` naming it and `backend`."""
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": False}
    body["tools"] = params["tools"]
    body["tool_choice"] = params.get("tool_choice") or "auto"
    for key, value in params.items():
        if value is None or key in _TOOL_KEYS:
            continue
        if key in CHAT_FIELDS or (extras and key in EXTRA_FIELDS):
            body[key] = value
        else:
            raise BackendError(f"{backend}: gen(tools=...) cannot send {key} to this server")
    if params.get("json_schema_mode") is not None:
        if not ours:
            raise BackendError(f"{backend}: json_schema_mode is this project's server's field")
        body["json_schema_mode"] = params["json_schema_mode"]
    if params.get("return_logprob") or params.get("top_logprobs_num"):
        body.update(logprobs=True, top_logprobs=int(params.get("top_logprobs_num") or 0))
    return body


def chat_tools_output(reply: dict[str, Any]) -> GenOutput:
    """The reply's first choice as the output of a tool gen."""
    choice = reply["choices"][0]
    message = choice.get("message") or {}
    content = message.get("content")
    calls = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args if args is not None else {})
        calls.append({"id": c.get("id"), "type": "function",
                      "function": {"name": fn.get("name"), "arguments": args}})  # fmt: skip
    usage = reply.get("usage") or {}
    reason = choice.get("finish_reason") or "stop"
    return GenOutput(
        text=calls_text(content, calls),
        finish_reason="length" if reason == "length" else "stop",
        prompt_tokens=usage.get("prompt_tokens", 0),
        cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        id=reply.get("id"),
        content=content,
        tool_calls=calls,
    )


def calls_text(content: str | None, calls: list[dict[str, Any]]) -> str:
    """The text of an answer whose calls came back parsed: its content, then one JSON object
    `{"name": ..., "arguments": ...}` per call, a line each."""
    lines = [content] if content else []
    for c in calls:
        fn = c["function"]
        args = json.loads(fn["arguments"] or "{}")
        lines.append(json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False))
    return "\n".join(lines)
