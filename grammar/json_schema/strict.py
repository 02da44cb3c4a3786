"""Strict generation: a schema transform under which an object emits only the properties its
schema declares.

JSON Schema lets an object carry any property its schema does not mention unless it says
`additionalProperties: false`. Most schemas written for generation (pydantic, LangChain tools,
OpenAI function parameters) never say it, yet want exactly the declared fields; generating
from the exact language lets a model wander into extra keys. `strict_schema(schema)` returns a
schema whose language is a subset of the original's: every object schema that leaves
`additionalProperties`, `patternProperties` and `unevaluatedProperties` unset gets
`additionalProperties: false`, with the names it declares in place (`properties`, `required`,
and those of its `allOf` / `anyOf` / `oneOf` / `then` / `else` / `dependentSchemas` members
and of a `$ref` it applies in place) kept allowed. `unevaluatedProperties: false` becomes that
same closure. An object that says `additionalProperties: true` (or a schema), has
`patternProperties`, or has a non-false `unevaluatedProperties` (its own or through `allOf` /
`$ref`) stays open. Nothing under `not` or `if` changes (tightening a condition or a negation
would loosen the schema). A schema with no object keywords (`{}`, any value) stays any value;
`{"type": "object"}` alone becomes the empty object, as in OpenAI's strict mode. An object
schema with `const` or `enum` stays as it is: its values name their own keys.

Integers: an integer schema without a `minimum` (`maximum`) gets I-JSON's exact range,
`-(2**53 - 1)` (`2**53 - 1`): a value JavaScript and float parsers read back unchanged, and a
bound on the digits a model can repeat (`"minutes": 1000000000...` to max_tokens). Integers
are generated plain (no `1.0` spelling, whose zeros would be unbounded); validation is unchanged.

Numbers: a number carries at most the digits a float64 does (`number_text.FLOAT64_NUMBER`:
17 in the integer part, 17 in the fraction, 3 in the exponent; more where the schema's own
bounds have more), so a model cannot loop inside one (`"population":1.0000000...`).
`apply_mode` marks the root with the private keyword `FLOAT64_MARK`, which the builder reads.

Modes: `JSON_SCHEMA_MODES = ("strict", "exact")`; `apply_mode(schema, mode)` is what the
compile functions call.
"""

from __future__ import annotations

import copy
from typing import Any

from grammar.json_schema.number_text import FLOAT64_MARK
from grammar.json_schema.refs.local import pointer_target

JSON_SCHEMA_MODES = ("strict", "exact")

_OBJECT_KEYS = (
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
)
# in-place members whose names the closure must allow, and that are closed in turn (with the
# names of the schema around them) when they are alternatives
_BRANCHES = ("anyOf", "oneOf")
SAFE_INTEGER = 2**53 - 1  # I-JSON (RFC 7493): integers every JSON parser keeps exact


def check_mode(mode: str) -> str:
    if mode not in JSON_SCHEMA_MODES:
        raise ValueError(f"json_schema_mode must be one of {list(JSON_SCHEMA_MODES)}, got {mode!r}")
    return mode


def apply_mode(schema: Any, mode: str) -> Any:
    """`schema` as generated under `mode`: unchanged for "exact"; for "strict", `strict_schema`
    with its root marked `FLOAT64_MARK` (numbers carry at most a float64's digits)."""
    if check_mode(mode) == "exact":
        return schema
    out = strict_schema(schema)
    if isinstance(out, dict):
        out[FLOAT64_MARK] = True
    return out


def strict_schema(schema: Any) -> Any:
    """A copy of `schema` whose objects emit only their declared properties (module doc)."""
    return _Strict(schema).value(copy.deepcopy(schema))


