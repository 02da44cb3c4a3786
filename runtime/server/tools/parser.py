r"""Tool-call parsers: a model family's call format read back into OpenAI `tool_calls`.

One parser per format, chosen with `--tool-call-parser NAME` or from the chat template
(`parser_for_template`):

- `hermes` (aliases `qwen25`, `qwen`): `<tool_call>\n{"name": f, "arguments": {...}}\n</tool_call>`,
  one block per call, text around them;
- `llama3` (`llama3_json`, `llama32`): `{"name": f, "parameters": {...}}`, optionally after
  `<|python_tag|>`, calls joined by `; `, as the whole answer;
- `mistral`: `[TOOL_CALLS] [{"name": f, "arguments": {...}}, ...]` after any text;
- `deepseekv3` (`deepseek_v3`): after `<｜tool▁calls▁begin｜>`, per call
  `<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```<｜tool▁call▁end｜>`,
  then `<｜tool▁calls▁end｜>`;
- `pythonic` (`llama4`): `[f(a=1), g(b="x")]` as the whole answer (Python literals; JSON's
  `true` / `false` / `null` read too);
- `json`: ours, `{"name": f, "arguments": {...}}` or a list of them, as the whole answer.

`scan(text)` reads a finished or partial answer into its content and its calls so far (a call
may have no name yet, or arguments that are still growing); `parse(text, tools)` keeps only
finished calls to declared tools whose arguments are JSON objects, and returns the whole text
as content when the calls do not parse. `CallStreamer` turns the growing text into OpenAI
stream deltas: content pieces (holding back a tail that may open a call), then per call its
name once and its argument text as it is decoded.

Each format also says how a call is constrained (`trigger`, `call_regex`, `block_regex`): the
strict-call planner in `tool_plan.py` builds its constraints from them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.server.tools.scan import (
    CallPiece,
    Scan,
    held_back,
    new_call_id,
    python_literal,
    scan_json_call,
    value_end,
    ws,
)

PYTHON_TAG = "<|python_tag|>"
DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"


class ToolParserError(ValueError):
    """An unknown parser name."""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _json_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


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

    def tag_parts(self, name: str) -> tuple[str, str]:
        """A call's text before and after its JSON arguments (structural tags' begin / end)."""
        raise NotImplementedError

    # one-block formats: the block's opening, the separator between calls, its closing
    block_parts: tuple[str, str, str] = ("", "", "")


class HermesParser(ToolParser):
    name = "hermes"
    trigger = "<tool_call>"
    end = "</tool_call>"
    markers = (trigger, end)

    def scan(self, text: str, final: bool = False) -> Scan:
        out = Scan("")
        i = 0
        while True:
            at = text.find(self.trigger, i)
            if at == -1:
                rest = text[i:]
                keep = 0 if final else held_back(rest, (self.trigger,))
                out.content += rest[: len(rest) - keep]
                return out
            out.content += text[i:at]
            j = ws(text, at + len(self.trigger))
            if j >= len(text):
                out.calls.append(CallPiece(None))
                return out
            if text[j] != "{":
                out.ok = False
                out.calls.append(CallPiece(None))
                return out
            piece, k = scan_json_call(text, j + 1, ("arguments", "parameters"))
            out.calls.append(piece)
            if k is None:
                piece.done = False
                return out
            k = ws(text, k)
            if text.startswith(self.end, k):
                i = k + len(self.end)
            elif self.end.startswith(text[k:]):  # the closing tag still coming (or cut off)
                piece.done = final
                return out
            else:
                i = k
            piece.done = True

    def render(self, calls: list[tuple[str, Any]]) -> str:
        return "\n".join(
            f"{self.trigger}\n{_dumps({'name': n, 'arguments': a})}\n{self.end}" for n, a in calls
        )

    def call_regex(self, name: str, args: str) -> str:
        head = re.escape('{"name": ' + _json_string(name) + ', "arguments": ')
        return f"{re.escape(self.trigger)}\\n{head}{args}\\}}\\n{re.escape(self.end)}"

    def tag_parts(self, name: str) -> tuple[str, str]:
        begin = f'{self.trigger}\n{{"name": {_json_string(name)}, "arguments": '
        return begin, f"}}\n{self.end}"


class JsonCallsParser(ToolParser):
    """Calls as JSON objects making up the whole answer (our format; Llama 3's)."""

    name = "json"
    openers = ("{", "[")
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    separators = ","
    prefix = ""

    def scan(self, text: str, final: bool = False) -> Scan:
        i = ws(text, 0)
        if self.prefix and text.startswith(self.prefix, i):
            i = ws(text, i + len(self.prefix))
        elif self.prefix and self.prefix.startswith(text[i:]) and not final and i < len(text):
            return Scan("")
        if i >= len(text):
            return Scan("" if not final else text)
        if text[i] not in self.openers:
            return Scan(text)
        out = Scan("")
        listed = text[i] == "["
        if listed:
            i += 1
        while True:
            i = ws(text, i)
            while i < len(text) and text[i] in self.separators:
                i = ws(text, i + 1)
            if i >= len(text):
                return out
            if text[i] != "{":
                if not (listed and text[i] == "]"):
                    out.ok = False
                return out
            piece, i = scan_json_call(text, i + 1, self.args_keys)
            out.calls.append(piece)
            if i is None:
                return out

    def render(self, calls: list[tuple[str, Any]]) -> str:
        objs = [{"name": n, "arguments": a} for n, a in calls]
        return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)

    def call_regex(self, name: str, args: str) -> str:
        head = re.escape('{"name": ' + _json_string(name) + ', "arguments": ')
        return f"{head}{args}\\}}"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        return f"{one}|\\[{one}(?:, {one})*\\]" if parallel else one


