"""Keyword combinations compiled exactly (grammar/automata/dfa_ops.py products and schema splits):
a string `pattern` or `format` with minLength / maxLength, `patternProperties` with open or
schema-valued `additionalProperties` and several patterns, `not: {}`, oneOf branches made
disjoint by their types (through nested anyOf), by a name one requires and the other forbids,
or made of `required` lists only,
`dependencies` / `dependentRequired` name lists (split on which trigger names are present).
`jsonschema` is the oracle: listed valid instances are accepted, listed invalid ones refused,
and on random JSON nothing the DFA accepts is invalid. A combination that has no regex text
form makes `json_schema_to_regex` raise UnsupportedSchemaError naming it, while
`compile_json_schema`'s DFA path honours it."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import UnsupportedSchemaError, json_schema_to_regex
from grammar.automata.fsm import node_to_dfa
from grammar.json_schema.schema import json_schema_to_node
from tests.support.json_text import serialise

CASES = [
    pytest.param(
        {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "minLength": 3, "maxLength": 6},
        ["abc", "ab-cd", "abcdef", "a-b", "ab-c-d"],
        ["abcdefg", "ab", "a--b", "", "abc-", "ABC"],
        id="pattern-anchored-length",
    ),
    pytest.param(
        {"type": "string", "pattern": "ab", "maxLength": 4},
        ["ab", "xaby", "\u00e9ab", "\u00e9\u00e9ab", "ab\n", '"ab', "ab\u00e9\u00e9"],
        ["xxaby", "a\nb", "abxyz", "\u00e9\u00e9\u00e9ab"],
        id="pattern-unanchored-maxLength-multibyte-escapes",
    ),
    pytest.param(
        {"type": "string", "pattern": "[a-zA-Z0-9_.-]+", "minLength": 3, "maxLength": 8},
        ["abc", "a.b", "  x", "abcdefgh"],
        ["ab", "   ", "abcdefghi", ""],
        id="pattern-unanchored-min-max",
    ),
    pytest.param(
        {"type": "string", "pattern": "^\\d+$", "minLength": 2},
        ["12", "123456789"],
        ["1", "a1", ""],
        id="pattern-minLength-only",
    ),
    pytest.param(
        {"type": "string", "format": "date", "maxLength": 10},
        ["2020-01-01"],
        ["2020-1-01", "x", "2020-01-01x"],
        id="format-maxLength",
    ),
    pytest.param(
        {"type": "object", "patternProperties": {".+": {"type": "integer"}}},
        [{}, {"a": 1}, {"": "x"}, {"": 1, "b": 2}],
        [{"a": "x"}, {"a": 1, "b": None}],
        id="patternProperties-open",
    ),
    pytest.param(
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "patternProperties": {"^x-": {"type": "string"}},
            "additionalProperties": False,
        },
        [{"id": 1}, {"id": 1, "x-a": "s"}, {"x-": "q"}],
        [{"id": 1, "x-a": 2}, {"id": 1, "y": "s"}, {"id": "s"}],
        id="patternProperties-with-properties-closed",
    ),
    pytest.param(
        {
            "type": "object",
            "patternProperties": {"^a": {"type": "integer"}, "b$": {"minimum": 3}},
            "additionalProperties": {"type": "boolean"},
        },
        [{"ab": 3}, {"a": 2}, {"b": "s"}, {"c": True}, {"ab": 3, "c": False}],
        [{"ab": 2}, {"b": 2}, {"c": 1}, {"ab": 3.5}, {"a": "s"}],
        id="patternProperties-two-patterns-overlap",
    ),
    pytest.param(
        {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "patternProperties": {"^avro_name$": {"type": ["string", "null"]}},
            "additionalProperties": {"type": "integer"},
        },
        [{"name": "n", "avro_name": None}, {"name": "n", "other": 3}, {"avro_name": "a"}],
        [{"avro_name": 1}, {"other": "x"}, {"name": 1}],
        id="patternProperties-properties-additional-schema",
    ),
    pytest.param(
        {
            "type": "object",
            "patternProperties": {
                "^\\w[-\\w_]*$": {},
                "^(relationships|links)$": {"not": {}},
            },
            "additionalProperties": False,
        },
        [{"a": 1}, {"linksx": [1]}, {"a-b": {}}],
        [{"links": 1}, {"relationships": {}}, {"-a": 1}],
        id="patternProperties-not-empty",
    ),
    pytest.param(
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}},
                    "required": ["start", "end"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"custom": {"type": "string"}},
                    "required": ["custom"],
                },
            ]
        },
        [{"start": 1, "end": 2}, {"custom": "x"}, {"custom": "x", "start": 1, "end": 2}],
        [{"start": 1}, {"start": 1, "end": "2"}, {}, {"custom": 1}, {"start": 1, "end": 2.5}],
        id="oneOf-required-vs-closed",
    ),
    pytest.param(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"mem": {"type": "integer"}, "swap": {"type": "integer"}},
            "dependencies": {"swap": ["mem"]},
        },
        [{}, {"mem": 1}, {"mem": 1, "swap": 2}, {"mem": 1, "a": 0}],
        [{"swap": 2}, {"swap": 2, "a": 1}, {"mem": "x", "swap": 1}],
        id="dependencies-declared",
    ),
    pytest.param(
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
            "dependentRequired": {"x-": ["b"]},
        },
        [{"a": 1}, {"a": 1, "x-": 0, "b": 2}, {"a": 1, "b": 2}],
        [{"a": 1, "x-": 0}, {"x-": 0, "b": 1}],
        id="dependentRequired-undeclared-trigger",
    ),
    pytest.param(
        {
            "type": "object",
            "properties": {
                "base": {"type": "integer"},
                "height": {"type": "integer"},
                "radius": {"type": "integer"},
                "side": {"type": "integer"},
            },
            "oneOf": [
                {"required": ["side"]},
                {"required": ["radius"]},
                {"required": ["base", "height"], "description": "triangle"},
            ],
        },
        [{"side": 1}, {"radius": 2}, {"base": 1, "height": 2}, {"base": 1, "side": 3}],
        [{}, {"side": 1, "radius": 2}, {"base": 1}, {"side": 1, "base": 1, "height": 2}],
        id="oneOf-required-lists",
    ),
    pytest.param(
        {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
        [{"a": 1}, {"b": None}, {"a": 1, "c": 2}],
        [{"a": 1, "b": 2}, {}, 1, "a", None],
        id="oneOf-required-lists-untyped",
    ),
    pytest.param(
        {
            "oneOf": [
                {"anyOf": [{"type": "null"}, {"type": "object", "required": ["id"]}]},
                {"type": "array", "items": {"type": "integer"}},
            ]
        },
        [None, {"id": 1}, [], [1, 2]],
        [{}, 1, "a", ["x"], True],
        id="oneOf-branch-types-through-anyOf",
    ),
]


def _dfa(schema):
    return node_to_dfa(json_schema_to_node(schema))


def _valid(schema, instance) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = cls(schema, format_checker=jsonschema.FormatChecker())
    return checker.is_valid(instance)


@pytest.mark.parametrize(("schema", "valid", "invalid"), CASES)
def test_listed_instances(schema, valid, invalid) -> None:
    dfa = _dfa(schema)
    for x in valid:
        assert _valid(schema, x), x  # the table itself agrees with the oracle
        assert dfa.matches(serialise(schema, x).encode()), x
    for x in invalid:
        assert not _valid(schema, x), x
        assert not dfa.matches(serialise(schema, x).encode()), x


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(-10, 10, allow_nan=False)
    | st.text(alphabet='ab-x_\u00e9\n"\\19', max_size=9),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "a",
                    "b",
                    "ab",
                    "x-",
                    "x-a",
                    "id",
                    "c",
                    "links",
                    "avro_name",
                    "name",
                    "start",
                    "end",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=6,
)


@pytest.mark.parametrize(("schema", "valid", "invalid"), CASES)
@settings(max_examples=60, deadline=None)
@given(instance=_json)
def test_no_invalid_instance_is_accepted(schema, valid, invalid, instance) -> None:
    text = serialise(schema, instance)
    if _dfa_cached(json.dumps(schema)).matches(text.encode()):
        assert _valid(schema, json.loads(text)), text


_CACHE: dict = {}


def _dfa_cached(key: str):
    if key not in _CACHE:
        _CACHE[key] = _dfa(json.loads(key))
    return _CACHE[key]


@pytest.mark.parametrize(
    ("schema", "keyword", "pointer"),
    [
        ({"type": "string", "pattern": "a", "maxLength": 3}, "maxLength", "#"),
        ({"type": "string", "format": "uuid", "minLength": 1}, "minLength", "#"),
        (
            {"type": "object", "patternProperties": {"^x": {}}},
            "patternProperties",
            "#/patternProperties",
        ),
    ],
)
def test_no_regex_text_form_is_refused_by_name(schema, keyword, pointer) -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_regex(schema)
    assert (info.value.keyword, info.value.pointer) == (keyword, pointer)


def test_oneOf_overlapping_through_anyOf_still_refused() -> None:
    # (with plain arrays it is exact: each branch and the `not` of the other; `not` of a
    # pattern is not)
    anyof = {"anyOf": [{"type": "null"}, {"type": "array", "items": {"pattern": "a"}}]}
    schema = {"oneOf": [anyof, {"type": "array"}]}
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_node(schema)
    assert (info.value.keyword, info.value.pointer) == ("oneOf", "#/oneOf")


@pytest.mark.parametrize(
    ("schema", "keyword", "pointer"),
    [
        (
            {"type": "object", "dependencies": {"a": {"$dynamicRef": "#meta"}}},
            "$dynamicRef",
            "#/dependencies/a/if/0/allOf/1/$dynamicRef",
        ),
        (
            {
                "allOf": [  # patterns on both sides, one closed by additionalProperties
                    {"patternProperties": {"^x": {"type": "integer"}}},
                    {
                        "patternProperties": {"^y": {"type": "integer"}},
                        "additionalProperties": False,
                    },
                ]
            },
            "allOf",
            "#/allOf/1",
        ),
    ],
)
def test_still_refused(schema, keyword, pointer) -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_node(schema)
    assert (info.value.keyword, info.value.pointer) == (keyword, pointer)


def test_product_over_budget_is_refused() -> None:
    schema = {"type": "string", "pattern": "(a|b)*c(a|b){12}", "maxLength": 4000}
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_node(schema)
    assert info.value.keyword == "maxLength"
