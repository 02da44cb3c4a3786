"""`LazyDFA.forced_run` (a forced text's rows built and read in one C call, or state by state
without the C core) against stepping `forced_byte` / `step` one state at a time."""

from __future__ import annotations

import random
import re

import pytest

from grammar.automata.fsm import DEFAULT_MAX_STATES, nfa_budget
from grammar.automata.lazy_dfa import START, LazyDFA
from grammar.automata.nfa import NFA, parse_regex

_HEAD = b"<call name='lookup'>" + bytes(range(ord("a"), ord("z") + 1)) * 3
_TAIL = b"</call>\n" * 4


def _dfa(native: bool, monkeypatch: pytest.MonkeyPatch) -> LazyDFA:
    """A fresh lazy DFA (no row built past the start) for head, then 'x' or 'yy', then tail."""
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1" if native else "0")
    pattern = re.escape(_HEAD.decode()) + "(x|yy)" + re.escape(_TAIL.decode())
    nfa = NFA(max_states=nfa_budget(DEFAULT_MAX_STATES))
    return LazyDFA(nfa, nfa.add_node(parse_regex(pattern), lazy=True), DEFAULT_MAX_STATES)


def _stepped(dfa, state: int, limit: int, stop: set[int]) -> tuple[list[int], bytes, int]:
    path, text, s = [], bytearray(), state
    while len(path) < limit and s not in stop:
        b = dfa.forced_byte(s)
        if b < 0:
            break
        path.append(s)
        text.append(b)
        s = dfa.step(s, b)
    return path, bytes(text), s


class _Sets:
    """States of `dfa` whose NFA state sets are in `sets` (a stop set across two DFAs)."""

    def __init__(self, dfa: LazyDFA, sets: set[tuple[int, ...]]) -> None:
        self.dfa, self.sets = dfa, sets

    def __contains__(self, x: object) -> bool:
        return self.dfa.nfa_states(int(x)) in self.sets


@pytest.mark.parametrize("native", [True, False])
def test_forced_run_equals_stepping(native, monkeypatch):
    text = _HEAD + b"yy" + _TAIL
    ref = _dfa(native, monkeypatch)
    states = [START]
    for b in text[:-1]:
        states.append(ref.step(states[-1], b))
    rng = random.Random(3)
    n_cut = 0
    for trial in range(40):
        k = rng.randrange(len(states))
        limit = rng.choice([1, 5, 64, 200])
        stop = {states[j] for j in range(len(states)) if j != k and rng.random() < 0.05}
        sets = {ref.nfa_states(j) for j in stop}
        dfa = _dfa(native, monkeypatch)  # rows past the prefix unbuilt: the run builds them
        assert dfa.native == native
        s = dfa.walk(START, text[:k])
        path, got, end = dfa.forced_run(s, limit, _Sets(dfa, sets))
        want_path, want, want_end = _stepped(ref, states[k], limit, stop)
        assert bytes(got) == want, (trial, k, limit)
        assert [dfa.nfa_states(x) for x in path] == [ref.nfa_states(x) for x in want_path]
        assert dfa.nfa_states(end) == ref.nfa_states(want_end)
        n_cut += bool(path) and dfa.nfa_states(end) in sets
    assert n_cut >= 3
    # a run stops at the branch ('x' or 'y' after the head)
    dfa = _dfa(native, monkeypatch)
    path, got, end = dfa.forced_run(START, 1000, set())
    assert bytes(got) == _HEAD and dfa.live_bytes(end) == 2 and len(path) == len(_HEAD)
