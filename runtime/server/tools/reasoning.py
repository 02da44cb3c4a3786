"""Reasoning parsers: a thinking model's `<think>...</think>` kept apart from its answer.

`--reasoning-parser NAME` (SGLang's names, vLLM's accepted too):

- `deepseek-r1` (`deepseek_r1`): the answer starts inside the reasoning (DeepSeek-R1's
  templates open `<think>` in the prompt; an opening tag the model writes itself is dropped);
  everything up to `</think>` is reasoning, and an answer that never closes it is all
  reasoning. A prompt that already closed it (`enable_thinking: false` templates) has none.
- `qwen3`: reasoning only when the answer opens `<think>` or the prompt ends with it (Qwen3's
  templates); `chat_template_kwargs={"enable_thinking": false}` turns it off.
- `gpt-oss` (`openai_gptoss`): Harmony's `<|channel|>analysis<|message|>` ... `<|end|>` (the
  markers of the `gpt-oss` call format's description); the answer after it is read by the
  `gpt-oss` tool-call parser, which drops the channel markup.

`split(text)` separates a finished answer; `ReasoningStream` does it for a growing one (the
reasoning's deltas, holding back a tail that may be the start of `</think>`, then the
answer's text, which the tool-call streamer reads on).
"""

from __future__ import annotations

from dataclasses import dataclass

START = "<think>"
END = "</think>"


class ReasoningParserError(ValueError):
    """An unknown reasoning parser name."""


@dataclass(slots=True)
class ReasoningParser:
    name: str
    # the answer starts inside the reasoning unless the prompt closed it
    forced: bool
    start: str = START
    end: str = END

    def opens_in_prompt(self, prompt: str, thinking: bool) -> bool:
        """Whether the answer begins inside the reasoning, given the rendered prompt."""
        if not thinking:
            return False
        tail = prompt.rstrip()
        if tail.endswith(self.end):
            return False
        return self.forced or tail.endswith(self.start)

    def split(self, text: str, open_at_start: bool) -> tuple[str | None, str]:
        """(reasoning or None, the answer's text) of a finished answer."""
        reasoning, answer, _ = self.scan(text, open_at_start, final=True)
        return reasoning, answer

    def scan(self, text: str, open_at_start: bool, final: bool) -> tuple[str | None, str, bool]:
        """(reasoning so far, answer so far, whether the reasoning ended) of a (partial)
        answer; while not final, a tail that may still become a tag is held back."""
        lead = text.lstrip()
        if lead.startswith(self.start):
            body = lead[len(self.start) :]
        elif not final and self.start.startswith(lead):  # may still open (or be blank)
            return ("" if open_at_start else None), "", False
        elif not open_at_start:
            return None, text, True
        else:
            body = text
        at = body.find(self.end)
        if at == -1:
            keep = 0
            if not final:
                for k in range(min(len(self.end) - 1, len(body)), 0, -1):
                    if body.endswith(self.end[:k]):
                        keep = k
                        break
            return body[: len(body) - keep], "", False
        answer = body[at + len(self.end) :]
        return body[:at], answer.lstrip(), True


def _harmony() -> ReasoningParser:
    """gpt-oss: the `analysis` channel, as the `gpt-oss` call format describes it."""
    from runtime.server.tools.formats import GPT_OSS

    start, end = GPT_OSS.reasoning
    return ReasoningParser("gpt-oss", forced=False, start=start, end=end)


REASONING_PARSERS = {
    "deepseek-r1": lambda: ReasoningParser("deepseek-r1", forced=True),
    "qwen3": lambda: ReasoningParser("qwen3", forced=False),
    "gpt-oss": _harmony,
}
REASONING_ALIASES = {
    "deepseek_r1": "deepseek-r1",
    "qwen3-thinking": "deepseek-r1",
    "openai_gptoss": "gpt-oss",  # vLLM's name
}


def get_reasoning_parser(name: str) -> ReasoningParser:
    key = REASONING_ALIASES.get(name, name)
    if key not in REASONING_PARSERS:
        known = sorted([*REASONING_PARSERS, *REASONING_ALIASES])
        raise ReasoningParserError(f"unknown reasoning parser {name!r}; known: {known}")
    return REASONING_PARSERS[key]()


def reasoning_parser_names() -> list[str]:
    return sorted([*REASONING_PARSERS, *REASONING_ALIASES])


class ReasoningStream:
    """Splits a growing answer into reasoning deltas and the answer's text so far."""

    def __init__(self, parser: ReasoningParser, open_at_start: bool) -> None:
        self.parser = parser
        self.open_at_start = open_at_start
        self.sent = 0

    def feed(self, text: str, final: bool = False) -> tuple[str, str, bool]:
        """(new reasoning text, the answer's text so far, whether the reasoning ended)."""
        reasoning, answer, ended = self.parser.scan(text, self.open_at_start, final)
        piece = ""
        if reasoning is not None and len(reasoning) > self.sent:
            piece = reasoning[self.sent :]
            self.sent = len(reasoning)
        return piece, answer, ended
