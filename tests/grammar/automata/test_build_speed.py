"""Shortcuts in building the lazy automaton (`grammar.automata`) that must not change what is
built: the lazy DFA's rows and state sets are the ones the plain construction gives, state for
state, whatever a walk reads first."""

from __future__ import annotations

import numpy as np
import pytest

from grammar.automata import nfa as nfa_module
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import DEFAULT_MAX_STATES, nfa_budget
from grammar.automata.lazy_dfa import LazyDFA
from grammar.automata.nfa import NFA, parse_regex
from grammar.json_schema.exact import names
from grammar.json_schema.scalars import STRING_CHAR_TEXT


def _lazy_dfa(tree: object) -> LazyDFA:
    nfa = NFA(max_states=nfa_budget(DEFAULT_MAX_STATES))
    return LazyDFA(nfa, nfa.add_node(tree, lazy=True), DEFAULT_MAX_STATES)


def _built(dfa: LazyDFA) -> list[tuple]:
    """Every numbered state: its NFA states, and its row and forced byte when expanded."""
    out = []
    for s in range(dfa.num_states):
        row = dfa.table[s].tolist() if dfa._live[s] >= 0 else None
        out.append((dfa.nfa_states(s), row, dfa._forced[s], bool(dfa.accepting[s])))
    return out


def _objects(name_lists: list[list[str]]) -> object:
    """`{` key `:` digits `}` for one object per name list, each key any but its names."""
    string_char = ra.parsed(STRING_CHAR_TEXT)
    digits = ra.repeat(ra.char_class(frozenset("0123456789")), 1, None)
    options = []
    for i, name_list in enumerate(name_lists):
        key = names.deferred_string_except(name_list, string_char)
        options.append(ra.seq(ra.char("{"), ra.char(str(i)), key, ra.char(":"), digits))
    return ra.seq(ra.alt(options), ra.char("}"))


NAME_LISTS = [["apiVersion", "kind"], ["kind", "metadata"], ["spec", "status", "kind"]]
TEXTS = [b'{0"x":1}', b'{1"kinds":2}', b'{2"sp":3}', b'{0"\\u0061":4}', b'{1"\xc3\xa9":5}']


def test_expanding_deferred_pieces_keeps_their_keys_and_builds_the_same_states(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nfa_module, "EAGER_STRUCTURES", 0)  # every complement deferred
    kept = _lazy_dfa(_objects(NAME_LISTS))
    for text in TEXTS:
        kept.walk(1, text)
    # the pieces the complements share (the string character) stay keyed between expansions
    assert kept.nfa._structures._ids

    fill = NFA.fill

    def fill_then_forget(self: NFA, x: int) -> None:  # each expansion keys from scratch
        fill(self, x)
        self._structures.forget()

    monkeypatch.setattr(NFA, "fill", fill_then_forget)
    plain = _lazy_dfa(_objects(NAME_LISTS))
    for text in TEXTS:
        plain.walk(1, text)
    assert _built(kept) == _built(plain)


ONE_EDGE = [
    pytest.param(r"abc", id="literal"),
    pytest.param(r"[a-f]x[0-9]", id="classes"),
    pytest.param(r"(ab|cd)e", id="set-of-states"),
    pytest.param(r"é[α-ω]", id="utf8"),
    pytest.param(r"a*b", id="loop"),
]


@pytest.mark.parametrize("pattern", ONE_EDGE)
def test_a_row_of_one_state_with_one_edge_is_the_general_construction_s(
    pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "0")  # (a shortcut of the Python construction)
    fast = _lazy_dfa(parse_regex(pattern))
    fast.expand(np.arange(fast.num_states))
    while fast.num_states > int((np.asarray(fast._live) >= 0).sum()):
        fast.expand(np.arange(fast.num_states))
    # the general path: every state set's length read as at least 2 (its states as they are)
    general = _lazy_dfa(parse_regex(pattern))
    order = general._order

    class Twice(tuple):
        def __len__(self) -> int:  # never 1: the one-state shortcut is not taken
            return max(2, super().__len__())

    expand = LazyDFA._expand

    def expand_general(self: LazyDFA, i: int) -> None:
        saved = order[i]
        order[i] = Twice(saved)
        try:
            expand(self, i)
        finally:
            order[i] = saved

    monkeypatch.setattr(LazyDFA, "_expand", expand_general)
    while general.num_states > int((np.asarray(general._live) >= 0).sum()):
        general.expand(np.arange(general.num_states))
    assert _built(fast) == _built(general)
