"""Normalisation of a schema before it becomes a language: `$ref` resolution (local, with the
recursion budget), `allOf` merged into one conjunction, `anyOf` / `oneOf` / `if-then-else` /
`not` kept as alternative groups (`_alts`), `dependencies` with schemas as conditionals, and
`not` rewritten as the union of the ways to violate each keyword.

Functions of the schema builder (`builder.Builder`, passed as `b`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grammar.automata.pattern import losses, note_loss
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.json_schema.builder import Builder
from grammar.json_schema.exact.evaluated import conditional_cases
from grammar.json_schema.exact.exclusive import group_violations
from grammar.json_schema.merge import ASSERTIONS, UNSUPPORTED, merge
from grammar.json_schema.objects import DEPENDENCY_KEYS, name_lists
from grammar.json_schema.refs.local import ptr_escape
from grammar.json_schema.vocabulary import type_set

CASES_OF = "_cases_of"  # on the anyOf of an unevaluated* case split: where the keyword is


def resolve_ref(b: Builder, ref: str, ptr: str) -> Any:
    if not ref.startswith("#"):
        raise UnsupportedSchemaError("$ref", ptr, f"only local references: {ref!r}")
    if ref != "#" and not ref.startswith("#/"):
        raise UnsupportedSchemaError("$ref", ptr, f"no place here is named {ref!r}")
    try:
        node = b.reach.target(ref)
    except LookupError:
        raise UnsupportedSchemaError("$ref", ptr, f"cannot resolve {ref!r}") from None
    return node


def normalise(b: Builder, schema: Any, ptr: str) -> dict | bool:
    """Flatten $ref and allOf; returns False when the recursion budget is exhausted."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise GrammarError(f"schema at {ptr} is not an object or boolean")
    if "$ref" in schema and b.ref_overrides_siblings:
        schema = {"$ref": schema["$ref"]}  # draft 4..7: keywords beside $ref are ignored
    if "unevaluatedProperties" in schema or "unevaluatedItems" in schema:
        schema = unevaluated(b, schema, ptr)
    if "not" in schema and schema["not"] in (True, False, {}):
        if schema["not"] is not False:
            return False  # not {} / not true: nothing is valid
        schema = {k: v for k, v in schema.items() if k != "not"}
    negated = None
    if "not" in schema:  # as an anyOf of the ways to violate it
        negated = ("anyOf", violations(b, schema["not"], f"{ptr}/not"), f"{ptr}/not")
        if not negated[1]:
            return False
        schema = {k: v for k, v in schema.items() if k != "not"}
    schema = _integral_counts(schema, ptr)
    schema = _contains_counts(schema, ptr, b.ref_overrides_siblings)
    schema, dependent = _dependent_schemas(schema)
    conditional = None
    if "if" in schema and ("then" in schema or "else" in schema):
        # (if and then) or (not if and else): an anyOf of two schemas
        cond, then, other = schema["if"], schema.get("then", True), schema.get("else", True)
        branches = [{"allOf": [cond, then]}, {"allOf": [{"not": cond}, other]}]
        conditional = ("anyOf", branches, f"{ptr}/if")
    if "if" in schema or "then" in schema or "else" in schema:  # then / else alone: ignored
        schema = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
    for key in UNSUPPORTED:
        if key in schema and not (key in DEPENDENCY_KEYS and name_lists(schema[key])):
            raise UnsupportedSchemaError(key, f"{ptr}/{key}")
    out: dict | bool = {
        k: v for k, v in schema.items() if k not in ("$ref", "allOf", "anyOf", "oneOf", CASES_OF)
    }
    alts = []
    for kind in ("anyOf", "oneOf"):
        if kind in schema:
            branches = schema[kind]
            if not isinstance(branches, list) or not branches:
                raise GrammarError(f"{kind} at {ptr} must be a non-empty list")
            # a case split's refusals name the keyword split for, not its made-up cases
            where = schema.get(CASES_OF, f"{ptr}/{kind}")
            alts.append((kind, branches, where))
    if negated and len(negated[1]) > 1:
        alts.append(negated)
    if conditional:
        alts.append(conditional)
    if alts:
        out["_alts"] = alts
    if "$ref" in schema:
        ref = schema["$ref"]
        if b.ref_stack.count(ref) >= b.max_depth:
            note_loss()  # the recursion cut: deeper instances are left out
            return False
        b.ref_stack.append(ref)
        try:
            target = b.normalise(b.resolve_ref(ref, f"{ptr}/$ref"), ref)
        finally:
            b.ref_stack.pop()
        out = merge(target, out, f"{ptr}/$ref")
        if isinstance(out, dict):
            out["_refs"] = [*out.get("_refs", []), ref]
    for i, branch in enumerate(schema.get("allOf", [])):
        out = merge(out, b.normalise(branch, f"{ptr}/allOf/{i}"), f"{ptr}/allOf/{i}")
    for at, name, sub in dependent:  # if the name is present, the schema applies
        cond = b.normalise({"if": {"required": [name]}, "then": sub}, f"{ptr}/{at}")
        out = merge(out, cond, f"{ptr}/{at}")
    if negated and len(negated[1]) == 1:  # one way to violate it: a plain conjunction
        out = merge(out, b.normalise(negated[1][0], negated[2]), negated[2])
    return out


