"""Regex -> byte DFA: agreement with Python's `re`, UTF-8 byte paths, typed errors, budgets."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import GrammarError, regex_to_dfa
from grammar.automata.utf8 import utf8_sequences
from grammar.json_schema.number_text import integer_range, number_range

REGEX_CASES = [
    pytest.param(r"abc", "abcx", id="literal"),
    pytest.param(r"a|bc|", "abc", id="alternation-with-empty"),
    pytest.param(r"(ab)*c+", "abc", id="star-plus"),
    pytest.param(r"a{2,4}b{3}c{2,}", "abc", id="counted-repeats"),
    pytest.param(r"[a-c]x?[^a-c]", "abcxyz", id="classes"),
    pytest.param(r"\d+(\.\d+)?", "0129.", id="decimal"),
    pytest.param(r"[\w.-]+@\w+", "ab_.-@1", id="email-like"),
    pytest.param(r"(a|ab)(c|bcd)(d*)", "abcd", id="ambiguous"),
    pytest.param(r"é|日本|[α-ω]+", "éa日本αβω", id="non-ascii"),
    pytest.param(r"[^é]*é", "aéb日", id="negated-non-ascii"),
    pytest.param(r"(x|y){0,3}z?", "xyz", id="bounded-optional"),
    pytest.param(r".a.", "a\nbé", id="dot-excludes-newline"),
    pytest.param(r"((a|b)(c|d)){2}", "abcd", id="nested-groups"),
    pytest.param(r"-?(0|[1-9][0-9]*)", "-0123", id="json-integer"),
]


@pytest.mark.parametrize(("pattern", "alphabet"), REGEX_CASES)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_dfa_agrees_with_python_re(pattern: str, alphabet: str, data: st.DataObject) -> None:
    dfa = regex_to_dfa(pattern)
    rx = re.compile(pattern)
    text = data.draw(st.text(alphabet=alphabet, max_size=10))
    assert dfa.matches(text.encode()) == bool(rx.fullmatch(text)), text


@pytest.mark.parametrize(("pattern", "alphabet"), REGEX_CASES)
def test_dfa_accepts_python_re_matches_from_a_generator(pattern: str, alphabet: str) -> None:
    """Exhaustive over short strings: accept exactly what `re` fully matches."""
    dfa = regex_to_dfa(pattern)
    rx = re.compile(pattern)
    words = [""]
    for _ in range(4):
        words += [w + c for w in words if len(w) == len(words[-1]) for c in alphabet]
    for w in words:
        assert dfa.matches(w.encode()) == bool(rx.fullmatch(w)), w


@given(st.integers(0, 0x10FFFF), st.integers(0, 0x10FFFF))
@settings(max_examples=300, deadline=None)
def test_utf8_sequences_cover_exactly_the_range(a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    seqs = utf8_sequences(lo, hi)

    def covered(cp: int) -> bool:
        if 0xD800 <= cp <= 0xDFFF:
            return False
        enc = chr(cp).encode()
        return any(
            len(s) == len(enc) and all(x <= y <= z for (x, z), y in zip(s, enc, strict=True))
            for s in seqs
        )

    probes = {lo, hi, (lo + hi) // 2, max(0, lo - 1), min(0x10FFFF, hi + 1), 0x7F, 0x80, 0xFFFF}
    for cp in probes:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        assert covered(cp) == (lo <= cp <= hi), hex(cp)


def test_tokens_splitting_a_multibyte_character_walk_byte_by_byte() -> None:
    dfa = regex_to_dfa("日+本")
    data = "日日本".encode()
    state = 1
    for i in range(len(data)):  # one byte at a time, mid-character states are live
        state = dfa.walk(state, data[i : i + 1])
        assert state != 0, i
    assert dfa.accepting[state]


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        pytest.param(r"(a)\1", "reference", id="backreference"),
        pytest.param(r"a(?=b)", "lookahead", id="lookahead"),
        pytest.param(r"a(?!b)", "lookahead", id="negative-lookahead"),
        pytest.param(r"(?<=a)b", "lookbehind", id="lookbehind"),
        pytest.param(r"(?x)a b", "Flag x", id="verbose-flag"),
        pytest.param(r"a(b", "syntax", id="unbalanced"),
        pytest.param(r"\p{L}", "unicode properties", id="unicode-property"),
    ],
)
def test_unsupported_regex_raises_grammar_error_naming_the_construct(
    pattern: str, construct: str
) -> None:
    with pytest.raises(GrammarError, match=construct):
        regex_to_dfa(pattern)


def test_grammar_error_is_a_value_error() -> None:
    assert issubclass(GrammarError, ValueError)


def test_state_budget_raises_instead_of_exploding() -> None:
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match="state budget"):
        regex_to_dfa("(a|b)*a(a|b){18}", max_states=5_000)  # needs 2**19 DFA states
    assert time.perf_counter() - t0 < 20


def test_huge_repetition_count_raises_quickly() -> None:
    with pytest.raises(GrammarError, match="budget"):
        regex_to_dfa("(abc){0,10000000}", max_states=1_000)


@given(
    st.one_of(st.none(), st.integers(-5000, 5000)),
    st.one_of(st.none(), st.integers(-5000, 5000)),
    st.integers(-6000, 6000),
)
@settings(max_examples=400, deadline=None)
def test_integer_range_regex_is_exact(lo: int | None, hi: int | None, x: int) -> None:
    r = integer_range(lo, hi)
    inside = (lo is None or x >= lo) and (hi is None or x <= hi)
    assert (r is not None and re.fullmatch(r, str(x)) is not None) == inside


@given(
    st.one_of(st.none(), st.integers(-50, 50)),
    st.one_of(st.none(), st.integers(-50, 50)),
    st.booleans(),
    st.booleans(),
    st.floats(-60, 60, allow_nan=False),
)
@settings(max_examples=400, deadline=None)
def test_number_range_regex_is_exact(lo, hi, lo_ex, hi_ex, x: float) -> None:
    text = repr(x)
    if "e" in text or text == "-0.0":
        return
    r = number_range(lo, hi, lo_ex, hi_ex)
    inside = (lo is None or (x > lo if lo_ex else x >= lo)) and (
        hi is None or (x < hi if hi_ex else x <= hi)
    )
    assert (r is not None and re.fullmatch(r, text) is not None) == inside
