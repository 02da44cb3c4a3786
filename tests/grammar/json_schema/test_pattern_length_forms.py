"""A string's `pattern` with length bounds, in the forms counted as a repetition rather than
a counted automaton (a literal prefix, then a class to the end or anything after it): the
compiled language is jsonschema's, string by string, and a form outside them (no change)
still compiles the same way."""

from __future__ import annotations

import itertools

import jsonschema
import pytest

from grammar.automata.fsm import node_to_lazy_dfa
from grammar.errors import GrammarError
from grammar.json_schema import scalars
from grammar.json_schema.schema import json_schema_to_node
from tests.support.json_text import compact

# no line break: Python's `$` also holds before a final newline, ECMA's does not
ALPHABET = ["/", "a", "1", "\t", "\u00e9", '"']
STRINGS = ["".join(p) for n in range(5) for p in itertools.product(ALPHABET, repeat=n)]
PATTERNS = ["^/.*", "^/", "^a[a-z1]*$", "^\\/a\\d+$", "^[^/]+$", "^.*", "^a/.+"]
BOUNDS = [(0, 3), (2, None), (1, 1), (3, 4)]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_bounded_patterns_keep_jsonschemas_verdicts(pattern: str) -> None:
    counted_as_repetition = scalars._bounded_class_pattern(pattern, 0, 3, "x") is not False
    assert counted_as_repetition == (pattern != "^a/.+")  # the last: the counted automaton
    for lo, hi in BOUNDS:
        schema = {"type": "string", "pattern": pattern, "minLength": lo}
        if hi is not None:
            schema["maxLength"] = hi
        check = jsonschema.Draft202012Validator(schema)
        try:
            dfa = node_to_lazy_dfa(json_schema_to_node(schema))
        except GrammarError:  # bounds the pattern cannot meet: refused as matching nothing
            assert not any(check.is_valid(s) for s in STRINGS), schema
            continue
        for s in STRINGS:
            assert dfa.matches(compact(s).encode()) == check.is_valid(s), (schema, s)


def test_bounds_shorter_than_the_prefix_match_nothing() -> None:
    assert scalars._bounded_class_pattern("^abc.*", 0, 2, "x") is None
    assert scalars._bounded_class_pattern("^ab[a-z]+$", 0, 2, "x") is None
