"""Strict generation (`grammar/json_schema/strict.py`): objects emit only their declared
properties; the transformed language is a subset of the schema's own; the compile functions
keep exact semantics unless asked, and cache the two modes apart."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from grammar import compile_json_schema, json_schema_to_regex
from grammar.json_schema.strict import apply_mode, strict_schema


def _accepts(schema, text: str) -> bool:
    return re.fullmatch(json_schema_to_regex(schema), text) is not None


OBJ = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

CASES = [
    # (schema, texts the strict language keeps, texts it drops that the exact one accepts)
    (OBJ, ['{"a":1}'], ['{"a":1,"b":2}']),
    (
        {"type": "object", "properties": {"p": OBJ}, "required": ["p"]},
        ['{"p":{"a":1}}'],
        ['{"p":{"a":1,"z":0}}', '{"p":{"a":1},"z":0}'],
    ),
    (
        {"type": "array", "items": OBJ, "prefixItems": [OBJ]},
        ['[{"a":1},{"a":2}]'],
        ['[{"a":1,"x":1}]', '[{"a":1},{"a":2,"x":1}]'],
    ),
    (  # allOf: the union of the members' names is allowed
        {"allOf": [OBJ, {"properties": {"b": {"type": "integer"}}}]},
        ['{"a":1}', '{"a":1,"b":2}'],
        ['{"a":1,"c":3}'],
    ),
    (  # anyOf: each branch keeps its own names and the parent's
        {
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "anyOf": [
                {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
            ],
        },
        ['{"x":0,"a":1}', '{"b":1}'],
        ['{"a":1,"b":2}', '{"a":1,"q":2}'],
    ),
    (  # $defs / $ref (pydantic's nesting)
        {
            "$defs": {"A": OBJ},
            "type": "object",
            "properties": {"inner": {"$ref": "#/$defs/A"}},
            "required": ["inner"],
        },
        ['{"inner":{"a":1}}'],
        ['{"inner":{"a":1,"b":1}}'],
    ),
    (  # unevaluatedProperties false: the same closure (exact mode cannot compile it)
        {**OBJ, "unevaluatedProperties": False},
        ['{"a":1}'],
        [],
    ),
    (  # then / else close like branches
        {
            "type": "object",
            "properties": {"k": {"enum": ["x", "y"]}},
            "required": ["k"],
            "if": {"properties": {"k": {"const": "x"}}},
            "then": {"properties": {"t": {"type": "integer"}}},
        },
        ['{"k":"x"}', '{"k":"x","t":0}', '{"k":"y"}'],
        ['{"k":"x","q":0}'],
    ),
]


@pytest.mark.parametrize("schema, kept, dropped", CASES)
def test_strict_keeps_declared_properties_and_drops_others(schema, kept, dropped):
    strict = strict_schema(schema)
    for text in kept:
        assert _accepts(strict, text), text
    for text in dropped:
        assert not _accepts(strict, text), text
        if "unevaluatedProperties" not in schema:
            assert _accepts(schema, text), f"the exact language accepts {text}"
            jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize(
    "schema",
    [
        {**OBJ, "additionalProperties": True},
        {**OBJ, "additionalProperties": {"type": "integer"}},
        {**OBJ, "patternProperties": {"^x": {"type": "integer"}}},
        {"allOf": [OBJ, {"additionalProperties": {"type": "integer"}}]},
        {"type": "object", "properties": {"m": {"type": "object", "additionalProperties": True}}},
    ],
)
def test_objects_that_ask_for_more_keys_stay_open(schema):
    strict = strict_schema(schema)
    open_part = strict if "m" not in str(schema) else strict["properties"]["m"]
    assert open_part.get("additionalProperties", True) is not False


def test_no_change_under_not_or_if_and_any_value_stays_any():
    schema = {"not": OBJ, "if": OBJ, "then": True}
    assert strict_schema(schema)["not"] == OBJ and strict_schema(schema)["if"] == OBJ
    assert strict_schema({}) == {} and strict_schema(True) is True
    assert strict_schema({"type": "object"})["additionalProperties"] is False
    assert strict_schema({"type": "string"}) == {"type": "string"}


def test_unbounded_integers_get_the_safe_range():
    out = strict_schema({"type": "object", "properties": {"n": {"type": "integer"}}})
    assert out["properties"]["n"] == {
        "type": "integer",
        "minimum": -(2**53 - 1),
        "maximum": 2**53 - 1,
    }
    kept = strict_schema({"type": "integer", "exclusiveMinimum": 0})
    assert "minimum" not in kept and kept["maximum"] == 2**53 - 1
    assert strict_schema({"type": ["integer", "number"]}) == {"type": ["integer", "number"]}
    assert _accepts(out, '{"n":9007199254740991}')
    assert not _accepts(out, '{"n":90071992547409910}')


def test_input_is_not_modified_and_recursive_refs_terminate():
    tree = {
        "$defs": {
            "N": {"type": "object", "properties": {"kids": {"items": {"$ref": "#/$defs/N"}}}}
        },
        "$ref": "#/$defs/N",
    }
    before = repr(tree)
    out = strict_schema(tree)
    assert repr(tree) == before
    assert out["additionalProperties"] is False
    assert out["$defs"]["N"]["properties"]["kids"]["items"]["additionalProperties"] is False


def test_pydantic_model_nested_and_dict_fields():
    from pydantic import BaseModel

    class Addr(BaseModel):
        city: str

    class Person(BaseModel):
        name: str
        addr: Addr
        scores: dict[str, int] = {}

    strict = strict_schema(Person.model_json_schema())
    assert strict["additionalProperties"] is False
    assert strict["properties"]["addr"]["additionalProperties"] is False
    assert strict["properties"]["scores"]["additionalProperties"]["type"] == "integer"
    assert _accepts(strict, '{"name":"a","addr":{"city":"b"},"scores":{"x":1}}')
    assert not _accepts(strict, '{"name":"a","addr":{"city":"b","zip":1}}')


def test_modes_and_compile_cache(smollm_vocab):
    with pytest.raises(ValueError, match="json_schema_mode"):
        apply_mode(OBJ, "lenient")
    exact = compile_json_schema(OBJ, smollm_vocab)
    assert compile_json_schema(OBJ, smollm_vocab, json_schema_mode="exact") is exact
    strict = compile_json_schema(OBJ, smollm_vocab, json_schema_mode="strict")
    assert strict is not exact
    assert _walks(exact, '{"a":1,"b":2}') and not _walks(strict, '{"a":1,"b":2}')
    assert _walks(strict, '{"a":1}')


def _walks(grammar, text: str) -> bool:
    from grammar import GrammarError

    m = grammar.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


@pytest.fixture(scope="module")
def smollm_vocab():
    from grammar import TokenVocabulary
    from tests.support.tokenizers import smollm2_tokenizer

    return TokenVocabulary.from_tokenizer(smollm2_tokenizer())


# ---- object values spelled out by const / enum; integers generated plain ----------------------


def _strict_accepts(schema, text: str) -> bool:
    return re.fullmatch(json_schema_to_regex(apply_mode(schema, "strict")), text) is not None


@pytest.mark.parametrize(
    "schema, text",
    [
        ({"type": "object", "const": {"key": "x"}}, '{"key":"x"}'),
        ({"type": "object", "enum": [{"key": "x"}, {"k": 1}]}, '{"k":1}'),
        (
            {"type": "object", "properties": {"o": {"type": "object", "const": {"a": [1]}}}},
            '{"o":{"a":[1]}}',
        ),
    ],
)
def test_strict_keeps_the_keys_of_object_constants(schema, text):
    assert _strict_accepts(schema, text)
    jsonschema.validate(json.loads(text), schema)


def test_strict_still_closes_an_object_beside_a_constant_member():
    schema = {"type": "object", "properties": {"k": {"const": 1}}}
    assert _strict_accepts(schema, '{"k":1}')
    assert not _strict_accepts(schema, '{"k":1,"z":2}')


@pytest.mark.parametrize(
    "schema", [{"type": "integer"}, {"type": "integer", "minimum": 0, "maximum": 10}]
)
def test_strict_integers_are_plain_and_exact_ones_keep_the_zero_fraction(schema):
    for text in ("1.0", "1.0000000000000000000000000000000000000000"):
        assert not _strict_accepts(schema, text)
        assert _accepts(schema, text)  # the schema's own language (draft 2020-12)
    assert _strict_accepts(schema, "7")
    nested = {"type": "object", "properties": {"population": schema}, "required": ["population"]}
    assert not _strict_accepts(nested, '{"population":1.00}')
    assert _strict_accepts(nested, '{"population":1}')