def violations(b: Builder, schema: Any, ptr: str) -> list:
    """Schemas whose union is exactly the instances that fail `schema` (for `not`): one
    per keyword of the conjunction, each the instances that keyword rejects. Keywords
    whose failures we cannot describe raise UnsupportedSchemaError naming `not`."""
    before = losses()
    n = b.normalise(schema, ptr)
    if n is False and losses() != before:
        raise UnsupportedSchemaError("not", ptr, "of a schema cut at the recursion depth")
    if n is True or n is False:
        return [True] if n is False else []
    out: list[Any] = []
    for kind, branches, where in n.get("_alts", []):
        if where.endswith("/not"):  # a `not` inside: its violations, not its schema
            raise UnsupportedSchemaError("not", ptr, "of a not of several keywords")
        out += group_violations(kind, branches)
    for key, v in n.items():
        if key not in ASSERTIONS:
            continue  # annotations and unknown keywords
        if key == "type":
            types = type_set(n)
            fractional = "integer" in types and "number" not in types
            if fractional and not b.integral_floats:  # draft 4: 1.0 is no integer
                raise UnsupportedSchemaError("not", ptr, "of integer (non-integer numbers)")
            if fractional:  # numbers with a non-zero fraction digit
                out.append({"type": "number", "_fractional": True})
            rest = [t for t in _ALL_TYPES if t not in types and not (fractional and t == "number")]
            if rest:
                out.append({"type": rest})
        elif key == "required":
            out += [{"type": "object", "properties": {name: False}} for name in v]
        elif key in _COUNT_KEYS and isinstance(v, int) and not isinstance(v, bool):
            kind, other = _COUNT_KEYS[key]
            if key.startswith("max"):
                out.append({"type": kind, other: v + 1})
            elif v > 0:
                out.append({"type": kind, other: v - 1})
        elif key == "propertyNames" and v is False:
            out.append({"type": "object", "minProperties": 1})
        elif key == "properties":
            for name, sub in v.items():
                if sub is False:
                    out.append({"type": "object", "required": [name]})
                elif sub is not True and sub != {}:
                    out.append(
                        {
                            "type": "object",
                            "required": [name],
                            "properties": {name: {"not": sub}},
                        }
                    )
        elif key in ("enum", "const"):
            values = [v] if key == "const" else list(v)
            if "const" in n and "enum" in n and key == "enum":
                continue  # merged already into one list
            out.append({"_not_values": [x for x in values if b.accepts(n, x)]})
        elif key == "additionalProperties" and v in (True, {}):
            continue
        elif key == "prefixItems" and isinstance(v, list):  # item i is there and fails
            out += [
                {"type": "array", "minItems": i + 1, "prefixItems": [*[True] * i, {"not": x}]}
                for i, x in enumerate(v)
                if x is not True and x != {}
            ]
        elif key == "items" and (v is True or v == {}):
            continue
        elif key == "items" and v is False:  # an item past the prefix
            out.append({"type": "array", "minItems": len(n.get("prefixItems", [])) + 1})
        elif key == "items" and isinstance(v, dict) and "prefixItems" not in n:
            out.append({"type": "array", "contains": {"not": v}})  # an item fails it
        elif key in _BOUND_KEYS and isinstance(v, int | float) and not isinstance(v, bool):
            out.append({"type": "number", _BOUND_KEYS[key]: v})  # the numbers past it
        else:
            raise UnsupportedSchemaError("not", ptr, f"cannot negate {key!r}")
    return out


