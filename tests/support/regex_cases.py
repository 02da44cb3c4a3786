"""Regex cases shared by the automata tests: a character class that matches nothing, and
random regexes with counted repetitions (a hypothesis strategy)."""

from __future__ import annotations

from hypothesis import strategies as st

from grammar.automata import interegular_adapter as ip

NOTHING = ip.CharGroup(frozenset(), False)  # a character class that matches nothing


def random_regexes() -> st.SearchStrategy[str]:
    """Random regexes over a few atoms, with alternations, stars, options and counted
    repetitions (`(r){lo,hi}`), for the property tests against Python's `re`."""
    atoms = st.sampled_from(["a", "b", "\u00e9", "[a-c]", ".", "(a|)", "[^a]"])

    def grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        counted = st.tuples(inner, st.integers(0, 12), st.integers(0, 6)).map(
            lambda t: f"({t[0]}){{{t[1]},{t[1] + t[2]}}}"
        )
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda t: f"({t[0]}|{t[1]})"),
            inner.map(lambda r: f"({r})*"),
            inner.map(lambda r: f"({r})?"),
            counted,
        )

    return st.recursive(atoms, grow, max_leaves=6)
