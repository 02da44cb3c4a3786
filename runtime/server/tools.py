r"""Tool calling: checking and describing tools, constraining calls, reading calls back.

A call is the JSON `{"name": <tool>, "arguments": {...}}`; with `parallel_tool_calls` (the
default) the answer may also be a list of calls `[{...}, {...}]`, each to any of the tools.

- `tool_choice` "required" or a named function: the output is constrained by a schema built
  from the tools' parameter schemas (`anyOf` over the tools for "required"), so the calls
  always parse and their arguments validate (unless max_tokens cuts them short: then
  finish_reason is "length" and the raw text is returned as content).
- `tool_choice` "auto" (the default when tools are given): the tools and the call format are
  listed in a system text, and the output is constrained to the regex
  `(<valid calls>)|([^{[][\s\S]*)`: an answer that starts with "{" (or "[" when parallel
  calls are allowed) must be complete, valid calls; any other first character starts free
  text. (A response_format given with auto joins the calls as another alternative.)
- "none": tools are not shown to the model.

The parameter schemas are generated under the request's `json_schema_mode` (strict by
default: an object emits only the properties its schema declares). A malformed tool or
`tool_choice` is a 400 naming the field (`tools.0.function.name`, ...).
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from typing import Any

from pydantic import ValidationError

from runtime.server.errors import APIError
from runtime.server.protocol import Tool

logger = logging.getLogger(__name__)

_HEADER = "You are a function calling assistant. You have access to the following tools:"
_CALL = (
    "When a tool can answer the user's request, reply with only a JSON object "
    '{"name": <tool name>, "arguments": <object of arguments>}.'
)
_PARALLEL = " To call several at once, reply with a JSON list of such objects."
_OTHERWISE = " Otherwise reply in plain text."


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# ---- checking the request --------------------------------------------------------------------
def parse_tools(raw: Any) -> list[Tool] | None:
    """`tools` as `Tool`s; a 400 naming the first malformed field."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise APIError(400, "tools must be a list of function tools", param="tools")
    tools: list[Tool] = []
    for i, entry in enumerate(raw):
        if isinstance(entry, Tool):
            tools.append(entry)
            continue
        try:
            tools.append(Tool.model_validate(entry))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            param = f"tools.{i}.{loc}" if loc else f"tools.{i}"
            msg = f"{param}: {first.get('msg', 'invalid')}"
            raise APIError(400, msg, param=param, code="invalid_tool") from exc
        params = tools[-1].function.parameters
        if params.get("type", "object") != "object":
            param = f"tools.{i}.function.parameters"
            msg = f"{param}: a function's parameters must be an object schema"
            raise APIError(400, msg, param=param, code="invalid_tool")
    names = [t.function.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise APIError(400, f"tools: duplicate function names {dup}", param="tools")
    return tools


def parse_tool_choice(raw: Any, tools: list[Tool] | None) -> str | dict[str, str] | None:
    """The choice: "none", "auto", "required" or {"name": <function>} (None: no tools); a
    400 for anything else."""
    if raw is None:
        return None if not tools else "auto"
    if isinstance(raw, str):
        if raw not in ("none", "auto", "required"):
            msg = f"tool_choice must be 'none', 'auto', 'required' or a function, got {raw!r}"
            raise APIError(400, msg, param="tool_choice")
        if raw == "required" and not tools:
            raise APIError(400, "tool_choice 'required' needs tools", param="tool_choice")
        return None if raw == "auto" and not tools else raw
    if hasattr(raw, "model_dump"):
        raw = raw.model_dump()
    fn = raw.get("function") if isinstance(raw, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or raw.get("type", "function") != "function":
        msg = "tool_choice must be {'type': 'function', 'function': {'name': ...}}"
        raise APIError(400, msg, param="tool_choice.function.name")
    if not tools:
        msg = "tool_choice names a function but no tools are given"
        raise APIError(400, msg, param="tool_choice")
    if name not in {t.function.name for t in tools}:
        msg = f"tool_choice names function {name!r}, which is not in tools"
        raise APIError(400, msg, param="tool_choice.function.name")
    return {"name": name}


def forced_tools(tools: list[Tool] | None, choice: str | dict | None) -> list[Tool] | None:
    """The tools the answer must call, or None when a call is not forced."""
    if not tools or choice in (None, "none", "auto"):
        return None
    if choice == "required":
        return list(tools)
    return [t for t in tools if t.function.name == choice["name"]]  # type: ignore[index]


def check_tool_schemas(tools: list[Tool], mode: str, check: Any) -> None:
    """`check(schema, param, mode)` (chat.check_schema) on each tool's parameters."""
    for i, tool in enumerate(tools):
        check(tool.function.parameters, f"tools.{i}.function.parameters", mode)


# ---- describing and constraining --------------------------------------------------------------
def tools_system_text(tools: list[Tool], parallel: bool = True) -> str:
    lines = [_HEADER]
    for tool in tools:
        f = tool.function
        entry = {"name": f.name, "description": f.description or "", "parameters": f.parameters}
        lines.append(json.dumps(entry))
    lines += ["", _CALL + (_PARALLEL if parallel else "") + _OTHERWISE]
    return "\n".join(lines)


def _call_schema(tool: Tool) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.function.name},
            "arguments": tool.function.parameters,
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_call_schema(tools: list[Tool], parallel: bool = False) -> dict[str, Any]:
    """The JSON schema of one call to one of `tools`, or (parallel) also of a list of calls."""
    one = _call_schema(tools[0]) if len(tools) == 1 else {"anyOf": [_call_schema(t) for t in tools]}
    if not parallel:
        return one
    return {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}


def auto_tool_regex(
    tools: list[Tool], parallel: bool, mode: str, other: str | None = None
) -> str | None:
    """Valid calls to `tools`, or `other` (a regex), or text that starts with neither "{"
    nor "[" (nor "{" alone without parallel calls); None when the grammar cannot say it.
    Cached by the tools' JSON (an agent sends the same tools with every turn)."""
    key = json.dumps([t.model_dump(mode="json") for t in tools], sort_keys=True)
    return _auto_tool_regex(key, parallel, mode, other)


@functools.lru_cache(maxsize=64)
def _auto_tool_regex(key: str, parallel: bool, mode: str, other: str | None) -> str | None:
    from grammar import GrammarError, json_schema_to_regex
    from grammar.json_schema.strict import apply_mode

    tools = [Tool.model_validate(t) for t in json.loads(key)]
    try:
        calls = json_schema_to_regex(apply_mode(tool_call_schema(tools, parallel), mode))
    except GrammarError as exc:
        logger.info("tool_choice auto without a constraint: %s", exc)
        return None
    text = r"[^{\[][\s\S]*" if parallel else r"[^{][\s\S]*"
    return f"({calls})|({other if other is not None else text})"


# ---- reading calls back -----------------------------------------------------------------------
def parse_tool_calls(text: str, tools: list[Tool]) -> list[dict[str, Any]] | None:
    """The OpenAI `tool_calls` entries of `text` if it is a call (or a list of calls) to
    `tools`, else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    values = value if isinstance(value, list) and value else [value]
    names = {t.function.name for t in tools}
    calls = []
    for v in values:
        if not isinstance(v, dict) or set(v) != {"name", "arguments"}:
            return None
        if v["name"] not in names or not isinstance(v["arguments"], dict):
            return None
        calls.append(
            {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": v["name"], "arguments": json.dumps(v["arguments"])},
            }
        )
    return calls


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """The index after the JSON string starting at text[i] == '"', None if unfinished."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def _value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at text[i], None if unfinished."""
    if i >= len(text):
        return None
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] not in "{[":
        j = i
        while j < len(text) and text[j] not in ",}] \t\r\n":
            j += 1
        return j if j < len(text) else None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == '"':
            end = _string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def scan_calls(text: str) -> list[tuple[str | None, str]]:
    """The calls of a (partial) answer, as (name or None, the arguments' JSON text so far)."""
    out: list[tuple[str | None, str]] = []
    i = _ws(text, 0)
    if i < len(text) and text[i] == "[":
        i += 1
    while True:
        i = _ws(text, i)
        while i < len(text) and text[i] in ",":
            i = _ws(text, i + 1)
        if i >= len(text) or text[i] != "{":
            return out
        name, args, i = _scan_call(text, i + 1)
        out.append((name, args))
        if i is None:
            return out


