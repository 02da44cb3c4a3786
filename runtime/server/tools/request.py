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
def tools_system_text(tools: list[Tool], parallel: bool = True, parser: Any = None) -> str:
    """Our description of the tools, for templates that cannot render them: the call format
    is ours (`json`) or, with another parser, that parser's, shown by an example."""
    lines = [_HEADER]
    for tool in tools:
        f = tool.function
        entry = {"name": f.name, "description": f.description or "", "parameters": f.parameters}
        lines.append(json.dumps(entry))
    if parser is None or parser.name == "json":
        lines += ["", _CALL + (_PARALLEL if parallel else "") + _OTHERWISE]
    else:
        example = parser.render([("<tool name>", {"<argument>": "<value>"})])
        lines += ["", f"When a tool can answer the user's request, call it by replying:\n{example}"]
        if parallel:
            lines.append("Several calls may follow one another.")
        lines.append(_OTHERWISE.strip())
    return "\n".join(lines)


def calls_text(parser: Any, calls: list[tuple[str, Any]]) -> str:
    """An assistant turn's calls as text, for templates that cannot render `tool_calls`."""
    if parser.name == "json":
        objs = [{"name": n, "arguments": a} for n, a in calls]
        return json.dumps(objs[0] if len(objs) == 1 else objs)
    return parser.render(calls)


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