_ALL_TYPES = ("string", "number", "boolean", "null", "object", "array")
# a count keyword -> (the type it applies to, the keyword its failures satisfy)
_COUNT_KEYS = {
    "maxProperties": ("object", "minProperties"),
    "minProperties": ("object", "maxProperties"),
    "maxLength": ("string", "minLength"),
    "minLength": ("string", "maxLength"),
    "maxItems": ("array", "minItems"),
    "minItems": ("array", "maxItems"),
}


# a numeric bound -> the keyword its failures satisfy (draft 4's boolean forms excluded)
_BOUND_KEYS = {
    "minimum": "exclusiveMaximum",
    "maximum": "exclusiveMinimum",
    "exclusiveMinimum": "maximum",
    "exclusiveMaximum": "minimum",
}


def _as_counts(out: dict, keys: Iterable[str], ptr: str) -> dict:
    """`out` with each of `keys` it has as an int (2.0 is 2); negative, fractional or
    non-numeric values are errors naming the keyword and where it is."""
    for k in keys:
        v = out.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or v != int(v):
            raise GrammarError(f"{k} at {ptr} must be a non-negative integer, not {v!r}")
        out[k] = int(v)
    return out


def _integral_counts(schema: dict, ptr: str) -> dict:
    """Count keywords (minLength, maxItems, ...) as ints: 2.0 is 2; others are errors."""
    bad = [k for k in _COUNT_KEYS if k in schema and not isinstance(schema[k], int)]
    bad += [k for k in _COUNT_KEYS if isinstance(schema.get(k), bool)]
    if not bad and all(schema[k] >= 0 for k in _COUNT_KEYS if k in schema):
        return schema
    out = dict(schema)
    return _as_counts(out, _COUNT_KEYS, ptr)


def _contains_counts(schema: dict, ptr: str, old_draft: bool) -> dict:
    """minContains / maxContains made explicit beside `contains` (minContains 1 unless
    given, so that allOf merges compare like with like), dropped without it or before
    2019-09 (they apply to `contains` only); values must be non-negative integers."""
    keys = ("minContains", "maxContains")
    if "contains" not in schema:
        if any(k in schema for k in keys):
            return {k: v for k, v in schema.items() if k not in keys}
        return schema
    out = {k: v for k, v in schema.items() if k not in keys or not old_draft}
    out.setdefault("minContains", 1)
    return _as_counts(out, keys, ptr)


def _dependent_schemas(schema: dict) -> tuple[dict, list[tuple[str, str, Any]]]:
    """Splits off the `dependencies` / `dependentSchemas` entries whose value is a schema, as
    (pointer part, name, schema); name-list entries stay (the object rules split on them)."""
    out, dependent = schema, []
    for key in ("dependencies", "dependentSchemas"):
        value = schema.get(key)
        if not isinstance(value, dict):
            continue
        out = dict(out)
        lists = {n: v for n, v in value.items() if isinstance(v, list)}
        dependent += [
            (f"{key}/{ptr_escape(n)}", n, v) for n, v in value.items() if not isinstance(v, list)
        ]
        if key == "dependentSchemas" or not lists:
            out.pop(key)
        else:
            out[key] = lists
    return out, dependent


# ----- unevaluatedProperties / unevaluatedItems
# `unevaluatedProperties` / `unevaluatedItems` as plain object / array keywords.
#
# What a schema "evaluates" is collected from its own keywords and those of the schemas it
# applies in place unconditionally (`allOf` branches, `$ref` targets, recursively): property
# names, `patternProperties` patterns, `prefixItems` lengths; `additionalProperties`, `items`
# or a nested `unevaluated*` evaluate everything. The keyword then constrains the rest:
#
# - everything evaluated: it is dropped;
# - nothing in place beside the schema's own keywords: it becomes `additionalProperties` /
#   `items` (the same members);
# - otherwise: one more `allOf` branch, `{"properties": {name: true, ...}, "patternProperties":
#   {pattern: true, ...}, "additionalProperties": U}` (or `{"prefixItems": [true] * P,
#   "items": U}`, P the longest evaluated prefix), which the merge makes exact or refuses.
#
# Conditional applicators (`anyOf`, `oneOf`, `if`, `dependentSchemas`) evaluate depending on
# the instance: at the schema's top and in its `allOf` branches they are split first into
# the cases of which branches apply (`grammar.json_schema.exact.evaluated`); elsewhere (in a
# `$ref` target), and `$dynamicRef` or `contains` (for items), raise UnsupportedSchemaError
# naming the keyword and its pointer. Before 2019-09 the keywords are dropped as annotations.
_CONDITIONAL = ("anyOf", "oneOf", "if", "then", "else", "dependentSchemas", "$dynamicRef")


