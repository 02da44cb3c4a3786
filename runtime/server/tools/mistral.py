r"""`mistral`: Mistral 7B v0.3, Nemo, Small.

`[TOOL_CALLS] [{"name": f, "arguments": {...}}, ...]` after any text; the block holds every
call and ends the answer.
"""

from __future__ import annotations

import re
from typing import Any

from runtime.server.tools.json_calls import JsonCallsParser
from runtime.server.tools.parser import ToolParser, dumps, json_string
from runtime.server.tools.scan import Scan, held_back


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
        return f"{self.trigger} " + dumps([{"name": n, "arguments": a} for n, a in calls])

    def tag_parts(self, name: str) -> tuple[str, str]:
        return f'{{"name": {json_string(name)}, "arguments": ', "}"

    def call_regex(self, name: str, args: str) -> str:
        head = re.escape('{"name": ' + json_string(name) + ', "arguments": ')
        return f"{head}{args}\\}}"

    def block_regex(self, calls: list[str], parallel: bool) -> str:
        one = "(?:" + "|".join(calls) + ")"
        many = f"{one}(?:, {one})*" if parallel else one
        return f"{re.escape(self.trigger)} ?\\[{many}\\]"
