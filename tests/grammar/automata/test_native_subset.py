"""The lazy DFA's subset construction in C (`native_dfa`, csrc/subset.c) against the Python
one: the same state sets for the same walks, the same NFA states filled (the NFA stays lazy),
the same budget errors, and a build without the C core still working."""

from __future__ import annotations

import io
import pickle
import random
import re
import threading

import pytest

from grammar import GrammarError, compile_json_schema
from grammar.automata import native_dfa
from grammar.automata import nfa as nfa_module
from grammar.automata.fsm import DEFAULT_MAX_STATES, nfa_budget
from grammar.automata.lazy_dfa import DEAD, START, LazyDFA
from grammar.automata.nfa import NFA, parse_regex
from grammar.json_schema.schema import json_schema_to_node
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import walk

REGEXES = [
    pytest.param(r"(ab|cd)*e", "abcde", id="loop-of-alternatives"),
    pytest.param(r"[a-c]{1,20}(d|e){0,3}", "abcde", id="counted"),
    pytest.param(r"[^x]{0,70}x", "axé", id="lazy-copies"),
    pytest.param(r"é(ü|ß){1,3}|[α-ω]+", "éüßαω", id="utf8"),
    pytest.param(r"((a|bc)*d){3}", "abcd", id="nested-loops"),
    pytest.param(r"(foo|bar|baz)(,(foo|bar|baz)){0,12}", "fobarz,", id="lists"),
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"enum": ["a", "bc", "déf"]}, "maxItems": 5},
        "n": {"type": "integer", "minimum": -5, "maximum": 300},
    },
    "required": ["name"],
    "additionalProperties": {"type": "number"},
}
INSTANCES = [
    {"name": "Ada", "tags": ["a", "déf"], "n": 299},
    {"name": "", "n": -5, "zz": 2},
    {"name": "x" * 40},
]


def _lazy(pattern_or_tree: object, monkeypatch: pytest.MonkeyPatch, on: bool,
          max_states: int = DEFAULT_MAX_STATES) -> LazyDFA:  # fmt: skip
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1" if on else "0")
    tree = parse_regex(pattern_or_tree) if isinstance(pattern_or_tree, str) else pattern_or_tree
    nfa = NFA(max_states=nfa_budget(max_states))
    dfa = LazyDFA(nfa, nfa.add_node(tree, lazy=True), max_states)
    assert dfa.native == on
    return dfa


def _samples(alphabet: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(n)]


def _trace(dfa: LazyDFA, texts: list[str]) -> list[tuple]:
    """Per text: the NFA state sets of the states its walk passes, and whether it matches."""
    out = []
    for text in texts:
        s, sets = START, []
        for b in text.encode():
            s = dfa.step(s, b)
            sets.append(dfa.nfa_states(s) if s != DEAD else ())
            if s == DEAD:
                break
        out.append((tuple(sets), s != DEAD and bool(dfa.accepting[s])))
    return out


def _filled(dfa: LazyDFA) -> int:
    """NFA states filled, by the NFA or (a block's, with the C core) by the core itself."""
    return sum(e is not None for e in dfa.nfa.edges) + dfa.block_fills_in_c


@pytest.mark.parametrize(("pattern", "alphabet"), REGEXES)
def test_c_core_builds_the_python_construction_s_states(
    pattern: str, alphabet: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if native_dfa.new_core(NFA(max_states=8), 8) is None:
        pytest.skip("no C compiler: only the Python construction runs")
    texts = _samples(alphabet, 300, seed=len(pattern))
    c_dfa, py_dfa = _lazy(pattern, monkeypatch, True), _lazy(pattern, monkeypatch, False)
    assert _trace(c_dfa, texts) == _trace(py_dfa, texts)
    # the matches are re's, and the NFA was filled exactly as far as the walks read it
    rx = re.compile(pattern)
    assert [m for _, m in _trace(c_dfa, texts)] == [bool(rx.fullmatch(t)) for t in texts]
    assert _filled(c_dfa) == _filled(py_dfa)
    assert c_dfa.num_states == py_dfa.num_states


def test_c_core_keeps_deferred_pieces_unbuilt_until_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nfa_module, "EAGER_STRUCTURES", 0)  # everything deferred
    tree = json_schema_to_node(SCHEMA)
    c_dfa = _lazy(tree, monkeypatch, True)
    py_dfa = _lazy(json_schema_to_node(SCHEMA), monkeypatch, False)
    assert _filled(c_dfa) == _filled(py_dfa) < len(c_dfa.nfa.edges)
    texts = ['{"name":"Ada","tags":["bc"],"zz":1}', '{"name":"x","n":301}', '{"n":3}']
    # (deferred pieces filled in another order number their NFA states otherwise: the sets
    # are compared by size)
    c_trace, py_trace = _trace(c_dfa, texts), _trace(py_dfa, texts)
    assert [m for _, m in c_trace] == [m for _, m in py_trace] == [True, False, False]
    sizes = [[len(s) for s in sets] for sets, _ in c_trace]
    assert sizes == [[len(s) for s in sets] for sets, _ in py_trace]
    assert _filled(c_dfa) == _filled(py_dfa) < len(c_dfa.nfa.edges)
    assert c_dfa.num_states == py_dfa.num_states


