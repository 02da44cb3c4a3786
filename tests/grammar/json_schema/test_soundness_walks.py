"""Soundness by generation on a fixed slice (benchmarks/correctness/soundness.py): seeded random
walks through compiled constraints, each emitted text parsed and validated with `jsonschema`
(formats asserted, patterns read as ECMA-262). The slice covers the exact machinery of
grammar/json_schema/exact/ (escaped name complements, overlapping oneOf, finite uniqueItems,
unevaluated* beside applicators, prefixItems merges), $dynamicRef, the formats of
grammar/json_schema/formats/ and the ECMA-262 escapes (`\\p{..}`, `\\s`) of patterns."""

from __future__ import annotations

import functools

import pytest

from benchmarks.correctness.soundness import InstanceCheck, WalkSettings, WalkTokens, walk_schema
from benchmarks.correctness.soundness_checkers import ecma_to_regex, is_date_time, is_uri_template
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab

D2020 = "https://json-schema.org/draft/2020-12/schema"
INT, STR = {"type": "integer"}, {"type": "string"}


def _obj(**props: object) -> dict:
    return {"type": "object", "properties": props}


# fmt: off
SCHEMAS = [
    pytest.param({"type": "object", "properties": {'a"b': INT, "c\\d": {"const": 1}},
                  "additionalProperties": {"type": "string", "maxLength": 2}},
                 id="names-escaped-complement"),
    pytest.param({"type": "object", "properties": {"\u00e9": INT, "a/b": STR},
                  "additionalProperties": {"type": "boolean"}, "maxProperties": 3},
                 id="names-non-ascii-complement"),
    pytest.param({"oneOf": [INT, {"minimum": 2}]}, id="oneof-overlap-numbers"),
    pytest.param({"type": "string", "oneOf": [{"maxLength": 2}, {"pattern": "^a"}]},
                 id="oneof-overlap-strings"),
    pytest.param({**_obj(a=INT, b=INT), "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
                  "additionalProperties": False}, id="oneof-overlap-objects"),
    pytest.param({"type": "array", "items": {"enum": [1, 2, "x", None]}, "uniqueItems": True},
                 id="unique-enum"),
    pytest.param({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True},
                 id="unique-booleans"),
    pytest.param({"$schema": D2020, "anyOf": [
        {"properties": {"bar": {"const": 1}}, "required": ["bar"]},
        {"properties": {"baz": {"const": 2}}, "required": ["baz"]}],
        "unevaluatedProperties": False}, id="unevaluated-anyOf"),
    pytest.param({"$schema": D2020, "type": "object", "oneOf": [
        {"properties": {"a": INT}, "required": ["a"]},
        {"properties": {"b": STR}, "required": ["b"]}],
        "unevaluatedProperties": False}, id="unevaluated-oneOf"),
    pytest.param({"$schema": D2020, "type": "object",
                  "if": {"properties": {"k": {"const": "x"}}, "required": ["k"]},
                  "then": {"properties": {"t": INT}}, "else": {"properties": {"e": {}}},
                  "unevaluatedProperties": False}, id="unevaluated-if-then-else"),
    pytest.param({"$schema": D2020, **_obj(a=INT), "dependentSchemas": {"a": _obj(b=INT)},
                  "unevaluatedProperties": False}, id="unevaluated-dependentSchemas"),
    pytest.param({"$schema": D2020, "type": "array", "prefixItems": [{"const": "p"}],
                  "anyOf": [{"prefixItems": [True, INT]}, {"prefixItems": [True, True, STR]}],
                  "unevaluatedItems": False}, id="unevaluated-items-anyOf"),
    pytest.param({"$schema": D2020, "type": "array", "maxItems": 4, "allOf": [
        {"prefixItems": [INT, STR]},
        {"prefixItems": [{"minimum": 0}], "items": {"type": ["string", "integer"]}}]},
        id="prefixItems-merge"),
    pytest.param({"$schema": D2020, "$id": "https://example.com/tree", "$dynamicAnchor": "node",
                  **_obj(data=True, children={"type": "array", "maxItems": 2,
                                              "items": {"$dynamicRef": "#node"}})},
                 id="dynamicRef"),
    *[pytest.param({"type": "string", "format": f}, id=f"format-{f}") for f in (
        "json-pointer", "relative-json-pointer", "duration", "uri-template", "iri",
        "iri-reference", "uri", "date-time", "time")],
    pytest.param({"type": "string", "format": "uri", "pattern": "^[a-z]+://\\["},
                 id="format-uri-ip-literal"),
    pytest.param({"type": "string", "pattern": "^\\p{Lu}\\p{Ll}*$"}, id="pattern-p-Lu-Ll"),
    pytest.param({"type": "string", "pattern": "^a\\s+b\\S?$"}, id="pattern-s-S"),
    pytest.param({"type": "string", "pattern": "^[\\s\\d]{2}\\w$"}, id="pattern-class-escapes"),
    pytest.param({"type": "object", "propertyNames": {"pattern": "^\\p{L}+$", "maxLength": 3},
                  "maxProperties": 3}, id="propertyNames-p-L"),
    pytest.param({"type": "object", "patternProperties": {"^\\s": INT, "x$": STR},
                  "additionalProperties": False}, id="patternProperties-ecma"),
]
# fmt: on


