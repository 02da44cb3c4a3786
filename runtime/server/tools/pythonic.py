r"""`pythonic` (alias `llama4`): Llama 3.2 / 4 with the pythonic template.

`[f(a=1), g(b="x")]` as the whole answer (Python literals; JSON's `true` / `false` / `null`
read too).
"""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.server.tools.parser import ToolParser, const, dumps, json_string
from runtime.server.tools.scan import CallPiece, Scan, python_literal, value_end, ws

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
            parts.append(f"{json_string(m.group(0))}: {json.dumps(value, ensure_ascii=False)}")
            piece.arguments = "{" + ", ".join(parts)
            i = stop

    def render(self, calls: list[tuple[str, Any]]) -> str:
        def kwargs(a: Any) -> str:
            items = a.items() if isinstance(a, dict) else []
            return ", ".join(f"{k}={dumps(v)}" for k, v in items)

        return "[" + ", ".join(f"{n}({kwargs(a)})" for n, a in calls) + "]"

    def call_regex(self, name: str, args: str) -> str:
        return f"{re.escape(name)}\\({args}\\)"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        many = f"{one}(?:, {one})*" if parallel else one
        return f"\\[{many}\\]"

    def call_format(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"type": "sequence", "elements": [const(name + "("), args, const(")")]}

    def block_format(self, one: dict[str, Any], parallel: bool) -> dict[str, Any]:
        items = [const("["), one]
        if parallel:
            more = {"type": "sequence", "elements": [const(", "), one]}
            items.append({"type": "star", "content": more})
        return {"type": "sequence", "elements": [*items, const("]")]}
