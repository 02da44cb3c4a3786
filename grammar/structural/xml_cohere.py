"""Cohere's XML argument style (`cohere_xml`, XGrammar's semantics): every value is a tag that
says how it is written,

    <cofl:value name="KEY" type="TYPE">VALUE</cofl:value>

TYPE `raw`: a string, raw text as in the other XML styles (`grammar.structural.xml_args`);
`dict`: an object, its parameters as tags of the same kind (declared ones in order, then the
extras of `grammar.structural.xml_extras`), white space between them; `list`: an array, its
items as tags without `name`; `json`: any other value (numbers, booleans, null, `{}`, and
`const` / `enum` values that are not strings) as JSON. A schema that may be written more ways
(`anyOf`, a type list, an `enum` of strings and others) takes each way with its own TYPE.
Refused by name: a recursive `$ref` (the tags nest only as deep as the schema does), `oneOf`
options that share a TYPE, `allOf` of more than one schema, and array or object keywords this
does not build.
"""

from __future__ import annotations

import json
from typing import Any

from grammar.ebnf.syntax import Alt, Lit, Rep, Seq

_ANNOTATIONS = {"title", "description", "examples", "default", "$comment", "deprecated"}
_OBJECT_KEYS = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
}
_ARRAY_KEYS = _ANNOTATIONS | {"type", "items", "prefixItems", "minItems", "maxItems"}
_JSON_TYPES = ("integer", "number", "boolean", "null")


def cohere_param(xml: Any, name: object, sub: Any, at: str) -> object:
    """One parameter (or list item: `name` empty) of schema `sub`, each way it can be written."""
    params = [
        Seq((Lit("<cofl:value"), name, Lit(f' type="{tag}">'), value, Lit("</cofl:value>")))
        for tag, value in _ways(xml, sub, at)
    ]
    return params[0] if len(params) == 1 else Alt(tuple(params))


def _ways(xml: Any, sub: Any, at: str) -> list[tuple[str, object]]:
    if isinstance(sub, dict) and "$ref" in sub:
        ref = sub["$ref"]
        if ref in xml.cohere_refs or ref == "#":
            raise xml.refuse(f"a recursive $ref ({ref!r})", at)
        target = xml._resolved(sub, at)
        xml.cohere_refs.append(ref)
        try:
            return _ways(xml, target, at)
        finally:
            xml.cohere_refs.pop()
    if sub is False:
        return []
    if sub is True or (isinstance(sub, dict) and set(sub) <= _ANNOTATIONS):
        return [("json", _json(xml, {}, at))]
    values = [sub["const"]] if "const" in sub else sub.get("enum")
    if isinstance(values, list):
        texts = [v for v in values if isinstance(v, str)]
        others = [json.dumps(v, separators=(",", ":")) for v in values if not isinstance(v, str)]
        ways = [(tag, Seq((xml.ws, Alt(tuple(map(Lit, vs))), xml.ws))) for tag, vs in
                (("raw", texts), ("json", others)) if vs]  # fmt: skip
        return ways
    for key in ("anyOf", "oneOf"):
        if key in sub:
            return _options(xml, sub, key, at)
    if "allOf" in sub:
        if len(sub["allOf"]) != 1 or set(sub) - _ANNOTATIONS - {"allOf"}:
            raise xml.refuse("allOf of more than one schema (or beside other keywords)", at)
        return _ways(xml, sub["allOf"][0], f"{at}/allOf/0")
    types = sub.get("type")
    if isinstance(types, list):
        return [w for t in types for w in _ways(xml, {**sub, "type": t}, at)]
    if types == "string":
        return [("raw", xml._string(sub, at))]
    if types == "object":
        extra = set(sub) - _OBJECT_KEYS
        if extra:
            raise xml.refuse(f"the object keyword {sorted(extra)[0]!r}", at)
        return [("dict", xml.body(sub, at))]
    if types == "array":
        return [("list", _array(xml, sub, at))]
    if types in _JSON_TYPES:
        return [("json", _json(xml, sub, at))]
    raise xml.refuse("a schema without one of the JSON types", at)


def _options(xml: Any, sub: dict, key: str, at: str) -> list[tuple[str, object]]:
    if set(sub) - _ANNOTATIONS - {key}:
        raise xml.refuse(f"{key} beside other keywords", at)
    ways = [w for i, o in enumerate(sub[key]) for w in _ways(xml, o, f"{at}/{key}/{i}")]
    tags = [tag for tag, _ in ways]
    if key == "oneOf" and len(set(tags)) != len(tags):
        raise xml.refuse("oneOf options written with the same Cohere type", at)
    return ways


def _json(xml: Any, sub: Any, at: str) -> object:
    with_defs = {**sub, **xml.defs} if xml.defs and sub else sub
    return Seq((xml.ws, xml.json_leaf(with_defs, f"{xml.where}.json_schema{at}"), xml.ws))


def _array(xml: Any, sub: dict, at: str) -> object:
    extra = set(sub) - _ARRAY_KEYS
    if extra:
        raise xml.refuse(f"the array keyword {sorted(extra)[0]!r}", at)
    items = sub.get("items")
    prefix = sub.get("prefixItems", [])
    if isinstance(items, list):  # the older spelling of prefixItems
        prefix, items = items, None
    if items is None:
        items = True if (not prefix or not xml.strict) else False
    lo, hi = int(sub.get("minItems", 0)), sub.get("maxItems")
    hi = None if hi is None else int(hi)
    heads = [
        Seq((cohere_param(xml, Seq(()), s, f"{at}/prefixItems/{i}"), xml.ws))
        for i, s in enumerate(prefix)
    ]
    more = None
    if items is not False:
        more = Seq((cohere_param(xml, Seq(()), items, f"{at}/items"), xml.ws))
    shapes = []
    for k in range(len(heads) + 1):
        if (hi is not None and k > hi) or (k < len(heads) and k < lo):
            continue
        if k < len(heads):
            shapes.append(Seq(tuple(heads[:k])))
        elif more is not None:
            top = None if hi is None else hi - k
            shapes.append(Seq((*heads, Rep(more, max(0, lo - k), top))))
        elif k >= lo:
            shapes.append(Seq(tuple(heads)))
    return Seq((xml.ws, Alt(tuple(shapes))))