class _Seen:
    def __init__(self) -> None:
        self.names: dict[str, None] = {}
        self.patterns: dict[str, None] = {}
        self.prefix = 0
        self.all_props = False
        self.all_items = False
        self.in_place = False  # some allOf branch or $ref target contributed


def _collect(b: Any, schema: Any, key: str, where: str, seen: _Seen, depth: int) -> None:
    if not isinstance(schema, dict):
        return
    if depth > 16:
        raise UnsupportedSchemaError(key, where, "in-place applicators nest too deeply")
    for k in _CONDITIONAL:
        if k in schema or (k == "dependentSchemas" and _schema_dependencies(schema)):
            raise UnsupportedSchemaError(key, where, f"beside {k!r} (evaluates conditionally)")
    if key == "unevaluatedItems" and "contains" in schema:
        raise UnsupportedSchemaError(key, where, "beside 'contains'")
    seen.names.update(dict.fromkeys(schema.get("properties", {}) or {}))
    seen.patterns.update(dict.fromkeys(schema.get("patternProperties", {}) or {}))
    if depth and "unevaluatedProperties" in schema or "additionalProperties" in schema:
        seen.all_props = True
    items = schema.get("items")
    if isinstance(items, list):
        raise UnsupportedSchemaError(key, where, "beside an items list")
    if depth and "unevaluatedItems" in schema or "items" in schema:
        seen.all_items = True
    seen.prefix = max(seen.prefix, len(schema.get("prefixItems", []) or []))
    subs = list(enumerate(schema.get("allOf", []) or []))
    for _, sub in subs:
        seen.in_place = True
        _collect(b, sub, key, where, seen, depth + 1)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        seen.in_place = True
        _collect(b, b.resolve_ref(ref, where), key, where, seen, depth + 1)


def _schema_dependencies(schema: dict) -> bool:
    deps = schema.get("dependencies")
    return isinstance(deps, dict) and any(not isinstance(v, list) for v in deps.values())


def unevaluated(b: Any, schema: dict, ptr: str) -> dict:
    """`schema` with its unevaluatedProperties / unevaluatedItems rewritten (module doc)."""
    out = dict(schema)
    if b.ref_overrides_siblings:  # draft 7 and before: unknown keywords
        out.pop("unevaluatedProperties", None)
        out.pop("unevaluatedItems", None)
        return out
    key = next(k for k in ("unevaluatedProperties", "unevaluatedItems") if k in out)
    cases = conditional_cases(out, key, f"{ptr}/{key}")
    if cases is not None:  # one case per set of conditional branches that apply
        return {"anyOf": cases, CASES_OF: f"{ptr}/{key}"}
    extra: list[dict] = []
    for key in ("unevaluatedProperties", "unevaluatedItems"):
        if key not in out:
            continue
        u = out.pop(key)
        where = f"{ptr}/{key}"
        seen = _Seen()
        _collect(b, out, key, where, seen, 0)
        if u is True or u == {}:
            continue
        if key == "unevaluatedProperties":
            if seen.all_props:
                continue
            if not seen.in_place:
                out["additionalProperties"] = u
                continue
            conj: dict = {"properties": dict.fromkeys(seen.names, True)}
            if seen.patterns:
                conj["patternProperties"] = dict.fromkeys(seen.patterns, True)
            conj["additionalProperties"] = u
            extra.append(conj)
        else:
            if seen.all_items:
                continue
            if not seen.in_place:
                out["items"] = u
                continue
            past = {"prefixItems": [True] * seen.prefix} if seen.prefix else {}
            extra.append({**past, "items": u})  # the items past every evaluated prefix
    if extra:
        out["allOf"] = [*(out.get("allOf", []) or []), *extra]
    return out
