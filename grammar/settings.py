"""Every environment variable the grammar package reads, declared once: name, type, default and
what it does. No other grammar module reads the environment (tests/project/test_layout.py
checks it).

`Setting` and its kinds are also what `runtime.settings` and `sgl_dsl.settings` declare theirs
with: grammar is the bottom package, which both may import. A setting is read from the
environment each time `get()` is called, so a process (or a test) may switch it while running;
an unset or empty variable gives the default, a value of the wrong form a `SettingError` naming
the variable. docs/configuration.md lists all of them (`markdown_table`; a test keeps the page
equal to the declarations).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar


class SettingError(ValueError):
    """An environment variable holds a value its setting cannot take."""


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """One environment variable: `get()` is its value now (`default` when unset or empty)."""

    name: str
    default: T
    doc: str

    kind = "text"

    def get(self) -> T:
        text = os.environ.get(self.name, "").strip()
        return self.parse(text) if text else self.default

    def parse(self, text: str) -> T:
        return text  # type: ignore[return-value]  # Text: T is str | None

    def shown_default(self) -> str:
        return "(unset)" if self.default is None else str(self.default)


@dataclass(frozen=True, slots=True)
class Flag(Setting[bool]):
    """On / off: 1, true, yes, on or 0, false, no, off (any case)."""

    kind = "flag"

    def parse(self, text: str) -> bool:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise SettingError(f"{self.name} must be 1 or 0 (true / false), got {text!r}")

    def shown_default(self) -> str:
        return "1" if self.default else "0"


@dataclass(frozen=True, slots=True)
class Choice(Setting[str]):
    """One of a few words (compared in lower case)."""

    choices: tuple[str, ...] = ()
    kind = "choice"

    def parse(self, text: str) -> str:
        low = text.lower()
        if low not in self.choices:
            raise SettingError(
                f"{self.name} must be one of {', '.join(self.choices)}, got {text!r}"
            )
        return low


@dataclass(frozen=True, slots=True)
class Text(Setting["str | None"]):
    """Free text (a URL, a program, a key); the default (often `None`) when unset."""


@dataclass(frozen=True, slots=True)
class Folder(Setting[Path]):
    """A folder; `~` expands to the home folder when the value is read."""

    kind = "folder"

    def get(self) -> Path:
        text = os.environ.get(self.name, "").strip()
        return Path(text or str(self.default)).expanduser()


def markdown_table(settings: Iterable[Setting]) -> str:
    """The settings as the rows of a markdown table: variable, kind, default, what it does."""
    rows = ["| variable | kind | default | what it does |", "|---|---|---|---|"]
    for s in settings:
        kind = s.kind if not isinstance(s, Choice) else " / ".join(s.choices)
        rows.append(f"| `{s.name}` | {kind} | `{s.shown_default()}` | {s.doc} |")
    return "\n".join(rows) + "\n"


GRAMMAR_NATIVE = Flag(
    "SGL_GRAMMAR_NATIVE",
    True,
    "The grammar's native code: first-visit token masks through the C trie walk "
    "(`tokens/native.py`; lark and GBNF grammars: `cfg/native_walk.py`) and the lazy DFA's "
    "subset construction in C (`automata/native_dfa.py`); 0 keeps the numpy walks and the "
    "Python construction. Read on each compile.",
)
NATIVE_CACHE = Folder(
    "SGL_NATIVE_CACHE",
    Path("~/.cache/sgl-native"),
    "Where compiled C libraries are kept (the grammar's trie walk, the runtime's fused CPU "
    "kernels), one file per source, flags, compiler and CPU.",
)
CC = Text(
    "CC",
    None,
    "The C compiler native code is built with; unset: `cc`, else `gcc` on the PATH. None found "
    "(or a failed build): the numpy and torch paths run instead.",
)

SETTINGS: tuple[Setting, ...] = (GRAMMAR_NATIVE, NATIVE_CACHE, CC)
