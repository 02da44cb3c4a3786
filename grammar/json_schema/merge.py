"""Schema normalisation: $ref resolution and allOf merging into one flat schema dict.

A normalised schema has no $ref and no allOf; alternatives are kept as a list of groups
`_alts = [(kind, [branch, ...], pointer), ...]` ("anyOf" / "oneOf") that the regex builder
distributes over. Merging is exact or raises UnsupportedSchemaError.
"""

from __future__ import annotations

import json
import math
from typing import Any

from grammar.errors import UnsupportedSchemaError
from grammar.json_schema.exact.tuples import merged_tuples
from grammar.json_schema.number_grid import exact
from grammar.json_schema.refs.local import local_refs  # noqa: F401  (re-exported for callers)
from grammar.json_schema.vocabulary import ANNOTATIONS, type_set

UNSUPPORTED = (
    "dependencies",
    "dependentRequired",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
)
# keywords that constrain instances (anything else is an annotation)
ASSERTIONS = frozenset(
    {
        "type",
        "enum",
        "const",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "format",
        "items",
        "prefixItems",
        "additionalItems",
        "maxItems",
        "minItems",
        "uniqueItems",
        "contains",
        "maxProperties",
        "minProperties",
        "required",
        "properties",
        "patternProperties",
        "additionalProperties",
        "propertyNames",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "if",
        "then",
        "else",
        "not",
        "allOf",
        "anyOf",
        "oneOf",
        "$ref",
        "unevaluatedItems",
        "unevaluatedProperties",
        "minContains",
        "maxContains",
    }
)
# (minContains / maxContains: merged only beside one `contains`; two different ones raise)
_MIN_KEYS = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum", "minContains")
_MAX_KEYS = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum", "maxContains")


def canonical(value: Any) -> str:
    """A key equal for equal JSON values (numbers by value: 2 and 2.0 are one)."""
    return json.dumps(_numbers_by_value(value), sort_keys=True, separators=(",", ":"))


def _numbers_by_value(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_numbers_by_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _numbers_by_value(v) for k, v in value.items()}
    return value


def merge(a: dict | bool, b: dict | bool, ptr: str) -> dict | bool:
    """The conjunction of two normalised schemas (both without $ref / allOf)."""
    if a is False or b is False:
        return False
    if a is True:
        return b
    if b is True:
        return a
    if "prefixItems" in a or "prefixItems" in b:  # tuples: element by element
        a, b = merged_tuples(a, b, ptr)
    patterned = _pattern_side(a, b, ptr)
    out = dict(a)
    for key, bv in b.items():
        if key in ANNOTATIONS:
            continue
        if key not in out:
            out[key] = bv
            continue
        av = out[key]
        if key not in ("properties", "_alts") and (av is bv or canonical(av) == canonical(bv)):
            continue
        if key == "type":
            both = type_set({"type": av}) & type_set({"type": bv})
            if not both:
                return False
            out[key] = sorted(both)
        elif key == "multipleOf" and (both := _common_multiple(av, bv)) is not None:
            out[key] = both
        elif key in ("enum", "const"):
            other = {canonical(x) for x in _values(bv, key)}
            keep = [v for v in _values(av, key) if canonical(v) in other]
            out.pop("const", None)
            out["enum"] = keep
            if not keep:
                return False
        elif key in _MIN_KEYS and not isinstance(av, bool) and not isinstance(bv, bool):
            out[key] = max(av, bv)
        elif key in _MAX_KEYS and not isinstance(av, bool) and not isinstance(bv, bool):
            out[key] = min(av, bv)
        elif key == "required":
            out[key] = list(dict.fromkeys([*av, *bv]))
        elif key == "pattern":  # both hold: the string automaton intersects them
            out["_patterns"] = [*out.get("_patterns", []), bv]
        elif key in ("_alts", "_refs", "_not_values", "_patterns"):
            out[key] = [*av, *bv]
        elif key in ("properties", "additionalProperties", "patternProperties"):
            continue  # handled together below (patterns: beside the same patterns)
        elif (
            key == "items"
            and isinstance(av, dict | bool)
            and isinstance(bv, dict | bool)
            and "prefixItems" not in a
            and "prefixItems" not in b
        ):
            out[key] = {"allOf": [av, bv]}
        elif key in ASSERTIONS:
            raise UnsupportedSchemaError("allOf", ptr, f"cannot merge two different {key!r}")
        # else: a keyword outside the vocabulary is an annotation (kept from the first side)
    if patterned is _SAME_PATTERNS:
        _merge_same_patterns(out, a, b)
    elif patterned is _OPEN_PATTERNS:
        _merge_open_patterns(out, a, b)
    elif patterned is not None:
        order = [*a.get("properties", {}), *b.get("properties", {})]
        _merge_pattern_object(out, *patterned, order)
    elif "properties" in b or "additionalProperties" in b:
        _merge_object(out, a, b)
    return out


