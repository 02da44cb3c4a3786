"""Numeric keywords (minimum / maximum / exclusive* / multipleOf) compile exactly: the
automaton (and the regex text where there is one) agrees with an exact decimal oracle."""

from __future__ import annotations

import functools
import json
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar.automata import regex_ast as ra
from grammar.automata.dfa_ops import DFANode
from grammar.automata.fsm import node_to_dfa
from grammar.errors import UnsupportedSchemaError
from grammar.json_schema.numbers import exact, number_node

MULTIPLES = [
    1,
    2,
    3,
    4,
    5,
    7,
    10,
    20,
    100,
    0.1,
    0.01,
    0.001,
    0.5,
    0.25,
    0.05,
    0.2,
    0.125,
    2.5,
    1.5,
    0.3,
    12.5,
    0.75,
    1e-05,
]


def _spelled(d: Decimal) -> str:
    return format(d, "f")


@functools.lru_cache(maxsize=256)
def _compiled(key: tuple):
    node = number_node(*key)
    if node is None:
        return None, None
    text = None if isinstance(node, DFANode) else ra.to_text(node)
    return node_to_dfa(node), text


def _oracle(key: tuple, text: str) -> tuple[bool, bool]:
    """(valid, spelled by the conventions) for a JSON number text."""
    kind, mn, mx, emn, emx, mult = key
    v = Fraction(Decimal(text))
    ok = (
        (kind == "number" or v.denominator == 1)
        and (mn is None or v >= exact(mn))
        and (mx is None or v <= exact(mx))
        and (emn is None or v > exact(emn))
        and (emx is None or v < exact(emx))
        and (mult is None or (v / exact(mult)).denominator == 1)
    )
    unconstrained = mn is None and mx is None and emn is None and emx is None and mult is None
    conventional = ("e" not in text.lower() or (kind == "number" and unconstrained)) and (
        kind == "number" or ("." not in text and "e" not in text.lower())
    )
    return ok, conventional


def _check(key: tuple, text: str) -> None:
    dfa, regex = _compiled(key)
    got = dfa is not None and dfa.matches(text.encode())
    if regex is not None:
        assert (re.fullmatch(regex, text) is not None) == got, (key, text, regex)
    valid, conventional = _oracle(key, text)
    if key[0] == "integer" and re.fullmatch(r"-0(\.0*)?", text):
        return  # integer -0: spelled or not, either is fine
    if got:
        assert valid, (key, text)
    elif conventional:
        assert not valid, (key, text)


def _bound() -> st.SearchStrategy:
    small = st.integers(-300, 300)
    dec = st.builds(lambda n, k: float(Decimal(n).scaleb(-k)), small, st.integers(0, 3))
    return st.one_of(st.none(), small, dec)


def _candidates(key: tuple) -> st.SearchStrategy:
    """Number texts near the interesting points: bounds, grid points, and random values."""
    kind, mn, mx, emn, emx, mult = key
    points = [Decimal(0)] + [Decimal(repr(b)) for b in (mn, mx, emn, emx) if b is not None]
    step = Decimal(repr(mult)) if mult is not None else Decimal("0.1")
    base = st.sampled_from(points)
    near = st.builds(
        lambda p, k, e: p + k * step + e,
        base,
        st.integers(-4, 4),
        st.sampled_from([Decimal(0), Decimal("0.001"), Decimal("-0.001"), Decimal("1e-9")]),
    )
    spelled = st.one_of(
        near.map(_spelled),
        st.builds(
            lambda d, z: _spelled(d) + ("0" * z if "." in _spelled(d) else ""),
            near,
            st.integers(1, 3),
        ),
        st.builds(lambda d: _spelled(d) + ("" if "." in _spelled(d) else ".0"), near),
        st.integers(-(10**6), 10**6).map(str),
        st.floats(-1e6, 1e6, allow_nan=False).map(json.dumps),
        st.sampled_from(["0", "-0", "0.0", "-0.0", "1e-05", "1.5e+20", "1E2", "10", "100"]),
    )
    return spelled.filter(lambda t: t not in ("NaN", "Infinity", "-Infinity"))


@given(
    st.sampled_from(["integer", "number"]),
    _bound(),
    _bound(),
    _bound(),
    _bound(),
    st.one_of(st.none(), st.sampled_from(MULTIPLES)),
    st.data(),
)
@settings(max_examples=250, deadline=None)
def test_numeric_keywords_are_exact(kind, mn, mx, emn, emx, mult, data) -> None:
    if data.draw(st.booleans()):
        emn = emx = None  # inclusive bounds only, more often non-empty
    key = (kind, mn, mx, emn, emx, mult)
    for text in data.draw(st.lists(_candidates(key), min_size=10, max_size=10)):
        _check(key, text)


@pytest.mark.parametrize("mult", [0.1, 0.01, 0.5, 0.25, 2, 5, 10, 2.5, 0.05, 20])
def test_common_multiples_have_regex_text(mult) -> None:
    for kind in ("integer", "number"):
        for bounds in [(None, None), (0, 100), (-7.5, 99.99)]:
            node = number_node(kind, *bounds, None, None, mult)
            assert node is not None and not isinstance(node, DFANode)
            ra.to_text(node)


def test_decimal_bounds_have_regex_text() -> None:
    node = number_node("number", 0.5, 99.9, None, None, None)
    text = ra.to_text(node)
    for t, ok in [
        ("0.5", True),
        ("0.49", False),
        ("99.9", True),
        ("99.90", True),
        ("99.91", False),
        ("1", True),
        ("0", False),
        ("100", False),
    ]:
        assert (re.fullmatch(text, t) is not None) == ok, t


@pytest.mark.parametrize(
    ("args", "accepted", "refused"),
    [
        (
            ("number", None, None, None, None, 0.01),
            ["500.25", "1000.0", "-3.1", "0", "-0.0"],
            ["10.001", "2.511", "1e-05"],
        ),
        (("number", None, None, None, 100, 10), ["30", "20.0", "0", "-10"], ["21", "100", "110"]),
        (("integer", None, None, None, None, 3), ["0", "3", "-9", "300"], ["1", "3.0", "-4"]),
        (("number", 0.1, None, None, None, 0.3), ["0.3", "0.90", "3"], ["0", "0.1", "0.31"]),
        (("number", None, None, 0.1, None, None), ["0.10001", "5"], ["0.1", "0.0999", "-1"]),
        (("integer", 0.5, 9.5, None, None, 0.5), ["1", "9"], ["0", "10", "1.5"]),
    ],
)
def test_examples(args, accepted, refused) -> None:
    dfa = node_to_dfa(number_node(*args))
    for t in accepted:
        assert dfa.matches(t.encode()), t
    for t in refused:
        assert not dfa.matches(t.encode()), t


def test_empty_and_refused() -> None:
    assert number_node("integer", 0.2, 0.8, None, None, None) is None
    assert number_node("number", 1, 1, None, 1, None) is None
    assert number_node("number", 1, 2, None, None, 5) is None
    with pytest.raises(UnsupportedSchemaError) as e:
        number_node("number", None, None, None, None, 0, "#/x")
    assert e.value.keyword == "multipleOf" and e.value.pointer == "#/x/multipleOf"