@functools.cache
def _walk_tokens() -> WalkTokens:
    return WalkTokens.of(deepseek_vocab())


@pytest.mark.parametrize("schema", SCHEMAS)
def test_random_walks_emit_only_valid_instances(schema):
    row = walk_schema(
        schema, deepseek_tokenizer(), deepseek_vocab(), _walk_tokens(), WalkSettings(walks=8)
    )
    assert row["compiled"], row["error"]
    assert not row["validator_error"], row["validator_error"]
    assert row["walks"] > 0
    assert row["invalid"] == []


# the oracle itself: its checkers must tell valid from invalid where jsonschema's are wrong
ORACLE = [
    pytest.param({"format": "date-time"}, '"1998-12-31T15:59:60.1-08:00"', True, id="leap-second"),
    pytest.param({"format": "date-time"}, '"1998-12-31T15:58:60-08:00"', False, id="bad-leap"),
    pytest.param({"format": "uri-template"}, '"{a:1000}{%41}"', True, id="template-4-digits"),
    pytest.param({"format": "uri-template"}, '"{a:10000}"', False, id="template-5-digits"),
    pytest.param({"format": "relative-json-pointer"}, '"70421"', True, id="rjp-with-zero"),
    pytest.param({"format": "relative-json-pointer"}, '"01"', False, id="rjp-leading-zero"),
    pytest.param({"format": "duration"}, '"PT1H1S"', False, id="duration-gap"),
    pytest.param({"format": "date"}, '"0000-02-29"', True, id="date-year-0"),
    pytest.param({"format": "uri"}, '"wss://[VC.x]#"', True, id="uri-ipvfuture-upper-v"),
    pytest.param({"pattern": "^\\s$"}, '"\\ufeff"', True, id="ecma-s-has-feff"),
    pytest.param({"pattern": "^\\s$"}, '"\\u001c"', False, id="ecma-s-lacks-1c"),
    pytest.param({"pattern": "^a$"}, '"a\\n"', False, id="ecma-dollar-at-end"),
    pytest.param({"pattern": "^\\d$"}, '"\\u0663"', False, id="ecma-d-ascii"),
    # U+0558 is unassigned in Unicode 14 (the grammar's), a letter in the regex package's
    pytest.param({"pattern": "^\\P{L}$"}, '"\\u0558"', True, id="p-escape-unicode-version"),
    pytest.param(
        {"type": "object", "properties": {"a": INT}},
        '{"a":1,"a":"x"}',
        False,
        id="duplicate-name-either-reading",
    ),
    pytest.param(
        {"multipleOf": 30},
        "21135648299300513252975899325750088497515450383289548"
        "319103131673247816970538561579044047877163094043019425441680.0",
        True,
        id="exact-multipleOf",
    ),
]


@pytest.mark.parametrize(("schema", "text", "valid"), ORACLE)
def test_the_oracle_reads_instances_as_the_specs_do(schema, text, valid):
    assert (InstanceCheck.of(schema).why_invalid(text)[0] == "") is valid


def test_ecma_translation_keeps_escapes_inside_classes():
    assert ecma_to_regex("[\\d]$") == ("[0-9]\\Z", 0)
    assert is_date_time("2024-02-29T23:59:60Z") and not is_date_time("2023-02-29T00:00:00Z")
    assert is_uri_template("a'b") and not is_uri_template("{}")
