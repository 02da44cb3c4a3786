"""Chat requests to prompts and constraints: the model's chat template, `response_format`.

Messages are rendered with the tokenizer's own template (`apply_chat_template`, generation
prompt added). Content given as a list of parts keeps its text parts; `developer` is a system
turn; an assistant turn that called tools is written as the JSON calls it made; a `tool` turn
is written as a user turn when the template has no tool role of its own.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from runtime.server.errors import APIError
from runtime.server.protocol import ChatCompletionRequest, ChatMessage
from runtime.server.tools import tools_system_text

# JSON-object mode: any object, nested objects/arrays unrolled to this depth
JSON_OBJECT_DEPTH = 2


def _text_of(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise APIError(
                400,
                f"content part of type {part.get('type')!r} is not supported (text only)",
                param=f"messages.{index}.content",
                code="unsupported_content",
            )
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _template_messages(request: ChatCompletionRequest) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for i, m in enumerate(request.messages):
        text = _text_of(m, i)
        role = "system" if m.role == "developer" else m.role
        if m.role == "assistant" and m.tool_calls:
            calls = [
                json.dumps({"name": c.function.name, "arguments": _arguments(c.function.arguments)})
                for c in m.tool_calls
            ]
            text = "\n".join([text, *calls]) if text else "\n".join(calls)
        if m.role == "tool":
            role, text = "user", f"Tool result ({m.name or m.tool_call_id or 'tool'}): {text}"
        out.append({"role": role, "content": text})
    if request.tools and request.tool_choice != "none":
        tools_text = tools_system_text(request.tools)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools_text}"}
        else:
            out.insert(0, {"role": "system", "content": tools_text})
    return out


def _arguments(arguments: str | dict[str, Any]) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def render_prompt(tokenizer: Any, request: ChatCompletionRequest) -> str:
    """The prompt text for a chat request, ending where the assistant's answer begins."""
    messages = _template_messages(request)
    if not getattr(tokenizer, "chat_template", None):
        lines = [f"{m['role'].capitalize()}: {m['content']}\n" for m in messages]
        return "".join(lines) + "Assistant: "
    try:
        return tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=True,
            **(request.chat_template_kwargs or {}),
        )
    except Exception as exc:  # the template's own checks (role order, ...)
        msg = f"chat template rejected the messages: {exc}"
        raise APIError(400, msg, param="messages") from exc


@functools.cache
def json_object_regex() -> str:
    """A regex for any JSON object (nesting unrolled to `JSON_OBJECT_DEPTH`)."""
    from grammar import json_schema_to_regex

    return json_schema_to_regex({"type": "object"}, any_depth=JSON_OBJECT_DEPTH)


def check_schema(schema: Any, param: str) -> None:
    """Raise a 400 naming the keyword when the grammar cannot honour `schema` (the same
    construction `compile_json_schema` uses, automaton-only shapes included)."""
    from grammar import GrammarError
    from grammar.json_schema.schema import json_schema_to_node

    try:
        json_schema_to_node(schema)
    except GrammarError as exc:
        code = "unsupported_schema_keyword" if hasattr(exc, "keyword") else "invalid_schema"
        raise APIError(400, str(exc), param=param, code=code) from exc
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        msg = f"invalid JSON schema: {exc}"
        raise APIError(400, msg, param=param, code="invalid_schema") from exc


def response_format_constraint(request: ChatCompletionRequest) -> dict[str, Any]:
    """Engine constraint keywords (`regex` / `json_schema`) for the request's output format."""
    fmt = request.response_format
    if request.json_schema is not None:
        check_schema(request.json_schema, "json_schema")
        return {"json_schema": request.json_schema}
    if request.regex is not None:
        return {"regex": request.regex}
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        return {"regex": json_object_regex()}
    if fmt.json_schema is None:
        raise APIError(
            400, "response_format json_schema needs a json_schema object", param="response_format"
        )
    schema = fmt.json_schema.schema_
    check_schema(schema, "response_format.json_schema.schema")
    return {"json_schema": schema}
