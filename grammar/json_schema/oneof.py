"""`oneOf` whose branches are not pairwise disjoint, made exact by splitting.

An instance is valid for `oneOf` when exactly one branch accepts it. When the builder cannot
show every two branches disjoint, the instances are split by JSON type, and within a type:

- one branch admits the type: that branch, restricted to it;
- two or more branches accept every value of the type (their keywords do not apply to it):
  no value of the type is valid;
- objects: split by which of the names the branches require or forbid are present
  (`split_by_presence`);
- types whose values hold no object (scalars, arrays of them): every value has one
  spelling, so "in exactly one branch" is a regular language, built from the branch DFAs by
  exact difference.

Anything else returns None and the caller refuses the schema.

Functions of the schema builder (`builder.Builder`, passed as `b`).
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from grammar.automata import dfa_ops
from grammar.automata import regex_ast as ra
from grammar.automata.intersect import dfas_intersect
from grammar.automata.pattern import losses
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.json_schema.builder import Builder
from grammar.json_schema.merge import merge
from grammar.json_schema.vocabulary import ANNOTATIONS, possible_types, type_set

MAX_PRESENCE_NAMES = 6  # objects split by present names: at most 2**6 cases
MAX_BRANCH_STATES = 20_000  # per branch DFA in a regular difference

# keywords that constrain only values of one JSON type
_TYPE_KEYS = {
    "object": {
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "minProperties",
        "maxProperties",
        "dependencies",
        "dependentRequired",
        "propertyNames",
    },
    "array": {
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
    },  # fmt: skip
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "boolean": set(),
    "null": set(),
}
_NEUTRAL = ANNOTATIONS | {"type", "_refs"}
# keywords that do not apply to a type
_OTHER_KEYS = {t: set().union(*_TYPE_KEYS.values()) - keys for t, keys in _TYPE_KEYS.items()}


def split_oneof(b: Any, branches: list[dict], ptr: str) -> object | None:
    """The exact language of oneOf(branches) (normalised, merged with their parent), or None."""
    if len(branches) < 2 or not all(isinstance(x, dict) for x in branches):
        return None
    options: list[object] = []
    for t in _TYPE_KEYS:
        admit = [x for x in branches if t in _family(b.types_of(x))]
        if not admit:
            continue
        typed = [merge(x, {"type": t}, ptr) for x in admit]
        typed = [x for x in typed if isinstance(x, dict)]
        if len(typed) == 1:
            options.append(b.from_norm(typed[0], ptr))
            continue
        if t != "object" and sum(_every(x, t) for x in typed) >= 2:
            continue  # two branches accept every value of type t: none is valid
        out = None
        if t == "object":
            out = split_by_presence(b, typed, ptr)
        else:
            kinds = [_leaf_kinds(b, x, ptr) for x in typed]
            # one spelling per value: no objects (key order), numbers in one branch at most
            # (1 and 1.0 are one number), strings canonical (see _regular_difference)
            if all("object" not in k for k in kinds) and sum("number" in k for k in kinds) < 2:
                out = _regular_difference(b, typed, ptr)
        if out is None:
            return None
        options.append(out)
    return ra.alt(options)


def _family(types: set[str]) -> set[str]:
    return {"number" if t == "integer" else t for t in types}


def _every(x: dict, t: str) -> bool:
    """Branch `x` (restricted to type t) accepts every value of type t."""
    whole = "number" in type_set(x) if t == "number" else t in type_set(x)
    return whole and set(x) - _NEUTRAL <= _OTHER_KEYS[t]


def _leaf_kinds(b: Any, s: Any, ptr: str, depth: int = 0) -> set[str]:
    """The JSON types that may occur in an instance of normalised `s`, inside arrays too."""
    if s is False:
        return set()
    if s is True or depth > 4:
        return {"object", "number", "string", "boolean", "null"}
    types = _family(b.types_of(s))
    out = types - {"array"}
    if "array" in types:
        items = s.get("items", True)
        subs = [*s.get("prefixItems", [])]
        subs += items if isinstance(items, list) else [items]
        if isinstance(items, list):
            subs.append(s.get("additionalItems", True))
        for x in subs:
            out |= _leaf_kinds(b, b.normalise(x, ptr), ptr, depth + 1)
    return out


# JSON text whose strings are spelled as json.dumps(..., ensure_ascii=False) spells them:
# escapes only for the quote, the backslash and control characters (short forms where
# there are, else lowercase \u00xx); one spelling per string value
CANONICAL_TEXT = r'([^"]|"([^"\\\x00-\x1f]|\\["\\bfnrt]|\\u00(0[0-7bef]|1[0-9a-f]))*")*'


def _regular_difference(b: Any, branches: list[dict], ptr: str) -> object | None:
    """Each branch's language minus every other's, as automata, over canonical spellings
    (a value spelled two ways could otherwise be in one branch's language under one
    spelling and in another's under the other)."""
    try:
        dfas = []
        before = losses()
        for x in branches:
            node = b.from_norm(x, ptr)
            if node is not None:
                dfas.append(b.dfa(node, MAX_BRANCH_STATES))
        if losses() != before:
            return None  # subtracting an automaton that leaves strings out is unsound
        canonical = b.dfa(ra.parsed(CANONICAL_TEXT))
        dfas = [dfa_ops.product(d, canonical, True) for d in dfas]
        out = []
        for i, d in enumerate(dfas):
            for j, other in enumerate(dfas):
                if i != j:
                    d = dfa_ops.product(d, other, False)
            if d.accepting.any():
                out.append(dfa_ops.DFANode(d, "oneOf", ptr))
        return ra.alt(out)
    except GrammarError as e:
        if isinstance(e, UnsupportedSchemaError):
            raise
        return None


def split_by_presence(b: Any, branches: list[dict], ptr: str) -> object | None:
    """Objects split by which of the names the branches require or forbid are present: for
    each set of present names, the branches an object with exactly those names can
    satisfy. One: it, with the other names forbidden. Several that are provably disjoint
    there: each. Several that are not: objects with those names are not generated (invalid
    when two branches match; when only one does, valid but refused), so the language stays
    within the schema's. None when more than MAX_PRESENCE_NAMES names are involved."""
    always = set.intersection(*(set(x.get("required", [])) for x in branches))
    mentioned = [n for x in branches for n in [*x.get("required", []), *x.get("properties", {})]]
    names = [
        n
        for n in dict.fromkeys(mentioned)
        if n not in always
        and (
            any(n in x.get("required", []) for x in branches)
            or any(member_schema(x, n) is False for x in branches)
        )
    ]
    if len(names) > MAX_PRESENCE_NAMES:
        return None
    options: list[object] = []
    for present in itertools.product((True, False), repeat=len(names)):
        here = [n for n, p in zip(names, present, strict=True) if p]
        fits = []
        for i, x in enumerate(branches):
            merged = merge(x, {"required": here}, f"{ptr}/{i}")
            if isinstance(merged, dict):  # the other names are forbidden
                absent = {n: False for n in names if n not in here}
                merged["properties"] = {**merged.get("properties", {}), **absent}
            if isinstance(merged, dict) and all(
                member_schema(merged, n) is not False for n in merged.get("required", [])
            ):
                fits.append((merged, f"{ptr}/{i}"))
        if len(fits) > 1 and not all(
            discriminated(b, x[0], y[0], ptr) for x, y in itertools.combinations(fits, 2)
        ):
            continue
        for merged, at in fits:
            b.count_alternative("oneOf", ptr)
            options.append(b.from_norm(merged, at))
    return ra.alt(options)


def member_schema(s: dict, name: str) -> Any:
    """The schema a member `name` of an instance of normalised `s` must satisfy."""
    props = s.get("properties", {})
    if name in props:
        return props[name]
    try:
        matching = [sub for p, sub in s.get("patternProperties", {}).items() if re.search(p, name)]
    except re.error:
        return True  # cannot tell: anything may be allowed
    if matching:
        return matching[0] if len(matching) == 1 else {"allOf": matching}
    if "_alts" in s:
        return True  # a branch may still add it
    return s.get("additionalProperties", True)


def required_only(branches: list) -> bool:
    return all(
        isinstance(b, dict)
        and "required" in b
        and set(b) <= {"required"} | ANNOTATIONS
        and all(isinstance(n, str) for n in b["required"])
        for b in branches
    )


def exactly_one_required(branches: list[dict], ptr: str) -> list[dict]:
    """oneOf of `required` lists as disjoint object schemas, one per set of present names
    (among those the branches mention) that satisfies exactly one branch; the others are
    forbidden. A non-object satisfies every branch, so (two or more branches) none is valid."""
    names = list(dict.fromkeys(n for b in branches for n in b["required"]))
    if len(names) > 8:
        raise UnsupportedSchemaError("oneOf", ptr, "more than 8 required names")
    out = []
    for present in itertools.product((True, False), repeat=len(names)):
        here = {n for n, p in zip(names, present, strict=True) if p}
        if sum(set(b["required"]) <= here for b in branches) != 1:
            continue
        out.append(
            {
                "type": "object",
                "required": [n for n in names if n in here],
                "properties": {n: False for n in names if n not in here},
            }
        )
    return out or [False]


def check_exclusive(b: Builder, options: list[tuple[object, Any, str]], ptr: str) -> None:
    """oneOf needs exactly one branch to match, so every two branches must be provably
    disjoint: different JSON types, different values of a required discriminator property,
    or (for scalars only, whose spelling is canonical) disjoint regex languages."""

    for (na, sa, _), (nb, sb, _) in itertools.combinations(options, 2):
        if not (isinstance(sa, dict) and isinstance(sb, dict)):
            raise UnsupportedSchemaError("oneOf", ptr, "branches may both match")
        ta, tb = b.types_of(sa), b.types_of(sb)
        if not (ta & tb) or discriminated(b, sa, sb, ptr):
            continue
        if b.lossy_nodes.get(id(sa)) or b.lossy_nodes.get(id(sb)):
            # automata that leave strings out cannot show the languages disjoint
            raise UnsupportedSchemaError("oneOf", ptr, "branches may both match")
        if (ta | tb) & {"object", "array"}:
            raise UnsupportedSchemaError("oneOf", ptr, "branches may both match")
        try:
            overlap = dfas_intersect(b.dfa(na, 20_000), b.dfa(nb, 20_000))
        except GrammarError:
            overlap = True
        if overlap:
            raise UnsupportedSchemaError("oneOf", ptr, "branches may both match")


def discriminated(b: Builder, first: dict, second: dict, ptr: str) -> bool:
    """Both are objects-only, and some property one of them requires has, in the other,
    a schema with no value in common (forbidden, different enum / const values, or
    scalar schemas whose languages are disjoint)."""
    if possible_types(first) != {"object"} or possible_types(second) != {"object"}:
        return False
    for x, y in ((first, second), (second, first)):
        for name in x.get("required", []):
            sx, sy = member_schema(x, name), member_schema(y, name)
            if sx is False or sy is False:
                return True
            if isinstance(sx, dict) and isinstance(sy, dict) and disjoint(b, sx, sy, ptr):
                return True
    return False


def disjoint(b: Builder, first: dict, second: dict, ptr: str) -> bool:
    """Provably no value is an instance of both (finite value sets, or scalar schemas
    whose regex languages do not intersect)."""

    for x, y in ((first, second), (second, first)):
        values = b.finite_values(x, ptr)
        if values is not None:  # exact: is any value of x an instance of y?
            return not any(b.accepts(x, v) and b.accepts(y, v) for v in values)
    try:
        na, nb = b.normalise(first, ptr), b.normalise(second, ptr)
        if not (isinstance(na, dict) and isinstance(nb, dict)):
            return False
        if (b.types_of(na) | b.types_of(nb)) & {"object", "array"}:
            return False
        before = losses()
        ra_, rb = b.from_norm(na, ptr), b.from_norm(nb, ptr)
        if losses() != before:
            return False  # an approximated language cannot show disjointness
        if ra_ is None or rb is None:
            return True
        return not dfas_intersect(b.dfa(ra_, 20_000), b.dfa(rb, 20_000))
    except GrammarError:
        return False
