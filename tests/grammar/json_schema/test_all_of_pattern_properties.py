"""`allOf` of two objects that both have patternProperties (neither additionalProperties):
the conjunction compiles, with jsonschema as oracle; a side with additionalProperties stays
refused by name."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import UnsupportedSchemaError, compile_json_schema
from grammar.errors import GrammarError
from tests.support.tokenizers import deepseek_vocab

INSTANCES = [
    {},
    {"foo": 42},
    {"foo": "x"},
    {"bar": "hello"},
    {"bar": 42},
    {"foo": 1, "bar": "x"},
    {"fb": 1},
    {"fb": "s"},
    {"name": "n", "foo": 3},
    {"name": 3},
    {"other": [1]},
]


def _accepts(schema, text: str) -> bool:
    m = compile_json_schema(schema, deepseek_vocab()).matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


@pytest.mark.parametrize(
    "schema",
    [
        {
            "allOf": [
                {"patternProperties": {"^f": {"type": "integer"}}},
                {"patternProperties": {"^b": {"type": "string"}}},
            ]
        },
        {  # a name both patterns match takes both schemas; a shared pattern, both of its own
            "allOf": [
                {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "patternProperties": {"^f": {"type": "integer"}, "b$": {"minimum": 2}},
                },
                {
                    "patternProperties": {"b$": {"type": "integer"}, "^n": {"minLength": 1}},
                    "additionalProperties": True,
                },
            ]
        },
    ],
    ids=["disjoint-patterns", "overlapping-patterns-and-properties"],
)
def test_all_of_with_pattern_properties_on_both_sides(schema: dict) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    for instance in INSTANCES:
        text = json.dumps(instance, separators=(",", ":"))
        assert _accepts(schema, text) == validator.is_valid(instance), text


def test_a_side_with_additional_properties_is_refused_by_name() -> None:
    schema = {
        "allOf": [
            {"patternProperties": {"^f": {"type": "integer"}}, "additionalProperties": False},
            {"patternProperties": {"^b": {"type": "string"}}},
        ]
    }
    with pytest.raises(UnsupportedSchemaError, match="patternProperties on both sides") as e:
        compile_json_schema(schema, deepseek_vocab())
    assert e.value.keyword == "allOf"
