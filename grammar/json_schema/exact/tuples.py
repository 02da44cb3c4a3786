"""The conjunction of two arrays schemas with `prefixItems` (2020-12 tuples), element by
element: position i must satisfy both sides' schema for it (its `prefixItems` entry, or its
`items` past its prefix, any value when it has neither), later positions both `items`."""

from __future__ import annotations

from typing import Any

from grammar.errors import UnsupportedSchemaError

_TUPLE_KEYS = ("prefixItems", "items")


def merged_tuples(a: dict, b: dict, ptr: str) -> tuple[dict, dict]:
    """(a with the element-wise conjunction of both sides' prefixItems / items, b without
    them); the draft-7 tuple form (`items` a list) is refused."""
    if any(isinstance(s.get("items"), list) for s in (a, b)):
        raise UnsupportedSchemaError("allOf", ptr, "prefixItems with an items list")
    pa, pb = a.get("prefixItems", []), b.get("prefixItems", [])
    if not isinstance(pa, list) or not isinstance(pb, list):
        raise UnsupportedSchemaError("prefixItems", ptr, "prefixItems must be a list")
    rest_a, rest_b = a.get("items", True), b.get("items", True)
    prefix = [
        _both(pa[i] if i < len(pa) else rest_a, pb[i] if i < len(pb) else rest_b)
        for i in range(max(len(pa), len(pb)))
    ]
    out = {k: v for k, v in a.items() if k not in _TUPLE_KEYS}
    out["prefixItems"] = prefix
    if "items" in a or "items" in b:
        out["items"] = _both(rest_a, rest_b)
    return out, {k: v for k, v in b.items() if k not in _TUPLE_KEYS}


def _both(x: Any, y: Any) -> Any:
    if x is True or x == {}:
        return y
    if y is True or y == {}:
        return x
    return False if x is False or y is False else {"allOf": [x, y]}
