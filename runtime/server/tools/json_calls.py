r"""`json`: our own call format, for templates that cannot render tools.

A call is the JSON `{"name": <tool>, "arguments": {...}}`; with `parallel_tool_calls` (the
default) the answer may also be a list of calls `[{...}, {...}]`, each to any of the tools;
the calls are the whole answer. `JsonCallsParser` reads it (Llama 3's and Mistral's formats
build on it). Its constraint:

- `tool_choice` "required" or a named function: the output is constrained by a schema built
  from the tools' parameter schemas (`anyOf` over the tools for "required"), so the calls
  always parse and their arguments validate (unless max_tokens cuts them short: then
  finish_reason is "length" and the raw text is returned as content).
- `tool_choice` "auto" (the default when tools are given): the tools and the call format are
  listed in a system text (`prompt.py`), and the output is constrained to the regex
  `(<valid calls>)|([^{[][\s\S]*)`: an answer that starts with "{" (or "[" when parallel
  calls are allowed) must be complete, valid calls; any other first character starts free
  text. (A response_format given with auto joins the calls as another alternative.)

The parameter schemas are generated under the request's `json_schema_mode` (strict by
default: an object emits only the properties its schema declares).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
from typing import Any

from runtime.server.errors import APIError
from runtime.server.protocol import Tool
from runtime.server.tools.parser import ToolParser, json_string
from runtime.server.tools.scan import Scan, scan_json_calls
from runtime.server.tools.schemas import embedded, local_pointers

logger = logging.getLogger(__name__)


class JsonCallsParser(ToolParser):
    """Calls as JSON objects making up the whole answer (our format; Llama 3's)."""

    name = "json"
    openers = ("{", "[")
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    separators = ","
    prefix = ""

    def scan(self, text: str, final: bool = False) -> Scan:
        return scan_json_calls(
            text, final, self.openers, self.args_keys, self.separators, self.prefix
        )

    def render(self, calls: list[tuple[str, Any]]) -> str:
        objs = [{"name": n, "arguments": a} for n, a in calls]
        return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)

    def call_regex(self, name: str, args: str) -> str:
        head = re.escape('{"name": ' + json_string(name) + ', "arguments": ')
        return f"{head}{args}\\}}"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        return f"{one}|\\[{one}(?:, {one})*\\]" if parallel else one


def _call_schema(tool: Tool) -> dict[str, Any]:
    f = tool.function
    return {
        "type": "object",
        "properties": {
            "name": {"const": f.name},
            # its own base URI, so `#/$defs/...` inside the parameters still resolves there
            "arguments": embedded(f.parameters, f.name),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_call_schema(tools: list[Tool], parallel: bool = False) -> dict[str, Any]:
    """The JSON schema of one call to one of `tools`, or (parallel) also of a list of calls."""
    one = _call_schema(tools[0]) if len(tools) == 1 else {"anyOf": [_call_schema(t) for t in tools]}
    if parallel:  # (a copy: strict mode rewrites each place of a schema in place)
        many = {"type": "array", "items": copy.deepcopy(one), "minItems": 1}
        one = {"anyOf": [one, many]}
    return local_pointers(one)


def _free_text(parallel: bool) -> str:
    """Text that does not open a call: its first character is not "{" (nor "[" with
    parallel calls)."""
    return r"[^{\[][\s\S]*" if parallel else r"[^{][\s\S]*"


def auto_tool_regex(tools: list[Tool], parallel: bool, mode: str, other: str | None = None) -> str:
    """Valid calls to `tools`, or `other` (a regex), or text that starts with neither "{"
    nor "[" (nor "{" alone without parallel calls). A 400 naming the tool and the keyword
    when the grammar cannot say the calls (never free text in their place). Cached by the
    tools' JSON (an agent sends the same tools with every turn)."""
    key = json.dumps([t.model_dump(mode="json") for t in tools])  # (declared order kept)
    return _auto_tool_regex(key, parallel, mode, other)


@functools.lru_cache(maxsize=64)
def _auto_tool_regex(key: str, parallel: bool, mode: str, other: str | None) -> str:
    from grammar import GrammarError, json_schema_to_regex
    from grammar.json_schema.strict import apply_mode

    tools = [Tool.model_validate(t) for t in json.loads(key)]
    try:
        calls = json_schema_to_regex(apply_mode(tool_call_schema(tools, parallel), mode))
    except GrammarError as exc:
        raise call_schema_refusal(exc, tools) from exc
    return f"({calls})|({other if other is not None else _free_text(parallel)})"


def tool_call_lark(tools: list[Tool], parallel: bool, mode: str, auto: bool) -> str | None:
    """The calls to `tools` as a lark grammar (the context-free path: recursive parameters
    exact, with no depth limit); with `auto`, free text that opens no call is the other
    alternative. None when the lark path cannot say a keyword (the regex path then unrolls
    the recursion to its depth). Cached by the tools' JSON, as `auto_tool_regex`."""
    key = json.dumps([t.model_dump(mode="json") for t in tools])
    return _tool_call_lark(key, parallel, mode, auto)


@functools.lru_cache(maxsize=64)
def _tool_call_lark(key: str, parallel: bool, mode: str, auto: bool) -> str | None:
    from grammar import GrammarError, json_schema_to_lark

    tools = [Tool.model_validate(t) for t in json.loads(key)]
    try:
        text = json_schema_to_lark(tool_call_schema(tools, parallel), json_schema_mode=mode)
    except GrammarError as exc:
        logger.debug("tool calls through the regex path: %s", exc)
        return None
    if not auto:
        return text
    head, _, rest = text.partition("\n")  # "start: <rule>"
    free = _free_text(parallel).replace("/", "\\/")
    return f"{head} | FREE_TEXT\nFREE_TEXT: /{free}/\n{rest}"


def call_schema_refusal(exc: Exception, tools: list[Tool]) -> APIError:
    """The 400 for calls the grammar cannot say: the tool named (from the JSON pointer of
    the refused keyword, `#/anyOf/<i>/properties/arguments/...`), and the keyword."""
    message = str(exc)
    name, param = None, "tools"
    at = re.search(r"(?:anyOf/(\d+)/)?properties/arguments", message)
    if at is not None:
        index = int(at.group(1)) if at.group(1) and len(tools) > 1 else 0
        if index < len(tools):
            name, param = tools[index].function.name, f"tools.{index}.function.parameters"
    where = f"tool {name!r}" if name else "the tools"
    msg = f"{where}: its parameters cannot be constrained as a call: {message}"
    return APIError(400, msg, param=param, code="unsupported_schema_keyword")
