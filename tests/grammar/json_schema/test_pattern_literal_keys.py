"""patternProperties whose patterns each match a finite set of keys (`^name:(en|nl)$`) are
split by those sets with no automata (objects.literal_regions); the compiled schemas keep
jsonschema's verdicts, escaped spellings included."""

from __future__ import annotations

import itertools
import json
import re

import jsonschema
import pytest

from grammar.automata import regex_ast as ra
from grammar.automata.fsm import node_to_lazy_dfa
from grammar.automata.pattern import pattern_to_content
from grammar.json_schema.objects import finite_texts, ip_char_not, literal_sets
from grammar.json_schema.scalars import STRING_CHAR_TEXT
from grammar.json_schema.schema import json_schema_to_node
from tests.support.json_text import compact

ALPHABET = ["a", "b", "1", ":", "\u00e9"]
FINITE = ["^a(b|1){0,2}$", "^(a|b):[1]{1}$", "^(ab|\u00e9)?$", "^a{2}b?$"]
INFINITE = ["^a+$", "^a", "b$", "^[^a]$", "^a.$"]


def _free(pattern: str) -> object:
    literal = ip_char_not(['"', "\\", *map(chr, range(0x20))])
    return pattern_to_content(pattern, literal, escape_free=True)


@pytest.mark.parametrize("pattern", FINITE + INFINITE)
def test_finite_texts_is_the_patterns_language(pattern: str) -> None:
    got = finite_texts(_free(pattern))
    if pattern in INFINITE:
        assert got is None
        return
    want = {
        "".join(p)
        for n in range(5)
        for p in itertools.product(ALPHABET, repeat=n)
        if re.search(pattern, "".join(p))
    }
    assert got == want


def test_a_pattern_matching_keys_that_need_escapes_takes_the_automata() -> None:
    char = ra.parsed(STRING_CHAR_TEXT)
    pats = ["^a(b|c)$", '^a("|b)$']
    contents = [pattern_to_content(p, char) for p in pats]
    assert literal_sets(contents[:1], [_free(pats[0])]) == [{"ab", "ac"}]
    assert literal_sets(contents, [_free(p) for p in pats]) is None


SCHEMA = {
    "type": "object",
    "properties": {"x:en": {"type": "string"}},
    "patternProperties": {
        "^x:(en|nl)$": {"type": "integer"},
        "^(x|y):nl$": {"minimum": 2},
        "^z:([0-1]{1})$": {"type": "string"},
    },
    "additionalProperties": {"type": "boolean"},
}
KEYS = ["x:en", "x:nl", "y:nl", "z:0", "z:1", "z:2", "x:", "", "q", "\u00e9"]
VALUES = [1, 3, "s", True]


@pytest.mark.parametrize("extra", [{"type": "boolean"}, False])
def test_literal_pattern_properties_keep_jsonschemas_verdicts(extra: object) -> None:
    schema = {**SCHEMA, "additionalProperties": extra}
    pats = list(schema["patternProperties"])
    char = ra.parsed(STRING_CHAR_TEXT)
    contents = [pattern_to_content(p, char) for p in pats]
    assert literal_sets(contents, [_free(p) for p in pats]) is not None  # the literal path
    dfa = node_to_lazy_dfa(json_schema_to_node(schema))
    check = jsonschema.Draft202012Validator(schema)
    for n in (1, 2):
        for keys in itertools.permutations(KEYS, n):
            for values in itertools.product(VALUES, repeat=n):
                instance = dict(zip(keys, values, strict=True))
                valid = check.is_valid(instance)
                text = compact(instance)
                assert dfa.matches(text.encode()) == valid, text
                escaped = json.dumps(instance, ensure_ascii=True, separators=(",", ":"))
                escaped = escaped.replace(":nl", ":\\u006el")
                if dfa.matches(escaped.encode()):
                    assert valid, escaped
                if (
                    valid
                    and extra is not False
                    and not any(
                        k in SCHEMA["properties"] or any(re.search(p, k) for p in pats)
                        for k in keys
                    )
                ):
                    assert dfa.matches(escaped.encode()), escaped  # others' keys: any spelling


@pytest.mark.parametrize("pattern", ["^.{1,3}$", "^\\n$", ".+", "^x:(en|nl)$"])
def test_one_pattern_without_other_keys_is_its_whole_language(pattern: str) -> None:
    """`additionalProperties: false`, one pattern, no names: its keys are the pattern's
    language in every spelling (no split is built)."""
    schema = {"type": "object", "patternProperties": {pattern: {"type": "integer"}}}
    schema["additionalProperties"] = False
    dfa = node_to_lazy_dfa(json_schema_to_node(schema))
    check = jsonschema.Draft202012Validator(schema)
    for key, value in itertools.product([*KEYS, "\n", '"', "abcd"], [1, "s"]):
        valid = check.is_valid({key: value})
        plain = json.dumps({key: value}, separators=(",", ":"), ensure_ascii=False)
        if "\n" not in key or "$" not in pattern:  # (Python's `$` before a final newline)
            assert dfa.matches(plain.encode()) == valid, plain  # the escapes JSON requires
        if dfa.matches(json.dumps({key: value}, separators=(",", ":")).encode()):
            assert valid, key  # \u escapes: never a wrong accept
