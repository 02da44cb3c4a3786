"""JSON Schema's vocabulary as this package reads it: the keywords that only annotate (they
constrain nothing, so every path ignores them), and the JSON types of a value, of a schema's
`type` keyword and of its `enum` / `const`."""

from __future__ import annotations

from typing import Any

ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "examples",
        "example",
        "$schema",
        "$id",
        "id",
        "default",
        "$comment",
        "readOnly",
        "writeOnly",
        "deprecated",
        "contentMediaType",
        "contentEncoding",
        "contentSchema",
        "$anchor",
        "$vocabulary",
        "$dynamicAnchor",
        "$defs",
        "definitions",
        "discriminator",
        "nullable",
        "xml",
        "externalDocs",
    }
)
JSON_TYPES = ("string", "integer", "number", "boolean", "null", "object", "array")


def type_set(schema: dict) -> set[str]:
    """The types a schema's `type` allows (all when it has none; `number` includes `integer`)."""
    t = schema.get("type")
    if t is None:
        return set(JSON_TYPES)
    types = set(t if isinstance(t, list) else [t])
    if "number" in types:
        types.add("integer")
    return types


def kind_of(v: Any) -> str:
    """The JSON type of a value (an integral float is an `integer`, as JSON Schema counts)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def values_of(s: dict) -> list | None:
    if "const" in s:
        return [s["const"]]
    return list(s["enum"]) if "enum" in s else None


def possible_types(s: dict) -> set[str]:
    values = values_of(s)
    types = type_set(s)
    if values is not None:
        kinds = {kind_of(v) for v in values}
        types &= kinds | ({"number"} if "integer" in kinds else set())
    return types
