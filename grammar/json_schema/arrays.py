"""Arrays: `prefixItems` / `items` (a list in drafts before 2020-12) / `additionalItems`, with
`minItems` / `maxItems`; `uniqueItems` is refused (not a regular language).

`ArrayRules` is mixed into the builder of `grammar.json_schema.schema`.
"""

from __future__ import annotations

from grammar.automata import regex_ast as ra
from grammar.errors import UnsupportedSchemaError

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing


class ArrayRules:
    """Needs from the builder: `value`, `comma`, `wrap`."""

    def array(self, s: dict, ptr: str) -> Node:
        if s.get("uniqueItems"):
            raise UnsupportedSchemaError("uniqueItems", f"{ptr}/uniqueItems")
        items = s.get("items", True)
        if "prefixItems" in s:
            prefix, rest, rest_ptr = s["prefixItems"], items, f"{ptr}/items"
        elif isinstance(items, list):
            prefix, rest, rest_ptr = items, s.get("additionalItems", True), f"{ptr}/additionalItems"
        else:
            prefix, rest, rest_ptr = [], items, f"{ptr}/items"
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        elems: list[Node] = [
            self.value(p, f"{ptr}/{'prefixItems' if 'prefixItems' in s else 'items'}/{i}")
            for i, p in enumerate(prefix)
        ]
        # positions past an impossible element cannot exist
        for i, e in enumerate(elems):
            if e is None:
                elems, hi = elems[:i], i if hi is None else min(hi, i)
                break
        rest_re = self.value(rest, rest_ptr) if (hi is None or hi > len(elems)) else None
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
                return ra.repeat(ra.seq(self.comma, rest_re), max(0, lo - i), top)
            step = ra.seq(self.comma, elems[i], tail(i + 1))
            return step if i < lo else ra.optional(step)

        first = elems[0] if k else rest_re
        if hi == 0 or first is None:
            inner: Node = ra.EMPTY if lo == 0 else None
        else:
            body = ra.seq(first, tail(1))
            inner = body if lo > 0 else ra.optional(body)
        return self.wrap("[", inner, "]")