def _scan_call(text: str, i: int) -> tuple[str | None, str, int | None]:
    name: str | None = None
    args = ""
    while True:
        i = _ws(text, i)
        if i < len(text) and text[i] == ",":
            i = _ws(text, i + 1)
        if i >= len(text):
            return name, args, None
        if text[i] == "}":
            return name, args, i + 1
        end = _string_end(text, i) if text[i] == '"' else None
        if end is None:
            return name, args, None
        key = json.loads(text[i:end])
        i = _ws(text, end)
        if i >= len(text) or text[i] != ":":
            return name, args, None
        i = _ws(text, i + 1)
        stop = _value_end(text, i)
        if key == "arguments":
            args = text[i : stop if stop is not None else len(text)]
        elif key == "name" and stop is not None:
            value = json.loads(text[i:stop])
            name = value if isinstance(value, str) else None
        if stop is None:
            return name, args, None
        i = stop


class CallStream:
    """Turns a growing answer into OpenAI's streamed `tool_calls` deltas: a call's first delta
    carries its index, id, type and name (arguments ""), later ones pieces of its arguments."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.sent: list[int] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        for k, (name, args) in enumerate(scan_calls(text)):
            if k >= len(self.ids):
                if name is None:
                    break
                self.ids.append(new_call_id())
                self.sent.append(0)
                fn = {"name": name, "arguments": ""}
                deltas.append({"index": k, "id": self.ids[k], "type": "function", "function": fn})
            if len(args) > self.sent[k]:
                deltas.append({"index": k, "function": {"arguments": args[self.sent[k] :]}})
                self.sent[k] = len(args)
        return deltas
