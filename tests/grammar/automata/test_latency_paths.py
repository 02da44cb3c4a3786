"""The paths that keep a constraint's first use fast must not change what it accepts: the
layered length product (`dfa_ops.with_length`) against a counted repeat of the JSON string
character, the NFA builder releasing the regex tree, and masks on those paths against a plain
token walk."""

from __future__ import annotations

import gc
import weakref

import pytest

from grammar import clear_caches, compile_json_schema
from grammar.automata import dfa_ops
from grammar.automata.fsm import START, ByteDFA, regex_to_dfa
from grammar.automata.nfa import NFA, parse_regex
from grammar.json_schema.scalars import STRING_CHAR_TEXT
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import assert_masks_on_walks_match


def _same_language(a: ByteDFA, b: ByteDFA) -> bool:
    """Both accept the same byte strings (a walk over the pairs of states they reach)."""
    ta, tb = a.byte_table(), b.byte_table()
    seen, todo = {(START, START)}, [(START, START)]
    while todo:
        x, y = todo.pop()
        if bool(a.accepting[x]) != bool(b.accepting[y]):
            return False
        for pair in set(zip(ta[x].tolist(), tb[y].tolist(), strict=True)):
            if pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return True


STRING_CONTENT = f"({STRING_CHAR_TEXT})*"


@pytest.mark.parametrize(
    ("lo", "hi"),
    [
        pytest.param(0, 0, id="empty-only"),
        pytest.param(0, 5, id="at-most-5"),
        pytest.param(1, 1, id="exactly-1"),
        pytest.param(3, 40, id="3-to-40"),
        pytest.param(2, None, id="at-least-2"),
        pytest.param(0, None, id="unbounded"),
        pytest.param(70, 200, id="long-steady-layers"),
    ],
)
def test_length_product_is_a_counted_json_character(lo, hi):
    content = regex_to_dfa(STRING_CONTENT)
    counted = dfa_ops.with_length(content, lo, hi)
    upper = "" if hi is None else hi
    expected = regex_to_dfa(f"({STRING_CHAR_TEXT}){{{lo},{upper}}}")
    assert _same_language(counted, expected)


@pytest.mark.parametrize(
    ("pattern", "lo", "hi", "spelled"),
    [
        pytest.param("^x", 2, 4, {"x": False, "xy": True, "xyzw": True, "xyzwv": False}, id="x"),
        pytest.param("^x", 2, 2, {"x\\n": True, "x\\u0041": True, "x\\nA": False}, id="escapes"),
        pytest.param(
            "^[a-z]+$", 0, 3, {"": False, "ab": True, "abc": True, "abcd": False}, id="class"
        ),
        pytest.param("é", 1, 2, {"é": True, "éé": True, "aé": True, "aéa": False}, id="multi-byte"),
        pytest.param("a", 2, 2, {"a\\ud83d\\ude00": True, "a🙂": True, "a🙂b": False}, id="pair"),
    ],
)
def test_length_product_counts_decoded_characters(pattern, lo, hi, spelled):
    """Through a schema: an escape (\\n, \\u0041, a surrogate pair) and a multi-byte
    character each count once."""
    grammar = compile_json_schema(
        {"type": "string", "pattern": pattern, "minLength": lo, "maxLength": hi},
        deepseek_vocab(),
    )
    for text, ok in spelled.items():
        assert grammar.dfa.matches(f'"{text}"'.encode()) == ok, text


def test_a_repeated_length_product_is_built_once():
    content = regex_to_dfa(STRING_CONTENT)
    first = dfa_ops.with_length(content, 3, 30)
    again = dfa_ops.with_length(regex_to_dfa(STRING_CONTENT), 3, 30)
    assert again is first
    assert dfa_ops.with_length(content, 3, 31) is not first


def test_the_nfa_keeps_no_reference_to_the_regex_tree():
    tree = parse_regex('\\{"a":[0-9]+(,"b":"[a-z]*")?\\}')
    nfa = NFA(10_000)
    nfa.add_node(tree)
    alive = weakref.ref(tree)
    del tree
    gc.collect()
    assert alive() is None
    assert all(type(e) is tuple for e in nfa.eps) and all(type(e) is tuple for e in nfa.edges)


CASES = [
    pytest.param(
        {"type": "string", "pattern": "^[a-z ]+$", "maxLength": 50},
        ["hello world", "a" * 50, "z"],
        id="pattern-maxLength",
    ),
    pytest.param(
        {"type": "string", "pattern": "-", "minLength": 2, "maxLength": 300},
        ["a-b", "--", "日本-語 and \\ slash", "x" * 150 + "-"],
        id="pattern-long-bounds",
    ),
]


@pytest.mark.parametrize(("schema", "instances"), CASES)
def test_masks_on_length_products_equal_a_token_walk(schema, instances):
    tok, vocab = deepseek_tokenizer(), deepseek_vocab()
    clear_caches()
    grammar = compile_json_schema(schema, vocab)
    assert_masks_on_walks_match(grammar, tok, instances, 8)
