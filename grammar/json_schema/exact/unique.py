"""`uniqueItems: true` over items with finitely many values (an `enum` / `const`, booleans,
null): the arrays of pairwise different values, remembering which values were used.

A state is the set of values written so far (its size is the number of elements, so the
position in `prefixItems` and the count against `minItems` / `maxItems` follow from it); from
it an array may end, or go on with any value its next position allows that is not in the
set. Values are compared as JSON Schema compares them (numbers by value: 1 and 1.0 are one);
each value's node holds every spelling of it the item schema accepts. With up to
MAX_UNIQUE_VALUES values there are at most 2**MAX_UNIQUE_VALUES states; items with more
values, or with infinitely many (strings, numbers, objects), are refused.
"""

from __future__ import annotations

from typing import Any

from grammar.automata import regex_ast as ra
from grammar.errors import UnsupportedSchemaError
from grammar.json_schema.merge import canonical

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing
MAX_UNIQUE_VALUES = 12
_SCALARS = (True, False, None)  # the values of the types whose values are finitely many


def unique_array(b: Any, s: dict, prefix: list, rest: Any, ptrs: list[str], ptr: str) -> Node:
    """Arrays of normalised `s` with `uniqueItems: true`: element i an instance of prefix[i],
    later ones of `rest` (`ptrs`: their pointers, the rest's last), all different."""
    where = f"{ptr}/uniqueItems"
    if "contains" in s:
        raise UnsupportedSchemaError("uniqueItems", where, "beside 'contains'")
    keys: dict[str, int] = {}  # canonical value -> its bit
    # per position (the prefix's, then the rest's): value bit -> the value's spellings there
    allowed: list[dict[int, Node]] = []
    for x, at in zip([*prefix, rest], ptrs, strict=True):
        here: dict[int, Node] = {}
        for v in _finite_values(b, x, at, where):
            node = b.literal_of(x, v, at)
            if node is not None:
                bit = keys.setdefault(canonical(v), len(keys))
                here[bit] = ra.alt([here.get(bit), node])
        allowed.append(here)
        if len(keys) > MAX_UNIQUE_VALUES:
            raise UnsupportedSchemaError(
                "uniqueItems", where, f"items of over {MAX_UNIQUE_VALUES} values"
            )
    lo, hi = s.get("minItems", 0), s.get("maxItems")
    comma = b.comma
    memo: dict[int, Node] = {}

    def after(used: int) -> Node:  # the elements still to come once `used` are written
        if used in memo:
            return memo[used]
        n = used.bit_count()
        options: list[Node] = [ra.EMPTY] if n >= lo else []
        if hi is None or n < hi:
            sep = comma if n else ra.EMPTY
            for bit, node in allowed[min(n, len(prefix))].items():
                if not used >> bit & 1:
                    options.append(ra.seq(sep, node, after(used | 1 << bit)))
        memo[used] = out = ra.alt(options)
        return out

    return b.wrap("[", after(0), "]")


def _finite_values(b: Any, x: Any, at: str, where: str) -> list:
    """Candidate values of item schema `x` (a superset of its instances, all finitely many),
    or raise: its enum / const, else true / false / null when it admits no other type."""
    if x is False:
        return []
    values = b.finite_values(x, at)
    if values is not None:
        return values
    norm = b.normalise(x, at)
    if norm is False:
        return []
    if norm is not True and b.types_of(norm) <= {"boolean", "null"}:
        return list(_SCALARS)
    raise UnsupportedSchemaError("uniqueItems", where, "items with infinitely many values")
