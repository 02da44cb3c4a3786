r"""`deepseekv3` (alias `deepseek_v3`): DeepSeek V3 / R1.

After `<｜tool▁calls▁begin｜>`, per call
`<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```<｜tool▁call▁end｜>`, then
`<｜tool▁calls▁end｜>`; the block holds every call.
"""

from __future__ import annotations

import re
from typing import Any

from runtime.server.tools.parser import ToolParser, dumps
from runtime.server.tools.scan import CallPiece, Scan, held_back, value_end, ws

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"


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
            f"{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{dumps(a)}\n```{DS_CALL_END}"
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
