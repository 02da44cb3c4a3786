"""`oneOf` whose branches may overlap, as "exactly one branch": the union over each branch
of it and the negation of every other branch,

    oneOf(A, B, C) = (A and not B and not C) or (B and not A and not C) or (C and not A and not B)

built as schemas (`allOf` with `not`), so each negation goes through the builder's own
`not` (the union of the ways to violate each keyword), which refuses what it cannot negate
exactly. The cases are pairwise disjoint and together exactly the valid instances; each
case's automaton is within its schema's language, so the union is too.

The other way round, for `not`: an `anyOf` fails when every branch does, a `oneOf` when none
or two of its branches hold (`group_violations`).
"""

from __future__ import annotations

import itertools
from typing import Any

from grammar.automata import regex_ast as ra
from grammar.errors import UnsupportedSchemaError
from grammar.json_schema.merge import merge

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing
MAX_NEGATED_BRANCHES = 6  # each case negates every other branch: n * (n - 1) negations


def oneof_by_negation(b: Any, norm: dict, branches: list, where: str, refusal: Exception) -> Node:
    """The instances of `norm` (a normalised schema, the other alternative groups left in
    it) that satisfy exactly one of `branches` (as written); None if no instance does.
    Raises `refusal` when some negation is not exact (or too many branches)."""
    if len(branches) > MAX_NEGATED_BRANCHES:
        raise refusal
    counted = b.n_alternatives
    options: list[Node] = []
    try:
        for i, branch in enumerate(branches):
            at = f"{where}/{i}"
            others = [{"not": x} for j, x in enumerate(branches) if j != i]
            case = b.normalise({"allOf": [branch, *others]}, at)
            b.count_alternative("oneOf", at)
            options.append(b.from_norm(merge(norm, case, at), at))
    except UnsupportedSchemaError:
        b.n_alternatives = counted  # the refused attempt spends no alternatives
        raise refusal from None
    return ra.alt(options)


def group_violations(kind: str, branches: list) -> list:
    """Schemas whose union is exactly the instances that fail an `anyOf` / `oneOf` group."""
    none = {"allOf": [{"not": x} for x in branches]}
    if kind == "anyOf":
        return [none]
    return [none, *({"allOf": [x, y]} for x, y in itertools.combinations(branches, 2))]
