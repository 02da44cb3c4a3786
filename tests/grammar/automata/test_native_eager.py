"""The eager DFA construction (`fsm.nfa_to_dfa`) in C (`native_dfa.eager_rows`) against the
Python one: the same automaton up to state numbering (and the same byte classes), dead ends
pruned, lazily filled blocks filled by the core, the same errors past the budget or for a
constraint that matches nothing."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from grammar import GrammarError
from grammar.automata import fsm, native_dfa
from grammar.automata.fsm import ByteDFA, nfa_budget, nfa_to_dfa
from grammar.automata.lazy_dfa import DEAD, START
from grammar.automata.nfa import NFA, parse_regex
from grammar.json_schema.schema import json_schema_to_node

PATTERNS = [
    pytest.param(r"[a-z]+@[a-z]+\.(com|org)", "ab@.comrgx", id="alternatives"),
    pytest.param(r"(ab|cd){2,70}x", "abcdx", id="counted-copies"),
    pytest.param(r"[^\"\\]{0,90}", 'a"é\\', id="lazy-copies"),
    pytest.param(r"é(ü|ß){1,3}|[α-ω]+z", "éüßαωz", id="utf8"),
    pytest.param(r"a(b[^\s\S])?c|d", "abcd", id="dead-end-pruned"),
    # one state with 70 distinct edge masks (over a 64-bit word of them), all fired by '!':
    # a union of 70 closures, {z(i), l(i)} each, the z(i) numbered in reverse by the first
    # option (an unsorted union of 140 states: past the insertion sort's 24)
    pytest.param(
        "q(?:"
        + "|".join(f"z{j:02d}" for j in reversed(range(70)))
        + ")|"
        + "|".join(f"[!-{re.escape(chr(0x22 + i))}](?:l{i:02d}|z{i:02d})" for i in range(70)),
        "!#qzl0123456789",
        id="many-masks-in-one-state",
    ),
]
BLOCK_SCHEMA = {  # embedded automata (key regions, a pattern with a length): lazily filled blocks
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^[a-f]+$", "maxLength": 6}},
    "patternProperties": {"^x[a-z]{0,3}$": {"type": "integer"}},
    "additionalProperties": False,
}


def _needs_c() -> None:
    if native_dfa.new_core(NFA(max_states=8), 8) is None:
        pytest.skip("no C compiler: only the Python construction runs")


def _eager(tree: object, monkeypatch: pytest.MonkeyPatch, on: bool, max_states: int = 50_000,
           ) -> ByteDFA:  # fmt: skip
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1" if on else "0")
    monkeypatch.setattr(fsm, "_C_FROM", 0)  # (small NFAs too: C builds them when on)
    nfa = NFA(max_states=nfa_budget(max_states))
    return nfa_to_dfa(nfa, nfa.add_node(tree), max_states)


def _same_automaton(a: ByteDFA, b: ByteDFA) -> bool:
    """Whether a and b are one automaton numbered two ways: a walk from both starts over every
    byte pairs their states one to one, with the same accepting states."""
    ta, tb = a.byte_table(), b.byte_table()
    pair = {DEAD: DEAD, START: START}
    todo = [START]
    while todo:
        x = todo.pop()
        y = pair[x]
        if bool(a.accepting[x]) != bool(b.accepting[y]):
            return False
        for u, v in zip(ta[x].tolist(), tb[y].tolist(), strict=True):
            w = pair.get(u)
            if w is None:
                pair[u] = v
                todo.append(u)
            elif w != v:
                return False
    return len(set(pair.values())) == len(pair) and a.num_states == b.num_states


def _samples(alphabet: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(n)]


@pytest.mark.parametrize(("pattern", "alphabet"), PATTERNS)
def test_c_builds_the_python_construction_s_automaton(
    pattern: str, alphabet: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _needs_c()
    c_dfa = _eager(parse_regex(pattern), monkeypatch, True)
    py_dfa = _eager(parse_regex(pattern), monkeypatch, False)
    assert _same_automaton(c_dfa, py_dfa)
    assert c_dfa.num_classes == py_dfa.num_classes
    assert c_dfa.classes == py_dfa.classes
    rx = re.compile(pattern)
    for text in _samples(alphabet, 300, seed=len(pattern)):
        assert c_dfa.matches(text.encode()) == bool(rx.fullmatch(text)), text


def test_dead_ends_are_pruned_on_the_c_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_c()
    dfa = _eager(parse_regex(r"a(b[^\s\S])?c|d"), monkeypatch, True)
    after_ab = dfa.walk(dfa.walk(START, b"a"), b"b")
    assert after_ab == DEAD  # "ab" leads only into the class that matches nothing
    assert dfa.matches(b"ac") and dfa.matches(b"d")


def test_block_states_are_filled_by_the_core_not_the_nfa(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _needs_c()
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1")
    monkeypatch.setattr(fsm, "_C_FROM", 0)
    nfa = NFA(max_states=nfa_budget(50_000))
    start = nfa.add_node(json_schema_to_node(BLOCK_SCHEMA))
    assert nfa.blocks  # (the schema has embedded automata)
    c_dfa = nfa_to_dfa(nfa, start, 50_000)
    unfilled = sum(
        nfa.edges[x] is None for b in nfa.blocks for x in range(b.first, b.first + b.size)
    )
    assert unfilled > 0  # the NFA's own lists never got them: the core filled what it read
    py_dfa = _eager(json_schema_to_node(BLOCK_SCHEMA), monkeypatch, False)
    assert _same_automaton(c_dfa, py_dfa)
    texts = ['{"s":"abc","xab":3}', '{"s":"abcdefa"}', '{"xabcd":1}', '{"s":"f","x":-2}', "{}"]
    assert [c_dfa.matches(t.encode()) for t in texts] == [True, False, False, True, True]


@pytest.mark.parametrize("on", [True, False], ids=["c", "python"])
def test_budget_and_empty_language_errors_match(on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if on:
        _needs_c()
    with pytest.raises(GrammarError, match=r"state budget \(300 states\)"):
        _eager(parse_regex(r"[a-z]{0,400}"), monkeypatch, on, max_states=300)
    with pytest.raises(GrammarError, match="matches nothing"):
        _eager(parse_regex(r"a[^\s\S]"), monkeypatch, on)
    dfa = _eager(parse_regex(r"[a-z]{0,250}"), monkeypatch, on, max_states=300)
    assert dfa.matches(b"a" * 250) and not dfa.matches(b"a" * 251)
    assert np.array_equal(dfa.byte_table()[DEAD], np.zeros(256, dtype=dfa.table.dtype))


def test_dead_end_pruning_in_c_finds_the_python_walk_s_live_states() -> None:
    _needs_c()
    rng = np.random.default_rng(7)
    for n, k in [(2, 1), (60, 3), (700, 9)]:
        table = rng.integers(0, n, size=(n, k), dtype=np.int32)
        table[rng.random((n, k)) < 0.7] = DEAD
        table[DEAD] = DEAD
        accepting = rng.random(n) < 0.03
        c_live = native_dfa.live_states(table, accepting)
        py_live = fsm._live_by_walk(*fsm.edges_into(table), accepting)
        assert np.array_equal(c_live, py_live)
        assert not c_live[DEAD] and c_live[np.flatnonzero(accepting[1:]) + 1].all()
