"""llguidance's parametric lark rules (`name::_`, `%if`), expanded by grammar.ebnf.lark_params:
the languages checked against Python predicates written from the functions' definitions."""

from __future__ import annotations

import itertools

import pytest

from grammar import GrammarError, compile_lark
from grammar.ebnf import lark_params
from tests.support.tokenizers import deepseek_vocab


def _accepts(grammar: str, text: str) -> bool:
    m = compile_lark(grammar, deepseek_vocab()).matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


def _words(alphabet: str, longest: int) -> list[str]:
    return ["".join(w) for n in range(longest + 1) for w in itertools.product(alphabet, repeat=n)]


EACH_ONCE = """
start   : seen::0 ";"
seen::_ : ""                    %if is_ones([0:3])
        | "x" seen::set_bit(0)  %if bit_clear(0)
        | "y" seen::set_bit(1)  %if bit_clear(1)
        | "z" seen::set_bit(2)  %if bit_clear(2)
"""


def test_each_symbol_exactly_once_in_any_order() -> None:
    for w in _words("xyz", 4):
        expected = sorted(w) == ["x", "y", "z"]
        assert _accepts(EACH_ONCE, w + ";") == expected, w


COUNTS = """
start    : tally::0x0
tally::_ : "p" tally::incr([0:2])   %if lt([0:2], 2)
         | "q" tally::incr([2:5])   %if le([2:5], 2)
         | "."                      %if or(bit_set(0), bit_set(1))
"""


def test_bounded_counters_and_an_end_condition() -> None:
    # at most two p and three q, in any order, and at least one p before the end
    for w in _words("pq", 6):
        expected = w.count("p") <= 2 and w.count("q") <= 3 and w.count("p") >= 1
        assert _accepts(COUNTS, w + ".") == expected, w


PICK = """
start   : pick::0
pick::_ : "!"                    %if and(bit_count_ge(_, 2), not(bit_set(3)))
        | "a" pick::set_bit(0)   %if and(bit_clear(0), bit_count_lt(_, 3))
        | "b" pick::set_bit(1)   %if and(bit_clear(1), bit_count_lt(_, 3))
        | "c" pick::set_bit(2)   %if and(bit_clear(2), bit_count_lt(_, 3))
        | "d" pick::set_bit(3)   %if and(bit_clear(3), bit_count_lt(_, 3))
"""


def test_distinct_picks_with_counted_bits_and_negation() -> None:
    for w in _words("abcd", 4):
        expected = len(set(w)) == len(w) and 2 <= len(w) <= 3 and "d" not in w
        assert _accepts(PICK, w + "!") == expected, w


def test_bit_functions_on_the_parameter() -> None:
    grammar = """
start  : f::0xF0
f::_   : "k" f::clear_bit(4)     %if bit_set(4)
       | "m" f::bit_and(0x0F)    %if ne([4:8], 0)
       | "n" f::bit_or(0x100)    %if eq([8:9], 0)
       | "."                     %if is_zeros([4:8])
"""
    assert _accepts(grammar, "m.")
    assert _accepts(grammar, "km.")
    assert _accepts(grammar, "nkm.")
    assert not _accepts(grammar, "kk.")  # bit 4 is clear after one k
    assert not _accepts(grammar, "nn.")  # bit 8 is set after one n
    assert not _accepts(grammar, "k.")  # bits 5-7 still set


def test_decrement_saturates_at_zero() -> None:
    grammar = """
start  : c::2
c::_   : "-" c::decr(_)   %if gt(_, 0)
       | "+" c::incr([0:2])
       | "="              %if eq(_, 0)
"""
    assert _accepts(grammar, "--=")
    assert _accepts(grammar, "+---=")
    assert _accepts(grammar, "++-----=") is False  # counter saturates at 3 going up
    assert _accepts(grammar, "++---=")
    assert not _accepts(grammar, "-=")


def test_a_rule_left_with_no_alternative_matches_nothing() -> None:
    grammar = """
start  : "a" dead::1 | "b"
dead::_ : "x" %if eq(_, 0)
"""
    assert _accepts(grammar, "b")
    assert not _accepts(grammar, "ax")


def test_too_many_reachable_parameters_are_refused_by_name(monkeypatch) -> None:
    monkeypatch.setattr(lark_params, "MAX_INSTANCES", 50)
    grammar = """
start   : n::0
n::_    : "a" n::incr([0:8]) | "."
"""
    with pytest.raises(GrammarError, match="parametric rule 'n'.*over 50"):
        compile_lark(grammar + "\n// fresh\n", deepseek_vocab())


@pytest.mark.parametrize(
    ("grammar", "named"),
    [
        ('start: r\nr: "a" %if true', "%if needs a parametric rule"),
        ('start: r::_\nr::_: "a" %if true', "not parametric, but its body requires"),
        ('start: r::1\nr::_: "a"', "doesn't need parameters"),
        ('start: r::1\nr::_[max_tokens=3]: "a" %if true', "attributes are not supported"),
        ('start: r::1\nr::_: "a" %if bit_set(64)', "must be <= 63"),
        ('start: r::1\nr::_: "a" %if eq([3:3], 0)', "must be > start bit index"),
        ('start: r::1\nr::_: "a" %if wobble(1)', "unknown %if condition"),
        ('start: R\nR: q::0\nq::_: "a" %if true', "cannot be used in terminals"),
    ],
)
def test_misuse_is_a_grammar_error_naming_it(grammar: str, named: str) -> None:
    with pytest.raises(GrammarError, match=named):
        compile_lark(grammar, deepseek_vocab())
