r"""Strict tool calls and reasoning as phases of one answer (see `phases.py`).

The constraint of a chat answer, from the tool-call parser's format and the tools:

- A call's arguments match the tool's parameter schema (generated under the request's
  `json_schema_mode`, strict by default, with the optional single spaces the templates write;
  inside structural tags as a regex content, so every format has the same language); a tool
  with `strict: false` takes any JSON object as arguments. Its name is one of
  the declared tools, and the format's opening and closing text come with it.
- Formats with a call opening (`<tool_call>`, `[TOOL_CALLS]`, `<｜tool▁calls▁begin｜>`) are
  one triggered structural tag (`grammar.compile_structural_tag`): in "auto" free text stays
  free, and from the moment the model writes the opening the call is constrained, then the
  text is free again (one-block formats end with their block); "required": the answer is
  calls only; a named function: exactly one call to it and nothing after;
  `parallel_tool_calls: false`: the answer ends after the first call. Formats whose calls are
  the whole answer (`llama3`, `pythonic`, `json`) are one regex: the calls, or text that does
  not open them.
- With `response_format` and "auto": the answer is a call block or the format.
- Recursive parameters (a tree of nodes: a `$defs` cycle, `"$ref": "#"`) would be unrolled to
  a depth by a regex: their arguments are a tag's `json_schema` content instead, which the
  structural-tag compiler says through the context-free path, exact at any depth, in every
  format (the whole-answer formats then become a tag too, `whole_answer_tag`; pythonic's
  recursive keyword values likewise). White space there: runs of at most one character.
- A reasoning parser puts a phase first: thinking is free (its own `<think>` opened when the
  template expects the model to write it) until `</think>` or until the reasoning budget is
  spent (half of max_tokens when a constrained answer follows and no budget is given), when
  `</think>` is forced; every constraint above starts after it.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from runtime.scheduling.request import GenerateResult
from runtime.server.errors import APIError
from runtime.server.protocol import Tool
from runtime.server.tools.call_format import FormatParser
from runtime.server.tools.call_tags import format_structural_tag
from runtime.server.tools.formats import PythonicParser
from runtime.server.tools.parser import ToolParser
from runtime.server.tools.phases import Phase
from runtime.server.tools.reasoning import ReasoningParser
from runtime.server.tools.schemas import property_schema, recursive_params

logger = logging.getLogger(__name__)

ARGS_WHITESPACE = "[ ]?"
# the share of max_tokens the reasoning may use when a constrained answer follows and the
# request gives no reasoning budget (the answer must have room: its constraint is not dropped)
DEFAULT_REASONING_SHARE = 0.5  # the templates show `{"a": 1, "b": 2}`; compact is allowed too


def not_prefixed(prefixes: tuple[str, ...]) -> str:
    """A regex of the non-empty strings that start with none of `prefixes`."""
    trie: dict[str, Any] = {}
    for p in prefixes:
        node = trie
        for ch in p:
            node = node.setdefault(ch, {})
        node[""] = {}

    def walk(node: dict[str, Any], root: bool) -> str:
        chars = "".join(re.escape(c) for c in node if c)
        alts = [f"[^{chars}][\\s\\S]*" if chars else "[\\s\\S]+"]
        for ch, child in node.items():
            if ch and "" not in child:
                alts.append(re.escape(ch) + walk(child, False))
        body = "(?:" + "|".join(alts) + ")"
        return body if root else body + "?"

    return walk(trie, True)


def _schema_regex(schema: Any, mode: str, param: str) -> str:
    from grammar import GrammarError, json_schema_to_regex
    from grammar.json_schema.schema import load_schema
    from grammar.json_schema.strict import apply_mode

    try:
        return json_schema_to_regex(apply_mode(load_schema(schema), mode), ARGS_WHITESPACE)
    except GrammarError as exc:
        raise APIError(400, str(exc), param=param, code="unsupported_schema_keyword") from exc


@functools.cache
def _any_object() -> str:
    from grammar import json_schema_to_regex

    return json_schema_to_regex({"type": "object"}, ARGS_WHITESPACE, any_depth=2)


def _kwargs_regex(params: dict[str, Any], mode: str, param: str, name: str) -> str:
    """Python keyword arguments whose values are JSON literals of each property's schema
    (declared order; required ones always present; a property's `$ref`s resolve in the
    parameters, `schemas.property_schema`)."""
    from grammar.json_schema.schema import load_schema
    from grammar.json_schema.strict import apply_mode
    from grammar.structural.xml_args import root_object

    params = root_object(params)  # (pydantic's recursive model: a root `$ref`)
    schema = apply_mode(load_schema(params), mode)
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not props:
        return ""
    required = set(schema.get("required", []))

    def keyword(k: str) -> str:
        value = _schema_regex(property_schema(params, k, name), mode, f"{param}.properties.{k}")
        return re.escape(k) + "=" + value

    items = [(keyword(k), k in required) for k in props]

    def after_first(i: int) -> str:  # the items after one was written
        return "".join(f", {r}" if req else f"(?:, {r})?" for r, req in items[i:])

    def from_(i: int) -> str:  # the items from i on, none written before
        if i == len(items):
            return ""
        r, req = items[i]
        first = r + after_first(i + 1)
        return first if req else f"(?:{first}|{from_(i + 1)})"

    return from_(0)


def args_regex(parser: ToolParser, tool: Tool, index: int, mode: str) -> str:
    param = f"tools.{index}.function.parameters"
    if isinstance(parser, PythonicParser):
        if tool.function.strict is False:
            return r"(?:[A-Za-z_]\w*=[^,()]+(?:, [A-Za-z_]\w*=[^,()]+)*)?"
        return _kwargs_regex(tool.function.parameters, mode, param, tool.function.name)
    if tool.function.strict is False:
        return _any_object()
    return _schema_regex(tool.function.parameters, mode, param)


def _call_alternatives(parser: ToolParser, tools: list[Tool], mode: str, only: str | None):
    return [
        parser.call_regex(t.function.name, args_regex(parser, t, i, mode))
        for i, t in enumerate(tools)
        if only is None or t.function.name == only
    ]


@dataclass(slots=True)
class AnswerSpec:
    constraint: dict[str, Any]


def tool_answer_spec(
    parser: ToolParser,
    tools: list[Tool],
    choice: str | dict[str, str],
    parallel: bool,
    mode: str,
    other: str | None,
) -> AnswerSpec:
    """The constraint of a tool-mode answer in `parser`'s format; `other`: the regex of the
    request's response_format (auto only)."""
    key = json.dumps([t.model_dump(mode="json") for t in tools])  # (declared order kept)
    named = choice["name"] if isinstance(choice, dict) else None
    if isinstance(parser, FormatParser):
        parser.bind(tools)  # the request's parser types XML values by these schemas, streamed too
    return _spec(parser.name, key, named, choice == "required", parallel, mode, other)


