"""A JSON Schema `pattern` (search semantics, ECMA dialect) -> a regex node for JSON string
content.

The pattern is parsed by interegular and rebuilt with every character class narrowed to
characters that appear literally in a JSON string (no quote, backslash or control character),
so a string the regex accepts is valid JSON whose decoded value matches the pattern (strings
that would need escapes inside the matched part are refused, never wrongly accepted).
"""

from __future__ import annotations

import re
import threading

from grammar.automata import interegular_adapter as ip
from grammar.automata import regex_ast as ra
from grammar.automata.ecma_regex import parse_pattern_regex
from grammar.errors import GrammarError

# what may appear unescaped inside a JSON string
_UNSAFE = frozenset('"\\') | frozenset(chr(i) for i in range(0x20))
_LINE_BREAKS = frozenset("\n\r\u2028\u2029")
_U_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u([0-9a-fA-F]{4})")


def regex_units(pattern: str):
    """(index, unit, inside a class) for each unit of a regex: an escape pair or one char."""
    in_class, i = False, 0
    while i < len(pattern):
        if pattern[i] == "\\":
            yield i, pattern[i : i + 2], in_class
            i += 2
            continue
        c = pattern[i]
        yield i, c, in_class
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        i += 1


def _split_top_level(pattern: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, unit, in_class in regex_units(pattern):
        if in_class:
            continue
        if unit == "(":
            depth += 1
        elif unit == ")":
            depth -= 1
        elif unit == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
    out.append(pattern[start:])
    return out


def _ends_with_anchor(branch: str) -> bool:
    if not branch.endswith("$"):
        return False
    backslashes = len(branch[:-1]) - len(branch[:-1].rstrip("\\"))
    return backslashes % 2 == 0


_END = "\x00"  # stands for an inner `$`; never a byte of JSON string content
_MARKING = threading.local()  # .on: _with_end_anchors is building (the marker is allowed)
_LOSS = threading.local()  # .count: constructions whose language is a strict subset
_FREE = threading.local()  # .on: only the spellings without escapes (pattern_to_content)


def note_loss() -> None:
    """Record that a language was narrowed (strings left out: sound, but not exact), so
    callers that subtract or intersect automata can tell (see json_oneof)."""
    _LOSS.count = losses() + 1


def losses() -> int:
    return getattr(_LOSS, "count", 0)


def _mark_end_anchors(branch: str) -> tuple[str, bool]:
    """`branch` with every unescaped `$` outside a class made _END, and whether one of them
    is not its last character (e.g. `(a|$)b*`)."""
    out, inner = [], False
    for i, unit, in_class in regex_units(branch):
        if unit == "$" and not in_class:
            inner = inner or i < len(branch) - 1
            unit = _END
        out.append(unit)
    return "".join(out), inner


_SHORT_ESCAPES = {'"': '"', "\\": "\\", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}


def _with_escapes(plain: object | None, chars: frozenset[str]) -> object | None:
    """`plain` or one of `chars` written as a JSON escape (`\\n`, `\\"`, `\\u001e` in either
    case): a pattern's class holding a quote, a backslash or a control character reaches it
    the way JSON must spell it. NUL is left out (it marks an inner `$`). Escape-free
    (see pattern_to_content): `plain` alone."""
    if getattr(_FREE, "on", False):
        return plain
    spellings: list[object] = [] if plain is None else [plain]
    for c in sorted(chars - {_END}):
        if c in _SHORT_ESCAPES:
            spellings.append(ra.lit("\\" + _SHORT_ESCAPES[c]))
        code = f"{ord(c):04x}"
        for hexa in sorted({code, code.upper()}):
            spellings.append(ra.lit("\\u" + hexa))
    if not spellings:
        return None
    return spellings[0] if len(spellings) == 1 else ra.alt(spellings)


def _json_safe(node: object) -> object | None:
    """The same regex with every character class narrowed to JSON-literal characters."""
    if isinstance(node, ip.CharGroup) and not node.negated and _END in node.chars:
        if node.chars == {_END} and getattr(_MARKING, "on", False):
            return node  # an inner `$` (see _with_end_anchors)
        # a NUL byte is never JSON string content (it is written \u0000): narrow it away
        note_loss()
        node = ip.CharGroup(node.chars - {_END}, False)
    if isinstance(node, ip.CharGroup):
        if node.negated:
            if _END not in node.chars:
                note_loss()  # NUL stays out (it marks an inner `$`)
            plain = ip.CharGroup(node.chars | _UNSAFE, True)
            return _with_escapes(plain, _UNSAFE - node.chars)
        chars = node.chars - _UNSAFE
        plain = ip.CharGroup(chars, False) if chars else None
        return _with_escapes(plain, node.chars & _UNSAFE)
    if node is ip.DOT:
        note_loss()
        plain = ip.CharGroup(_UNSAFE | _LINE_BREAKS, True)
        return _with_escapes(plain, _UNSAFE - _LINE_BREAKS)
    if node is ip.EMPTY:
        return ra.EMPTY
    if isinstance(node, ip.Concatenation):
        return ra.seq(*(_json_safe(p) for p in node.parts))
    if isinstance(node, ip.Pattern):
        if node.added_flags or node.removed_flags:
            raise GrammarError("regex flags are not supported")
        return ra.alt([_json_safe(o) for o in node.options])
    if isinstance(node, ip.Repeated):
        return ra.repeat(_json_safe(node.base), node.min, node.max)
    if isinstance(node, ip.NonCapturing):
        raise GrammarError("regex construct not supported: lookaround (?=, ?!, ?<=, ?<!)")
    raise GrammarError(f"regex construct not supported: {type(node).__name__}")


def pattern_to_content(pattern: str, any_char: object, escape_free: bool = False) -> object | None:
    """Node for JSON string content whose decoded text contains a match of `pattern`.

    `any_char` is the node of one JSON string character (used for unanchored ends).
    Returns None when no string can match. Raises GrammarError for constructs we cannot take.
    `escape_free`: only the contents written without a backslash escape (the same language
    intersected with escape-free text, `any_char` being escape-free too): a smaller automaton
    where only escape-free strings are asked about (patternProperties' key regions). Narrowings
    it meets are not recorded again (the full build records them)."""
    if escape_free:
        lost, was = losses(), getattr(_FREE, "on", False)
        _FREE.on = True
        try:
            return pattern_to_content(pattern, any_char)
        finally:
            _FREE.on, _LOSS.count = was, lost
    pattern = _U_ESCAPE.sub(
        lambda m: m.group(1) + ra.escape_char(chr(int(m.group(2), 16))), pattern
    )
    free = ra.repeat(any_char, 0, None)
    branches = []
    parts = _split_top_level(pattern)
    if any(_mark_end_anchors(b)[1] for b in parts):
        return _with_end_anchors(parts, free)
    for branch in parts:
        anchored_start, anchored_end = branch.startswith("^"), _ends_with_anchor(branch)
        body = branch[1:] if anchored_start else branch
        body = body[:-1] if anchored_end else body
        node = _json_safe(parse_pattern_regex(body)) if body else ra.EMPTY
        branches.append(
            ra.seq(ra.EMPTY if anchored_start else free, node, ra.EMPTY if anchored_end else free)
        )
    return ra.alt(branches)


def _with_end_anchors(branches: list[str], free: object) -> object:
    """Patterns with `$` inside a group: each `$` becomes the byte _END, and a string
    matches when it, followed by some run of _END bytes, is in the language (a `$` holds only
    at the end, and several may hold there). Exact, as an automaton."""
    from grammar.automata import dfa_ops
    from grammar.automata.fsm import DEAD, node_to_dfa

    nodes = []
    _MARKING.on = True
    try:
        for branch in branches:
            anchored = branch.startswith("^")
            body = branch[1:] if anchored else branch
            marked, _ = _mark_end_anchors(body)
            node = _json_safe(parse_pattern_regex(marked))
            nodes.append(ra.seq(ra.EMPTY if anchored else free, node, free))
    finally:
        _MARKING.on = False
    dfa = node_to_dfa(ra.alt(nodes))
    table = dfa.byte_table()
    end = table[:, 0].copy()
    accepting = dfa.accepting.copy()
    for _ in range(dfa.num_states):  # accepting after some run of _END bytes
        reach = accepting[end] & (end != DEAD)
        if not (reach & ~accepting).any():
            break
        accepting |= reach
    table[:, 0] = DEAD
    return dfa_ops.DFANode(dfa_ops.from_rows(table.tolist(), accepting.tolist()), "pattern", "#")
