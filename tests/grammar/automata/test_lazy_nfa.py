"""The NFA built on first read (`NFA.add_node(tree, lazy=True)`): alternations and repetitions
are built when a lazy DFA first reads them. The DFA it gives must be the eager build's, state
for state, and what the eager build refuses at compile time it must still refuse then."""

from __future__ import annotations

import random
import re

import pytest

from grammar import GrammarError, compile_json_schema
from grammar.automata import nfa as nfa_module
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import DEFAULT_MAX_STATES, nfa_budget, node_to_lazy_dfa
from grammar.automata.lazy_dfa import LazyDFA
from grammar.automata.nfa import NFA, parse_regex
from grammar.json_schema.schema import json_schema_to_node
from tests.support.regex_cases import NOTHING
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import walk

# every test here runs on both subset constructions (C and Python)
pytestmark = pytest.mark.usefixtures("subset_construction")

REGEXES = [
    r"(ab|cd)*e",
    r"(a|b){2,5}c?",
    r"x(y(z|w)+)*",
    r"[a-c]{1,20}(d|e){0,3}",
    r"(foo|bar|baz)(,(foo|bar|baz)){0,12}",
    r"((a|bc)*d){3}",
    r"[^x]{0,70}x",  # past the lazy-copies threshold
    r"é(ü|ß){1,3}|[α-ω]+",
]


def _dfas(tree: object) -> tuple[LazyDFA, LazyDFA, NFA]:
    """The same tree as a lazy DFA over a lazily built NFA and over an eagerly built one."""
    out = []
    for lazy in (True, False):
        nfa = NFA(max_states=nfa_budget(DEFAULT_MAX_STATES))
        start = nfa.add_node(tree, lazy=lazy)
        out.append((LazyDFA(nfa, start, DEFAULT_MAX_STATES), nfa))
    return out[0][0], out[1][0], out[0][1]


def _samples(pattern: str, alphabet: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(n)]