@functools.lru_cache(maxsize=64)
def _spec(name: str, key: str, named: str | None, required: bool, parallel: bool, mode: str,
          other: str | None) -> AnswerSpec:  # fmt: skip
    from runtime.server.tools.registry import get_parser

    parser = get_parser(name)
    tools = [Tool.model_validate(t) for t in json.loads(key)]
    many = parallel and named is None
    xml = isinstance(parser, FormatParser) and parser.fmt.args not in ("json", "json_call")
    # recursive parameters (a tree of nodes) are said exactly by a tag's json_schema content
    # (the context-free path); a regex unrolls them to a depth
    tree = any(t.function.strict is not False and recursive_params(t.function.parameters)
               for t in tools)  # fmt: skip
    whole = isinstance(parser, FormatParser) and parser.fmt.whole_answer
    if isinstance(parser, FormatParser) and not whole and (other is None or xml or tree):
        # described formats: the tag from the description (XML arguments have no regex of
        # theirs beside a response_format: the tag's `or` holds both)
        first = required or named is not None or other is not None

        def content(tool: Tool, index: int) -> dict[str, Any]:
            return _content(tool, index, mode)

        tag = format_structural_tag(parser.fmt, tools, named, first, many, json_content=content)
        if xml:
            _check_xml_arguments(parser.fmt.args, tools, mode)
        return AnswerSpec({"structural_tag": _or_format(tag, other, named or required)})
    if parser.trigger is not None and (other is None or tree):
        first = required or named is not None or other is not None
        tag = structural_tag(parser, tools, mode, named, first, many)
        return AnswerSpec({"structural_tag": _or_format(tag, other, named or required)})
    if tree:  # a whole-answer format (llama3, pythonic) as a tag
        tag = whole_answer_tag(parser, tools, mode, named, many)
        if not (named or required):
            other = other if other is not None else not_prefixed(parser.openers)
        return AnswerSpec({"structural_tag": _or_format(tag, other, named or required)})
    calls = _call_alternatives(parser, tools, mode, named)
    if parser.trigger is None:  # the calls are the whole answer
        block = parser.block_regex(calls, many)
        if named or required:
            return AnswerSpec({"regex": block})
        text = other if other is not None else not_prefixed(parser.openers)
        return AnswerSpec({"regex": f"(?:{block})|(?:{text})"})
    # a trigger format with a response_format beside the calls: a call block or the format
    if parser.one_block:
        block = parser.block_regex(calls, many)
    else:
        block = "(?:" + "|".join(calls) + ")"
    if named or required:
        return AnswerSpec({"regex": block})
    return AnswerSpec({"regex": f"(?:{block})|(?:{other})"})


