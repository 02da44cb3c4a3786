r"""Strict tool calls and reasoning as phases of one answer (see `phases.py`).

The constraint of a chat answer, from the tool-call parser's format and the tools:

- A call's arguments match the tool's parameter schema (generated under the request's
  `json_schema_mode`, strict by default, with the optional single spaces the templates
  write); a tool with `strict: false` takes any JSON object as arguments. Its name is one of
  the declared tools, and the format's opening and closing text come with it.
- `tool_choice` "required": the answer opens with a call (a block of calls in formats that
  hold them all in one block); a named function: exactly one call to it; "auto": free text
  stays free, and from the moment the model writes the format's call opening (`<tool_call>`,
  `[TOOL_CALLS]`, `<｜tool▁calls▁begin｜>`) the call is constrained, then the text is free
  again (one-block formats end with their block). Formats whose calls are the whole answer
  (`llama3`, `pythonic`, `json`) are one regex: the calls, or text that does not open them.
  `parallel_tool_calls: false`: at most one call.
- With `response_format` and "auto": the answer is a call block or the format.
- A reasoning parser puts a phase first: thinking is free (its own `<think>` opened when the
  template expects the model to write it) until `</think>` or until the reasoning budget is
  spent, when `</think>` is forced; every constraint above starts after it.
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
from runtime.server.phases import Phase
from runtime.server.protocol import Tool
from runtime.server.reasoning import ReasoningParser
from runtime.server.tool_parsers import PythonicParser, ToolParser

logger = logging.getLogger(__name__)

ARGS_WHITESPACE = "[ ]?"  # the templates show `{"a": 1, "b": 2}`; compact is allowed too


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


def _kwargs_regex(params: dict[str, Any], mode: str, param: str) -> str:
    """Python keyword arguments whose values are JSON literals of each property's schema
    (declared order; required ones always present)."""
    from grammar.json_schema.schema import load_schema
    from grammar.json_schema.strict import apply_mode

    schema = apply_mode(load_schema(params), mode)
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not props:
        return ""
    required = set(schema.get("required", []))
    items = [
        (re.escape(k) + "=" + _schema_regex(v, mode, f"{param}.properties.{k}"), k in required)
        for k, v in props.items()
    ]

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
        return _kwargs_regex(tool.function.parameters, mode, param)
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
class Triggered:
    """Free text until `parser.trigger`, then one call (after the trigger) constrained."""

    parser: ToolParser
    after_trigger: str  # regex of a call's text after the trigger
    forced_first: str | None  # "required": the answer opens with a call (its full regex)
    parallel: bool


@dataclass(slots=True)
class AnswerSpec:
    constraint: dict[str, Any]
    triggered: Triggered | None = None


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
    key = json.dumps([t.model_dump(mode="json") for t in tools], sort_keys=True)
    named = choice["name"] if isinstance(choice, dict) else None
    return _spec(parser.name, key, named, choice == "required", parallel, mode, other)


@functools.lru_cache(maxsize=64)
def _spec(name: str, key: str, named: str | None, required: bool, parallel: bool, mode: str,
          other: str | None) -> AnswerSpec:  # fmt: skip
    from runtime.server.tool_parsers import get_parser

    parser = get_parser(name)
    tools = [Tool.model_validate(t) for t in json.loads(key)]
    calls = _call_alternatives(parser, tools, mode, named)
    many = parallel and named is None
    trigger = parser.trigger
    if trigger is None:  # the calls are the whole answer
        block = parser.block_regex(calls, many)
        if named or required:
            return AnswerSpec({"regex": block})
        text = other if other is not None else not_prefixed(parser.openers)
        return AnswerSpec({"regex": f"(?:{block})|(?:{text})"})
    if parser.one_block:
        block = parser.block_regex(calls, many)
        if named or required:
            return AnswerSpec({"regex": block})
        if other is not None:
            return AnswerSpec({"regex": f"(?:{block})|(?:{other})"})
        after = block[len(re.escape(trigger)) :]
        return AnswerSpec({}, Triggered(parser, after, None, many))
    one = "(?:" + "|".join(calls) + ")"
    if named:
        return AnswerSpec({"regex": one})
    if other is not None and not required:
        return AnswerSpec({"regex": f"(?:{one})|(?:{other})"})
    after = "(?:" + "|".join(c[len(re.escape(trigger)) :] for c in calls) + ")"
    return AnswerSpec({}, Triggered(parser, after, one if required else None, many))


@dataclass(slots=True)
class ReasoningSpec:
    parser: ReasoningParser
    open_at_start: bool
    budget: int | None


class AnswerPlan:
    """The phases of one answer: reasoning (if any), then the answer's constraint."""

    def __init__(self, reasoning: ReasoningSpec | None, answer: AnswerSpec) -> None:
        self.reasoning = reasoning
        self.answer = answer
        self.stage = "reasoning" if reasoning is not None else "answer"
        self.last = ""  # the kind of the last phase: "free", "call", "whole"
        self.calls = 0

    def first(self) -> Phase | None:
        r = self.reasoning
        if r is not None:
            opening = "" if r.open_at_start else r.parser.start + "\n"
            return Phase(forced=opening, stop=(r.parser.end,), max_tokens=r.budget)
        return self._answer_start("")

    def _answer_start(self, forced: str) -> Phase:
        self.stage = "answer"
        t = self.answer.triggered
        if t is None:
            self.last = "whole"
            return Phase(forced=forced, constraint=dict(self.answer.constraint))
        if t.forced_first is not None:
            self.last = "call"
            self.calls += 1
            return Phase(forced=forced, constraint={"regex": t.forced_first})
        self.last = "free"
        return Phase(forced=forced, stop=(t.parser.trigger or "",))

    def next(self, text: str, result: GenerateResult, capped: bool) -> Phase | None:
        if self.stage == "reasoning":
            end = self.reasoning.parser.end  # type: ignore[union-attr]
            if result.matched_stop == end or capped:
                return self._answer_start(end)
            return None
        t = self.answer.triggered
        if t is None or result.finish_reason != "stop":
            return None
        if self.last == "free":
            if result.matched_stop != t.parser.trigger:
                return None
            self.last = "call"
            self.calls += 1
            return Phase(forced=t.parser.trigger or "", constraint={"regex": t.after_trigger})
        if self.last == "call" and t.parallel and not t.parser.one_block:
            self.last = "free"
            return Phase(stop=(t.parser.trigger or "",))
        return None