class Llama3Parser(JsonCallsParser):
    name = "llama3"
    openers = ("{", PYTHON_TAG)
    separators = ";"
    prefix = PYTHON_TAG
    markers = (PYTHON_TAG,)

    def render(self, calls: list[tuple[str, Any]]) -> str:
        return "; ".join(_dumps({"name": n, "parameters": a}) for n, a in calls)

    def call_regex(self, name: str, args: str) -> str:
        head = re.escape('{"name": ' + _json_string(name) + ', "parameters": ')
        return f"{head}{args}\\}}"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        block = f"{one}(?:; {one})*" if parallel else one
        return f"(?:{re.escape(PYTHON_TAG)})?{block}"  # the tag its templates may open with


class MistralParser(ToolParser):
    name = "mistral"
    trigger = "[TOOL_CALLS]"
    one_block = True
    markers = (trigger,)

    # `[TOOL_CALLS]` is a control token of Mistral's tokenizers: text decoded without special
    # tokens has only the list, so an answer that is a list of calls is read as calls too
    bare = '[{"name"'

    def scan(self, text: str, final: bool = False) -> Scan:
        at = text.find(self.trigger)
        if at == -1:
            lead = text.lstrip()
            if lead.startswith(self.bare):
                return JsonCallsParser().scan(lead, final)
            if not final and self.bare.startswith(lead):
                return Scan("")  # may still become a list of calls
            keep = 0 if final else held_back(text, (self.trigger,))
            return Scan(text[: len(text) - keep])
        inner = JsonCallsParser().scan(text[at + len(self.trigger) :], final)
        inner.content = text[:at]
        return inner

    block_parts = ("[TOOL_CALLS] [", ", ", "]")

    def render(self, calls: list[tuple[str, Any]]) -> str:
        return f"{self.trigger} " + _dumps([{"name": n, "arguments": a} for n, a in calls])

    def tag_parts(self, name: str) -> tuple[str, str]:
        return f'{{"name": {_json_string(name)}, "arguments": ', "}"

    def call_regex(self, name: str, args: str) -> str:
        head = re.escape('{"name": ' + _json_string(name) + ', "arguments": ')
        return f"{head}{args}\\}}"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        many = f"{one}(?:, {one})*" if parallel else one
        return f"{re.escape(self.trigger)} ?\\[{many}\\]"


class DeepSeekV3Parser(ToolParser):
    name = "deepseekv3"
    trigger = DS_CALLS_BEGIN
    one_block = True
    markers = (DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP)

    def scan(self, text: str, final: bool = False) -> Scan:
        at = text.find(self.trigger)
        if at == -1:
            keep = 0 if final else held_back(text, (self.trigger,))
            return Scan(text[: len(text) - keep])
        out = Scan(text[:at])
        i = at + len(self.trigger)
        while True:
            i = ws(text, i)
            if text.startswith(DS_CALLS_END, i):
                rest = text[i + len(DS_CALLS_END) :]
                out.content += rest
                return out
            if not text.startswith(DS_CALL_BEGIN, i):
                if not (DS_CALL_BEGIN.startswith(text[i:]) or DS_CALLS_END.startswith(text[i:])):
                    out.ok = False
                return out
            i += len(DS_CALL_BEGIN)
            piece = CallPiece(None)
            out.calls.append(piece)
            sep = text.find(DS_SEP, i)
            if sep == -1:
                return out
            nl = text.find("\n", sep)
            if nl == -1:
                return out
            piece.name = text[sep + len(DS_SEP) : nl].strip()
            fence = "```json\n"
            j = nl + 1
            if not text.startswith(fence, j):
                if not fence.startswith(text[j:]):
                    out.ok = False
                return out
            j += len(fence)
            stop = value_end(text, ws(text, j))
            piece.arguments = text[j : stop if stop is not None else len(text)].strip()
            if stop is None:
                return out
            close = text.find(DS_CALL_END, stop)
            if close == -1:
                return out
            piece.done = True
            i = close + len(DS_CALL_END)

    block_parts = (DS_CALLS_BEGIN, "\n", DS_CALLS_END)

    def tag_parts(self, name: str) -> tuple[str, str]:
        return f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n", f"\n```{DS_CALL_END}"

    def render(self, calls: list[tuple[str, Any]]) -> str:
        body = "\n".join(
            f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{_dumps(a)}\n```{DS_CALL_END}"
            for n, a in calls
        )
        return f"{self.trigger}{body}{DS_CALLS_END}"

    def call_regex(self, name: str, args: str) -> str:
        head = f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n"
        return f"{re.escape(head)}{args}\\n```{re.escape(DS_CALL_END)}"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        many = f"{one}(?:\\n{one})*" if parallel else one
        return f"{re.escape(self.trigger)}{many}{re.escape(DS_CALLS_END)}"


