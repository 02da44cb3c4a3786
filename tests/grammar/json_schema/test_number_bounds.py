"""Strict mode bounds a number's digits to what a float64 carries (17 integer digits, 17
fraction digits, 3 exponent digits; more only where the schema's own bounds need them), so
no output loops inside one number; exact mode keeps the schema's own language."""

from __future__ import annotations

import pytest

from grammar.automata.fsm import DEAD, START, node_to_dfa
from grammar.json_schema.number_text import (
    FLOAT64_EXPONENT_DIGITS,
    FLOAT64_FRACTION_DIGITS,
    FLOAT64_INT_DIGITS,
)
from grammar.json_schema.schema import json_schema_to_node
from grammar.json_schema.strict import apply_mode


def _language(schema, mode: str):
    dfa = node_to_dfa(json_schema_to_node(apply_mode(schema, mode)))
    return lambda text: dfa.matches(text.encode())


def _prefix_alive(schema, mode: str):
    """Whether some completion of a prefix is still in the language (the mask's view)."""
    dfa = node_to_dfa(json_schema_to_node(apply_mode(schema, mode)))
    return lambda text: dfa.walk(START, text.encode()) != DEAD


NUMBER = {"type": "number"}
LONG_INT = "1" + "0" * FLOAT64_INT_DIGITS  # one digit past the bound
LONG_FRACTION = "1." + "0" * (FLOAT64_FRACTION_DIGITS + 1)
LONG_EXPONENT = "1e" + "1" * (FLOAT64_EXPONENT_DIGITS + 1)


def test_strict_number_keeps_float64_spellings() -> None:
    ok = _language(NUMBER, "strict")
    for x in (0.1, 1e308, -2.2250738585072014e-308, 5e-324, 123456789.123456789, 2**53, -0.0):
        assert ok(repr(x)), repr(x)
    assert ok("9" * FLOAT64_INT_DIGITS + "." + "9" * FLOAT64_FRACTION_DIGITS)
    assert ok("1.7976931348623157e+308")


@pytest.mark.parametrize("text", [LONG_INT, LONG_FRACTION, LONG_EXPONENT])
def test_strict_number_refuses_digits_past_a_float64(text: str) -> None:
    assert not _language(NUMBER, "strict")(text)
    assert _language(NUMBER, "exact")(text)  # exact mode: the schema's own language


def test_a_looping_fraction_is_cut_inside_an_object() -> None:
    schema = {"type": "object", "properties": {"population": NUMBER}, "required": ["population"]}
    alive = _prefix_alive(schema, "strict")
    assert alive('{"population":1.' + "0" * FLOAT64_FRACTION_DIGITS)
    assert not alive('{"population":1.' + "0" * (FLOAT64_FRACTION_DIGITS + 1))
    assert _prefix_alive(schema, "exact")('{"population":1.' + "0" * 500)


def test_bounded_numbers_cut_their_fraction_but_keep_values_near_large_bounds() -> None:
    bounded = {"type": "number", "minimum": 0, "maximum": 10}
    assert _language(bounded, "strict")("9.5")
    assert not _language(bounded, "strict")("9." + "5" * (FLOAT64_FRACTION_DIGITS + 1))
    assert _language(bounded, "exact")("9." + "5" * (FLOAT64_FRACTION_DIGITS + 1))
    big = {"type": "number", "minimum": 10**20}  # beyond 17 integer digits: still satisfiable
    assert _language(big, "strict")(str(10**20))
    assert not _language(big, "strict")(str(10**25))
    fine = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-19}
    assert _language(fine, "strict")("0.00000000000000000005")


def test_unconstrained_values_and_multiples_are_bounded_too() -> None:
    anything = _language({"type": "object", "properties": {"x": {}}}, "strict")
    assert anything('{"x":[1.5,{"y":2}]}')
    assert not anything('{"x":[' + LONG_FRACTION + "]}")
    multiples = _language({"type": "number", "multipleOf": 0.5}, "strict")
    assert multiples("2.5") and not multiples("2." + "5" + "0" * FLOAT64_FRACTION_DIGITS)


def test_strict_integers_stay_within_the_safe_range() -> None:
    ok = _language({"type": "integer"}, "strict")
    assert ok(str(2**53 - 1)) and not ok(str(2**53))
