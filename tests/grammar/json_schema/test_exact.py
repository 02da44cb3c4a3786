"""Keyword combinations made exact (oneOf with overlapping branches, enum values under other
keywords, pattern + format, member counts, propertyNames, patternProperties over named
properties): the compiled automaton must agree with the jsonschema library on every instance."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import GrammarError, UnsupportedSchemaError
from grammar.automata.fsm import node_to_dfa
from grammar.json_schema.schema import json_schema_to_node


def _agrees(schema: dict, instances: list) -> None:
    dfa = node_to_dfa(json_schema_to_node(schema), 200_000)
    cls = jsonschema.validators.validator_for(schema)
    check = cls(schema, format_checker=cls.FORMAT_CHECKER)
    for inst in instances:
        text = json.dumps(inst, separators=(",", ":"), ensure_ascii=False)
        assert dfa.matches(text.encode()) == check.is_valid(inst), (text, check.is_valid(inst))


DEPENDENT = [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 7}, {"b": 1}, {"a": 1, "b": 9, "c": 0}]
DEPENDENT += [{"c": 1}, {"b": 6, "c": 1}]

CASES = [
    (  # open objects told apart by required names only
        {
            "oneOf": [
                {"type": "object", "required": ["a"]},
                {"type": "object", "properties": {"b": {}}, "required": ["b"]},
            ]
        },
        [{"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {}, {"c": 1}, {"a": 1, "c": 3}, [], "x"],
    ),
    (  # closed objects: the empty object matches both
        {
            "type": "object",
            "oneOf": [
                {"additionalProperties": False, "properties": {"next": {"type": "string"}}},
                {"additionalProperties": False, "properties": {"prev": {"type": "string"}}},
            ],
        },
        [{}, {"next": "a"}, {"prev": "b"}, {"next": "a", "prev": "b"}, {"next": 1}],
    ),
    (  # no type: object keywords accept every non-object, so no non-object is valid
        {
            "required": ["kind"],
            "oneOf": [{"required": ["x", "y"]}, {"required": ["z"]}],
        },
        [
            {"kind": 1, "x": 1, "y": 2},
            {"kind": 1, "z": 3},
            {"kind": 1, "x": 1, "y": 2, "z": 3},
            {"kind": 1, "x": 1},
            {"x": 1, "y": 2},
            3,
            "s",
            None,
        ],
    ),
    (  # a discriminator by pattern, a forbidden member through patternProperties
        {
            "type": "object",
            "oneOf": [
                {"properties": {"s": {"type": "string", "pattern": "^ok$"}}, "required": ["s"]},
                {"properties": {"s": {"type": "string", "pattern": "^fail$"}}, "required": ["s"]},
                {
                    "properties": {"m": {"type": "string"}},
                    "patternProperties": {"^s$": {"type": "null"}},
                    "required": ["m"],
                },
            ],
        },
        [
            {"s": "ok"},
            {"s": "fail"},
            {"s": "other"},
            {"m": "x"},
            {"s": "ok", "m": "x"},
            {"m": "x", "s": None},
        ],
    ),
    (  # arrays of scalars: exact difference (the empty array is in both)
        {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"items": {"type": "string"}}]},
        [[], [1, 2], ["a"], [1, "a"], "a", 1, None, {"k": 1}],
    ),
    (  # scalars whose languages overlap
        {"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "maxLength": 2}]},
        ["a", "abc", "bb", "bbb", "", 1],
    ),
    (  # enum values checked against every keyword beside them
        {
            "allOf": [
                {"enum": [{"a": 1}, {"a": 1, "b": 2}, "xy", "xyz"]},
                {"not": {"minProperties": 2}},
            ]
        },
        [{"a": 1}, {"a": 1, "b": 2}, "xy", "xyz", "q"],
    ),
    ({"enum": ["a", "abc", 3], "maxLength": 2}, ["a", "abc", 3, "b"]),
    (  # member counts: optional properties and additional members
        {
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {}},
            "minProperties": 2,
            "maxProperties": 3,
        },
        [{}, {"a": 1}, {"a": 1, "c": 2}, {"a": 1, "b": 2, "c": 3}, {"a": 1, "x": 2}]
        + [{"a": 1, "b": 2, "c": 3, "x": 4}, {"x": 1, "y": 2, "z": 3, "w": 4}],
    ),
    (
        {"type": "object", "minProperties": 1},
        [{}, {"a": 1}, {"a": 1, "b": [1, {"c": None}]}],
    ),
    (
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "maxProperties": 1,
            "additionalProperties": False,
        },
        [{}, {"a": 1}, {"b": 2}, {"a": 1, "b": 2}],
    ),
    (  # propertyNames filters named and additional members
        {
            "type": "object",
            "properties": {"ok": {}, "NO": {}},
            "additionalProperties": {"type": "string"},
            "propertyNames": {"pattern": "^[a-z]{1,3}$"},
        },
        [{"ok": 1}, {"NO": 1}, {"ok": 1, "abc": "x"}, {"abcd": "x"}, {"abc": 1}, {}],
    ),
    ({"type": "object", "propertyNames": False}, [{}, {"a": 1}]),
    (  # allOf of an object with patterns and one without (closed, then open)
        {
            "allOf": [
                {"patternProperties": {"^x": {"type": "integer"}}},
                {"properties": {"y": {}, "xa": {"minimum": 3}}, "additionalProperties": False},
            ]
        },
        [{}, {"y": 1}, {"xa": 5}, {"xa": 1}, {"xa": "s"}, {"xb": 1}, {"z": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {"p": {"properties": {"a": {}, "b": {}}}},
            "patternProperties": {
                "^[^/]": {"type": "object", "patternProperties": {"^/": {"type": "string"}}}
            },
        },
        [{"p": {"a": 1}}, {"p": {"/x": "s"}}, {"p": {"/x": 1}}, {"p": 1}, {"q": {"/y": 2}}],
    ),
    (  # many patterns, some overlapping: keys split into the non-empty regions
        {
            "type": "object",
            "patternProperties": {
                "^a": {"type": "integer"},
                "^ab": {"minimum": 5},
                "^c[0-9]$": {"type": "string"},
                "^d": {"type": "null"},
                "x$": {"type": "boolean"},
            },
            "additionalProperties": {"type": "array"},
        },
        [{"a1": 1}, {"ab": 3}, {"ab": 7}, {"c1": "s"}, {"c1": 1}, {"d": None}, {"dx": None}]
        + [{"ax": 1}, {"zx": True}, {"z": []}, {"z": 1}, {"c12": []}],
    ),
    (  # not: the union of the ways to violate each keyword
        {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "args": {"type": "array"}},
            "not": {"allOf": [{"required": ["cmd"]}, {"required": ["args"]}]},
        },
        [{}, {"cmd": "x"}, {"args": []}, {"cmd": "x", "args": []}],
    ),
    ({"type": "object", "not": {"propertyNames": False}}, [{}, {"a": 1}]),
    (  # if / then / else: (if and then) or (not if and else)
        {
            "type": "object",
            "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "lib"}}},
            "then": {"required": ["n"]},
            "else": {"properties": {"n": {"maximum": 3}}},
        },
        [{"kind": "lib"}, {"kind": "lib", "n": 9}, {"kind": "app", "n": 9}, {"kind": "app", "n": 2}]
        + [{"n": 9}, {"n": 1}, {}],
    ),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, ["a", "ab", 1, None]),
    (  # dependencies with a schema: if the name is present, the schema applies
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"a": {}, "b": {"type": "integer"}, "c": {}},
            "dependencies": {
                "a": {"required": ["b"], "properties": {"b": {"minimum": 5}}},
                "c": ["a"],
            },
        },
        DEPENDENT,
    ),
    (
        {
            "type": "object",
            "properties": {"a": {}, "b": {"type": "integer"}, "c": {}},
            "dependentSchemas": {"a": {"required": ["b"], "properties": {"b": {"minimum": 5}}}},
            "dependentRequired": {"c": ["a"]},
        },
        DEPENDENT,
    ),
    ({"then": {"minLength": 2}, "type": "string"}, ["a", "ab"]),
    (  # not of an enum: other values of every type, other strings in canonical spelling
        {"type": "object", "properties": {"t": {"not": {"enum": ["car", True, None]}}}},
        [{"t": "car"}, {"t": "cart"}, {"t": "ca"}, {"t": True}, {"t": False}, {"t": None}]
        + [{"t": 1}, {"t": []}, {}],
    ),
    (  # keywords outside the vocabulary are annotations, also when allOf merges them
        {"allOf": [{"_id": "a", "type": "string"}, {"_id": "b", "maxLength": 2}]},
        ["ab", "abc", 1],
    ),
    (
        {"not": {"type": ["string", "object"], "maxLength": 2}},
        ["ab", "abc", 1, None, {}, [1], True],
    ),
    (
        {"type": "object", "not": {"properties": {"k": {"type": "string"}}}},
        [{}, {"k": "x"}, {"k": 1}, {"j": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {
                "x": {"not": {"type": ["array", "boolean", "number", "null", "object", "string"]}}
            },
        },
        [{}, {"x": 1}, {"y": 1}],
    ),
    (  # an open object whose pattern also matches a named property
        {
            "type": "object",
            "properties": {"id": {"type": "string", "pattern": "^[a-f]{3}$"}},
            "patternProperties": {"^[a-z]{1,8}$": {"type": ["string", "number"]}},
        },
        [{"id": "abc"}, {"id": "ab"}, {"id": 3}, {"x": "ab"}, {"x": None}, {"X": None}],
    ),
    (  # patternProperties that match a named property: both schemas apply
        {
            "type": "object",
            "properties": {"line1": {"type": "string"}, "city": {"type": "string"}},
            "patternProperties": {"^line[1-3]$": {"maxLength": 3}},
            "additionalProperties": False,
            "required": ["city", "line2"],
        },
        [
            {"city": "x", "line2": "ab"},
            {"line1": "abcd", "city": "x", "line2": "ab"},
            {"line1": "abc", "city": "x", "line2": "ab"},
            {"city": "x"},
            {"city": "x", "line2": 3},
            {"city": "x", "line2": "abcd"},
        ],
    ),
    (
        {"type": "string", "format": "uri", "pattern": "^mailto:"},
        ["mailto:a@b.c", "http://x", "mailto:x"],
    ),
]


@pytest.mark.parametrize(("schema", "instances"), CASES)
def test_agrees_with_jsonschema(schema, instances) -> None:
    _agrees(schema, instances)


def test_calculate_area_discriminated_through_merged_const() -> None:
    shapes = {"circle": ["radius"], "rectangle": ["length", "width"]}
    schema = {
        "type": "object",
        "properties": {
            "shape": {"enum": list(shapes)},
            **{n: {"type": "number"} for v in shapes.values() for n in v},
        },
        "required": ["shape"],
        "oneOf": [
            {"properties": {"shape": {"const": s}}, "required": names}
            for s, names in shapes.items()
        ],
    }
    _agrees(
        schema,
        [
            {"shape": "circle", "radius": 1},
            {"shape": "rectangle", "length": 1, "width": 2},
            {"shape": "circle", "length": 1, "width": 2},
            {"shape": "circle", "radius": 1, "length": 1, "width": 2},
        ],
    )


def test_member_counts_are_not_fooled_by_repeated_keys() -> None:
    """JSON text may repeat a key ({"x":1,"x":2} is one member), so other members count once
    at most towards minProperties: objects needing two of them are not generated."""
    with pytest.raises(GrammarError):  # no named properties: nothing left to generate
        json_schema_to_node({"type": "object", "minProperties": 2})
    named = {"type": "object", "properties": {"a": {}}, "minProperties": 2}
    dfa = node_to_dfa(json_schema_to_node(named))
    assert dfa.matches(b'{"a":1,"x":1}') and not dfa.matches(b'{"x":1,"x":1}')


@pytest.mark.parametrize(
    "schema",
    [
        {"oneOf": [{"type": "string"}, {"type": "string", "pattern": "^[^a]*$"}]},
        {"oneOf": [{"type": "string"}, {"type": "string", "pattern": "^\\x00$"}]},
        {
            "$defs": {
                "T": {
                    "type": "object",
                    "properties": {
                        "c": {
                            "oneOf": [{"$ref": "#/$defs/T"}, {"type": "object", "required": ["x"]}]
                        }
                    },
                }
            },
            "$ref": "#/$defs/T",
        },
    ],
)
def test_oneOf_over_approximated_branches_is_refused(schema) -> None:
    """A branch whose automaton leaves strings out (a pattern whose NUL is narrowed away, a
    recursion cut) cannot be subtracted or shown disjoint."""
    with pytest.raises(UnsupportedSchemaError):
        json_schema_to_node(schema)


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        ({"properties": {"a": {"type": "integer"}}}, b'{"\\u0061":"x"}'),
        ({"not": {"required": ["a"]}}, b'{"\\u0061":1}'),
        ({"type": "string", "format": "date-time", "enum": ["nope"]}, None),
        ({"type": "string", "pattern": "^a\\u0000$"}, None),
    ],
)
def test_names_in_disguise_and_unchecked_formats_stay_out(schema, text) -> None:
    try:
        dfa = node_to_dfa(json_schema_to_node(schema))
    except GrammarError:
        return  # refusing is fine too
    assert text is not None and not dfa.matches(text)


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": 5},
        {"$ref": 5},
        {"const": 10**400},
        {"maxItems": -1},
        {"minLength": 1.5},
        {
            "$defs": {"T": {"properties": {"a": {"$ref": "#/$defs/T"}}}},
            "not": {"$ref": "#/$defs/T"},
        },
    ],
)
def test_malformed_schemas_raise_grammar_error(schema) -> None:
    with pytest.raises(GrammarError):
        node_to_dfa(json_schema_to_node(schema))


def test_presence_split_stays_within_the_schema() -> None:
    """Objects with the required names of two branches that cannot be told apart are not
    generated: some of them are valid (one branch fails on a value), none accepted is invalid."""
    schema = {
        "type": "object",
        "oneOf": [
            {"properties": {"s": {"pattern": "^ok$"}}, "required": ["s"]},
            {"properties": {"s": {"pattern": "^no$"}}, "required": ["s"], "maxProperties": 1},
            {"properties": {"m": {"type": "string"}}, "required": ["m"]},
        ],
    }
    dfa = node_to_dfa(json_schema_to_node(schema), 200_000)
    check = jsonschema.Draft202012Validator(schema)
    instances = [{"s": "ok"}, {"s": 1}, {"m": "x"}, {"m": "x", "s": 2}, {"s": "ok", "m": 1}, {}]
    accepted = 0
    for inst in instances:
        text = json.dumps(inst, separators=(",", ":"))
        if dfa.matches(text.encode()):
            accepted += 1
            assert check.is_valid(inst), text
    assert dfa.matches(b'{"m":"x"}') and accepted >= 1


def test_overlap_that_cannot_be_split_is_made_exact_by_negation() -> None:
    schema = {"oneOf": [{"anyOf": [{"type": "null"}, {"type": "array"}]}, {"type": "array"}]}
    dfa = node_to_dfa(json_schema_to_node(schema))  # each branch and not the other
    assert [dfa.matches(t) for t in (b"null", b"[]", b"[1]", b"1")] == [True, False, False, False]
