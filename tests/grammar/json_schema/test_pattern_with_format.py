"""A string with both `pattern` and `format`: where the format's automaton spells no character
with a backslash (URIs, dates, hosts...), the product takes the pattern's escape-free
spellings only (a smaller automaton); the language must be the product with the full
pattern's, which every check here compares state pair by state pair."""

from __future__ import annotations

import pytest

from grammar.automata.fsm import ByteDFA, node_to_dfa
from grammar.automata.pattern import pattern_to_content
from grammar.errors import GrammarError
from grammar.json_schema import scalars
from grammar.json_schema.schema import SchemaBuilder, json_schema_to_node

PATTERNS = [
    "^https://img\\.example\\.com/.*?(no-image)?\\._SL75_\\.(gif|jpg)$",
    "^[12][0-9]{3}-",
    "a.b",
    "^[^/]+$",
    "\\\\",  # a backslash in the text: only escaped spellings hold one
    '"',
]
# escape-free formats, and ones whose automata read a backslash (the full content stays)
FORMATS = ["uri", "date", "hostname", "email"]


def _dfa(schema: dict) -> ByteDFA | None:
    """The schema's automaton, None where it matches nothing."""
    try:
        return node_to_dfa(json_schema_to_node(schema))
    except GrammarError:
        return None


def _same_language(a: ByteDFA | None, b: ByteDFA | None) -> bool:
    """Whether two byte DFAs accept the same strings (their product's reachable pairs)."""
    if a is None or b is None:
        return a is b
    columns = {(a.classes[byte], b.classes[byte]) for byte in range(256)}  # one per group
    seen, todo = {(1, 1)}, [(1, 1)]
    while todo:
        x, y = todo.pop()
        if bool(a.accepting[x]) != bool(b.accepting[y]):
            return False
        for ca, cb in columns:
            nxt = (int(a.table[x, ca]), int(b.table[y, cb]))
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return True


@pytest.mark.parametrize("fmt", FORMATS)
def test_pattern_and_format_is_the_product_with_the_full_pattern(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = []
    for pattern in PATTERNS:
        schema = {"type": "string", "pattern": pattern, "format": fmt}
        new = _dfa(schema)
        builder = SchemaBuilder(schema, "", 3, 3)
        full = pattern_to_content(pattern, builder.string_char)
        fmt_dfa = builder.dfa(scalars.format_node(fmt, None)[0])
        asked = []
        with monkeypatch.context() as m:  # did it ask for the escape-free spellings?
            m.setattr(
                scalars,
                "pattern_to_content",
                lambda p, c, asked=asked, full=full, **kw: asked.append(kw) or full,
            )
            scalars._content_beside(builder, pattern, fmt_dfa)
        fast.append(asked[-1] == {"escape_free": True})
        with monkeypatch.context() as m:  # the product with the full pattern's content
            m.setattr(
                scalars, "_content_beside", lambda b, p, f: pattern_to_content(p, b.string_char)
            )
            old = _dfa(schema)
        assert _same_language(new, old), (pattern, fmt)
    escape_free = fmt != "email"
    assert fast == [escape_free] * len(PATTERNS)
