"""lark terminals -> byte DFAs, through the regex machinery of `grammar.automata.fsm`.

A lark terminal is a string literal (`PatternStr`) or a Python regex (`PatternRE`). Both become
full-match regexes in the interegular dialect and then byte DFAs. Flags: `i` (case-insensitive)
is rewritten into the regex; any other flag raises GrammarError naming the terminal.

Constructs whose Python `re` meaning differs from a DFA's (lazy quantifiers, lookaround) raise
GrammarError naming the terminal, except in lark's common library terminals, which are replaced
by DFA-exact equivalents (ESCAPED_STRING: a closing quote ends the string unless escaped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grammar.automata.fsm import ByteDFA, regex_to_dfa
from grammar.automata.pattern import regex_units
from grammar.automata.regex_ast import regex_escape  # the same escape serves Python re
from grammar.errors import GrammarError

# lark's common.lark terminals whose Python regexes use laziness / lookbehind
_COMMON_EQUIVALENTS = {
    r'".*?(?<!\\)(\\\\)*?"': r'"([^"\\\n]|\\[^\n])*"',  # ESCAPED_STRING
}

# a quantifier followed by `?` (lazy), outside character classes
_LAZY = re.compile(r"(\*|\+|\?|\})\?")


@dataclass(slots=True, frozen=True)
class TerminalSpec:
    """One terminal as the lexer sees it. rank orders terminals that accept the same text:
    lower wins (lark's order: priority, literal before regex, longer max width, name)."""

    name: str
    regex: str
    dfa: ByteDFA
    is_literal: bool
    rank: tuple


def _outside_classes(pattern: str) -> str:
    """The pattern with escapes and character classes blanked, for construct detection."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append("__")
            i += 2
            continue
        if in_class:
            in_class = c != "]" or (out and out[-1] == "[")
            out.append("_")
        elif c == "[":
            in_class = True
            out.append("_")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _case_insensitive(pattern: str) -> str:
    """Rewrite a regex so letters match either case (the `i` flag), outside and inside classes."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
                out.append(c)
            elif c.isalpha() and i + 2 < len(pattern) and pattern[i + 1] == "-":
                hi = pattern[i + 2]
                out.append(f"{c}-{hi}{c.swapcase()}-{hi.swapcase()}")
                i += 3
                continue
            else:
                out.append(c + c.swapcase() if c.isalpha() and c.swapcase() != c else c)
        elif c == "[":
            in_class = True
            out.append(c)
            if pattern[i + 1 : i + 2] == "^":
                out.append("^")
                i += 1
        elif c.isalpha() and c.swapcase() != c and not (i > 0 and pattern[i - 1] == "?"):
            out.append(f"[{c}{c.swapcase()}]")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _inline_case_groups(pattern: str) -> str:
    """Rewrite every `(?i:...)` group as a plain group with both letter cases spelled out."""
    while True:
        at = pattern.find("(?i:")
        if at < 0:
            return pattern
        depth, end = 0, len(pattern)
        for i, unit, in_class in regex_units(pattern[at:]):
            if in_class:
                continue
            if unit == "(":
                depth += 1
            elif unit == ")":
                depth -= 1
                if depth == 0:
                    end = at + i
                    break
        body = _case_insensitive(pattern[at + 4 : end])
        pattern = pattern[:at] + "(?:" + body + pattern[end:]


def terminal_regex(name: str, pattern: object) -> str:
    """The full-match regex of a lark pattern; GrammarError naming the terminal if unusable."""
    kind = type(pattern).__name__
    value = pattern.value  # type: ignore[attr-defined]
    flags = set(pattern.flags)  # type: ignore[attr-defined]
    unknown = flags - {"i", "s", "u"}  # u: Unicode matching, what a text pattern has anyway
    if unknown:
        raise GrammarError(f"terminal {name}: regex flags {sorted(unknown)} are not supported")
    if kind == "PatternStr":
        regex = regex_escape(value)
        if "i" in flags:
            regex = "".join(
                f"[{c}{c.swapcase()}]" if c.isalpha() and c.swapcase() != c else regex_escape(c)
                for c in value
            )
        return regex
    regex = _COMMON_EQUIVALENTS.get(value, value)
    bare = _outside_classes(regex)
    if _LAZY.search(bare):
        raise GrammarError(
            f"terminal {name}: lazy quantifiers (*?, +?) are not supported in {value!r}; "
            "write the terminal so that its longest match is the intended one"
        )
    if "(?=" in bare or "(?!" in bare or "(?<" in bare:
        raise GrammarError(f"terminal {name}: lookaround is not supported in {value!r}")
    if "i" in flags:
        regex = _case_insensitive(regex)
    if "s" in flags:  # `.` also matches a line break (grammar.automata.regex_syntax)
        regex = f"(?s:{regex})"
    return _inline_case_groups(regex)


def build_terminal(name: str, pattern: object, priority: int) -> TerminalSpec:
    regex = terminal_regex(name, pattern)
    try:
        dfa = regex_to_dfa(regex)
    except GrammarError as e:
        raise GrammarError(f"terminal {name}: {e}") from None
    if dfa.accepting[1]:
        raise GrammarError(f"terminal {name} matches the empty string")
    is_literal = type(pattern).__name__ == "PatternStr"
    max_width = pattern.max_width  # type: ignore[attr-defined]
    rank = (-priority, 0 if is_literal else 1, -max_width, -len(pattern.value), name)  # type: ignore[attr-defined]
    return TerminalSpec(name, regex, dfa, is_literal, rank)
