"""patternProperties' key regions are split with each pattern's escape-free automaton
(`pattern_to_content(..., escape_free=True)`): that automaton is the full one intersected with
escape-free text, and the compiled schemas keep jsonschema's verdicts on keys written with and
without escapes (a pattern only escaped keys can match keeps its full automaton)."""

from __future__ import annotations

import itertools
import json
import re

import jsonschema
import pytest

from grammar.automata import regex_ast as ra
from grammar.automata.fsm import node_to_dfa, node_to_lazy_dfa
from grammar.automata.pattern import pattern_to_content
from grammar.json_schema.objects import ip_char_not
from grammar.json_schema.scalars import STRING_CHAR_TEXT
from grammar.json_schema.schema import json_schema_to_node
from tests.support.json_text import compact

# JSON string content spellings: plain, multi-byte, short and \u escapes
SPELLINGS = ["a", "b", "\u00e9", "\\n", '\\"', "\\u0061", "\\\\"]
PATTERNS = ["^a.b$", "^.{1,2}$", "[^a]", "^\\n$", "^(a|\u00e9)+$", "b$"]


def _char() -> object:
    """One JSON string character, escapes included (what the schema builder uses)."""
    return ra.parsed(STRING_CHAR_TEXT)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_escape_free_content_is_the_full_language_without_escapes(pattern: str) -> None:
    full = pattern_to_content(pattern, _char())
    literal = ip_char_not(['"', "\\", *map(chr, range(0x20))])
    free = pattern_to_content(pattern, literal, escape_free=True)
    full_dfa = node_to_dfa(full)
    free_dfa = node_to_dfa(free) if free is not None else None
    checked = 0
    for n in range(4):
        for parts in itertools.product(SPELLINGS, repeat=n):
            text = "".join(parts).encode()
            want = full_dfa.matches(text) and b"\\" not in text
            got = free_dfa is not None and free_dfa.matches(text)
            assert got == want, (pattern, text)
            checked += want
    assert checked or free is None or pattern == "^\\n$"


SCHEMAS = [
    {"type": "object", "patternProperties": {"^.{1,3}$": {"type": "integer"}}},
    {
        "type": "object",
        "patternProperties": {"^\\n$": {"type": "integer"}},
        "additionalProperties": {"type": "string"},
    },
    {
        "type": "object",
        "patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 2}},
        "additionalProperties": False,
    },
]
KEYS = ["", "a", "ab", "abcd", "\n", "a\n", '"', "\u00e9\u00e9", "b", "zb"]
VALUES = [1, 3, "s"]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["counted-dot", "escaped-only", "two"])
def test_pattern_properties_keep_jsonschemas_verdicts(schema: dict) -> None:
    """Escape-free keys: exactly jsonschema's verdict. Keys written with escapes: never a
    wrong accept, and the escapes JSON requires accepted where the key is in every pattern
    (objects.pattern_member: only such regions take escaped keys)."""
    dfa = node_to_lazy_dfa(json_schema_to_node(schema))
    check = jsonschema.Draft202012Validator(schema)
    pats = list(schema["patternProperties"])
    for key, value in itertools.product(KEYS, VALUES):
        instance, valid = {key: value}, check.is_valid({key: value})
        text = compact(instance)
        escaped = "{" + json.dumps(key, ensure_ascii=True) + ":" + json.dumps(value) + "}"
        if "\\" not in text:
            assert dfa.matches(text.encode()) == valid, (schema, text)
        for spelled in {text, escaped}:
            if dfa.matches(spelled.encode()):
                assert valid, (schema, spelled)
        # (Python's `$` also holds before a final newline, ECMA's does not)
        everywhere = "\n" not in key and all(re.search(p, key) for p in pats)
        if valid and everywhere and "\\" in text:  # the escapes JSON requires
            assert dfa.matches(text.encode()), (schema, text)
