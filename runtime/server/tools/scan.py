"""Reading a (partial) tool-call answer: the pieces every call format shares.

JSON values scanned without parsing (so an unfinished one is seen as unfinished), a call
object's name and arguments so far, Python literals (the `pythonic` format). The formats'
`CallStreamer` (in `parser.py`) turns what they read into OpenAI's streamed `tool_calls`.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class CallPiece:
    """One call of a (partial) answer: its name once known, its arguments' JSON text so far."""

    name: str | None
    arguments: str = ""
    done: bool = False


@dataclass(slots=True)
class Scan:
    """A (partial) answer read: its content (text outside calls, minus a held-back tail that
    may still open a call) and its calls so far. `ok` is False when a call is malformed."""

    content: str
    calls: list[CallPiece] = field(default_factory=list)
    ok: bool = True


# ---- JSON scanning --------------------------------------------------------------------------
def ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """The index after the JSON (or Python) string starting at text[i], None if unfinished."""
    quote = text[i]
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == quote:
            return i + 1
        i += 1
    return None


def value_end(text: str, i: int, stops: str = ",}] \t\r\n") -> int | None:
    """The index after the JSON value starting at text[i], None if unfinished."""
    if i >= len(text):
        return None
    if text[i] in "\"'":
        return string_end(text, i)
    if text[i] not in "{[(":
        j = i
        while j < len(text) and text[j] not in stops:
            j += 1
        return j if j < len(text) else None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c in "\"'":
            end = string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def scan_json_call(text: str, i: int, args_keys: tuple[str, ...]) -> tuple[CallPiece, int | None]:
    """The call object whose "{" is at text[i - 1]: its name and arguments so far, and the
    index after its "}" (None while unfinished)."""
    piece = CallPiece(None)
    while True:
        i = ws(text, i)
        if i < len(text) and text[i] == ",":
            i = ws(text, i + 1)
        if i >= len(text):
            return piece, None
        if text[i] == "}":
            piece.done = True
            return piece, i + 1
        end = string_end(text, i) if text[i] == '"' else None
        if end is None:
            return piece, None
        key = json.loads(text[i:end])
        i = ws(text, end)
        if i >= len(text) or text[i] != ":":
            return piece, None
        i = ws(text, i + 1)
        stop = value_end(text, i)
        if key in args_keys:
            piece.arguments = text[i : stop if stop is not None else len(text)]
        elif key == "name" and stop is not None:
            value = json.loads(text[i:stop])
            piece.name = value if isinstance(value, str) else None
        if stop is None:
            return piece, None
        i = stop


def scan_json_calls(
    text: str,
    final: bool,
    openers: tuple[str, ...] = ("{", "["),
    args_keys: tuple[str, ...] = ("arguments", "parameters"),
    separators: str = ",",
    prefix: str = "",
) -> Scan:
    """Calls written as JSON objects making up the whole text: one object, or (when "[" is
    among `openers`) a list of them, any white space and `separators` between them, an
    optional `prefix` before; the arguments under one of `args_keys`. Text that does not
    open with a call is content; nothing after a list's "]" is read."""
    i = ws(text, 0)
    if prefix and text.startswith(prefix, i):
        i = ws(text, i + len(prefix))
    elif prefix and prefix.startswith(text[i:]) and not final and i < len(text):
        return Scan("")
    if i >= len(text):
        return Scan("" if not final else text)
    if text[i] not in openers:
        return Scan(text)
    out = Scan("")
    listed = text[i] == "["
    if listed:
        i += 1
    while True:
        i = ws(text, i)
        while i < len(text) and text[i] in separators:
            i = ws(text, i + 1)
        if i >= len(text):
            return out
        if text[i] != "{":
            if not (listed and text[i] == "]"):
                out.ok = False
            return out
        piece, stop = scan_json_call(text, i + 1, args_keys)
        out.calls.append(piece)
        if stop is None:
            return out
        i = stop


_IDENT = re.compile(r"[A-Za-z_][\w.\-]*")


def scan_python_calls(text: str, final: bool) -> Scan:
    """Calls written as a Python list of calls with keyword arguments making up the whole
    text, `[f(a=1), g(b="x")]` (Python literals; JSON's `true` / `false` / `null` read too):
    each call's arguments as the JSON object of its keywords, growing one finished keyword at
    a time. Text that does not open with "[" is content."""
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
        stop = _scan_kwargs(text, m.end() + 1, piece, out)
        if stop is None:
            return out
        i = stop


def _scan_kwargs(text: str, i: int, piece: CallPiece, out: Scan) -> int | None:
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
        key = json.dumps(m.group(0), ensure_ascii=False)
        parts.append(f"{key}: {json.dumps(value, ensure_ascii=False)}")
        piece.arguments = "{" + ", ".join(parts)
        i = stop


def held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of `text` may be the start of one of `markers`."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), 0, -1):
            if text.endswith(m[:k]):
                best = max(best, k)
                break
    return best


_PY_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False,
             "None": None}  # fmt: skip


def python_literal(text: str) -> Any:
    """A Python literal (JSON's true / false / null read too) as a value."""

    def convert(node: ast.AST) -> Any:
        if isinstance(node, ast.Name) and node.id in _PY_NAMES:
            return _PY_NAMES[node.id]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple):
            return [convert(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {convert(k): convert(v) for k, v in zip(node.keys, node.values, strict=True)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = convert(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        raise ValueError(f"not a literal: {ast.dump(node)}")

    return convert(ast.parse(text.strip(), mode="eval").body)