@pytest.mark.usefixtures("subset_construction")
def test_a_walk_past_the_state_budget_raises_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    dfa = LazyDFA(*_nfa_start(r"[a-z]{0,400}"), 64)
    with pytest.raises(GrammarError, match=r"state budget \(64 states\)"):
        dfa.walk(START, b"a" * 200)
    # and again on the next read of the same row (nothing half-built is kept)
    with pytest.raises(GrammarError, match="state budget"):
        dfa.walk(START, b"a" * 200)
    assert dfa.matches(b"abc")  # the states inside the budget still work


@pytest.mark.usefixtures("subset_construction")
def test_a_budget_lowered_after_construction_holds_on_both_constructions() -> None:
    dfa = LazyDFA(*_nfa_start(r"[a-z]{0,400}"), DEFAULT_MAX_STATES)
    assert dfa.matches(b"abc")
    dfa.max_states = dfa.num_states + 3  # what a serving process may do to a rebuilt DFA
    with pytest.raises(GrammarError, match="state budget"):
        dfa.walk(START, b"a" * 50)


def _nfa_start(pattern: str) -> tuple[NFA, int]:
    nfa = NFA(max_states=nfa_budget(DEFAULT_MAX_STATES))
    return nfa, nfa.add_node(parse_regex(pattern), lazy=True)


@pytest.mark.usefixtures("subset_construction")
def test_only_the_empty_string_and_optional_pieces() -> None:
    empty = LazyDFA(*_nfa_start(r"a{0}"), DEFAULT_MAX_STATES)
    assert empty.matches(b"") and not empty.matches(b"a")
    assert not empty.can_continue(START)
    optional = LazyDFA(*_nfa_start(r"(ab|b)?"), DEFAULT_MAX_STATES)
    assert [optional.matches(t) for t in (b"", b"ab", b"b", b"a", b"bb")] == [
        True, True, True, False, False,
    ]  # fmt: skip
    assert optional.forced_byte(optional.step(START, ord("a"))) == ord("b")


@pytest.mark.usefixtures("subset_construction")
def test_schema_masks_accept_valid_instances_on_both_constructions() -> None:
    from grammar import clear_caches
    from tests.support.json_text import compact

    clear_caches()
    tok, grammar = deepseek_tokenizer(), compile_json_schema(SCHEMA, deepseek_vocab())
    for instance in INSTANCES:
        assert walk(grammar, tok.encode(compact(instance), add_special_tokens=False))
    assert not walk(grammar, tok.encode('{"name":1}', add_special_tokens=False))


def test_the_c_source_compiles_without_warnings() -> None:
    from grammar import native_build

    if native_build.compiler() is None:
        pytest.skip("no C compiler")
    assert native_build.compile_warnings(native_dfa.UNITS) == {}


class _LockPickler(pickle.Pickler):
    """Pickles a lazy DFA as the compile worker does: its lock by name, remade on load."""

    def persistent_id(self, obj: object) -> str | None:
        return "rlock" if isinstance(obj, type(threading.RLock())) else None


class _LockUnpickler(pickle.Unpickler):
    def persistent_load(self, pid: str) -> object:
        return threading.RLock()


def _round_trip(dfa: LazyDFA) -> LazyDFA:
    buf = io.BytesIO()
    _LockPickler(buf).dump(dfa)
    return _LockUnpickler(io.BytesIO(buf.getvalue())).load()


@pytest.mark.parametrize("reload_native", ["1", "0"], ids=["loaded-with-c", "loaded-without"])
@pytest.mark.usefixtures("subset_construction")
def test_a_pickled_lazy_dfa_keeps_its_states_and_goes_on_building(
    reload_native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pattern = r"(ab|cd)*e[0-9]{2,30}"
    dfa = LazyDFA(*_nfa_start(pattern), DEFAULT_MAX_STATES)
    seen = ["abe12", "cdab"]
    sets = _trace(dfa, seen)
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", reload_native)
    copy = _round_trip(dfa)
    assert copy.num_states == dfa.num_states
    assert _trace(copy, seen) == sets  # the same ids for the same walks
    rx = re.compile(pattern)
    texts = _samples("abcde0123", 200, seed=3) + ["e" + "7" * k for k in range(35)]
    assert [copy.matches(t.encode()) for t in texts] == [bool(rx.fullmatch(t)) for t in texts]


BLOCK_SCHEMA = {  # embedded automata (key regions, a pattern with a length): lazily filled blocks
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^[a-f]+$", "maxLength": 6}},
    "patternProperties": {"^x[a-z]{0,3}$": {"type": "integer"}},
    "additionalProperties": False,
}


def test_the_c_core_fills_block_states_itself_as_python_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if native_dfa.new_core(NFA(max_states=8), 8) is None:
        pytest.skip("no C compiler: only the Python construction runs")
    c_dfa = _lazy(json_schema_to_node(BLOCK_SCHEMA), monkeypatch, True)
    py_dfa = _lazy(json_schema_to_node(BLOCK_SCHEMA), monkeypatch, False)
    texts = ['{"s":"abc","xab":3}', '{"s":"abcdefa"}', '{"xabcd":1}', '{"s":"f","x":-2}', "{}"]
    c_trace, py_trace = _trace(c_dfa, texts), _trace(py_dfa, texts)
    assert [m for _, m in c_trace] == [m for _, m in py_trace] == [True, False, False, True, True]
    assert [[len(s) for s in sets] for sets, _ in c_trace] == [
        [len(s) for s in sets] for sets, _ in py_trace
    ]
    assert c_dfa.block_fills_in_c > 0  # (the NFA's own lists lack those states)
    assert _filled(c_dfa) == _filled(py_dfa)
    assert c_dfa.num_states == py_dfa.num_states
