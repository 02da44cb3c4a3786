r"""Tool calling: describing tools to the model, constraining a forced call, reading calls back.

- `tool_choice` "required" or a named function: the output is constrained to the JSON
  `{"name": <tool>, "arguments": {...}}` by a schema built from the tools' parameter schemas
  (`anyOf` over the tools for "required"), so the call always parses and its arguments
  validate (unless max_tokens cuts it short: then finish_reason is "length" and the raw text is
  returned as content).
- `tool_choice` "auto" (the default when tools are given): the tools and the call format are
  listed in a system text, and the output is constrained to the regex
  `(<one valid call>)|([^{][\s\S]*)`: an answer that starts with "{" must be a complete,
  valid call; any other first character starts free text. An answer that parses as a call to
  a known tool is returned as a tool call, anything else as content. (When the tools'
  schemas use a keyword the grammar cannot honour, auto falls back to unconstrained text read
  back the same way; a response_format given with auto replaces the alternation.)
- "none": tools are not shown to the model.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from runtime.server.errors import APIError
from runtime.server.protocol import ChatCompletionRequest, Tool

logger = logging.getLogger(__name__)

_INSTRUCTIONS = (
    "You can call the following tools. To call one, answer with only a JSON object "
    '{"name": <tool name>, "arguments": <object of arguments>} and nothing else.\n\nTools:'
)


def tools_system_text(tools: list[Tool]) -> str:
    lines = [_INSTRUCTIONS]
    for tool in tools:
        f = tool.function
        entry = {"name": f.name, "description": f.description or "", "parameters": f.parameters}
        lines.append(json.dumps(entry))
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


def forced_tools(request: ChatCompletionRequest) -> list[Tool] | None:
    """The tools one of which the answer must call, or None when the call is not forced."""
    choice = request.tool_choice
    if not request.tools:
        if choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return None
    if choice is None or choice in ("auto", "none"):
        return None
    if choice == "required":
        return list(request.tools)
    name = choice.function.get("name")  # type: ignore[union-attr]
    for tool in request.tools:
        if tool.function.name == name:
            return [tool]
    raise APIError(
        400, f"tool_choice names function {name!r}, which is not in tools", param="tool_choice"
    )


def tool_call_schema(tools: list[Tool]) -> dict[str, Any]:
    """The JSON schema of one call to one of `tools`."""
    if len(tools) == 1:
        return _call_schema(tools[0])
    return {"anyOf": [_call_schema(t) for t in tools]}


def auto_tool_regex(tools: list[Tool]) -> str | None:
    """Either one valid call to one of `tools`, or text that does not start with "{"."""
    from grammar import GrammarError, json_schema_to_regex

    try:
        call = json_schema_to_regex(tool_call_schema(tools))
    except GrammarError as exc:
        logger.info("tool_choice auto without a constraint: %s", exc)
        return None
    return f"({call})|([^{{][\\s\\S]*)"


def parse_tool_call(text: str, tools: list[Tool]) -> dict[str, Any] | None:
    """The OpenAI `tool_calls` entry for `text` if it is a JSON call to one of `tools`."""
    try:
        value = json.loads(text.strip())
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("arguments"), dict):
        return None
    names = {t.function.name for t in tools}
    if value.get("name") not in names:
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": json.dumps(value["arguments"])},
    }
