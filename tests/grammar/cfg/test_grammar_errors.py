"""Grammar errors raise GrammarError naming the rule or terminal."""

from __future__ import annotations

import pytest

from grammar.cfg.compiler import compile_lark
from grammar.errors import GrammarError
from tests.support.tokenizers import deepseek_vocab


@pytest.mark.parametrize(
    ("grammar", "named"),
    [
        pytest.param("start: missing_rule", "missing_rule", id="undefined-rule"),
        pytest.param("start: MISSING", "MISSING", id="undefined-terminal"),
        pytest.param(
            'start: a | b\na: "x"\nb: "x"', "Reduce/Reduce collision", id="reduce-reduce-conflict"
        ),
        pytest.param("start: LAZY\nLAZY: /a.*?b/", "LAZY", id="lazy-quantifier"),
        pytest.param("start: LOOK\nLOOK: /a(?=b)/", "LOOK", id="lookahead"),
        pytest.param("start: BACK\nBACK: /(a)\\1/", "BACK", id="backreference"),
        pytest.param('start: "a" EMPTY\nEMPTY: /b*/', "EMPTY", id="empty-terminal"),
        pytest.param("start: MULTI\nMULTI: /a b/x", "MULTI", id="unsupported-flag"),
        pytest.param("start: (", "lark grammar error", id="syntax-error"),
    ],
)
def test_grammar_errors(grammar: str, named: str) -> None:
    with pytest.raises(GrammarError, match=named):
        compile_lark(grammar, deepseek_vocab())


def test_undefined_start() -> None:
    with pytest.raises(GrammarError):
        compile_lark('start: "a"', deepseek_vocab(), start="nope")


def test_common_escaped_string_is_supported() -> None:
    g = compile_lark("start: ESCAPED_STRING\n%import common.ESCAPED_STRING", deepseek_vocab())
    m = g.matcher()
    m.advance_bytes(b'"a\\"b"')
    assert m.is_accepting()


def test_case_insensitive_literal_and_regex() -> None:
    g = compile_lark('start: "select"i NAME\nNAME: /(?i:[a-c]+)/\n%ignore " "', deepseek_vocab())
    m = g.matcher()
    m.advance_bytes(b"SeLeCt AbC")
    assert m.is_accepting()
