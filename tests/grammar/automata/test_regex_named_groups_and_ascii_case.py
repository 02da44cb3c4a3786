"""Named groups in ECMAScript's spelling `(?<name>...)` (plain groups), and XGrammar's `Regex()`
EBNF macro folding ASCII letters only under `i`; Python's `re` is the oracle (`(?a)` for ASCII
folding, `(?P<name>...)` for the named group)."""

from __future__ import annotations

import re

import pytest

from grammar import GrammarError, compile_ebnf, compile_regex
from tests.support.tokenizers import deepseek_vocab

TEXTS = [
    "ab",
    "abab",
    "abc",
    "ababc",
    "a",
    "",
    "ba",
    "ABAB",
    "σς",
    "ΣΣ",
    "Σσ",
    "éÉ",
    "ÉÉ",
    "k",
    "K",
]


def _walks(g, text: str) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


@pytest.mark.parametrize("pattern", ["(?<pair>ab)+", "(?<x>a)(?<y>b)(?<z>c)?", "(?<g>(?<h>a)b)+c"])
def test_ecmascript_named_groups_are_plain_groups(pattern: str) -> None:
    g = compile_regex(pattern, deepseek_vocab())
    python = re.compile(pattern.replace("(?<", "(?P<"))
    for text in TEXTS:
        assert _walks(g, text) == bool(python.fullmatch(text)), text


def test_lookbehind_stays_refused_by_name() -> None:
    with pytest.raises(GrammarError, match="look"):
        compile_regex("(?<=a)b", deepseek_vocab())


@pytest.mark.parametrize(
    ("body", "python"),
    [
        ('Regex("(?i)[a-c]+")', "(?ai)[a-c]+"),
        ('Regex("σ+", flags="i")', "(?a)σ+"),
        ('Regex("(?i)(é|k)+")', "(?ai)(é|k)+"),
        ('Regex("Σ[σς]", flags="is")', "(?as)Σ[σς]"),
        ('Regex("(?<p>ab)+", flags="i")', "(?ai)(?P<p>ab)+"),
    ],
)
def test_the_ebnf_regex_macro_folds_ascii_letters_only(body: str, python: str) -> None:
    g = compile_ebnf(f"root ::= {body}", deepseek_vocab())
    oracle = re.compile(python)
    for text in TEXTS:
        assert _walks(g, text) == bool(oracle.fullmatch(text)), text


def test_a_plain_regex_still_folds_every_letter() -> None:
    g = compile_regex("(?i)σ+é", deepseek_vocab())
    assert _walks(g, "ΣσÉ")
    assert not _walks(g, "ΣσE")