def _or_format(tag: dict[str, Any], other: str | None, forced: Any) -> dict[str, Any]:
    """The calls' tag, or (auto with a response_format, or a whole-answer format's text) the
    regex `other`."""
    if other is None or forced:
        return tag
    fmt = {"type": "or", "elements": [tag["format"], {"type": "regex", "pattern": other}]}
    return {"type": "structural_tag", "format": fmt}


def whole_answer_tag(
    parser: ToolParser, tools: list[Tool], mode: str, named: str | None, many: bool
) -> dict[str, Any]:
    """The calls of a format whose calls are the whole answer (`llama3`, `pythonic`) as a
    structural tag: its regex's language, the arguments as `json_schema` contents where the
    parameters are recursive (exact at any depth)."""
    calls = []
    for i, t in enumerate(tools):
        if named is None or t.function.name == named:
            if isinstance(parser, PythonicParser):
                args = _kwargs_format(t, i, mode)
            else:
                args = _content(t, i, mode)
            calls.append(parser.call_format(t.function.name, args))
    one = calls[0] if len(calls) == 1 else {"type": "or", "elements": calls}
    return {"type": "structural_tag", "format": parser.block_format(one, many)}


def _kwargs_format(tool: Tool, index: int, mode: str) -> dict[str, Any]:
    """`_kwargs_regex` as a structural-tag format: a recursive property's value is the
    property's schema as `json_schema` content (its `$ref`s resolving in the parameters)."""
    from grammar.json_schema.schema import load_schema
    from grammar.json_schema.strict import apply_mode
    from grammar.structural.xml_args import root_object

    params, name = root_object(tool.function.parameters), tool.function.name
    param = f"tools.{index}.function.parameters"
    if tool.function.strict is False:
        return {"type": "regex", "pattern": args_regex(PythonicParser(), tool, index, mode)}
    schema = apply_mode(load_schema(params), mode)
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not props:
        return {"type": "const_string", "value": ""}
    required = set(schema.get("required", []))

    def keyword(k: str) -> dict[str, Any]:
        sub = property_schema(params, k, name)
        value = _schema_regex(sub, mode, f"{param}.properties.{k}")  # (a 400 when unsayable)
        content: dict[str, Any] = {"type": "regex", "pattern": value}
        if isinstance(sub, dict) and recursive_params(sub):
            content = {"type": "json_schema", "json_schema": sub, "max_whitespace_cnt": 1}
        return _seq({"type": "const_string", "value": k + "="}, content)

    items = [(keyword(k), k in required) for k in props]

    def after_first(i: int) -> list[dict[str, Any]]:
        out = []
        for item, req in items[i:]:
            more = _seq({"type": "const_string", "value": ", "}, item)
            out.append(more if req else {"type": "optional", "content": more})
        return out

    def from_(i: int) -> dict[str, Any]:
        if i == len(items):
            return {"type": "const_string", "value": ""}
        item, req = items[i]
        first = _seq(item, *after_first(i + 1))
        return first if req else {"type": "or", "elements": [first, from_(i + 1)]}

    return from_(0)


def _seq(*elements: dict[str, Any]) -> dict[str, Any]:
    return {"type": "sequence", "elements": list(elements)}


