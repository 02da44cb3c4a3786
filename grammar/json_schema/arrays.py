"""Arrays: `prefixItems` / `items` (a list in drafts before 2020-12) / `additionalItems`, with
`minItems` / `maxItems`, `contains` with `minContains` / `maxContains` (counted); `uniqueItems`
over items with finitely many values (`grammar.json_schema.exact.unique`), refused otherwise
(not a regular language).

Functions of the schema builder (`builder.Builder`, passed as `b`).
"""

from __future__ import annotations

from grammar.automata import dfa_ops
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import node_to_dfa
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.json_schema.builder import Builder
from grammar.json_schema.exact.unique import unique_array

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing
MAX_CONTAINS = 64  # minContains / maxContains counted up to this


def array_value(b: Builder, s: dict, ptr: str) -> Node:
    items = s.get("items", True)
    if "prefixItems" in s:
        prefix, rest, rest_ptr = s["prefixItems"], items, f"{ptr}/items"
    elif isinstance(items, list):
        prefix, rest, rest_ptr = items, s.get("additionalItems", True), f"{ptr}/additionalItems"
    else:
        prefix, rest, rest_ptr = [], items, f"{ptr}/items"
    at = f"{ptr}/{'prefixItems' if 'prefixItems' in s else 'items'}"
    if s.get("uniqueItems") and s.get("maxItems", 2) > 1:  # one item is always unique
        ptrs = [*(f"{at}/{i}" for i in range(len(prefix))), rest_ptr]
        return unique_array(b, s, prefix, rest, ptrs, ptr)
    lo, hi = s.get("minItems", 0), s.get("maxItems")
    elems: list[Node] = [b.value(p, f"{at}/{i}") for i, p in enumerate(prefix)]
    # positions past an impossible element cannot exist
    for i, e in enumerate(elems):
        if e is None:
            elems, hi = elems[:i], i if hi is None else min(hi, i)
            break
    rest_re = b.value(rest, rest_ptr) if (hi is None or hi > len(elems)) else None
    if rest_re is None:
        hi = len(elems) if hi is None else min(hi, len(elems))
    if hi is not None and hi < lo:
        return None
    k = len(elems)

    def tail(i: int) -> Node:
        """What may follow once i >= 1 elements are written."""
        if hi is not None and i >= hi:
            return ra.EMPTY
        if i >= k:
            if rest_re is None:
                return ra.EMPTY
            top = None if hi is None else hi - i
            return ra.repeat(ra.seq(b.comma, rest_re), max(0, lo - i), top)
        step = ra.seq(b.comma, elems[i], tail(i + 1))
        return step if i < lo else ra.optional(step)

    first = elems[0] if k else rest_re
    if hi == 0 or first is None:
        inner: Node = ra.EMPTY if lo == 0 else None
    else:
        body = ra.seq(first, tail(1))
        inner = body if lo > 0 else ra.optional(body)
    # a recursive closure is a cycle through its cell: emptied, it is freed now
    tail = None  # type: ignore[assignment]  # noqa: F841
    if "contains" not in s:
        return b.wrap("[", inner, "]")
    plain = not prefix and lo == 0 and hi is None and rest_re is not None
    return containing(b, s, b.wrap("[", inner, "]"), [*elems, rest_re], plain, ptr)


def containing(b: Builder, s: dict, base: Node, elems: list[Node], plain: bool, ptr: str) -> Node:
    """`contains` with `minContains` / `maxContains`: arrays of `base` (whose elements are
    among `elems`) with lo..hi elements valid for `contains`. Counted by a regex over
    the elements: "matching" ones are the contains schema's instances, the others those
    of its negation (only needed when hi is bounded; otherwise they are any element).
    When `base` is a plain `items` array that regex is built on the items schema
    itself; otherwise it is intersected with `base` (an automaton product)."""
    where = f"{ptr}/contains"
    lo, hi = s.get("minContains", 1), s.get("maxContains")
    if lo == 0 and hi is None or base is None:
        return base
    if hi is not None and hi < lo:
        return None
    if max(lo, hi or 0) > MAX_CONTAINS:
        key = "maxContains" if (hi or 0) > MAX_CONTAINS else "minContains"
        raise UnsupportedSchemaError(key, f"{ptr}/{key}", f"over {MAX_CONTAINS}")
    items = s.get("items", True) if plain else True
    match = b.value({"allOf": [items, s["contains"]]}, where)
    if hi is None:
        other = elems[-1] if plain else ra.alt([e for e in elems if e is not None])
    else:
        try:
            other = b.value({"allOf": [items, {"not": s["contains"]}]}, where)
        except UnsupportedSchemaError as e:
            raise UnsupportedSchemaError("maxContains", f"{ptr}/maxContains", str(e)) from None

    def rest(c: int) -> Node:  # after the first element, c matching ones written
        end = ra.EMPTY if c >= lo and (hi is None or c <= hi) else None
        if hi is None and c >= lo:
            return ra.repeat(ra.seq(b.comma, other), 0, None)
        more = None if match is None or (hi is not None and c >= hi) else rest(c + 1)
        again = None if more is None else ra.seq(b.comma, match, more)
        skip = ra.repeat(ra.seq(b.comma, other), 0, None) if other is not None else ra.EMPTY
        return ra.seq(skip, ra.alt([end, again]))

    starts = [ra.seq(match, rest(1)) if match is not None else None]
    starts.append(ra.seq(other, rest(0)) if other is not None else None)
    if lo == 0:
        starts.append(ra.EMPTY)
    counted = b.wrap("[", ra.alt(starts), "]")
    if plain or counted is None:
        return counted
    try:
        both = dfa_ops.product(b.dfa(base), node_to_dfa(counted), True)
    except GrammarError as e:
        raise UnsupportedSchemaError("contains", where, str(e)) from None
    return dfa_ops.DFANode(both, "contains", where) if both.accepting.any() else None
