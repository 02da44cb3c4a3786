"""Long bounded repetitions (`x{lo,hi}` with hi over 64: a string's maxLength 32767) are NFA
copies made on first read; the lazy and the eager automaton must agree on their language."""

from __future__ import annotations

import json

import pytest

from grammar.automata import regex_ast as ra
from grammar.automata.fsm import node_to_lazy_dfa, regex_to_dfa
from grammar.json_schema.schema import json_schema_to_node

CASES = [
    pytest.param("a{70,100}", 70, 100, [69, 70, 85, 100, 101], "a", id="mandatory-and-optional"),
    pytest.param("a{0,90}", 0, 90, [0, 1, 90, 91], "a", id="all-optional"),
    pytest.param("a{80}", 80, 80, [79, 80, 81], "a", id="all-mandatory"),
    pytest.param("(ab|c){65,70}", 65, 70, [64, 65, 70, 71], "ab", id="alternation-base"),
    pytest.param("(ab|c){65,70}", 65, 70, [65, 70], "c", id="alternation-other-branch"),
    pytest.param("[é]{0,66}", 0, 66, [66, 67], "é", id="multi-byte-base"),
]


@pytest.mark.parametrize(("pattern", "lo", "hi", "counts", "unit"), CASES)
def test_lazy_copies_match_exactly_the_counted_lengths(pattern, lo, hi, counts, unit):
    lazy = node_to_lazy_dfa(pattern)
    eager = regex_to_dfa(pattern)
    for n in counts:
        data = (unit * n).encode()
        assert lazy.matches(data) == (lo <= n <= hi) == eager.matches(data), n


@pytest.mark.parametrize(
    ("schema", "length", "ok"),
    [
        pytest.param({"type": "string", "maxLength": 2000}, 2000, True, id="at-max"),
        pytest.param({"type": "string", "maxLength": 2000}, 2001, False, id="over-max"),
        pytest.param({"type": "string", "minLength": 100, "maxLength": 300}, 99, False, id="under"),
        pytest.param(
            {"type": "string", "minLength": 100, "maxLength": 300}, 100, True, id="at-min"
        ),
    ],
)
def test_long_max_length_strings_are_exact(schema, length, ok):
    dfa = node_to_lazy_dfa(json_schema_to_node(schema, None, 3, 3))
    assert dfa.matches(json.dumps("x" * length).encode()) == ok
    assert dfa.matches(json.dumps("é" * length).encode()) == ok


def test_nested_long_repeats_stay_exact():
    node = ra.repeat(ra.seq(ra.char("["), ra.repeat(ra.char("a"), 0, 70), ra.char("]")), 0, 66)
    dfa = node_to_lazy_dfa(node)
    assert dfa.matches(b"[" + b"a" * 70 + b"]" + b"[]" * 65)
    assert not dfa.matches(b"[" + b"a" * 71 + b"]")
    assert not dfa.matches(b"[]" * 67)
