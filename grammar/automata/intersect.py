"""Whether two byte DFAs accept a common string (product-automaton search)."""

from __future__ import annotations

from grammar.automata.fsm import DEAD, START, ByteDFA
from grammar.errors import GrammarError


def dfas_intersect(a: ByteDFA, b: ByteDFA, max_pairs: int = 200_000) -> bool:
    """True if some string is accepted by both; GrammarError past `max_pairs` state pairs."""
    ta, tb = a.byte_table(), b.byte_table()
    seen = {(START, START)}
    stack = [(START, START)]
    while stack:
        sa, sb = stack.pop()
        if a.accepting[sa] and b.accepting[sb]:
            return True
        ra, rb = ta[sa], tb[sb]
        both = (ra != DEAD) & (rb != DEAD)
        pairs = set(zip(ra[both].tolist(), rb[both].tolist(), strict=True))
        for p in pairs:
            if p not in seen:
                seen.add(p)
                stack.append(p)
        if len(seen) > max_pairs:
            raise GrammarError("intersection search exceeds its budget")
    return False


__all__ = ["dfas_intersect"]
