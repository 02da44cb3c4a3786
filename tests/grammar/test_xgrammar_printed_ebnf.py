"""XGrammar's printer writes an unbounded repetition as `{n, -1}` and its parser reads that
back as `{n,}`: EBNF copied from its printed grammars compiles here with that meaning."""

from __future__ import annotations

import re

import pytest

from grammar import GrammarError, compile_ebnf
from tests.support.tokenizers import deepseek_vocab


def _walks(g, text: str) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


@pytest.mark.parametrize(("spelled", "python"), [("{0, -1}", "*"), ("{2,-1}", "{2,}")])
def test_minus_one_as_the_upper_bound_is_unbounded(spelled: str, python: str) -> None:
    g = compile_ebnf(f'root ::= "<" item{spelled} ">"\nitem ::= [xy] | "z"', deepseek_vocab())
    oracle = re.compile(f"<[xyz]{python}>")
    for n in range(6):
        for text in ("<" + "xz" * n + ">", "<" + "y" * n + ">", "<" + "q" * n + ">"):
            assert _walks(g, text) == bool(oracle.fullmatch(text)), text


@pytest.mark.parametrize("bad", ["{-1}", "{-1,2}", "{1,-2}", "{,-1,}"])
def test_other_negative_bounds_stay_errors(bad: str) -> None:
    with pytest.raises(GrammarError, match="repetition"):
        compile_ebnf(f'root ::= "a"{bad}', deepseek_vocab())
