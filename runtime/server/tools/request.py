"""The request's `tools` and `tool_choice`, checked.

A malformed tool or `tool_choice` is a 400 naming the field (`tools.0.function.name`, ...);
`"none"` leaves the tools out of the prompt.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from runtime.server.errors import APIError
from runtime.server.protocol import Tool


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
    """`check(schema, param, mode)` (structured.check_schema) on each tool's parameters; the
    400 names the tool and the keyword."""
    for i, tool in enumerate(tools):
        try:
            check(tool.function.parameters, f"tools.{i}.function.parameters", mode)
        except APIError as exc:
            exc.message = f"tool {tool.function.name!r}: {exc.message}"
            exc.args = (exc.message,)
            raise
