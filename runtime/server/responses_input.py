"""A Responses API request (`POST /v1/responses`) read as the chat request it amounts to.

OpenAI's Responses API says the same things as chat completions with other names: `input` (a
string, or items: messages whose content is `input_text` / `output_text` parts, the
`function_call` and `function_call_output` items of earlier turns, `reasoning` items),
`instructions` (a system turn first), flat function tools (`{"type": "function", "name",
"parameters", "strict"}`), `tool_choice` `{"type": "function", "name"}`, `text.format` (the
response format: `text`, `json_object`, `json_schema` with `name` / `schema` / `strict`, and
our `structural_tag`), `max_output_tokens`, `reasoning`. `to_chat` writes them as a
`ChatRequest`, so the request goes through the chat route's phases (prompt, constraint,
generation, answer) unchanged.

What is refused, with a 400 naming the field: a field that would change the answer and that
this server does not implement (`include` values, `truncation: "auto"`, `background: true`,
`conversation`, `prompt`, `top_logprobs`, `text.verbosity` other than medium,
`reasoning.summary`, `reasoning` without `--reasoning-parser`, `context_management`,
`moderation`), built-in tools (web search, file search, ...), input items that are not text
(images, files, audio) or that name stored items (`item_reference`). Accepted and ignored,
since ignoring them changes nothing here: `metadata` (echoed), `user`, `safety_identifier`,
`prompt_cache_key`, `prompt_cache_retention`, `prompt_cache_options`, `service_tier`,
`max_tool_calls` (it limits built-in tools), `stream_options`, `truncation: "disabled"`,
`include: []`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from runtime.server.chat import ChatRequest, JsonSchemaMode
from runtime.server.errors import APIError
from runtime.server.protocol import _Body

# `reasoning.effort` values that ask for no thinking (the template's `enable_thinking` off)
NO_THINKING = ("none", "minimal")
# input item types that are text, and how a message part of each type is read
TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")


class ResponsesRequest(_Body):
    """The body of `POST /v1/responses` (OpenAI's names; engine extras beside them)."""

    model: str | None = None
    input: str | list[Any] = Field(default_factory=list)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    stream: bool | None = False
    # refused unless they ask for nothing (see the module doc)
    include: list[str] | None = None
    truncation: str | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    context_management: Any = None
    moderation: Any = None
    # engine extras (as on chat completions)
    seed: int | None = None
    top_k: int = -1
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    stop: str | list[str] | None = None
    json_schema_mode: JsonSchemaMode | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def check_supported(body: ResponsesRequest, reasoning_parser: str | None) -> None:
    """A 400 naming the first field that asks for something this server does not do."""
    refused = [
        ("include", bool(body.include), "no `include` value is supported"),
        ("truncation", body.truncation not in (None, "disabled"), "only 'disabled' is"),
        ("background", bool(body.background), "background responses are not supported"),
        ("conversation", body.conversation is not None, "conversations are not supported; "
         "chain responses with previous_response_id"),
        ("prompt", body.prompt is not None, "prompt templates are not supported"),
        ("top_logprobs", bool(body.top_logprobs), "log-probs are not returned here"),
        ("context_management", body.context_management is not None, "not supported"),
        ("moderation", body.moderation is not None, "not supported"),
    ]  # fmt: skip
    for param, bad, why in refused:
        if bad:
            raise APIError(400, f"{param}: {why}", param=param, code="unsupported_parameter")
    verbosity = (body.text or {}).get("verbosity")
    if verbosity not in (None, "medium"):
        msg = "text.verbosity: only 'medium' (the model's own length) is supported"
        raise APIError(400, msg, param="text.verbosity", code="unsupported_parameter")
    _check_reasoning(body.reasoning, reasoning_parser)


def _check_reasoning(reasoning: dict[str, Any] | None, parser: str | None) -> None:
    if not reasoning:
        return
    if reasoning.get("summary") is not None or reasoning.get("generate_summary") is not None:
        msg = "reasoning.summary: summaries are not generated (the reasoning text is returned)"
        raise APIError(400, msg, param="reasoning.summary", code="unsupported_parameter")
    effort = reasoning.get("effort")
    if parser is None and effort not in (None, *NO_THINKING):
        msg = "reasoning: this server separates no reasoning (start it with --reasoning-parser)"
        raise APIError(400, msg, param="reasoning", code="unsupported_parameter")


# ---- input items -> chat messages -------------------------------------------------------------
def input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's `input` as a list of items (a string is one user message)."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    items = []
    for i, item in enumerate(body.input):
        if not isinstance(item, dict):
            raise APIError(400, f"input.{i} must be an object", param=f"input.{i}")
        items.append(item)
    return items


def _part_text(part: Any, where: str) -> str:
    if isinstance(part, str):
        return part
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in TEXT_PARTS:
        msg = f"{where}.type {kind!r} is not supported (this model reads text only)"
        raise APIError(400, msg, param=f"{where}.type", code="unsupported_content")
    return str(part.get("text", ""))


def _content_text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(400, f"{where} must be a string or a list of parts", param=where)
    return "".join(_part_text(p, f"{where}.{j}") for j, p in enumerate(content))


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        msg = f"{where}.role must be user, system, developer or assistant, got {role!r}"
        raise APIError(400, msg, param=f"{where}.role")
    return {"role": role, "content": _content_text(item.get("content"), f"{where}.content")}


def to_messages(items: list[dict[str, Any]], where: str = "input") -> list[dict[str, Any]]:
    """Chat messages of Responses input items: messages as they are, consecutive
    `function_call` items as one assistant turn's `tool_calls`, each `function_call_output`
    as a `tool` turn; `reasoning` items are not rendered (chat templates drop earlier turns'
    thinking)."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        at = f"{where}.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, at))
        elif kind == "function_call":
            call = {
                "id": _field(item, "call_id", at),
                "type": "function",
                "function": {
                    "name": _field(item, "name", at),
                    "arguments": item.get("arguments") or "{}",
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{at}.output")
            out.append(
                {"role": "tool", "tool_call_id": _field(item, "call_id", at), "content": text}
            )
        elif kind != "reasoning":
            msg = f"{at}.type {kind!r} is not supported here (messages, function_call, "
            msg += "function_call_output and reasoning items are)"
            raise APIError(400, msg, param=f"{at}.type", code="unsupported_input_item")
    return out


def _field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise APIError(400, f"{where}.{name} must be a non-empty string", param=f"{where}.{name}")
    return value


# ---- tools, tool_choice, text.format ----------------------------------------------------------
def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Flat function tools as chat tools; a built-in tool is a 400 naming it."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            msg = f"tools.{i}.type {kind!r} is not supported (function tools only)"
            raise APIError(400, msg, param=f"tools.{i}.type", code="unsupported_tool")
        if isinstance(tool.get("function"), dict):  # the chat shape, accepted too
            out.append(tool)
            continue
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        if fn.get("parameters") is None:
            fn.pop("parameters", None)
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    """`tool_choice` in the chat shape (`{"type": "function", "name"}` -> its `function`)."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        return {"type": "function", "function": {"name": name}}
    kind = choice.get("type") if isinstance(choice, dict) else type(choice).__name__
    msg = f"tool_choice of type {kind!r} is not supported (auto, none, required or a function)"
    raise APIError(400, msg, param="tool_choice", code="unsupported_tool_choice")


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict | bool):
            msg = "text.format.schema: a json_schema format needs its schema"
            raise APIError(400, msg, param="text.format.schema")
        inner = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": inner}
    if kind == "structural_tag":
        return {k: v for k, v in fmt.items() if k in ("type", "format", "structures", "triggers")}
    msg = f"text.format.type {kind!r} is not supported (text, json_object, json_schema, "
    msg += "structural_tag)"
    raise APIError(400, msg, param="text.format.type")


