"""The lazily determinised DFA (grammar/automata/lazy_dfa.py) against the eager construction
and `re`."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import GrammarError, compile_json_schema, compile_regex
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import DEAD, START, node_to_lazy_dfa, regex_to_dfa
from grammar.automata.lazy_dfa import LazyDFA
from grammar.json_schema.schema import json_schema_to_node
from tests.support.regex_cases import NOTHING, random_regexes
from tests.support.tokenizers import deepseek_vocab

# every test here runs on both subset constructions (C and Python)
pytestmark = pytest.mark.usefixtures("subset_construction")


def _expand_all(dfa: LazyDFA) -> None:
    """Read every reachable row (breadth first from START)."""
    seen, todo = {START}, [START]
    while todo:
        s = todo.pop()
        for t in set(dfa.row_list(s)):
            if t != DEAD and t not in seen:
                seen.add(t)
                todo.append(t)


def _reaches_acceptance(dfa: LazyDFA) -> bool:
    """Every numbered state but DEAD can still reach an accepting state."""
    n = dfa.num_states
    rows = [dfa.row_list(s) for s in range(n)]
    live = {s for s in range(1, n) if dfa.accepting[s]}
    changed = True
    while changed:
        changed = False
        for s in range(1, n):
            if s not in live and any(t in live for t in rows[s]):
                live.add(s)
                changed = True
    return live == set(range(1, n))


@given(pattern=random_regexes(), data=st.data())
@settings(max_examples=200, deadline=None)
def test_lazy_dfa_agrees_with_re_and_the_eager_dfa(pattern: str, data: st.DataObject) -> None:
    lazy = node_to_lazy_dfa(pattern)
    eager = regex_to_dfa(pattern)
    rx = re.compile(pattern)
    for _ in range(20):
        text = data.draw(st.text(alphabet="abc\u00e9\n", max_size=30))
        b = text.encode()
        assert lazy.matches(b) == eager.matches(b) == bool(rx.fullmatch(text)), (pattern, text)
    if isinstance(lazy, LazyDFA):
        _expand_all(lazy)
        assert _reaches_acceptance(lazy), pattern


def test_empty_pieces_fall_back_to_the_eager_pruned_dfa() -> None:
    nothing = NOTHING
    node = ra.alt([ra.seq(ra.char("a"), nothing), ra.char("c")])
    dfa = node_to_lazy_dfa(node)
    assert not dfa.lazy  # a piece that matches nothing: only the eager build prunes it
    assert dfa.walk(START, b"a") == DEAD and dfa.matches(b"c")
    with pytest.raises(GrammarError, match="matches nothing"):
        node_to_lazy_dfa(nothing)


def test_schema_rows_are_built_only_where_walks_go() -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["id", "name"],
    }
    dfa = node_to_lazy_dfa(json_schema_to_node(schema))
    assert dfa.lazy and dfa.num_states < 10  # the start row only (and its targets)
    assert dfa.matches(b'{"id":1,"name":"x","other":[1,{"a":null}]}')
    assert not dfa.matches(b'{"id":1,"name":"x","other":[1,{"a":nul}]}')
    expanded = sum(n >= 0 for n in dfa._live)
    _expand_all(dfa)
    assert expanded < sum(n >= 0 for n in dfa._live)  # most rows were never read
    assert _reaches_acceptance(dfa)


def test_lazy_budget_raises_when_a_walk_would_exceed_it() -> None:
    vocab = deepseek_vocab()
    # a small NFA whose DFA remembers the last 9 letters: 2**9 states
    g = compile_regex("[ab]*a[ab]{8}", vocab, max_states=100)
    m = g.matcher()
    rng = np.random.default_rng(0)
    with pytest.raises(GrammarError, match="state budget"):
        for _ in range(2000):
            m.advance_bytes(bytes(rng.choice([97, 98], size=4).tolist()))


def test_masks_built_from_many_threads_match_one_thread() -> None:
    vocab = deepseek_vocab()
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": "array", "items": {"type": "number"}},
        },
    }
    texts = [b'{"a":"', b'{"a":"x","b":[', b'{"a":"x","b":[1.5,', b'{"b":[2', b'{"z":{"q":[']
    one = compile_json_schema(schema, vocab)
    want = {t: one.index.bitmask(one.dfa.walk(START, t)).copy() for t in texts}
    from grammar import clear_caches

    clear_caches()
    shared = compile_json_schema(schema, vocab)
    assert shared is not one
    got: dict[tuple[int, bytes], np.ndarray] = {}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for t in texts[k % 2 :] + texts[: k % 2]:
                got[(k, t)] = shared.index.bitmask(shared.dfa.walk(START, t)).copy()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for (_, t), words in got.items():
        assert (words == want[t]).all(), t


def test_the_dead_state_allows_nothing() -> None:
    g = compile_regex("[a-z]+", deepseek_vocab())
    assert not g.index.bitmask(DEAD).any()
