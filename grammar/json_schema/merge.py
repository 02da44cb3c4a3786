"""Schema normalisation: $ref resolution and allOf merging into one flat schema dict.

A normalised schema has no $ref and no allOf; alternatives are kept as a list of groups
`_alts = [(kind, [branch, ...], pointer), ...]` ("anyOf" / "oneOf") that the regex builder
distributes over. Merging is exact or raises UnsupportedSchemaError.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urljoin, urlsplit, uses_relative

from grammar.errors import UnsupportedSchemaError
from grammar.json_schema.exact.tuples import merged_tuples
from grammar.json_schema.number_grid import exact

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
_TYPES = ("string", "integer", "number", "boolean", "null", "object", "array")


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


def type_set(schema: dict) -> set[str]:
    t = schema.get("type")
    if t is None:
        return set(_TYPES)
    types = set(t if isinstance(t, list) else [t])
    if "number" in types:
        types.add("integer")
    return types


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
        if canonical(av) == canonical(bv) and key not in ("properties", "_alts"):
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
        elif key in ("_alts", "_refs", "_not_values"):
            out[key] = [*av, *bv]
        elif key in ("properties", "additionalProperties"):
            continue  # handled together below
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
    if patterned is not None:
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
    if pa and pb:
        raise UnsupportedSchemaError("allOf", ptr, "patternProperties on both sides")
    if plain.get("additionalProperties", True) not in (True, False, {}):
        raise UnsupportedSchemaError("allOf", ptr, "patternProperties with additionalProperties")
    return plain, patterned


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


# ----- references through $id / $anchor (local_refs)
# `$ref`s through `$id`, `$anchor` and relative URIs inside one document, made local.
#
# The builders resolve `#` and `#/json/pointer` references against the document root. A
# schema whose references go through base URIs (`$id`, draft 7's `"$id": "#name"`), anchors
# (`$anchor`, and `$dynamicAnchor`, which a plain `$ref` treats as an anchor) or relative URIs
# is rewritten first: every `$ref` that names a place in this document becomes the JSON pointer
# of that place from the root, and the identifiers are dropped (the rewritten document has one
# base, so the validator that checks enum values reads it the same way). References that
# name no place here (other documents, unknown anchors) are left as they are: the builders
# refuse them with UnsupportedSchemaError naming `$ref`. A `$dynamicRef` is a `$ref` when its
# anchor is the `$dynamicAnchor` of at most one schema here (dynamic scope then finds that
# one or none); with more it stays, and is refused.
DEFAULT_BASE = "https://root.invalid/schema.json"  # the root's URI when it has no $id
_IDS = ("$id", "$anchor", "$dynamicAnchor")
# keywords whose value is a schema, a list of schemas, or a name -> schema map
_ONE = (
    "additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
    "contains", "not", "if", "then", "else", "propertyNames", "contentSchema", "items",
)  # fmt: skip
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
        "dependencies")  # fmt: skip


def pointer_part(name: str) -> str:
    """One JSON pointer token (escaped; "%" encoded, as the resolver decodes it)."""
    return name.replace("~", "~0").replace("/", "~1").replace("%", "%25")


def subschemas(schema: dict) -> list[tuple[str, Any]]:
    """(pointer suffix, subschema) for each subschema directly under `schema`."""
    out: list[tuple[str, Any]] = []
    for key in _ONE:
        if isinstance(schema.get(key), dict | bool):
            out.append((f"/{pointer_part(key)}", schema[key]))
    for key in _LIST:
        if isinstance(schema.get(key), list):
            out += [(f"/{key}/{i}", s) for i, s in enumerate(schema[key])]
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            out += [
                (f"/{pointer_part(key)}/{pointer_part(n)}", s)
                for n, s in schema[key].items()
                if isinstance(s, dict | bool)
            ]
    return out


def join(base: str, ref: str) -> str | None:
    """`ref` resolved against `base` (None where the base cannot take a relative URI)."""
    if ref.startswith("#"):
        return base.split("#", 1)[0] + ref
    if urlsplit(ref).scheme:
        return ref
    if urlsplit(base).scheme in uses_relative:
        return urljoin(base, ref)
    return None


def _needs_rewrite(schema: Any, depth: int = 0) -> bool:
    if not isinstance(schema, dict) or depth > 200:
        return False
    if any(isinstance(schema.get(k), str) for k in _IDS):
        return True
    ref = schema.get("$ref")
    if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")) or "$dynamicRef" in schema:
        return True
    return any(_needs_rewrite(s, depth + 1) for _, s in subschemas(schema))


def local_refs(root: Any) -> Any:
    """`root` with its in-document references as root JSON pointers (see the module doc);
    `root` itself when it needs no rewriting."""
    if not _needs_rewrite(root):
        return root
    draft = root.get("$schema") if isinstance(root, dict) else None
    old = "draft-0" in str(draft or "")
    places: dict[str, str] = {}  # absolute URI (with fragment) -> pointer from the root
    bases: dict[int, str] = {}  # id(schema dict) -> its base URI
    dynamic: list[str] = []  # the $dynamicAnchor names, once per schema

    def index(schema: Any, base: str, ptr: str, depth: int) -> None:
        if not isinstance(schema, dict) or depth > 200:
            return
        sid = schema.get("$id")
        if isinstance(sid, str) and "$ref" in schema and draft is None:
            # draft 7 ignores an $id beside $ref, 2019-09 on apply it: say which
            raise UnsupportedSchemaError(
                "$id", f"#{ptr}", "beside $ref in a schema without $schema"
            )
        if isinstance(sid, str) and not (old and "$ref" in schema):  # draft 7: $ref wins
            uri = join(base, sid)
            if uri is not None:
                whole, _, frag = uri.partition("#")
                if frag and not frag.startswith("/"):  # draft 7: "$id": "#name" names it
                    places.setdefault(f"{whole}#{frag}", ptr)
                base = whole
                places.setdefault(base, ptr)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(schema.get(key), str):
                places.setdefault(f"{base}#{schema[key]}", ptr)
        if isinstance(schema.get("$dynamicAnchor"), str):
            dynamic.append(schema["$dynamicAnchor"])
        bases[id(schema)] = base
        for suffix, sub in subschemas(schema):
            index(sub, base, ptr + suffix, depth + 1)

    def target(base: str, ref: str) -> str | None:
        uri = join(base, ref)
        if uri is None:
            return None
        whole, _, frag = uri.partition("#")
        if not frag or frag.startswith("/"):
            at = places.get(whole)
            return None if at is None else "#" + at + frag
        at = places.get(f"{whole}#{frag}")
        return None if at is None else "#" + at

    def rewrite(schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict) or depth > 200:
            return schema
        out = {k: v for k, v in schema.items() if k not in _IDS}
        base = bases.get(id(schema), DEFAULT_BASE)
        if isinstance(schema.get("$ref"), str):
            local = target(base, schema["$ref"])
            if local is not None:
                out["$ref"] = local
        dref = schema.get("$dynamicRef")
        if isinstance(dref, str) and dynamic.count(dref.partition("#")[2]) <= 1:
            local = target(base, dref)
            if local is not None:
                del out["$dynamicRef"]
                if "$ref" in out:  # both apply
                    out["allOf"] = [*out.get("allOf", []), {"$ref": local}]
                else:
                    out["$ref"] = local
        for key in _ONE:
            if isinstance(schema.get(key), dict | bool):
                out[key] = rewrite(schema[key], depth + 1)
        for key in _LIST:
            if isinstance(schema.get(key), list):
                out[key] = [rewrite(s, depth + 1) for s in schema[key]]
        for key in _MAP:
            if isinstance(schema.get(key), dict):
                out[key] = {n: rewrite(s, depth + 1) for n, s in schema[key].items()}
        return out

    places[DEFAULT_BASE] = ""
    index(root, DEFAULT_BASE, "", 0)
    return rewrite(root, 0)
