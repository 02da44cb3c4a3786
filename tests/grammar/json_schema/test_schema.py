"""JSON Schema -> regex: instances accepted exactly when `jsonschema` says valid (compact,
schema-ordered serialisation), unsupported keywords refused with keyword + pointer."""

from __future__ import annotations

import json
import re

import jsonschema
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import (
    GrammarError,
    UnsupportedSchemaError,
    dtype_to_regex,
    json_schema_to_regex,
    regex_to_dfa,
)
from tests.support.json_text import compact, serialise

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["v"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}

SCHEMA_CASES = [
    pytest.param(
        PERSON,
        [
            {"name": "Al", "age": 3},
            {"name": "Bo", "age": 130, "tags": ["a", "b"]},
            {"name": "Zoë 日本", "age": 0, "email": "a@b.co"},
        ],
        [
            {"name": "", "age": 3},
            {"name": "Al", "age": 131},
            {"name": "Al"},
            {"name": "Al", "age": 3, "x": 1},
            {"name": "Al", "age": 3, "tags": ["a"] * 4},
            {"name": "Al", "age": -1},
            {"name": "Al", "age": 3.5},
        ],
        id="object-bounds",
    ),
    pytest.param(
        {
            "type": "array",
            "prefixItems": [{"type": "boolean"}, {"type": "null"}],
            "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
            "minItems": 1,
        },
        [[True], [False, None], [True, None, 0.5, 10, 3]],
        [[], [None], [True, None, 0], [True, None, 10.5], [True, 1]],
        id="prefix-items-number-bounds",
    ),
    pytest.param(
        {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "integer"}]},
        ["abc", 12, -3],
        ["ABC", "", 1.5, None],
        id="anyOf-pattern",
    ),
    pytest.param(
        {"oneOf": [{"type": "string"}, {"type": "null"}]},
        ["x", None],
        [1, True],
        id="oneOf-disjoint",
    ),
    pytest.param(
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"enum": ["x", "y"]}}, "required": ["b"]},
            ]
        },
        [{"a": 1, "b": "x"}, {"a": 1, "b": "y", "c": [1, {"d": None}]}],
        [{"a": 1}, {"a": 1, "b": "z"}, {"b": "x"}],
        id="allOf-merged",
    ),
    pytest.param(
        {
            "type": "object",
            "properties": {"a": {"const": "k"}},
            "required": ["a"],
            "additionalProperties": {"type": "integer"},
        },
        [{"a": "k"}, {"a": "k", "n": 1, "a2": 2}],
        [{"a": "k", "n": "1"}, {"a": "j"}],
        id="additionalProperties-schema",
    ),
    pytest.param(
        TREE,
        [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}],
        [{"v": 1, "kids": [{}]}, {"kids": []}],
        id="recursive-ref",
    ),
    pytest.param(
        {"type": "string", "format": "date"},
        ["2024-02-29", "1999-12-31"],
        ["2023-02-29", "2024-13-01", "2024-1-01", "2024-04-31"],
        id="format-date",
    ),
    pytest.param(
        {"type": "string", "format": "uuid"},
        ["123e4567-e89b-12d3-a456-426614174000"],
        ["123e4567e89b12d3a456426614174000", "x"],
        id="format-uuid",
    ),
    pytest.param(
        {"type": "string", "format": "ipv4"},
        ["0.0.0.0", "255.255.255.255"],
        ["256.1.1.1", "1.2.3", "01.2.3.4"],
        id="format-ipv4",
    ),
    pytest.param(
        {"type": ["integer", "null"], "minimum": -20, "exclusiveMaximum": 7},
        [-20, 6, None, 0],
        [7, -21, 6.5, "1"],
        id="type-list-integer-bounds",
    ),
    pytest.param(
        {"enum": ["a", 1, None, {"k": [1, 2]}]},
        ["a", 1, None, {"k": [1, 2]}],
        ["b", 2, {"k": [1]}],
        id="enum-mixed",
    ),
    pytest.param(
        {
            "type": "object",
            "patternProperties": {"^[a-z]+$": {"type": "integer"}},
            "additionalProperties": False,
        },
        [{}, {"ab": 1}, {"a": 1, "bc": -2}],
        [{"a": "x"}, {"A": 1}, {"a1": 2}],
        id="patternProperties-closed",
    ),
    pytest.param(
        {"type": "string", "pattern": "ab+"},
        ["ab", "xxabbby"],
        ["a", "ba"],
        id="pattern-unanchored-search",
    ),
]


_DFAS: dict[str, object] = {}


def _dfa(schema):
    key = json.dumps(schema)
    if key not in _DFAS:
        _DFAS[key] = regex_to_dfa(json_schema_to_regex(schema))
    return _DFAS[key]


