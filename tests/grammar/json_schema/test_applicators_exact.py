"""In-place applicators compiled exactly: unevaluatedProperties / unevaluatedItems
beside conditional applicators, prefixItems merged element by element, `not` of tuples and of
alternatives, $dynamicRef through the dynamic scope, objects with the same patterns merged.
Each instance is walked through the compiled constraint, `jsonschema` the oracle (helpers:
tests/support/exact_walks.py)."""

from __future__ import annotations

import pytest

from tests.support.exact_walks import assert_exact

D2020 = "https://json-schema.org/draft/2020-12/schema"


# ----- unevaluatedProperties beside conditional applicators -----
BAR, BAZ = {"properties": {"bar": {"const": 1}}}, {"properties": {"baz": {"const": 2}}}


@pytest.mark.parametrize(
    "schema, instances",
    [
        pytest.param(
            {"$schema": D2020, "anyOf": [BAR, BAZ], "unevaluatedProperties": False},
            [{}, {"bar": 1}, {"baz": 2}, {"bar": 1, "baz": 2}, {"bar": 2}, {"bar": 1, "q": 0}],
            id="anyOf",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "oneOf": [BAR, {"required": ["baz"]}],
                "unevaluatedProperties": False,
            },
            [{"bar": 1}, {"baz": 2}, {"bar": 1, "baz": 2}, {"bar": 2, "baz": 2}, {"q": 1}],
            id="oneOf",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "if": {"required": ["bar"]},
                "then": BAR,
                "else": BAZ,
                "unevaluatedProperties": {"type": "string"},
            },
            [{"bar": 1}, {"bar": 1, "baz": 2}, {"bar": 1, "baz": "x"}, {"baz": 2}, {"baz": 3}],
            id="if-then-else",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "properties": {"foo": {}},
                "dependentSchemas": {"foo": BAR},
                "unevaluatedProperties": False,
            },
            [{"foo": 1}, {"foo": 1, "bar": 1}, {"bar": 1}, {"foo": 1, "bar": 2}, {}],
            id="dependentSchemas",
        ),
        pytest.param(
            {"$schema": D2020, "allOf": [{"oneOf": [BAR, BAZ]}], "unevaluatedProperties": False},
            [{"bar": 1}, {"baz": 2}, {"bar": 1, "baz": 2}, {}, {"x": 1}],
            id="oneOf-in-allOf",
        ),
    ],
)
def test_unevaluated_properties_beside_conditional_applicators_are_exact(schema, instances) -> None:
    assert_exact(schema, instances)


# ----- prefixItems merged element by element; unevaluatedItems past an evaluated prefix -----
@pytest.mark.parametrize(
    "schema, instances",
    [
        pytest.param(
            {
                "$schema": D2020,
                "prefixItems": [{"type": "integer"}],
                "allOf": [{"prefixItems": [{"minimum": 2}, {"type": "string"}]}],
            },
            [[], [1], [2], [2, "x"], [2, 3], [2, "x", None], [2.5]],
            id="prefix-and-prefix",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "prefixItems": [True, {"type": "null"}],
                "allOf": [{"items": {"type": ["integer", "null"]}}],
                "items": {"const": 7},
            },
            [[1, None], ["x"], [1, None, 7], [1, None, 8], [None]],
            id="prefix-and-items",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "allOf": [{"prefixItems": [True, True]}],
                "unevaluatedItems": {"type": "boolean"},
            },
            [[1, 2], [1, 2, True], [1, 2, 3], ["a"]],
            id="unevaluated-past-allOf-prefix",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "prefixItems": [{"const": "a"}],
                "anyOf": [
                    {"prefixItems": [True, {"const": "b"}]},
                    {"prefixItems": [True, True, True]},
                ],
                "unevaluatedItems": False,
            },
            [["a", "b"], ["a", "c"], ["a", "b", 1], ["a", "c", 1], ["a", "b", 1, 2], ["a"]],
            id="unevaluated-items-anyOf",
        ),
    ],
)
def test_tuples_merge_element_by_element(schema, instances) -> None:
    assert_exact(schema, instances)


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"not": {"prefixItems": [{"type": "integer"}, {"const": "x"}]}}, id="prefix"),
        pytest.param({"not": {"items": {"type": "integer"}}}, id="items"),
        pytest.param({"not": {"prefixItems": [True], "items": False}}, id="items-false"),
    ],
)
def test_not_of_tuples_and_items_is_exact(schema) -> None:
    assert_exact(schema, [[], [1], ["a"], [1, "x"], [1, "y"], [1, "x", 3], [2.5, "x"], "s", {}])


# ----- $dynamicRef through the dynamic scope -----
GENERIC = {
    "$id": "generic",
    "type": "array",
    "items": {"$dynamicRef": "#item"},
    "$defs": {"default": {"$dynamicAnchor": "item"}},
}


