r"""`hermes` (aliases `qwen25`, `qwen`, `qwen3`): Qwen 2.5 / 3, Hermes, QwQ.

`<tool_call>\n{"name": f, "arguments": {...}}\n</tool_call>`, one block per call, text around
them.
"""

from __future__ import annotations

import re
from typing import Any

from runtime.server.tools.parser import ToolParser, dumps, json_string
from runtime.server.tools.scan import CallPiece, Scan, held_back, scan_json_call, ws


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
            f"{self.trigger}\n{dumps({'name': n, 'arguments': a})}\n{self.end}" for n, a in calls
        )

    def call_regex(self, name: str, args: str) -> str:
        head = re.escape('{"name": ' + json_string(name) + ', "arguments": ')
        return f"{re.escape(self.trigger)}\\n{head}{args}\\}}\\n{re.escape(self.end)}"

    def tag_parts(self, name: str) -> tuple[str, str]:
        begin = f'{self.trigger}\n{{"name": {json_string(name)}, "arguments": '
        return begin, f"}}\n{self.end}"
