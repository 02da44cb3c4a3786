"""A large enum of strings (from TRIE_MIN_VALUES values on) compiles to a trie of its values'
JSON texts: exactly the same language as the alternation, filtered by the rest of the schema,
with its regex text kept."""

from __future__ import annotations

import re

from grammar.automata.fsm import node_to_dfa
from grammar.json_schema.literals import TRIE_MIN_VALUES, literal_trie
from grammar.json_schema.schema import json_schema_to_node, json_schema_to_regex

VALUES = [f"city-{i}" for i in range(TRIE_MIN_VALUES * 4)] + ["é", 'a"b', "", "city-1x"]


def _matches(schema):
    dfa = node_to_dfa(json_schema_to_node(schema))
    return lambda text: dfa.matches(text.encode())


def test_the_trie_matches_exactly_its_texts():
    texts = [b"ab", b"abc", b"b", b""]
    dfa = literal_trie(texts)
    for t in texts:
        assert dfa.matches(t)
    for t in (b"a", b"abcd", b"c", b"ba"):
        assert not dfa.matches(t)


def test_a_large_string_enum_is_exactly_its_values():
    ok = _matches({"type": "object", "properties": {"c": {"enum": VALUES}}, "required": ["c"]})
    for v in ("city-0", "city-1023", "é", 'a\\"b', "", "city-1x"):
        assert ok('{"c":"' + v + '"}'), v
    for v in ("city-", "city-1024", "city-01", "e", "city-1y"):
        assert not ok('{"c":"' + v + '"}'), v


def test_the_rest_of_the_schema_filters_a_large_enum():
    ok = _matches({"type": "string", "maxLength": 6, "enum": [*VALUES, True, None]})
    assert ok('"city-9"') and ok('""') and not ok('"city-10"')
    assert not ok("true") and not ok("null")  # not strings
    mixed = _matches({"enum": [*VALUES, True, None]})
    assert mixed("true") and mixed("null") and mixed('"city-10"')


def test_a_large_enum_keeps_its_regex_text():
    regex = json_schema_to_regex({"enum": VALUES})
    assert re.fullmatch(regex, '"city-77"') and not re.fullmatch(regex, '"city-x"')
