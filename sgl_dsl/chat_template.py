"""Role markers derived from a tokenizer's own chat template.

The template is rendered around sentinel contents and the text on each side of a sentinel
becomes that role's begin / end string. Rendering [system], [system, user] and
[system, user, assistant] and taking each render's new tail isolates one role at a time, so
text a template adds once at the start (a BOS) stays with the first message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

_SENTINEL = {
    "system": "Zq7SystemSentinel",
    "user": "Zq7UserSentinel",
    "assistant": "Zq7AssistantSentinel",
}

Render = Callable[[list[dict[str, str]]], str]


@dataclass(slots=True)
class ChatTemplate:
    """Begin / end text of each role, plus what a template adds when no system turn is given.

    Invariant: rendering messages m1..mk with the template equals concatenating
    `first_turn_prefix(m1.role)`, then begin(role) + content + end(role) per message.
    """

    role_begin: dict[str, str]
    role_end: dict[str, str]
    # Text the template puts before a conversation that does not start with a system turn
    # (e.g. a default system prompt), and that default system prompt's content if any.
    default_prefix: str = ""
    default_system: str | None = None
    source: str = field(default="template")

    def begin(self, role: str) -> str:
        return self.role_begin[role]

    def end(self, role: str) -> str:
        return self.role_end[role]

    def first_turn_prefix(self, role: str) -> str:
        return "" if role == "system" else self.default_prefix

    @classmethod
    def plain(cls) -> ChatTemplate:
        """For tokenizers without a template: `Role: content` lines."""
        roles = ("system", "user", "assistant")
        return cls(
            {r: f"{r.capitalize()}: " for r in roles}, {r: "\n" for r in roles}, source="plain"
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        if not getattr(tokenizer, "chat_template", None):
            logger.info("tokenizer has no chat template; using plain 'Role: ' lines")
            return cls.plain()

        def render(messages: list[dict[str, str]]) -> str:
            return tokenizer.apply_chat_template(messages, tokenize=False)

        return cls.derive(render)

    @classmethod
    def derive(cls, render: Render) -> ChatTemplate:
        s, u, a = (_SENTINEL[r] for r in ("system", "user", "assistant"))
        msg = lambda role: {"role": role, "content": _SENTINEL[role]}
        try:
            system_only = render([msg("system")])
        except Exception:  # a template that rejects the system role
            system_only = None
        if system_only is None or s not in system_only:
            # no system role: a system turn is written as a user turn
            base, convo = "", []
        else:
            base, convo = system_only, [msg("system")]
        with_user = render([*convo, msg("user")])
        with_assistant = render([*convo, msg("user"), msg("assistant")])
        begin, end = {}, {}
        begin["user"], end["user"] = _split_tail(with_user, base, u)
        begin["assistant"], end["assistant"] = _split_tail(with_assistant, with_user, a)
        if convo:
            begin["system"], end["system"] = system_only.split(s, 1)
        else:
            begin["system"], end["system"] = begin["user"], end["user"]
        user_first = render([msg("user")])
        default_prefix = user_first[: user_first.find(begin["user"] + u)]
        if begin["user"] + u not in user_first:
            default_prefix = ""
        default_system = None
        sb, se = begin["system"], end["system"]
        if convo and default_prefix.startswith(sb) and default_prefix.endswith(se):
            default_system = default_prefix[len(sb) : len(default_prefix) - len(se)]
        return cls(begin, end, default_prefix, default_system)


def _split_tail(longer: str, shorter: str, sentinel: str) -> tuple[str, str]:
    """The (begin, end) around `sentinel` in what `longer` adds after `shorter`."""
    tail = longer[len(shorter) :] if longer.startswith(shorter) else longer
    if sentinel not in tail:
        raise ValueError(f"chat template dropped the message content {sentinel!r}: {tail!r}")
    before, after = tail.split(sentinel, 1)
    return before, after