def _typed_list(name: str, t: str) -> dict:
    return {"$id": name, "$defs": {"t": {"$dynamicAnchor": "item", "type": t}}, "$ref": "generic"}


@pytest.mark.parametrize(
    "schema, instances",
    [
        pytest.param(
            {
                "$schema": D2020,
                "$id": "https://example.test/root",
                "$ref": "generic",
                "$defs": {"s": {"$dynamicAnchor": "item", "type": "string"}, "generic": GENERIC},
            },
            [[], ["a", "b"], [1], ["a", None]],
            id="outermost-anchor",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "$id": "https://example.test/two",
                "properties": {"n": {"$ref": "numbers"}, "s": {"$ref": "strings"}},
                "$defs": {
                    "generic": GENERIC,
                    "numbers": _typed_list("numbers", "number"),
                    "strings": _typed_list("strings", "string"),
                },
            },
            [{"n": [1.5], "s": ["x"]}, {"n": ["x"]}, {"s": [1]}, {"n": [], "s": []}],
            id="two-paths",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "$id": "https://example.test/left",
                "properties": {
                    "a": {
                        "$id": "scope",
                        "$defs": {"t": {"$dynamicAnchor": "item", "type": "null"}},
                    },
                    "b": {"$ref": "generic"},
                },
                "$defs": {"generic": GENERIC},
            },
            [{"a": 1, "b": [1, "x"]}, {"b": [None]}],
            id="scope-left-behind",
        ),
    ],
)
def test_dynamic_refs_resolve_through_the_dynamic_scope(schema, instances) -> None:
    assert_exact(schema, instances)


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"not": {"anyOf": [{"type": "integer"}, {"maxLength": 1}]}}, id="anyOf"),
        pytest.param({"not": {"oneOf": [{"type": "integer"}, {"minimum": 2}]}}, id="oneOf"),
        pytest.param({"not": {"if": {"minimum": 2}, "then": {"type": "integer"}}}, id="if-then"),
    ],
)
def test_not_of_alternatives_is_exact(schema) -> None:
    assert_exact(schema, [1, 2, 3, 2.5, 1.5, "a", "ab", None, [], {}])


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(
            {
                "allOf": [
                    {
                        "patternProperties": {"^a": {"type": "integer"}},
                        "properties": {"b": {"type": "string"}},
                    },
                    {
                        "patternProperties": {"^a": {"minimum": 2}},
                        "additionalProperties": False,
                        "properties": {"ab": {"maximum": 5}},
                    },
                ]
            },
            id="same-patterns",
        ),
        pytest.param(
            {
                "$schema": D2020,
                "properties": {"foo": {"type": "string"}},
                "allOf": [{"patternProperties": {"^bar": {"type": "string"}}}],
                "unevaluatedProperties": False,
            },
            id="unevaluated-beside-patterns",
        ),
    ],
)
def test_objects_with_the_same_patterns_merge_exactly(schema) -> None:
    instances = [{}, {"a": 1}, {"a": 3}, {"ab": 3}, {"ab": 7}, {"b": "x"}, {"b": 1}, {"c": 1}]
    more = [{"a": "x"}, {"foo": "x", "bar": "y"}, {"bark": 1}, {"baz": 1}]
    assert_exact(schema, [*instances, *more])


@pytest.mark.parametrize(
    ("schema", "inner"),
    [
        (  # a refused keyword in one anyOf branch
            {
                "type": "object",
                "anyOf": [
                    {"properties": {"a": {"type": "string"}}},
                    {
                        "properties": {
                            "b": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
                        }
                    },
                ],
                "unevaluatedProperties": False,
            },
            "uniqueItems",
        ),
        (  # oneOf's "and not the others" needs a negation that cannot be exact
            {
                "properties": {
                    "box": {
                        "type": "object",
                        "oneOf": [
                            {"properties": {"a": {"pattern": "^x"}}},
                            {"properties": {"a": {"pattern": "^y"}}},
                        ],
                        "unevaluatedProperties": False,
                    }
                },
            },
            "not",
        ),
    ],
)
def test_refusals_inside_an_unevaluated_case_split_name_the_users_keyword(schema, inner) -> None:
    """The split's cases are made up (`anyOf` of `allOf`s): a refusal inside one names the
    unevaluated* keyword where the user wrote it, and what was refused."""
    from grammar import UnsupportedSchemaError
    from grammar.json_schema.schema import json_schema_to_node

    with pytest.raises(UnsupportedSchemaError) as caught:
        json_schema_to_node(schema)
    e = caught.value
    at = (
        "#/properties/box/unevaluatedProperties"
        if "properties" in schema and "box" in schema["properties"]
        else "#/unevaluatedProperties"
    )
    assert (e.keyword, e.pointer) == ("unevaluatedProperties", at)
    assert f"{inner!r} is refused" in str(e)
    assert "allOf" not in e.pointer
