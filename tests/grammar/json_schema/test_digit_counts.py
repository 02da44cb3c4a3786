"""outlines-core's digit-count keywords on integers and numbers (`minDigits` / `maxDigits`,
`min|maxDigitsInteger|Fraction|Exponent`), checked against a predicate on the text's parts."""

from __future__ import annotations

import re

import pytest

from grammar import GrammarError, UnsupportedSchemaError, compile_json_schema
from tests.support.tokenizers import deepseek_vocab

NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE][+-]?([0-9]+))?")


def _walks(g, text: str) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


def _within(part: str | None, lo: int | None, hi: int | None, whole: bool = False) -> bool:
    if part is None or (whole and part == "0"):
        return True
    return (lo is None or len(part) >= lo) and (hi is None or len(part) <= hi)


TEXTS = ["0", "7", "42", "-420", "1234", "123456", "1.5", "12.345", "123.4567", "100.05e12",
         "9e1", "120.125e-004", "-0.5", "3.0", "10000.00001e+99999"]  # fmt: skip


@pytest.mark.parametrize(
    "bounds",
    [
        {"minDigits": 3},
        {"maxDigits": 2},
        {"minDigits": 2, "maxDigits": 4},
    ],
)
def test_integer_digit_counts(bounds: dict) -> None:
    g = compile_json_schema({"type": "integer", **bounds}, deepseek_vocab())
    for text in TEXTS:
        m = NUMBER.fullmatch(text)
        ok = m is not None and m.group(2) is None and m.group(3) is None
        ok = ok and _within(m.group(1), bounds.get("minDigits"), bounds.get("maxDigits"), True)
        assert _walks(g, text) == ok, text


@pytest.mark.parametrize(
    "bounds",
    [
        {"minDigitsInteger": 2, "maxDigitsInteger": 3},
        {"minDigitsFraction": 2, "maxDigitsFraction": 4},
        {"minDigitsExponent": 2},
        {"maxDigitsInteger": 5, "maxDigitsFraction": 5, "minDigitsExponent": 3},
    ],
)
def test_number_digit_counts(bounds: dict) -> None:
    g = compile_json_schema({"type": "number", **bounds}, deepseek_vocab())
    for text in TEXTS:
        m = NUMBER.fullmatch(text)
        ok = m is not None
        ok = ok and _within(m.group(1), bounds.get("minDigitsInteger"),
                            bounds.get("maxDigitsInteger"), True)  # fmt: skip
        ok = ok and _within(m.group(2), bounds.get("minDigitsFraction"),
                            bounds.get("maxDigitsFraction"))  # fmt: skip
        ok = ok and _within(m.group(3), bounds.get("minDigitsExponent"),
                            bounds.get("maxDigitsExponent"))  # fmt: skip
        assert _walks(g, text) == ok, text


def test_digit_counts_combine_with_bounds() -> None:
    g = compile_json_schema({"type": "integer", "minimum": 50, "maxDigits": 2}, deepseek_vocab())
    assert [t for t in ("49", "50", "99", "100", "7") if _walks(g, t)] == ["50", "99"]


def test_a_bad_digit_count_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedSchemaError, match="minDigits"):
        compile_json_schema({"type": "integer", "minDigits": -1}, deepseek_vocab())
