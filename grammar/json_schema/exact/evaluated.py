"""`unevaluatedProperties` / `unevaluatedItems` beside conditional applicators (`anyOf`, `oneOf`,
`if`, `dependentSchemas`, also inside `allOf` branches), split into the cases of which
branches apply. In each case the branches that apply are `allOf` branches (they apply in
place, so what they evaluate is known) and the others are negated (`not`: no annotations);
the builder's `unevaluated` rewrite then handles each case, and the schema is their `anyOf`.

Which properties count as evaluated only grows with the set of branches that apply, so the
keyword's constraint only weakens (call it R(M) for the set M). That spares negations: for
`anyOf`, the union over non-empty M of (every branch of M and R(M)) is exactly the valid
instances (an instance whose true set is M* is in the case M* and, by monotony, any case
it is in is no stronger than M*'s); `if` without `then` / `else` is (if and R(if)) or R({}).
`oneOf` (exactly one), `if` with `then` / `else` and `dependentSchemas` (the name absent)
need the negations, which the builder's `not` makes exact or refuses.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from grammar.errors import UnsupportedSchemaError

MAX_CASES = 32  # cases of one schema (the product over its conditional applicators)
MAX_ANY_OF = 4  # anyOf branches (non-empty subsets of them are cases)
_UNEVALUATED = ("unevaluatedProperties", "unevaluatedItems")


def conditional_cases(schema: dict, key: str, where: str) -> list[dict] | None:
    """`schema` as disjoint or monotone cases (module doc) with no conditional applicator
    left at its top or in its `allOf` branches; None if it has none."""
    rest, groups = _hoisted(schema, key, where)
    if not groups:
        return None
    if math.prod(len(g) for g in groups) > MAX_CASES:
        raise UnsupportedSchemaError(key, where, f"over {MAX_CASES} cases of which branches apply")
    base = list(rest.get("allOf", []))
    return [
        {**rest, "allOf": [*base, *(p for case in combo for p in case)]}
        for combo in itertools.product(*groups)
    ]


def _hoisted(schema: dict, key: str, where: str) -> tuple[dict, list[list[list[Any]]]]:
    """`schema` without its conditional applicators, and per applicator its cases (each a
    list of schemas that hold together). `allOf` branches apply in place: theirs are taken
    too, unless the branch has its own unevaluated* keyword (their scope)."""
    rest = dict(schema)
    groups: list[list[list[Any]]] = []
    if "anyOf" in rest:
        branches = _branches(rest.pop("anyOf"), "anyOf", where)
        if len(branches) > MAX_ANY_OF:
            raise UnsupportedSchemaError(key, where, f"beside anyOf of over {MAX_ANY_OF} branches")
        n = len(branches)
        groups.append([[b for i, b in enumerate(branches) if m >> i & 1] for m in range(1, 1 << n)])
    if "oneOf" in rest:
        branches = _branches(rest.pop("oneOf"), "oneOf", where)
        groups.append(
            [
                [b if i == j else {"not": b} for i, b in enumerate(branches)]
                for j in range(len(branches))
            ]
        )
    if "if" in rest:
        cond = rest.pop("if")
        if "then" in rest or "else" in rest:
            then, other = rest.pop("then", True), rest.pop("else", True)
            groups.append([[cond, then], [{"not": cond}, other]])
        else:
            groups.append([[cond], []])
    rest.pop("then", None)  # without `if`: ignored
    rest.pop("else", None)
    deps = rest.pop("dependentSchemas", None)
    if isinstance(deps, dict):
        for name, sub in deps.items():
            present = {"required": [name]}
            groups.append([[present, sub], [{"not": present}]])
    inner = rest.get("allOf")
    if isinstance(inner, list):
        flat = []
        for branch in inner:
            if isinstance(branch, dict) and not any(k in branch for k in _UNEVALUATED):
                branch, more = _hoisted(branch, key, where)
                groups += more
            flat.append(branch)
        rest["allOf"] = flat
    return rest, groups


def _branches(value: Any, kind: str, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise UnsupportedSchemaError(kind, where, f"{kind} must be a non-empty list")
    return value


_SPLIT_FOR = ("/unevaluatedProperties", "/unevaluatedItems")  # where a split's cases are built


def split_refusal(e: UnsupportedSchemaError, where: str) -> UnsupportedSchemaError | None:
    """A refusal raised building one case of a split (its pointer leads into made-up `allOf`
    cases) as one at the unevaluated* keyword the user wrote; None for any other group."""
    if not where.endswith(_SPLIT_FOR):
        return None
    detail = str(e).split(": ", 1)[-1]
    return UnsupportedSchemaError(
        where.rsplit("/", 1)[1],
        where,
        f"in the case where some of its conditional branches apply, {e.keyword!r} is refused: "
        f"{detail}",
    )
