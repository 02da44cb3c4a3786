"""Strict structural tags from a `CallFormat`, and a family's built-in tag for a list of tools.

From the description alone (`call_format.py`):

- a call to tool f is a `tag` whose begin is the call's opening with f's name (a numbered
  family's counter, `[0-9]+`, opens the content), whose content is f's arguments (JSON, or
  `json_schema` in the format's XML `style`), and whose end is the call's end;
- a block format wraps the calls in one tag (the block's begin and end) holding
  `tags_with_separator`; the other formats separate their calls by the format's separator;
- `auto`: free text until the format's trigger (`triggered_tags`); `required` / a named tool
  (`first`): the answer is calls only; `many` False (`parallel_tool_calls: false`, a named
  tool): one call.

`builtin_structural_tag(family, tools, tool_choice, reasoning)` is XGrammar's idea of built-in
tags: the tag a family's model writes for those tools, with the family's thinking (`<think>`
... `</think>`, Harmony's analysis channel) first when reasoning is on. Its arguments are the
tools' parameter schemas as `json_schema` contents (the server's own plan, `plan.py`, gives
JSON arguments its regex of them instead: the same language with the templates' spaces).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.server.protocol import Tool
from runtime.server.tools.call_format import INDEX_PATTERN, CallFormat, FormatParser

Content = Callable[[Tool, int], dict[str, Any]]


class BuiltinTagError(ValueError):
    """A family without a built-in tag, or a tool_choice naming no declared tool."""


def schema_content(tool: Tool, index: int) -> dict[str, Any]:
    """A call's JSON arguments as the tool's schema (any object when `strict` is false), with
    white space runs of at most one character (the templates write `{"a": 1, "b": 2}`)."""
    params = tool.function.parameters if tool.function.strict is not False else {"type": "object"}
    return {"type": "json_schema", "json_schema": params, "max_whitespace_cnt": 1}


def call_tag(fmt: CallFormat, tool: Tool, content: dict[str, Any]) -> dict[str, Any]:
    counted = fmt.after_name[1]
    if counted is not None:
        index = [{"type": "regex", "pattern": INDEX_PATTERN},
                 {"type": "const_string", "value": counted}]  # fmt: skip
        content = {"type": "sequence", "elements": [*index, content]}
    begin = fmt.call_opening(tool.function.name)  # (the counter, if any, opens the content)
    return {"type": "tag", "begin": begin, "content": content, "end": fmt.call_end}


def args_content(fmt: CallFormat, tool: Tool, index: int, json_content: Content) -> dict:
    if fmt.args in ("json", "json_call"):
        return json_content(tool, index)
    params: Any = tool.function.parameters if tool.function.strict is not False else True
    # white space runs of one character, as the templates write them (`\n` around elements and
    # values): unbounded runs would let a model pad an answer until max_tokens
    return {"type": "json_schema", "json_schema": params, "style": fmt.args,
            "max_whitespace_cnt": 1}  # fmt: skip


def calls_format(fmt: CallFormat, tags: list[dict], first: bool, many: bool) -> dict[str, Any]:
    """The calls made of `tags` (see the module's docstring)."""
    if fmt.block_begin:
        inner = {"type": "tags_with_separator", "tags": tags, "separator": fmt.separator,
                 "at_least_one": True, "stop_after_first": not many}  # fmt: skip
        block = {"type": "tag", "begin": fmt.block_begin, "content": inner, "end": fmt.block_end}
        if first:
            return block
        return {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": [block],
                "at_least_one": False, "stop_after_first": True}  # fmt: skip
    if first:
        return {"type": "tags_with_separator", "tags": tags, "separator": fmt.separator,
                "at_least_one": True, "stop_after_first": not many}  # fmt: skip
    return {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": tags,
            "at_least_one": False, "stop_after_first": not many}  # fmt: skip


def format_structural_tag(
    fmt: CallFormat,
    tools: list[Tool],
    named: str | None,
    first: bool,
    many: bool,
    json_content: Content = schema_content,
) -> dict[str, Any]:
    """The strict structural tag of calls to `tools` in `fmt` (only `named` when given)."""
    tags = [
        call_tag(fmt, t, args_content(fmt, t, i, json_content))
        for i, t in enumerate(tools)
        if named is None or t.function.name == named
    ]
    return {"type": "structural_tag", "format": calls_format(fmt, tags, first, many)}


def builtin_structural_tag(
    family: str,
    tools: list[Any],
    tool_choice: str | dict[str, Any] = "auto",
    reasoning: bool = False,
    parallel_tool_calls: bool = True,
) -> dict[str, Any]:
    """The built-in structural tag of `family` (a `--tool-call-parser` name or alias) for
    `tools` (OpenAI tool objects or `Tool`s): `tool_choice` "auto" / "required" / "none" / a
    function (`{"type": "function", "function": {"name": ...}}` or `{"name": ...}`);
    `reasoning`: the family's thinking comes first, free, until its closing."""
    from runtime.server.tools.registry import ToolParserError, get_parser

    try:
        parser = get_parser(family)
    except ToolParserError as exc:
        raise BuiltinTagError(str(exc)) from None
    if not isinstance(parser, FormatParser) or parser.fmt.whole_answer:
        raise BuiltinTagError(f"tool-call format {family!r} has no built-in structural tag")
    fmt = parser.fmt
    listed = [t if isinstance(t, Tool) else Tool.model_validate(t) for t in tools]
    named = _named(tool_choice, listed)
    if tool_choice == "none" or not listed:
        calls: dict[str, Any] = {"type": "any_text"}
    else:
        first = tool_choice == "required" or named is not None
        many = parallel_tool_calls and named is None
        calls = format_structural_tag(fmt, listed, named, first, many)["format"]
    if reasoning:
        start, end = fmt.reasoning
        think = {"type": "tag", "begin": start, "content": {"type": "any_text"}, "end": end}
        gap = {"type": "regex", "pattern": r"[ \n]*"}  # the templates' blank line after it
        calls = {"type": "sequence", "elements": [think, gap, calls]}
    return {"type": "structural_tag", "format": calls}


def _named(choice: str | dict[str, Any], tools: list[Tool]) -> str | None:
    if isinstance(choice, str):
        if choice not in ("auto", "required", "none"):
            raise BuiltinTagError(f"tool_choice {choice!r}: auto, required, none or a function")
        return None
    fn = choice.get("function", choice) if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if name not in {t.function.name for t in tools}:
        raise BuiltinTagError(f"tool_choice names {name!r}, which is not among the tools")
    return name