def to_chat(body: ResponsesRequest, history: list[dict[str, Any]]) -> ChatRequest:
    """The chat request a Responses request amounts to; `history`: the input and output
    items of the responses before it (`previous_response_id`), oldest first."""
    messages = to_messages(history, "previous_response_id") + to_messages(input_items(body))
    if body.instructions:
        messages.insert(0, {"role": "system", "content": body.instructions})
    if not messages:
        raise APIError(400, "input is empty", param="input")
    kwargs = dict(body.chat_template_kwargs or {})
    effort = (body.reasoning or {}).get("effort")
    if effort in NO_THINKING:
        kwargs.setdefault("enable_thinking", False)
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens,
        "tools": chat_tools(body.tools),
        "tool_choice": chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": response_format(body.text),
        "seed": body.seed,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        "stop": body.stop,
        "user": body.user,
        "stream": bool(body.stream),
        "json_schema_mode": body.json_schema_mode,
        "chat_template_kwargs": kwargs or None,
    }
    if body.temperature is not None:
        fields["temperature"] = body.temperature
    if body.top_p is not None:
        fields["top_p"] = body.top_p
    try:
        return ChatRequest.model_validate(fields)
    except ValueError as exc:
        raise APIError(400, f"input: {exc}", param="input") from exc


def arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
