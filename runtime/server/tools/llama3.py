r"""`llama3` (aliases `llama3_json`, `llama32`): Llama 3.1 / 3.2 / 3.3 with JSON tools.

`{"name": f, "parameters": {...}}`, optionally after `<|python_tag|>`, calls joined by `; `,
as the whole answer.
"""

from __future__ import annotations

import re
from typing import Any

from runtime.server.tools.json_calls import JsonCallsParser
from runtime.server.tools.parser import const, dumps, json_string

PYTHON_TAG = "<|python_tag|>"


class Llama3Parser(JsonCallsParser):
    name = "llama3"
    openers = ("{", PYTHON_TAG)
    separators = ";"
    prefix = PYTHON_TAG
    markers = (PYTHON_TAG,)

    def render(self, calls: list[tuple[str, Any]]) -> str:
        return "; ".join(dumps({"name": n, "parameters": a}) for n, a in calls)

    def call_regex(self, name: str, args: str) -> str:
        head = re.escape('{"name": ' + json_string(name) + ', "parameters": ')
        return f"{head}{args}\\}}"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        block = f"{one}(?:; {one})*" if parallel else one
        return f"(?:{re.escape(PYTHON_TAG)})?{block}"  # the tag its templates may open with

    def call_format(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        head = const('{"name": ' + json_string(name) + ', "parameters": ')
        return {"type": "sequence", "elements": [head, args, const("}")]}

    def block_format(self, one: dict[str, Any], parallel: bool) -> dict[str, Any]:
        items = [{"type": "optional", "content": const(PYTHON_TAG)}, one]
        if parallel:
            more = {"type": "sequence", "elements": [const("; "), one]}
            items.append({"type": "star", "content": more})
        return {"type": "sequence", "elements": items}
