"""Name complements as `Deferred` nodes (`grammar.automata.nfa_keys`): the NFA builds an
object's other-keys trie when a walk first reaches it. The automaton must be the one of the
trie built at once, state for state; a compile must leave the unread tries unbuilt; and
building one must leave nothing for the cyclic GC."""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest

from grammar import GrammarError, compile_json_schema
from grammar.automata import nfa as nfa_module
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import DEFAULT_MAX_STATES, nfa_budget, node_to_dfa
from grammar.automata.lazy_dfa import LazyDFA
from grammar.automata.nfa import NFA
from grammar.automata.nfa_keys import Deferred
from grammar.json_schema.exact import names
from grammar.json_schema.scalars import STRING_CHAR_TEXT
from tests.support.regex_cases import NOTHING
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import walk

# every test here runs on both subset constructions (C and Python)
pytestmark = pytest.mark.usefixtures("subset_construction")

NAME_LISTS = [
    pytest.param(["apiVersion", "kind", "metadata"], id="kubernetes"),
    pytest.param(["kind", "kinds", "kin"], id="prefixes"),
    pytest.param(["a\x01b", 'q"', "x\\y", "\U0001f600z", "\ud800", "é"], id="escapes"),
    pytest.param(["", "spec", "spec2"], id="empty-name"),
]


def _member(key: object) -> object:
    """`{` key `:` digits (`,` key `:` digits)* `}`: keys in a context, as in an object."""
    one = ra.seq(key, ra.char(":"), ra.repeat(ra.char_class(frozenset("0123456789")), 1, None))
    return ra.seq(ra.char("{"), one, ra.repeat(ra.seq(ra.char(","), one), 0, None), ra.char("}"))


def _lazy_dfa(tree: object) -> LazyDFA:
    nfa = NFA(max_states=nfa_budget(DEFAULT_MAX_STATES))
    return LazyDFA(nfa, nfa.add_node(tree, lazy=True), DEFAULT_MAX_STATES)


def _keys(name_list: list[str], rng: random.Random) -> list[str]:
    """Keys near the names: the names, their prefixes and extensions, escaped spellings."""
    out = []
    for n in name_list:
        out += [n, n[:-1], n + "x", n[1:], "\\u0061" + n, n.replace("k", "\\u006b")]
    out += ["".join(rng.choice("akinds\\u0") for _ in range(rng.randint(0, 8))) for _ in range(60)]
    return out


@pytest.mark.parametrize("eager_structures", [0, 1500])
@pytest.mark.parametrize("name_list", NAME_LISTS)
def test_a_deferred_complement_gives_the_built_one_s_dfa_state_for_state(
    name_list: list[str], eager_structures: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nfa_module, "EAGER_STRUCTURES", eager_structures)
    string_char = ra.parsed(STRING_CHAR_TEXT)
    deferred = names.deferred_string_except(name_list, string_char)
    assert type(deferred) is Deferred
    built = names.string_except(name_list, string_char)
    lazy, whole = _lazy_dfa(_member(deferred)), _lazy_dfa(_member(built))
    for key in _keys(name_list, random.Random(len(name_list))):
        text = ('{"' + key + '":12}').encode("utf-8", "surrogatepass")
        assert lazy.matches(text) == whole.matches(text), text
        assert lazy.walk(1, text) == whole.walk(1, text), text  # the same states, numbered alike
    assert lazy.num_states == whole.num_states
    assert ra.to_text(deferred) == ra.to_text(built)


def test_a_long_name_s_complement_is_built_at_once() -> None:
    string_char = ra.parsed(STRING_CHAR_TEXT)
    long_name = "n" * (names.MAX_DEFERRED_NAME + 1)
    assert type(names.deferred_string_except(["a", long_name], string_char)) is not Deferred
    assert type(names.deferred_string_except(["a", long_name[1:]], string_char)) is Deferred


def test_a_deferred_piece_matching_nothing_is_refused_by_a_lazy_build_and_pruned_by_an_eager():
    # against the contract: the lazy DFA cannot prune it, so reading it raises
    bad = Deferred(("bad",), (), lambda: ra.alt([ra.seq(ra.char("a"), NOTHING), ra.char("b")]), 1)
    tree = ra.seq(ra.char("x"), ra.alt([bad, ra.char("c")]))
    with pytest.raises(GrammarError, match="deferred"):
        nfa = NFA(max_states=10_000)
        nfa.add_node(tree, lazy=True)
        nfa.materialize()
    dfa = node_to_dfa(tree)
    assert dfa.matches(b"xb") and dfa.matches(b"xc") and not dfa.matches(b"xa")


def _objects_schema(n: int) -> dict:
    """n objects, each with its own property names (so its own complement)."""
    obj = {"type": "object", "properties": {f"name_{i}": {"type": "integer"} for i in range(6)}}
    props = {
        f"o{j}": {**obj, "properties": {"p" + str(j): {}, **obj["properties"]}} for j in range(n)
    }
    return {"type": "object", "properties": props}


def test_a_compile_and_first_mask_build_only_the_complements_they_read() -> None:
    names._BUILT.clear()
    g = compile_json_schema(_objects_schema(40), deepseek_vocab())
    m = g.matcher()
    m.fill_bitmask(np.zeros((len(deepseek_vocab()) + 31) // 32, dtype=np.int32))
    first = len(names._BUILT)
    assert 1 <= first <= 3  # the top object's (a first token may spell part of a key)
    tok = deepseek_tokenizer()
    good = '{"o3":{"name_1":5,"other":"x"},"o39":{"more":[1]},"zz":null}'
    assert walk(g, tok.encode(good, add_special_tokens=False))
    for bad in (good.replace("5", '"5"'), good.replace('"other"', '"name_2"')):
        assert not walk(g, tok.encode(bad, add_special_tokens=False)), bad
    assert first < len(names._BUILT) <= first + 4  # and those of the objects the walks reached


def test_building_a_complement_leaves_no_cycle_for_the_gc() -> None:
    string_char = ra.parsed(STRING_CHAR_TEXT)
    names._BUILT.clear()
    names._SUBTRIES.clear()
    was = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        names.string_except(["apiVersion", "kind", "metadata", "spec", "status"], string_char)
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()
