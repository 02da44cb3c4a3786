"""The tools described in a system text, for templates that cannot render them, and an
assistant turn's calls written in the chosen format."""

from __future__ import annotations

import json
from typing import Any

from runtime.server.protocol import Tool

_HEADER = "You are a function calling assistant. You have access to the following tools:"
_CALL = (
    "When a tool can answer the user's request, reply with only a JSON object "
    '{"name": <tool name>, "arguments": <object of arguments>}.'
)
_PARALLEL = " To call several at once, reply with a JSON list of such objects."
_OTHERWISE = " Otherwise reply in plain text."


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
