r"""A tool-call format described once, and the streaming parser that comes from the description.

A `CallFormat` says how one model family writes calls:

    block_begin  call  separator  call  ...  block_end        (a block holding every call)
    call  separator  call  ...                                (each call opening itself)
    call = call_begin (with the name, and a call counter where the family numbers calls)
           + arguments (a JSON object, or XML elements in one of the grammar's styles)
           + call_end

`FormatParser` reads that text back (`scan`: a finished or partial answer into content and
calls; `render`: calls into text) and `call_tags.format_structural_tag` builds the strict
structural tag from the same fields, so what the grammar lets a model write is what the parser
reads. XML arguments are converted to JSON values by the tool's parameter schema once the
tools are bound (`bind`): a string property keeps its raw text, any other value is read as
JSON (raw text when it is not JSON). Without the schema a value is JSON when it parses as a
number, boolean, null, array or object.

Invariant: every string of the description that is not `{name}` / `{index}` is written
literally, in the tag and in `render`, and looked for literally by `scan`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from runtime.server.tools.parser import ToolParser, const, dumps, json_string
from runtime.server.tools.scan import (
    CallPiece,
    Scan,
    held_back,
    scan_json_call,
    scan_json_calls,
    scan_python_calls,
    value_end,
    ws,
)

_NAME = re.compile(r"[^\s<>\"']+")
_INDEX = re.compile(r"[0-9]+")
INDEX_PATTERN = "[0-9]+"


@dataclass(frozen=True, slots=True)
class CallFormat:
    """One family's way of writing calls (see the module's docstring)."""

    name: str
    call_begin: str  # "{name}" where the function's name goes, "{index}" a call counter
    call_end: str
    # "json"; "json_call": the call is a JSON object with the name and the arguments (call_begin
    # opens it: `{"name": "{name}", "arguments": `, call_end closes it with "}"); "pythonic":
    # Python keyword arguments `a=1, b="x"` (values Python literals, written as JSON); or an
    # XML style of `grammar.structural.xml_args.STYLES`
    args: str = "json"
    block_begin: str = ""  # the opening of the block holding every call ("": none)
    block_end: str = ""
    separator: str = ""  # between two calls
    trigger_text: str = ""  # the text that opens calls, when shorter than the fixed opening
    reasoning: tuple[str, str] = ("<think>", "</think>")  # the thinking's opening and closing
    markup: tuple[str, ...] = ()  # channel markup around content (Harmony), not content
    markers: tuple[str, ...] = ()  # the texts that are special tokens in the family's vocab
    # the block is a JSON list of `json_call` objects after the trigger (Mistral), read as JSON
    # (`scan.scan_json_calls`): any white space and commas between calls, a lone call object
    # without the list, nothing read after the list's "]"
    json_list: bool = False
    # an answer that starts with this text is a block whose trigger was decoded away (a
    # control token, Mistral's `[TOOL_CALLS]`); "": none
    bare_block: str = ""
    # the calls are the whole answer (Llama 3, pythonic): no trigger; an answer whose first
    # characters open the block, a call or `lead` is calls, any other is content; `json_call`
    # calls (read as JSON objects) or `pythonic` ones (a Python list of calls with keyword
    # arguments, `scan.scan_python_calls`)
    whole_answer: bool = False
    lead: str = ""  # optional text before the calls (Llama 3's `<|python_tag|>`)

    @property
    def head(self) -> str:
        """A call's fixed opening (before the name)."""
        return self.call_begin.split("{name}", 1)[0]

    @property
    def after_name(self) -> tuple[str, str | None]:
        """The text after the name up to the counter (or the arguments), and after the counter
        (None: the family does not number calls)."""
        post = self.call_begin.split("{name}", 1)[1]
        if "{index}" not in post:
            return post, None
        a, _, b = post.partition("{index}")
        return a, b

    @property
    def trigger(self) -> str:
        return self.trigger_text or self.block_begin or self.head

    @property
    def object_parts(self) -> tuple[str, str]:
        """A `json_call` format's text before its call object and after its "}"."""
        head, end = self.head, self.call_end
        return head[: head.index("{")].rstrip(), end[end.index("}") + 1 :]

    def call_opening(self, name: str, index: int | None = None) -> str:
        """The opening of a call to `name` (the counter written when given)."""
        a, b = self.after_name
        if self.args == "json_call":  # the name is a JSON string's body there
            name = json_string(name)[1:-1]
        text = self.head + name + a
        if b is not None and index is not None:
            text += str(index) + b
        return text

    def render_call(self, name: str, arguments: Any, index: int) -> str:
        return self.call_opening(name, index) + self.render_args(arguments) + self.call_end

    def render_args(self, arguments: Any) -> str:
        if self.args in ("json", "json_call"):
            return dumps(arguments)
        if self.args == "pythonic":
            items = arguments.items() if isinstance(arguments, dict) else []
            return ", ".join(f"{k}={dumps(v)}" for k, v in items)
        style = xml_style(self.args)
        gap = "\n" if style.value_prefix else ""  # GLM's line break between key and value
        parts = []
        for key, value in (arguments or {}).items():
            text = value if isinstance(value, str) else dumps(value)
            element = style.key_prefix + key + style.key_suffix + gap + style.value_prefix
            parts.append(element + text + style.closing + "\n")
        lead = "" if self.call_begin.endswith("\n") else "\n"
        return lead + "".join(parts)

    def render(self, calls: list[tuple[str, Any]]) -> str:
        body = self.separator.join(self.render_call(n, a, i) for i, (n, a) in enumerate(calls))
        return self.block_begin + body + self.block_end