def _check_xml_arguments(style: str, tools: list[Tool], mode: str) -> None:
    """A 400 naming the tool and the keyword when its parameters cannot be written in the
    format's XML argument style (a value that may be a string or something else, ...)."""
    from grammar import GrammarError
    from grammar.structural.spec import SpecReader

    for i, t in enumerate(tools):
        if t.function.strict is False:
            continue
        param = f"tools.{i}.function.parameters"
        content = {"type": "json_schema", "json_schema": t.function.parameters, "style": style}
        try:
            SpecReader(mode, None).format(content, param)
        except GrammarError as exc:
            msg = f"tool {t.function.name!r}: its parameters cannot be written as {style}: {exc}"
            raise APIError(400, msg, param=param, code="unsupported_schema_keyword") from exc


def _content(tool: Tool, index: int, mode: str) -> dict[str, Any]:
    """A call's arguments inside its tag: the tool's schema as our regex (the same language as
    the regex formats: strict mode, bounded numbers, the templates' optional spaces)."""
    if tool.function.strict is False:  # any object
        return {"type": "regex", "pattern": _any_object()}
    param = f"tools.{index}.function.parameters"
    pattern = _schema_regex(tool.function.parameters, mode, param)  # (a 400 when unsayable)
    if recursive_params(tool.function.parameters):  # a tree: the context-free path, exact
        return {"type": "json_schema", "json_schema": tool.function.parameters,
                "max_whitespace_cnt": 1}  # fmt: skip
    return {"type": "regex", "pattern": pattern}


def structural_tag(
    parser: ToolParser, tools: list[Tool], mode: str, named: str | None, first: bool, many: bool
) -> dict[str, Any]:
    """XGrammar's structural tag of strict calls in `parser`'s format: free text until the
    format's trigger, then a call to a declared tool (its begin text names it), its arguments
    under the tool's schema, and the call's end text. `first`: the answer opens with a call;
    `many`: more than one call may follow."""
    tags = []
    for i, t in enumerate(tools):
        if named is not None and t.function.name != named:
            continue
        begin, end = parser.tag_parts(t.function.name)
        tags.append({"type": "tag", "begin": begin, "content": _content(t, i, mode), "end": end})
    if parser.one_block:  # one tag holding every call, separated
        begin, separator, end = parser.block_parts
        calls = {"type": "tags_with_separator", "tags": tags, "separator": separator,
                 "at_least_one": True, "stop_after_first": not many}  # fmt: skip
        tags = [{"type": "tag", "begin": begin, "content": calls, "end": end}]
        many = False
    elif first:  # forced calls: calls only, one per line, then the end
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n",
               "at_least_one": True, "stop_after_first": not many}  # fmt: skip
        return {"type": "structural_tag", "format": fmt}
    fmt = {"type": "triggered_tags", "triggers": [parser.trigger], "tags": tags,
           "at_least_one": first, "stop_after_first": not many}  # fmt: skip
    return {"type": "structural_tag", "format": fmt}


@dataclass(slots=True)
class ReasoningSpec:
    parser: ReasoningParser
    open_at_start: bool
    budget: int | None


class AnswerPlan:
    """The phases of one answer: reasoning, then the answer under its constraint."""

    def __init__(self, reasoning: ReasoningSpec, answer: AnswerSpec) -> None:
        self.reasoning = reasoning
        self.answer = answer
        self.stage = "reasoning"

    def first(self) -> Phase | None:
        r = self.reasoning
        opening = "" if r.open_at_start else r.parser.start + "\n"
        # without a budget, a constrained answer keeps half of max_tokens for itself
        share = DEFAULT_REASONING_SHARE if r.budget is None and self.answer.constraint else None
        return Phase(forced=opening, stop=(r.parser.end,), max_tokens=r.budget, share=share)

    def next(self, text: str, result: GenerateResult, capped: bool) -> Phase | None:
        if self.stage != "reasoning":
            return None
        self.stage = "answer"
        end = self.reasoning.parser.end
        # the end of the turn inside the reasoning (an end-of-sequence token): a constrained
        # answer is still owed, so the reasoning is closed for it
        owed = isinstance(result.matched_stop, int) and bool(self.answer.constraint)
        if result.matched_stop == end or capped or owed:
            return Phase(forced=end, constraint=dict(self.answer.constraint))
        return None