class _Strict:
    def __init__(self, root: Any) -> None:
        self.root = root

    # ---- what a schema declares, in place ---------------------------------------------------
    def _target(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        try:
            return pointer_target(self.root, ref)
        except LookupError:
            return None

    def _in_place(self, s: dict, branches: bool) -> list[Any]:
        """The schemas that apply to the same instance as `s` (allOf, $ref, dependentSchemas;
        with `branches`, also anyOf / oneOf / then / else)."""
        out: list[Any] = list(s.get("allOf") or [])
        if "$ref" in s:
            out.append(self._target(s["$ref"]))
        deps = s.get("dependentSchemas")
        if isinstance(deps, dict):
            out += list(deps.values())
        if branches:
            for key in _BRANCHES:
                out += list(s.get(key) or [])
            out += [s[k] for k in ("then", "else") if k in s]
        return [m for m in out if isinstance(m, dict)]

    def names(self, s: Any, branches: bool = True, seen: frozenset = frozenset()) -> list[str]:
        if not isinstance(s, dict) or id(s) in seen:
            return []
        seen = seen | {id(s)}
        out = [*(s.get("properties") or {}), *(s.get("required") or [])]
        for m in self._in_place(s, branches):
            out += self.names(m, branches, seen)
        return list(dict.fromkeys(n for n in out if isinstance(n, str)))

    def is_open(self, s: Any, seen: frozenset = frozenset()) -> bool:
        """Whether `s` (or a schema applied with it through allOf / $ref) allows extra keys
        on purpose, or uses keywords the closure cannot express."""
        if not isinstance(s, dict) or id(s) in seen:
            return False
        seen = seen | {id(s)}
        if s.get("additionalProperties", False) is not False or "patternProperties" in s:
            return True
        if s.get("unevaluatedProperties", False) is not False:
            return True
        if "$ref" in s and self._target(s["$ref"]) is None:
            return True  # cannot see what it declares: left to the grammar
        return any(self.is_open(m, seen) for m in self._in_place(s, branches=False))

    @staticmethod
    def _object_like(s: dict, names: list[str]) -> bool:
        t = s.get("type")
        if t is not None:
            return t == "object" or (isinstance(t, list) and "object" in t)
        return bool(names) or any(k in s for k in _OBJECT_KEYS)

    # ---- the rewrite --------------------------------------------------------------------------
    def value(self, s: Any, inherited: tuple[str, ...] = ()) -> Any:
        """`s` where it is the whole schema of a value (root, property, item, branch)."""
        if not isinstance(s, dict):
            return s
        _safe_integers(s)
        self.children(s)
        names = [*inherited, *self.names(s)]
        if self.is_open(s) or not self._object_like(s, names) or _enumerated(s):
            self.branches(s, None)
            return s
        own = [*inherited, *self.names(s, branches=False)]
        self.branches(s, tuple(dict.fromkeys(own)))
        s.pop("unevaluatedProperties", None)  # false, or is_open would have said so
        closure = {n: {} for n in dict.fromkeys(names)}
        if "$ref" in s:  # keywords beside a $ref are ignored in drafts 4-7: the $ref moves
            # into allOf (which only narrows those drafts' language), the rest stays in place
            # so that JSON pointers into this schema still resolve
            s["allOf"] = [*s.get("allOf", []), {"$ref": s.pop("$ref")}]
        props = s.setdefault("properties", {})
        for n, sub in closure.items():
            props.setdefault(n, sub)
        s["additionalProperties"] = False
        return s

    def branches(self, s: dict, inherited: tuple[str, ...] | None) -> None:
        """anyOf / oneOf / then / else members: closed with the names around them, or only
        their insides when `s` is open (`inherited` None)."""
        for key in _BRANCHES:
            if isinstance(s.get(key), list):
                s[key] = [self._member(m, inherited) for m in s[key]]
        for key in ("then", "else"):
            if key in s:
                s[key] = self._member(s[key], inherited)

    def _member(self, m: Any, inherited: tuple[str, ...] | None) -> Any:
        if inherited is None:
            return self.open(m)
        return self.value(m, inherited)

    def open(self, s: Any) -> Any:
        """`s` applied in place (allOf member, $defs entry): its insides only."""
        if isinstance(s, dict):
            _safe_integers(s)
            self.children(s)
            self.branches(s, None)
        return s

    def children(self, s: dict) -> None:
        """The value positions inside `s` (properties, items, ...) and its in-place members."""
        for key in ("properties", "patternProperties", "$defs", "definitions"):
            sub = s.get(key)
            if isinstance(sub, dict):
                rewrite = self.open if key in ("$defs", "definitions") else self.value
                s[key] = {k: rewrite(v) for k, v in sub.items()}
        for key in ("additionalProperties", "additionalItems", "unevaluatedItems", "contains"):
            if isinstance(s.get(key), dict):
                s[key] = self.value(s[key])
        items = s.get("items")
        if isinstance(items, list):
            s["items"] = [self.value(v) for v in items]
        elif isinstance(items, dict):
            s["items"] = self.value(items)
        if isinstance(s.get("prefixItems"), list):
            s["prefixItems"] = [self.value(v) for v in s["prefixItems"]]
        if isinstance(s.get("allOf"), list):
            s["allOf"] = [self.open(m) for m in s["allOf"]]
        deps = s.get("dependentSchemas")
        if isinstance(deps, dict):
            s["dependentSchemas"] = {k: self.open(v) for k, v in deps.items()}


def _enumerated(s: dict) -> bool:
    """`const` / `enum` spell out every allowed value, their keys included: closing the object
    to its declared properties would refuse them (`{"type": "object", "const": {"k": 1}}`)."""
    return "const" in s or "enum" in s


def _safe_integers(s: dict) -> None:
    t = s.get("type")
    types = set(t) if isinstance(t, list) else {t}
    if "integer" not in types or "number" in types:
        return
    if "minimum" not in s and "exclusiveMinimum" not in s:
        s["minimum"] = -SAFE_INTEGER
    if "maximum" not in s and "exclusiveMaximum" not in s:
        s["maximum"] = SAFE_INTEGER