_IDENT = re.compile(r"[A-Za-z_][\w.\-]*")


class PythonicParser(ToolParser):
    name = "pythonic"
    openers = ("[",)

    def scan(self, text: str, final: bool = False) -> Scan:
        i = ws(text, 0)
        if i >= len(text):
            return Scan("" if not final else text)
        if text[i] != "[":
            return Scan(text)
        out = Scan("")
        i += 1
        while True:
            i = ws(text, i)
            while i < len(text) and text[i] == ",":
                i = ws(text, i + 1)
            if i >= len(text) or text[i] == "]":
                return out
            m = _IDENT.match(text, i)
            if m is None:
                out.ok = False
                return out
            if m.end() >= len(text):
                return out  # the name may still grow
            if text[m.end()] != "(":
                out.ok = False
                return out
            piece = CallPiece(m.group(0))
            out.calls.append(piece)
            i = self._scan_kwargs(text, m.end() + 1, piece, out)
            if i is None:
                return out

    def _scan_kwargs(self, text: str, i: int, piece: CallPiece, out: Scan) -> int | None:
        parts: list[str] = []
        piece.arguments = "{"
        while True:
            i = ws(text, i)
            if i < len(text) and text[i] == ",":
                i = ws(text, i + 1)
            if i >= len(text):
                return None
            if text[i] == ")":
                piece.arguments = "{" + ", ".join(parts) + "}"
                piece.done = True
                return i + 1
            m = _IDENT.match(text, i)
            eq = ws(text, m.end()) if m else len(text)
            if m is None or eq >= len(text) or text[eq] != "=":
                if m is None or eq < len(text):
                    out.ok = False
                return None
            start = ws(text, eq + 1)
            stop = value_end(text, start, ",) \t\r\n")
            if stop is None:
                return None
            try:
                value = python_literal(text[start:stop])
            except (ValueError, SyntaxError):
                out.ok = False
                return None
            parts.append(f"{_json_string(m.group(0))}: {json.dumps(value, ensure_ascii=False)}")
            piece.arguments = "{" + ", ".join(parts)
            i = stop

    def render(self, calls: list[tuple[str, Any]]) -> str:
        def kwargs(a: Any) -> str:
            items = a.items() if isinstance(a, dict) else []
            return ", ".join(f"{k}={_dumps(v)}" for k, v in items)

        return "[" + ", ".join(f"{n}({kwargs(a)})" for n, a in calls) + "]"

    def call_regex(self, name: str, args: str) -> str:
        return f"{re.escape(name)}\\({args}\\)"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        many = f"{one}(?:, {one})*" if parallel else one
        return f"\\[{many}\\]"


PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "llama3": Llama3Parser,
    "mistral": MistralParser,
    "deepseekv3": DeepSeekV3Parser,
    "pythonic": PythonicParser,
    "json": JsonCallsParser,
}
ALIASES = {
    "qwen25": "hermes",
    "qwen": "hermes",
    "qwen3": "hermes",
    "llama3_json": "llama3",
    "llama32": "llama3",
    "llama4": "pythonic",
    "deepseek_v3": "deepseekv3",
}


def get_parser(name: str) -> ToolParser:
    key = ALIASES.get(name, name)
    if key not in PARSERS:
        known = sorted([*PARSERS, *ALIASES])
        raise ToolParserError(f"unknown tool-call parser {name!r}; known: {', '.join(known)}")
    return PARSERS[key]()


def parser_for_template(template: str | None) -> str:
    """The parser a chat template's tool format asks for (its call markers, looked up in
    this order); `json` (our system text) when the template shows no known format."""
    if not template:
        return "json"
    if "<tool_call>" in template:
        return "hermes"
    if "tool▁calls▁begin" in template:
        return "deepseekv3"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if PYTHON_TAG in template or ('"parameters"' in template and "ipython" in template):
        return "llama3"
    if "func_name1(" in template or "[func_name(" in template:
        return "pythonic"
    return "json"