@pytest.fixture
def defer_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tree deferred from its first node (small trees otherwise start eager)."""
    monkeypatch.setattr(nfa_module, "EAGER_STRUCTURES", 0)


@pytest.mark.parametrize("eager_structures", [0, 1500])
@pytest.mark.parametrize("pattern", REGEXES)
def test_lazy_nfa_gives_the_eager_dfa_state_for_state(
    pattern: str, eager_structures: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nfa_module, "EAGER_STRUCTURES", eager_structures)
    tree = parse_regex(pattern)
    lazy, eager, _ = _dfas(tree)
    alphabet = "".join(sorted(set(re.sub(r"[\\()|*+?{},\[\]^0-9-]", "", pattern)))) + "x"
    for text in _samples(pattern, alphabet, 400, seed=len(pattern)):
        want = re.fullmatch(pattern, text) is not None
        data = text.encode()
        assert lazy.matches(data) == want, text
        assert eager.matches(data) == want, text
        # the same walk numbers the same states: one DFA, built in the same order
        assert lazy.walk(1, data) == eager.walk(1, data), text
    assert lazy.num_states == eager.num_states


def _wide_schema(n: int) -> dict:
    member = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
            "size": {"type": "integer", "minimum": 0},
        },
    }
    props = {f"field_{i}": member for i in range(n)}
    return {"type": "object", "properties": props, "additionalProperties": False}


def test_lazy_build_leaves_unread_members_unbuilt_until_a_walk_reaches_them(
    defer_at_once: None,
) -> None:
    tree = json_schema_to_node(_wide_schema(40))
    lazy, eager, nfa = _dfas(tree)
    built_at_start = len(nfa.eps) - len(nfa._pending)
    eager_states = len(eager._nfa.eps)
    assert nfa._pending, "nothing was deferred"
    assert built_at_start < eager_states / 4, (built_at_start, eager_states)
    text = b'{"field_7":{"name":"a","tags":["red","blue"],"size":3},"field_31":{}}'
    assert lazy.matches(text) and eager.matches(text)
    assert not lazy.matches(text.replace(b"red", b"pink"))
    assert lazy.walk(1, text) == eager.walk(1, text)


def test_a_compiled_schema_walks_tokens_through_members_built_on_the_way() -> None:
    g = compile_json_schema(_wide_schema(12), deepseek_vocab())
    tok = deepseek_tokenizer()
    good = '{"field_3":{"tags":["green"],"size":12},"field_11":{"name":"x"}}'
    assert walk(g, tok.encode(good, add_special_tokens=False))
    bad_texts = (
        good.replace("12", "-12"),
        good.replace("field_11", "field_12"),
        good.replace('"x"', "5"),
    )
    for bad in bad_texts:
        assert not walk(g, tok.encode(bad, add_special_tokens=False)), bad


def test_a_bad_repetition_is_refused_at_compile_time_even_when_deferred() -> None:
    nfa = NFA(max_states=10_000)
    tree = ra.alt([ra.char("a"), ra.seq(ra.char("b"), ra.repeat(ra.char("c"), 0, None))])
    bad = ra.alt([tree, ra.seq(ra.char("d"), type(tree.options[1].parts[1])(ra.char("e"), 3, 2))])
    with pytest.raises(GrammarError, match="bad repetition"):
        nfa.add_node(bad, lazy=True)


def test_a_piece_matching_nothing_makes_the_build_eager() -> None:
    # an option that can never finish: only the eager construction prunes that dead end
    tree = ra.alt([ra.seq(ra.char("a"), NOTHING), ra.repeat(ra.char("b"), 1, None)])
    dfa = node_to_lazy_dfa(tree)
    assert not getattr(dfa, "lazy", False)
    assert dfa.matches(b"bbb") and not dfa.matches(b"a")


def test_a_small_tree_starts_eager_and_defers_past_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = json_schema_to_node(_wide_schema(40))
    _, _, whole = _dfas(tree)
    assert not whole._pending  # small enough: built whole at once
    monkeypatch.setattr(nfa_module, "EAGER_WORK", 50)
    lazy, eager, capped = _dfas(tree)
    assert capped._pending and capped._work >= 50
    text = b'{"field_2":{"size":1},"field_39":{"tags":[]}}'
    assert lazy.matches(text) and lazy.walk(1, text) == eager.walk(1, text)


def test_lazy_fill_past_the_state_budget_raises_a_grammar_error(defer_at_once: None) -> None:
    # nothing deferred is built at compile time; reading past the budget raises, typed
    tree = ra.seq(ra.char("x"), ra.repeat(ra.alt([ra.lit("ab"), ra.lit("cd")]), 0, None))
    nfa = NFA(max_states=6)
    start = nfa.add_node(tree, lazy=True)
    with pytest.raises(GrammarError, match="state budget"):
        dfa = LazyDFA(nfa, start, 1000)
        dfa.walk(1, b"xabcdabcd")


def test_a_compile_leaves_no_reference_cycle_behind() -> None:
    """What one compile does not keep is freed by reference counting as it goes, not left as
    cycles for the next GC pass to trace (the builder's recursive closures were such cycles:
    ~35k objects on a Kubernetes schema)."""
    import gc

    schema = _wide_schema(6)
    schema["properties"]["list"] = {
        "type": "array",
        "prefixItems": [{"type": "string"}],
        "items": {"type": "integer"},
        "maxItems": 4,
    }
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        before = {id(o) for o in gc.get_objects()}
        tree = json_schema_to_node(schema)
        alive = [o for o in gc.get_objects() if id(o) not in before]
        kinds = {type(o).__name__ for o in alive}
        closures = {o.__qualname__ for o in alive if type(o).__name__ == "function"}
    finally:
        if was:
            gc.enable()
    assert tree is not None
    assert "SchemaBuilder" not in kinds
    kept = ("members.<locals>.rest", "array_value.<locals>.tail")
    assert not {q for q in closures if q.endswith(kept)}


def test_a_fill_that_fails_fails_again_on_the_next_read(defer_at_once: None) -> None:
    tree = ra.seq(ra.char("x"), ra.repeat(ra.alt([ra.lit("ab"), ra.lit("cd")]), 0, None))
    nfa = NFA(max_states=1000)
    start = nfa.add_node(tree, lazy=True)
    nfa.max_states = len(nfa.eps)  # no room left: the next state a fill makes is refused
    pending = dict(nfa._pending)
    x = next(iter(pending))
    for _ in range(2):  # the same typed error each time, the state still deferred
        with pytest.raises(GrammarError, match="state budget"):
            nfa.fill(x)
        assert nfa._pending.get(x) == pending[x]
    assert start is not None