def _pattern_side(a: dict, b: dict, ptr: str) -> tuple[dict, dict] | None:
    """(plain side, patterned side) when one side has patternProperties and the other
    object keywords; None when neither has patterns. Each side's patternProperties /
    additionalProperties judge keys by that side's own properties, so the conjunction is
    one object only when the plain side's additionalProperties is true or false."""
    pa, pb = "patternProperties" in a, "patternProperties" in b
    if not (pa or pb):
        return None
    plain, patterned = (b, a) if pa else (a, b)
    if not any(k in plain for k in ("properties", "additionalProperties", "patternProperties")):
        return None  # nothing to combine: the patterned side's keywords are copied
    if pa and pb and set(a["patternProperties"]) == set(b["patternProperties"]):
        return _SAME_PATTERNS
    if pa and pb and all(x.get("additionalProperties", True) in (True, {}) for x in (a, b)):
        return _OPEN_PATTERNS
    if pa and pb:
        raise UnsupportedSchemaError(
            "allOf", ptr, "patternProperties on both sides, one with additionalProperties"
        )
    if plain.get("additionalProperties", True) not in (True, False, {}):
        raise UnsupportedSchemaError("allOf", ptr, "patternProperties with additionalProperties")
    return plain, patterned


_SAME_PATTERNS = ({}, {})  # both sides have patternProperties, with the same patterns
_OPEN_PATTERNS = ({}, {})  # both sides have patternProperties, neither additionalProperties


def _merge_open_patterns(out: dict, a: dict, b: dict) -> None:
    """Conjunction of two objects with patternProperties and no additionalProperties: a name
    takes its properties' schemas and every matching pattern's, on each side alike, so the
    properties and the patterns of both sides together say it (a shared one: both schemas)."""
    _merge_object(out, a, b)
    pats = dict(a["patternProperties"])
    for p, schema in b["patternProperties"].items():
        pats[p] = _all_of(pats[p], schema) if p in pats else schema
    out["patternProperties"] = pats


def _merge_same_patterns(out: dict, a: dict, b: dict) -> None:
    """Conjunction of two objects with the same patternProperties patterns: a key matches
    them on both sides or on neither, so each pattern's schemas, each name's (a side
    without the name: its additionalProperties where no pattern matches) and the
    additionalProperties are conjoined one by one."""
    import re

    pats = a["patternProperties"]
    out["patternProperties"] = {p: _all_of(pats[p], b["patternProperties"][p]) for p in pats}
    props: dict[str, Any] = {}
    for name in dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]):
        try:
            patterned = any(re.search(p, name) for p in pats)
        except re.error as e:
            raise UnsupportedSchemaError("patternProperties", "#", str(e)) from None
        sides = []
        for x in (a, b):
            other = True if patterned else x.get("additionalProperties", True)
            sides.append(x.get("properties", {}).get(name, other))
        props[name] = False if False in sides else _all_of(*sides)
    out["properties"] = props
    xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
    out["additionalProperties"] = False if False in (xa, xb) else _all_of(xa, xb)


def _merge_pattern_object(out: dict, plain: dict, patterned: dict, order: list[str]) -> None:
    """Conjunction of an object without patterns (`plain`, additionalProperties true or
    false) and one with patternProperties: every name of either side gets both sides'
    schemas; other keys follow the patterned side, or are forbidden when `plain` is closed."""
    import re

    pp = patterned["patternProperties"]
    closed = plain.get("additionalProperties", True) is False
    xb = patterned.get("additionalProperties", True)
    names = dict.fromkeys(order)  # the first side's properties first, as the other merges
    props: dict[str, Any] = {}
    for name in names:
        if closed and name not in plain.get("properties", {}):
            props[name] = False
            continue
        side_a = plain.get("properties", {}).get(name, True)
        try:
            matching = [v for p, v in pp.items() if re.search(p, name)]
        except re.error as e:
            raise UnsupportedSchemaError("patternProperties", "#", str(e)) from None
        if name in patterned.get("properties", {}):
            side_b = patterned["properties"][name]
            side_b = _all_of(side_b, {"allOf": matching}) if closed and matching else side_b
        elif matching:  # the merged patterns apply to it (unless closed: applied here)
            side_b = {"allOf": matching} if closed else True
        else:
            side_b = xb
        props[name] = False if (side_a is False or side_b is False) else _all_of(side_a, side_b)
    out["properties"] = props
    if closed:
        out.pop("patternProperties", None)
        out["additionalProperties"] = False
    else:
        out["patternProperties"] = pp
        out["additionalProperties"] = xb


def _common_multiple(a: Any, b: Any) -> Any:
    """The least common multiple of two multipleOf values when it is one of them or both
    are integers (exact); None otherwise (the caller refuses the merge)."""
    try:
        x, y = exact(a), exact(b)
    except (TypeError, ValueError):
        return None
    if x <= 0 or y <= 0:
        return None
    if (x / y).denominator == 1:
        return a
    if (y / x).denominator == 1:
        return b
    if x.denominator == y.denominator == 1:
        return math.lcm(int(x), int(y))
    return None


def _values(v: Any, key: str) -> list:
    return [v] if key == "const" else list(v)


def _merge_object(out: dict, a: dict, b: dict) -> None:
    """Properties of a conjunction: a key allowed by one side must be allowed by the other
    (through its properties or additionalProperties)."""
    pa, pb = a.get("properties", {}), b.get("properties", {})
    xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
    props: dict[str, Any] = {}
    for name in dict.fromkeys([*pa, *pb]):
        sa = pa.get(name, xa)
        sb = pb.get(name, xb)
        props[name] = False if (sa is False or sb is False) else _all_of(sa, sb)
    out["properties"] = props
    if xa is False or xb is False:
        out["additionalProperties"] = False
    else:
        out["additionalProperties"] = _all_of(xa, xb)


def _all_of(a: Any, b: Any) -> Any:
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    return {"allOf": [a, b]}
