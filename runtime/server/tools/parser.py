r"""The interface every tool-call format implements, and the stream deltas of any of them.

A format (`ToolParser`) is one model family's way of writing calls (a `CallFormat` description
in `formats.py`, whose `FormatParser` derives all of this, or a module of its own; each named in
`registry.py`). It says:

- how calls are found in text: `scan(text)` reads a finished or partial answer into its
  content and its calls so far (a call may have no name yet, or arguments that are still
  growing); `parse(text, tools)` keeps only finished calls to declared tools whose arguments
  are JSON objects, and returns the whole text as content when the calls do not parse;
- how a call starts: `trigger` (the text that opens a call, None when the calls are the whole
  answer), `openers` (an answer's first characters that make it a call block), `markers` (the
  texts that are special tokens in some tokenizers), `one_block`;
- how calls are written (`render`) and constrained (`call_regex`, `block_regex`, `tag_parts`,
  `block_parts`): the strict-call planner in `plan.py` builds its constraints from them.

`CallStreamer` turns the growing text of any format into OpenAI stream deltas: content pieces
(holding back a tail that may open a call), then per call its name once and its argument text
as it is decoded.
"""

from __future__ import annotations

import json
from typing import Any

from runtime.server.tools.scan import Scan, new_call_id


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def json_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def const(text: str) -> dict[str, Any]:
    """A structural tag's `const_string` format."""
    return {"type": "const_string", "value": text}


class ToolParser:
    """A call format. Subclasses read it (`scan`) and say how it is constrained."""

    name = ""
    # the text that opens a call (None: calls are the whole answer, recognised by its start)
    trigger: str | None = None
    # the answer's first characters that make it a call block (whole-answer formats)
    openers: tuple[str, ...] = ()
    # after its trigger a block holds all the calls (mistral, deepseekv3): nothing follows it
    one_block = False
    # the format's marker texts: special tokens in some tokenizers, kept in the text it reads
    markers: tuple[str, ...] = ()

    def scan(self, text: str, final: bool = False) -> Scan:
        raise NotImplementedError

    def parse(self, text: str, tools: list[Any]) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, OpenAI tool_calls) of a finished answer. A last call cut short (by
        max_tokens) is dropped; a malformed call, or one to an undeclared tool or whose
        arguments are not a JSON object, leaves the whole text as content."""
        names = {t.function.name for t in tools}
        s = self.scan(text, final=True)
        pieces = s.calls[:-1] if s.calls and not s.calls[-1].done else s.calls
        if not pieces or not s.ok:
            return text, []
        calls = []
        for c in pieces:
            try:
                args = json.loads(c.arguments) if c.arguments.strip() else {}
            except ValueError:
                return text, []
            if not c.done or c.name not in names or not isinstance(args, dict):
                return text, []
            fn = {"name": c.name, "arguments": json.dumps(args, ensure_ascii=False)}
            calls.append({"id": new_call_id(), "type": "function", "function": fn})
        content = s.content.strip()
        return (content or None), calls

    def cut_in_a_call(self, text: str) -> bool:
        """Whether a finished answer ends inside an unfinished call (cut by max_tokens)."""
        calls = self.scan(text, final=True).calls
        return bool(calls) and not calls[-1].done

    def render(self, calls: list[tuple[str, Any]]) -> str:
        """`calls` ((name, arguments) pairs) written in this format."""
        raise NotImplementedError

    # ---- constraints ----
    def call_regex(self, name: str, args: str) -> str:
        """A regex of one call to `name` whose arguments match the regex `args`, with the
        format's own opening and closing text."""
        raise NotImplementedError

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        """A regex of the call block made of calls each matching one of `calls`."""
        one = "(?:" + "|".join(calls) + ")"
        return one

    def call_format(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """`call_regex` as a structural-tag format, the arguments a format too (whole-answer
        formats: their calls as a tag when a regex cannot say the arguments)."""
        raise NotImplementedError

    def block_format(self, one: dict[str, Any], parallel: bool) -> dict[str, Any]:
        """`block_regex` as a structural-tag format, `one` the format of one call."""
        raise NotImplementedError

    def tag_parts(self, name: str) -> tuple[str, str]:
        """A call's text before and after its JSON arguments (structural tags' begin / end)."""
        raise NotImplementedError

    # one-block formats: the block's opening, the separator between calls, its closing
    block_parts: tuple[str, str, str] = ("", "", "")


class CallStreamer:
    """OpenAI stream deltas of a growing answer: content pieces, and per call (in order, with
    its own `index`) a first delta with id, type and name, then pieces of its arguments."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.ids: list[str] = []
        self.sent_args: list[int] = []
        self.sent_content = 0

    def feed(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        s = self.parser.scan(text, final)
        deltas: list[dict[str, Any]] = []
        if len(s.content) > self.sent_content and s.content.strip():
            deltas.append({"content": s.content[self.sent_content :]})
            self.sent_content = len(s.content)
        calls: list[dict[str, Any]] = []
        for k, c in enumerate(s.calls):
            if k >= len(self.ids):
                if c.name is None:
                    break
                self.ids.append(new_call_id())
                self.sent_args.append(0)
                fn = {"name": c.name, "arguments": ""}
                calls.append({"index": k, "id": self.ids[k], "type": "function", "function": fn})
            if len(c.arguments) > self.sent_args[k]:
                piece = c.arguments[self.sent_args[k] :]
                calls.append({"index": k, "function": {"arguments": piece}})
                self.sent_args[k] = len(c.arguments)
        deltas.extend({"tool_calls": [d]} for d in calls)
        return deltas

    @property
    def started_calls(self) -> bool:
        return bool(self.ids)
