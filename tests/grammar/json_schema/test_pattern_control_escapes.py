"""A `pattern` whose class holds a quote, a backslash or a control character reaches it the
way JSON spells it (`\\t`, `\\"`, `\\u0009` in either hex case); jsonschema (on the decoded
string) is the oracle. Explicit classes only: `\\s` and `.` follow ECMA-262 here, which
Python's `re` (jsonschema's) reads differently for some control characters."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import GrammarError, compile_json_schema
from tests.support.tokenizers import deepseek_vocab

SPELLINGS = ['"\\t"', '"\\u0009"', '"\\n"', '"\\u000A"', '"\\u000a"', '"\\r"', '"\\u001e"',
             '"\\u001E"', '"\\""', '"\\u0022"', '"\\\\"', '" "', '"a"', '"\\b"', '"\\f"',
             '"a\\tb"', '"\\t\\t"']  # fmt: skip


def _walks(g, text: str) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


def _canonical_or_escaped(text: str) -> bool:
    """Spellings our strings take: every character literal except those JSON must escape."""
    inner = text[1:-1]
    return "\\u00" not in inner or any(f"\\u00{h}" in inner.lower() for h in ("0", "1", "22", "5c"))


@pytest.mark.parametrize(
    "pattern", ["^[\\t\\n]+$", "^[^a]$", '^[\\x01-\\x1f"\\\\]$', "a\\tb", "^[ \\t\\r]$", "^[^\\n]$"]
)
def test_pattern_classes_take_json_escapes(pattern: str) -> None:
    schema = {"type": "string", "pattern": pattern}
    g = compile_json_schema(schema, deepseek_vocab())
    validator = jsonschema.Draft202012Validator(schema)
    for text in SPELLINGS:
        expected = validator.is_valid(json.loads(text)) and _canonical_or_escaped(text)
        assert _walks(g, text) == expected, text