@pytest.mark.parametrize(("schema", "valid", "invalid"), SCHEMA_CASES)
def test_schema_regex_accepts_exactly_the_valid_instances(schema, valid, invalid) -> None:
    dfa = _dfa(schema)
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for inst in valid:
        assert checker.is_valid(inst), inst
        assert dfa.matches(serialise(schema, inst).encode()), inst
    for inst in invalid:
        assert not checker.is_valid(inst), inst
        assert not dfa.matches(serialise(schema, inst).encode()), inst


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-200, 200)
    | st.floats(-1e3, 1e3, allow_nan=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["name", "age", "tags", "email", "a", "b", "v", "kids", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=8,
)


@pytest.mark.parametrize(("schema", "valid", "invalid"), SCHEMA_CASES)
@settings(max_examples=50, deadline=None)
@given(instance=_json)
def test_no_invalid_instance_is_accepted(schema, valid, invalid, instance) -> None:
    """Soundness on random JSON: whatever the regex accepts, jsonschema says is valid."""
    dfa = _dfa(schema)
    text = serialise(schema, instance)
    if dfa.matches(text.encode()):
        checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
        assert checker.is_valid(json.loads(text)), text


@pytest.mark.parametrize(
    ("schema", "keyword", "pointer"),
    [
        pytest.param(
            {"type": "array", "uniqueItems": True}, "uniqueItems", "#/uniqueItems", id="uniqueItems"
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {"not": {"pattern": "^x"}}}},
            "not",
            "#/properties/a/not",
            id="not",
        ),
        pytest.param(
            {"type": "integer", "multipleOf": 0}, "multipleOf", "#/multipleOf", id="multipleOf"
        ),
        pytest.param(
            {"type": "object", "patternProperties": {"^x": {}}},
            "patternProperties",
            "#/patternProperties",
            id="patternProperties-open",
        ),
        pytest.param(
            {"type": "array", "contains": {"pattern": "^a"}, "maxContains": 1},
            "maxContains",
            "#/maxContains",
            id="maxContains-not-negatable",
        ),
        pytest.param(
            {"type": "object", "dependencies": {"a": {"$dynamicRef": "#meta"}}},
            "$dynamicRef",
            "#/dependencies/a/if/0/allOf/1/$dynamicRef",
            id="dependencies",
        ),
        pytest.param({"$ref": "other.json#/x"}, "$ref", "#/$ref", id="remote-ref"),
        pytest.param({"type": "string", "format": "idn-hostname"}, "format", "#/format", id="idn"),
        pytest.param(
            {"oneOf": [{"type": "array", "items": {"pattern": "a"}}, {"type": "array"}]},
            "oneOf",
            "#/oneOf",
            id="oneOf-overlapping",
        ),
        pytest.param(
            {"type": "string", "pattern": "^(?=a).*$"},
            "pattern",
            "#/pattern",
            id="pattern-lookahead",
        ),
    ],
)
def test_unhonourable_keywords_raise_with_keyword_and_pointer(schema, keyword, pointer) -> None:
    with pytest.raises(UnsupportedSchemaError) as info:
        json_schema_to_regex(schema)
    assert info.value.keyword == keyword
    assert info.value.pointer == pointer
    assert keyword in str(info.value) and pointer in str(info.value)
    assert isinstance(info.value, GrammarError) and isinstance(info.value, ValueError)


def test_date_time_format() -> None:
    dfa = regex_to_dfa(json_schema_to_regex({"type": "string", "format": "date-time"}))
    for good in ["2024-02-29T10:00:00Z", "1999-12-31T23:59:59.5+01:00"]:
        assert dfa.matches(compact(good).encode()), good
    for bad in ["2023-02-29T10:00:00Z", "2024-13-01T00:00:00Z", "2024-01-01", "x"]:
        assert not dfa.matches(compact(bad).encode()), bad


def test_annotations_are_ignored() -> None:
    plain = json_schema_to_regex({"type": "integer"})
    annotated = json_schema_to_regex(
        {
            "type": "integer",
            "title": "t",
            "description": "d",
            "examples": [1],
            "default": 2,
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "x",
        }
    )
    assert plain == annotated


def test_properties_keep_schema_order() -> None:
    r = json_schema_to_regex(
        {
            "type": "object",
            "properties": {"z": {"const": 1}, "a": {"const": 2}},
            "required": ["z", "a"],
            "additionalProperties": False,
        }
    )
    assert re.fullmatch(r, '{"z":1,"a":2}') and not re.fullmatch(r, '{"a":2,"z":1}')


def test_json_text_and_pydantic_class_inputs() -> None:
    class Item(pydantic.BaseModel):
        name: str
        qty: int
        note: str | None = None

    r = json_schema_to_regex(Item)
    assert re.fullmatch(r, '{"name":"x","qty":2}')
    assert re.fullmatch(r, '{"name":"x","qty":2,"note":null}')
    assert not re.fullmatch(r, '{"qty":2}')
    assert json_schema_to_regex(json.dumps(PERSON)) == json_schema_to_regex(PERSON)
    with pytest.raises(GrammarError):
        json_schema_to_regex("{not json")


def test_whitespace_policy() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert not re.fullmatch(json_schema_to_regex(schema), '{ "a": 1 }')
    assert re.fullmatch(json_schema_to_regex(schema, whitespace=r"[ \n]?"), '{ "a": 1 }')


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_recursion_unrolled_to_the_stated_depth(depth: int) -> None:
    r = regex_to_dfa(json_schema_to_regex(TREE, max_recursion_depth=depth))

    def nested(n: int) -> dict:
        return {"v": 0} if n == 1 else {"v": 0, "kids": [nested(n - 1)]}

    assert r.matches(compact(nested(depth)).encode())
    assert not r.matches(compact(nested(depth + 1)).encode())


@pytest.mark.parametrize(
    ("dtype", "good", "bad"),
    [
        (int, ["0", "-12"], ["01", "1.0"]),
        (float, ["1.5", "-2e3", "7"], ["1.", "."]),
        (bool, ["True", "False"], ["true"]),
        (str, ['"a b"'], ["a"]),
    ],
    ids=["int", "float", "bool", "str"],
)
def test_dtype_to_regex(dtype, good, bad) -> None:
    r = dtype_to_regex(dtype)
    assert all(re.fullmatch(r, g) for g in good)
    assert not any(re.fullmatch(r, b) for b in bad)
