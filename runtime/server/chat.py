"""Chat requests to prompts and constraints: the model's chat template, `response_format`.

Messages are rendered with the tokenizer's own template (`apply_chat_template`, generation
prompt added). Content given as a list of parts keeps its text parts; `developer` is a system
turn. Tool turns: when the template renders assistant `tool_calls` itself (Qwen, Llama 3.1,
Mistral, ... templates), assistant calls and `tool` results are passed to it as they are
(arguments as objects); otherwise an assistant turn that called tools is written as the JSON
calls it made and a `tool` turn as a user turn naming the tool. A `tool` message must carry
the `tool_call_id` of a call made before it (400 otherwise).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from runtime.server.errors import APIError
from runtime.server.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from runtime.server.structured import check_schema, constraint_field, openai_constraint
from runtime.server.tools import (
    auto_tool_regex,
    check_tool_schemas,
    forced_tools,
    parse_tool_choice,
    parse_tools,
    tool_call_schema,
    tools_system_text,
)

JsonSchemaMode = Literal["strict", "exact"]


class ChatRequest(ChatCompletionRequest):
    """A chat request as the endpoint reads it: `tools` / `tool_choice` are checked by
    `tools.py` (a malformed one is a 400 naming the field), plus `json_schema_mode`."""

    tools: list[Any] | None = None  # type: ignore[assignment]
    tool_choice: Any = None
    # "strict" (objects emit only their declared properties) or "exact"; None: the server's
    json_schema_mode: JsonSchemaMode | None = None

    def prepare(self) -> None:
        self.tools = parse_tools(self.tools)
        self.tool_choice = parse_tool_choice(self.tool_choice, self.tools)
        check_messages(self.messages)

    @property
    def parallel(self) -> bool:
        return self.parallel_tool_calls is not False

    @property
    def tool_mode(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionsRequest(CompletionRequest):
    json_schema_mode: JsonSchemaMode | None = None


def check_messages(messages: list[ChatMessage]) -> None:
    ids: set[str] = set()
    for i, m in enumerate(messages):
        for c in m.tool_calls or []:
            if c.id:
                ids.add(c.id)
        if m.role != "tool":
            continue
        if not m.tool_call_id:
            msg = f"messages.{i}: a tool message needs the tool_call_id of the call it answers"
            raise APIError(400, msg, param=f"messages.{i}.tool_call_id")
        if m.tool_call_id not in ids:
            msg = f"messages.{i}.tool_call_id {m.tool_call_id!r} answers no earlier tool call"
            raise APIError(400, msg, param=f"messages.{i}.tool_call_id")


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


def _template_messages(request: ChatRequest, native: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call_id -> function name
    for i, m in enumerate(request.messages):
        text = _text_of(m, i)
        role = "system" if m.role == "developer" else m.role
        entry: dict[str, Any] = {"role": role, "content": text}
        if m.role == "assistant" and m.tool_calls:
            for c in m.tool_calls:
                names[c.id or ""] = c.function.name
            if native:
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.function.name,
                            "arguments": _arguments(c.function.arguments),
                        },
                    }
                    for c in m.tool_calls
                ]
            else:
                calls = [
                    {"name": c.function.name, "arguments": _arguments(c.function.arguments)}
                    for c in m.tool_calls
                ]
                shown = json.dumps(calls[0] if len(calls) == 1 else calls)
                entry["content"] = f"{text}\n{shown}" if text else shown
        if m.role == "tool":
            name = m.name or names.get(m.tool_call_id or "", "tool")
            if native:
                entry.update(tool_call_id=m.tool_call_id, name=name)
            else:
                entry = {"role": "user", "content": f"Tool result ({name}): {text}"}
        out.append(entry)
    if request.tool_mode:
        tools_text = tools_system_text(request.tools, request.parallel)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools_text}"}
        else:
            out.insert(0, {"role": "system", "content": tools_text})
    return out


_NATIVE: dict[str, bool] = {}


def renders_tool_calls(tokenizer: Any) -> bool:
    """Whether the chat template writes assistant `tool_calls` itself (probed once)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "tool_calls" not in template:
        return False
    if template not in _NATIVE:
        probe = [
            {"role": "user", "content": "u"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_probe",
                        "type": "function",
                        "function": {"name": "probe_fn_x", "arguments": {"a": 1}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_probe", "name": "probe_fn_x", "content": "r9"},
        ]
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False)
            _NATIVE[template] = "probe_fn_x" in text and "r9" in text
        except Exception:
            _NATIVE[template] = False
    return _NATIVE[template]


def _arguments(arguments: str | dict[str, Any]) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def render_prompt(tokenizer: Any, request: ChatRequest) -> str:
    """The prompt text for a chat request, ending where the assistant's answer begins."""
    messages = _template_messages(request, renders_tool_calls(tokenizer))
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


def response_format_constraint(request: ChatRequest, mode: str) -> dict[str, Any]:
    """Engine constraint keywords for the request's output format (`structured.py` reads every
    field that gives one). `response_format.json_schema.strict` true or false: the output is
    constrained either way, under `mode`."""
    return openai_constraint(request, mode).kwargs


def has_output_format(request: ChatRequest) -> bool:
    return constraint_field(request) is not None


def chat_constraint(request: ChatRequest, mode: str) -> dict[str, Any]:
    """The engine constraint of a chat request: its forced tool calls, or auto's alternation
    of calls and text (or of calls and the response_format), or its response_format."""
    from grammar import GrammarError, choices_to_regex, json_schema_to_regex
    from grammar.json_schema.schema import load_schema
    from grammar.json_schema.strict import apply_mode

    if request.tool_mode:
        check_tool_schemas(request.tools, mode, check_schema)
    forced = forced_tools(request.tools, request.tool_choice)
    if forced is not None:
        # a named function is one call, as OpenAI answers it; "required" may be several
        several = request.parallel and not isinstance(request.tool_choice, dict)
        return {"json_schema": tool_call_schema(forced, several), "json_schema_mode": mode}
    fmt = response_format_constraint(request, mode)
    if not request.tool_mode:
        return fmt
    other = fmt.get("regex")
    if "choices" in fmt:
        other = choices_to_regex(fmt["choices"])
    if "ebnf" in fmt or "structural_tag" in fmt:
        raise APIError(
            400,
            f"{constraint_field(request)} cannot be combined with tools here; "
            'send tool_choice "none" or drop the tools',
            param=constraint_field(request),
        )
    if "json_schema" in fmt:
        try:
            other = json_schema_to_regex(apply_mode(load_schema(fmt["json_schema"]), mode))
        except GrammarError:
            return fmt  # a format the regex path cannot say (recursive): the format alone
    regex = auto_tool_regex(request.tools, request.parallel, mode, other)
    return {"regex": regex} if regex else fmt