def xml_style(name: str) -> Any:
    from grammar.structural.xml_args import STYLES

    return STYLES[name]


class FormatParser(ToolParser):
    """The streaming parser of a `CallFormat`."""

    fmt: CallFormat

    def __init__(self, fmt: CallFormat | None = None) -> None:
        if fmt is not None:
            self.fmt = fmt
        self.name = self.fmt.name
        self.trigger = None if self.fmt.whole_answer else self.fmt.trigger
        self.one_block = bool(self.fmt.block_begin) and not self.fmt.whole_answer
        if self.fmt.whole_answer:  # (the block's or the call object's first character, or lead)
            first = self.fmt.block_begin[:1] or self.fmt.call_begin[:1]
            self.openers = tuple(t for t in (first, self.fmt.lead) if t)
        self.markers = self.fmt.markers
        self._schemas: dict[str, dict[str, Any]] = {}
        self._final = False  # the answer being scanned is finished
        # tails held back from content while they may still open a call or be markup
        separator = "" if self.fmt.json_list else self.fmt.separator  # (inside the list only)
        held = (self.trigger or "", separator, *self.fmt.markup)
        if self.fmt.markup:
            held += (self.fmt.reasoning[0],)
        self._held = tuple(t for t in held if t)

    def bind(self, tools: list[Any] | None) -> None:
        """The declared tools' parameter schemas, for typing XML argument values."""
        from grammar.structural.xml_args import root_object

        for t in tools or []:
            props = root_object(t.function.parameters or {}).get("properties")
            self._schemas[t.function.name] = props if isinstance(props, dict) else {}

    def parse(self, text: str, tools: list[Any]) -> tuple[str | None, list[dict[str, Any]]]:
        self.bind(tools)
        content, calls = super().parse(text, tools)
        if not calls and self.fmt.markup:  # a channelled answer without calls: its final text
            content = self._clean(text).strip() or None
        return content, calls

    def render(self, calls: list[tuple[str, Any]]) -> str:
        return self.fmt.render(calls)

    # ---- reading ----
    def scan(self, text: str, final: bool = False) -> Scan:
        fmt, out, i = self.fmt, Scan(""), 0
        self._final = final
        if fmt.json_list:
            return self._json_list(text, final)
        if fmt.whole_answer and fmt.args == "pythonic":
            return scan_python_calls(text, final)
        if fmt.whole_answer:
            separators = fmt.separator.strip()
            return scan_json_calls(
                text, final, self.openers, prefix=fmt.lead, separators=separators
            )
        while True:
            at = text.find(fmt.trigger, i)
            if at == -1:
                rest = text[i:]
                keep = 0 if final else held_back(rest, self._held)
                out.content += rest[: len(rest) - keep]
                break
            out.content += text[i:at]
            if fmt.block_begin:
                j = self._block(text, at + len(fmt.block_begin), out)
                if j is not None:
                    out.content += text[j:]  # (a one-block format: nothing should follow)
                break
            j = self._call(text, at, out)
            if j is None:
                break
            i = ws(text, j)  # a separator (or the white space templates put) before the next
            if fmt.separator and text.startswith(fmt.separator, i):
                i += len(fmt.separator)
        out.content = self._clean(out.content)
        return out

    def _json_list(self, text: str, final: bool) -> Scan:
        """A `json_list` format: content up to the trigger, then the calls as JSON (an answer
        opening with `bare_block` is that list without its trigger)."""
        at = text.find(self.fmt.trigger)
        if at == -1:
            lead, bare = text.lstrip(), self.fmt.bare_block
            if bare and lead.startswith(bare):
                return scan_json_calls(lead, final)
            if bare and not final and bare.startswith(lead):
                return Scan("")  # may still become a list of calls
            keep = 0 if final else held_back(text, self._held)
            return Scan(text[: len(text) - keep])
        inner = scan_json_calls(text[at + len(self.fmt.trigger) :], final)
        inner.content = text[:at]
        return inner

    def _clean(self, content: str) -> str:
        """Content without the channel markup; in a channelled format (Harmony) the thinking
        channel is not content either (the whole of it, closed or still open)."""
        if not self.fmt.markup:
            return content
        start, end = self.fmt.reasoning
        kept, i = [], 0
        while (at := content.find(start, i)) != -1:
            kept.append(content[i:at])
            close = content.find(end, at + len(start))
            i = len(content) if close == -1 else close + len(end)
        kept.append(content[i:])
        text = "".join(kept)
        for m in self.fmt.markup:
            text = text.replace(m, "")
        return text

    def _block(self, text: str, j: int, out: Scan) -> int | None:
        """Calls from text[j] to the block's end; the index after it, None while unfinished."""
        fmt = self.fmt
        while True:
            j = ws(text, j)
            if fmt.separator and out.calls and text.startswith(fmt.separator, j):
                j = ws(text, j + len(fmt.separator))
            if text.startswith(fmt.block_end, j):
                return j + len(fmt.block_end)
            rest = text[j:]
            head = fmt.object_parts[0] if fmt.args == "json_call" else fmt.head
            if not text.startswith(head, j):
                pending = (head, fmt.block_end, fmt.separator)
                if not any(p.startswith(rest) for p in pending if p):
                    out.ok = False
                return None
            j = self._call(text, j, out)
            if j is None:
                return None

    def _call(self, text: str, at: int, out: Scan) -> int | None:
        """The call opening at text[at]: appended to `out.calls`; the index after its end,
        None while it is unfinished (or malformed: `out.ok` False)."""
        fmt = self.fmt
        if fmt.args == "json_call":
            return self._object_call(text, at, out)
        piece = CallPiece(None)
        out.calls.append(piece)
        j = self._head(text, at, piece, out)
        if j is None:
            return None
        if fmt.args == "json":
            stop = self._json_args(text, j, piece)
        else:
            stop = self._xml_args(text, j, piece, out)
        return None if stop is None else self._closing(text, stop, fmt.call_end, piece, out)

    def _head(self, text: str, at: int, piece: CallPiece, out: Scan) -> int | None:
        """A call's opening with its name (and counter): the index of its arguments."""
        head = self.fmt.head
        if not text.startswith(head, at):
            if not head.startswith(text[at:]):
                out.ok = False
            return None
        j = at + len(head)
        post, counted = self.fmt.after_name
        k = text.find(post, j) if post else -1
        if k == -1:
            if _NAME.match(text, j) is None and j < len(text):
                out.ok = False
            return None
        name = text[j:k]
        if not _NAME.fullmatch(name):
            out.ok = False
            return None
        j = k + len(post)
        if counted is not None:
            m = _INDEX.match(text, j)
            if m is None or m.end() >= len(text):
                if j < len(text) and m is None:
                    out.ok = False
                return None
            j = m.end()
            if not text.startswith(counted, j):
                if not counted.startswith(text[j:]):
                    out.ok = False
                return None
            j += len(counted)
        piece.name = name
        return j

    def _object_call(self, text: str, at: int, out: Scan) -> int | None:
        """A `json_call` call: the opening before the call object, the object read in any
        spacing and key order (its arguments under "arguments" or "parameters"), the closing
        after its "}"."""
        opening, closing = self.fmt.object_parts
        if not text.startswith(opening, at):
            out.calls.append(CallPiece(None))
            if not opening.startswith(text[at:]):
                out.ok = False
            return None
        j = ws(text, at + len(opening))
        if j >= len(text) or text[j] != "{":
            out.calls.append(CallPiece(None))
            out.ok = out.ok and j >= len(text)
            return None
        piece, stop = scan_json_call(text, j + 1, ("arguments", "parameters"))
        out.calls.append(piece)
        if stop is None:
            return None
        piece.done = False  # (until its closing is read)
        return self._closing(text, stop, closing, piece, out)

    def _closing(self, text: str, stop: int, end: str, piece: CallPiece, out: Scan) -> int | None:
        """The call's closing at text[stop], its leading white space as the model spaced it;
        a finished answer whose last call lacks (the rest of) it still has that call."""
        tail = end if text.startswith(end, stop) else end.lstrip()
        at = stop if tail is end else ws(text, stop)
        if text.startswith(tail, at):
            piece.done = True
            return at + len(tail)
        if tail.startswith(text[at:]) or end.startswith(text[stop:]):
            piece.done = self._final
        else:
            out.ok = False
        return None

    def _json_args(self, text: str, j: int, piece: CallPiece) -> int | None:
        start = ws(text, j)
        stop = value_end(text, start)
        piece.arguments = text[start : stop if stop is not None else len(text)]
        return stop

    def _xml_args(self, text: str, j: int, piece: CallPiece, out: Scan) -> int | None:
        """XML elements up to the call's end: the arguments' JSON text grows one finished
        element at a time (a prefix of the final text at every step)."""
        style = xml_style(self.fmt.args)
        types = self._schemas.get(piece.name or "", {})
        parts: list[str] = []
        piece.arguments = "{"
        while True:
            j = ws(text, j)
            if text.startswith(self.fmt.call_end, j):
                piece.arguments = "{" + ", ".join(parts) + "}"
                return j
            if not text.startswith(style.key_prefix, j):
                rest = text[j:]
                if not (style.key_prefix.startswith(rest) or self.fmt.call_end.startswith(rest)):
                    out.ok = False
                return None
            k = text.find(style.key_suffix, j + len(style.key_prefix))
            if k == -1:
                return None
            key = text[j + len(style.key_prefix) : k]
            v = k + len(style.key_suffix)
            if style.value_prefix:
                v = ws(text, v)
                if not text.startswith(style.value_prefix, v):
                    if not style.value_prefix.startswith(text[v:]):
                        out.ok = False
                    return None
                v += len(style.value_prefix)
            close = text.find(style.closing, v)
            if close == -1:
                return None
            value = xml_value(text[v:close], types.get(key))
            parts.append(f"{json_string(key)}: {dumps(value)}")
            piece.arguments = "{" + ", ".join(parts)
            j = close + len(style.closing)

    # ---- the constraint pieces `plan.py` reads for JSON arguments ----
    def tag_parts(self, name: str) -> tuple[str, str]:
        return self.fmt.call_opening(name, 0), self.fmt.call_end

    def call_regex(self, name: str, args: str) -> str:
        counted = self.fmt.after_name[1]
        opening = re.escape(self.fmt.call_opening(name))
        if counted is not None:
            opening += INDEX_PATTERN + re.escape(counted)
        return opening + args + re.escape(self.fmt.call_end)

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        many = f"{one}(?:{re.escape(self.fmt.separator)}{one})*" if parallel else one
        lead = f"(?:{re.escape(self.fmt.lead)})?" if self.fmt.lead else ""
        return lead + re.escape(self.fmt.block_begin) + many + re.escape(self.fmt.block_end)

    def call_format(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        opening, end = const(self.fmt.call_opening(name)), const(self.fmt.call_end)
        return {"type": "sequence", "elements": [opening, args, end]}

    def block_format(self, one: dict[str, Any], parallel: bool) -> dict[str, Any]:
        fmt = self.fmt
        items = [{"type": "optional", "content": const(fmt.lead)}] if fmt.lead else []
        items += [const(fmt.block_begin), one]
        if parallel:
            more = {"type": "sequence", "elements": [const(fmt.separator), one]}
            items.append({"type": "star", "content": more})
        items.append(const(fmt.block_end))
        return {"type": "sequence", "elements": [i for i in items if i.get("value") != ""]}

    @property
    def block_parts(self) -> tuple[str, str, str]:  # type: ignore[override]
        return self.fmt.block_begin, self.fmt.separator, self.fmt.block_end


def xml_value(raw: str, schema: Any) -> Any:
    """An XML argument's value: the templates' newline on each side dropped; raw text for a
    string property, else JSON where it parses."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string" or (isinstance(schema, dict) and _all_strings(schema)):
        return raw
    try:
        value = json.loads(raw.strip())
    except ValueError:
        return raw
    if isinstance(value, str) and kind is None:
        return raw  # a quoted text where any value goes: kept as written
    return value


def _all_strings(schema: dict[str, Any]) -> bool:
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    return isinstance(values, list) and bool(values) and all(isinstance(v, str) for v in values)
