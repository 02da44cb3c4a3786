"""JSON Schema keywords compiled exactly: schemas that admit no instance, property
names that need escapes, oneOf whose branches overlap, uniqueItems over finitely many values,
and unconstrained values nested 5 deep (applicators: test_applicators_exact.py).
Every instance is walked token by token through the compiled constraint; `jsonschema` says
whether it is valid."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import grammar
from grammar import EmptyLanguageError, UnsupportedSchemaError
from tests.support.exact_walks import Spelt, Text, assert_exact, exact_walks
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab

D7 = "http://json-schema.org/draft-07/schema#"


# ----- schemas that admit no instance -----
@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(False, id="false"),
        pytest.param({"not": {}}, id="not-empty"),
        pytest.param({"not": True}, id="not-true"),
        pytest.param({"allOf": [True, False]}, id="allOf-false-branch"),
        pytest.param({"anyOf": [False, False]}, id="anyOf-all-false"),
        pytest.param({"enum": []}, id="empty-enum"),
        pytest.param({"$defs": {"no": False}, "$ref": "#/$defs/no"}, id="ref-to-false"),
        pytest.param({"oneOf": [False, False]}, id="oneOf-all-false"),
        pytest.param({"oneOf": [True, True]}, id="oneOf-all-true"),
        pytest.param({"type": "string", "minLength": 3, "maxLength": 2}, id="crossed-bounds"),
        pytest.param({"type": "object", "required": ["a"], "properties": {"a": False}}, id="req"),
    ],
)
def test_a_schema_that_admits_nothing_compiles_to_a_constraint_that_refuses_every_token(
    schema,
) -> None:
    g = grammar.compile_json_schema(schema, deepseek_vocab())
    m = g.matcher()
    assert g.admits_nothing
    assert not m.mask().any() and not m.is_accepting()
    assert not any(ok for _, ok, _ in exact_walks(schema, [None, 0, "", [], {}, {"a": 1}]))


@pytest.mark.parametrize(
    "schema, instances",
    [
        pytest.param({"properties": {"a": False}}, [{}, {"a": 1}, {"b": 1}], id="optional-false"),
        pytest.param({"anyOf": [False, {"type": "null"}]}, [None, 0], id="anyOf-one-false"),
        pytest.param({"oneOf": [True, False, False]}, [None, {"a": [1]}], id="oneOf-one-true"),
    ],
)
def test_a_part_that_admits_nothing_is_pruned(schema, instances) -> None:
    assert not grammar.compile_json_schema(schema, deepseek_vocab()).admits_nothing
    assert_exact(schema, instances)


def test_the_runtime_ends_a_request_whose_schema_admits_nothing() -> None:
    from runtime.scheduling.constrained import ConstraintHooks

    hooks = ConstraintHooks(deepseek_tokenizer(), [])
    hooks._vocab = deepseek_vocab()
    req = SimpleNamespace(prompt_ids=[1, 2], constraint=None, cache_limit=None)
    hooks.attach(req, json_schema={"enum": []}, json_schema_mode="exact")
    req.constraint.future.exception(timeout=120)
    err = hooks.admissible(req)
    assert isinstance(err, EmptyLanguageError) and "admits no instance" in str(err)


# ----- property names that need escapes -----
ESCAPED = {"foo\nbar": {"type": "number"}, 'foo"bar': {"type": "number"}, "foo\\bar": {}}


@pytest.mark.parametrize(
    "schema, instances",
    [
        pytest.param(
            {"properties": ESCAPED, "additionalProperties": False},
            [
                {"foo\nbar": 1, 'foo"bar': 1},
                {"foo\nbar": "x"},
                {"foo\\bar": [1]},
                {"foo": 1},
                Spelt('{"foo\\u000abar":1}'),
                Spelt('{"foo\\u0022bar":1}'),
                Spelt('{"foo\\u005Cbar":1}'),
                Text('{"foo\\u005cbaz":1}'),
            ],
            id="closed",
        ),
        pytest.param(
            {"properties": ESCAPED, "additionalProperties": {"type": "string"}},
            [
                {"foo\nbar": 1, "x": "y"},
                {"foo\nbar": 1, "x": 2},
                {"foo\rbar": "y"},
                Spelt('{"foo\\u000Abar":"no"}'),
                Spelt('{"fo\\u006f\\nbar":"no"}'),
                Text('{"fo\\u006f\\tbar":"yes"}'),
                Text('{"\\/":"yes"}'),
                Text('{"foo\\"baz":"yes"}'),
            ],
            id="extra-strings",
        ),
        pytest.param(
            {"properties": {"\U0001f600": {"type": "null"}, "é": {"type": "null"}}},
            [
                {"\U0001f600": None},
                {"\U0001f600": 1},
                Spelt('{"\\ud83d\\ude00":1}'),
                Text('{"\\uD83D\\uDE01":1}'),
                Spelt('{"\\u00e9":1}'),
                Spelt('{"\\u00E9":null}'),
                Text('{"\\u00e8":1}'),
            ],
            id="astral-and-accented",
        ),
        pytest.param(
            {"required": ['a"b'], "additionalProperties": False, "properties": {'a"b': {}}},
            [{'a"b': 1}, {}, {"ab": 1}, Spelt('{"a\\u0022b":1}')],
            id="required",
        ),
    ],
)
def test_names_that_need_escapes_are_exact_in_every_spelling(schema, instances) -> None:
    assert_exact(schema, instances)


@pytest.mark.parametrize(
    "names",
    [
        pytest.param(['foo"bar', "foo\nbar", "foo\\bar", "a", "ab", "/"], id="escapes"),
        pytest.param(["\U0001f600x", "\U0001f601", "é", "\ud7ff", "\ue000", "\uffff"], id="wide"),
        pytest.param(["", "\x00", "\x1f", "a", "a"], id="empty-and-controls"),
    ],
)
def test_extra_keys_and_name_spellings_partition_the_strings(names) -> None:
    """Every JSON string is either a spelling of a name or in the extra-key language."""
    from grammar.automata import dfa_ops
    from grammar.automata import regex_ast as ra
    from grammar.automata.fsm import node_to_dfa
    from grammar.json_schema.exact.names import name_spellings, string_except
    from grammar.json_schema.scalars import STRING_CHAR_TEXT, STRING_TEXT

    extra = string_except(names, ra.parsed(STRING_CHAR_TEXT))
    spelt = ra.alt([name_spellings(n) for n in names])
    strings, either = node_to_dfa(ra.parsed(STRING_TEXT)), node_to_dfa(ra.alt([extra, spelt]))
    assert not dfa_ops.product(node_to_dfa(extra), node_to_dfa(spelt), True).accepting.any()
    assert not dfa_ops.product(strings, either, False).accepting.any()
    assert not dfa_ops.product(either, strings, False).accepting.any()


# ----- oneOf whose branches may both match -----
@pytest.mark.parametrize(
    "schema, instances",
    [
        pytest.param(
            {"oneOf": [{"type": "integer"}, {"minimum": 2}]},
            [1, 2.5, 3, 1.5, 2, 2.0, -7, "x", None],
            id="integer-or-minimum",
        ),
        pytest.param(
            {"type": "string", "oneOf": [{"minLength": 2}, {"maxLength": 4}]},
            ["", "a", "abc", "abcd", "abcde", 5],
            id="string-lengths",
        ),
        pytest.param(
            {"oneOf": [{"type": "array", "maxItems": 2}, {"type": "array", "minItems": 1}]},
            [[], [1], [1, 2], [1, 2, 3], {}],
            id="array-counts",
        ),
        pytest.param({"oneOf": [True, True, False]}, [None, 1, {}], id="two-true"),
        pytest.param(
            {"$schema": D7, "oneOf": [{"type": "number"}, {"maximum": 3}]},
            [3, 4, 6.0, "x", 1.5, None],
            id="draft7-maximum",
        ),
    ],
)
def test_overlapping_oneOf_is_exactly_one_branch(schema, instances) -> None:
    assert_exact(schema, instances)


def test_overlapping_oneOf_with_a_branch_that_cannot_be_negated_is_refused() -> None:
    schema = {"oneOf": [{"type": "array", "items": {"pattern": "a"}}, {"type": "array"}]}
    with pytest.raises(UnsupportedSchemaError, match="oneOf"):
        grammar.compile_json_schema(schema, deepseek_vocab())


# ----- uniqueItems over finitely many values -----
METHODS = {"type": "string", "enum": ["GET", "POST", "PATCH", "PUT", "DELETE"]}


@pytest.mark.parametrize(
    "schema, instances",
    [
        pytest.param(
            {"type": "array", "items": METHODS, "uniqueItems": True},
            [[], ["GET"], ["GET", "GET"], ["PUT", "GET", "DELETE"], ["GET", "PUT", "GET"], ["x"]],
            id="enum-of-strings",
        ),
        pytest.param(
            {"items": {"enum": [1, 1.0, 2, "1"]}, "uniqueItems": True, "minItems": 2},
            [[1, 2], [1, 1.0], Text("[1.0,1]"), Text("[2,2.00]"), [1, "1"], [2]],
            id="numbers-by-value",
        ),
        pytest.param(
            {
                "$schema": D7,
                "items": [{"type": "boolean"}, {"type": "boolean"}],
                "additionalItems": False,
                "uniqueItems": True,
            },
            [[], [True], [True, False], [False, False], [True, False, None]],
            id="draft7-item-list",
        ),
        pytest.param(
            {
                "prefixItems": [{"const": "a"}],
                "items": {"type": ["boolean", "null"]},
                "uniqueItems": True,
                "maxItems": 3,
            },
            [["a"], ["a", None, True], ["a", True, True], [None], ["a", False, None, True]],
            id="prefix-then-scalars",
        ),
        pytest.param(
            {"items": {"type": "string"}, "uniqueItems": True, "maxItems": 1},
            [[], ["a"], ["a", "b"], [1]],
            id="at-most-one-item",
        ),
    ],
)
def test_unique_items_over_finite_values_are_exact(schema, instances) -> None:
    assert_exact(schema, instances)


@pytest.mark.parametrize(
    "schema, detail",
    [
        pytest.param({"items": {"type": "string"}, "uniqueItems": True}, "infinitely", id="str"),
        pytest.param({"items": {"enum": list(range(13))}, "uniqueItems": True}, "over 12", id="13"),
        pytest.param(
            {"items": {"enum": [1, 2]}, "uniqueItems": True, "contains": {"const": 1}},
            "contains",
            id="contains",
        ),
    ],
)
def test_unique_items_over_other_items_are_refused(schema, detail) -> None:
    with pytest.raises(UnsupportedSchemaError, match=detail):
        grammar.compile_json_schema(schema, deepseek_vocab())


# ----- unconstrained values nested 5 deep -----
def test_unconstrained_values_nest_five_levels_in_a_compiled_constraint() -> None:
    deep = {"a": [{"b": [{"c": [1]}]}]}  # 6 containers: nested 5 levels below the first
    walks = exact_walks({"properties": {"x": {}}}, [{"x": deep}, {"x": {"y": deep}}])
    assert [(ok, valid) for _, ok, valid in walks] == [(True, True), (False, True)]  # 7: cut
