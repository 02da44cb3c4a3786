"""The regex dialect of `grammar/automata/regex_syntax.py` (escapes, end anchors, flags), with
Python's `re` as the oracle on every string of a small alphabet up to a length."""

from __future__ import annotations

import itertools
import re

import pytest

from grammar import GrammarError, TokenVocabulary, compile_regex
from grammar.automata.fsm import regex_to_dfa

ALPHABET = "aAbB\n\x1b\x00\x0a"


def _dfa_accepts(dfa, text: str) -> bool:
    q = 1
    for byte in text.encode():
        q = int(dfa.table[q, dfa.byte_to_class[byte]])
        if q == 0:
            return False
    return bool(dfa.accepting[q])


def _strings(max_len: int = 4):
    chars = sorted(set(ALPHABET))
    for n in range(max_len + 1):
        for t in itertools.product(chars, repeat=n):
            yield "".join(t)


@pytest.mark.parametrize(
    "pattern, python",
    [
        ("^ab$", None),
        ("^a|b$", None),
        ("(^a$|^b$)", None),
        ("(?:^(a|b)$)", None),
        ("^(^a)?b$", None),
        (r"\e", "\x1b"),
        (r"\0", "\x00"),
        (r"[\0b]", "[\x00b]"),
        (r"\cJ", "\n"),
        (r"[\cJa]+", "[\na]+"),
        (r"\u0041", None),
        (r"\u{41}b", "Ab"),
        (r"\U00000062", "b"),
        ("(?s).", None),
        ("(?s)a.b", None),
        ("a.b", None),
        ("(?i)ab", None),
        ("(?i)[a-b]+", None),
        ("(?i)[^a]", None),
        ("a(?i:b)", None),
        ("(?i)a(?-i:b)", None),
        ("(?u)a+", None),
        ("(?iu:a)b", "(?i:a)b"),
        ("(?m)^a$", None),
    ],
)
def test_regex_dialect_agrees_with_python_re(pattern, python):
    dfa = regex_to_dfa(pattern)
    oracle = re.compile(python or pattern)
    wrong = [s for s in _strings() if _dfa_accepts(dfa, s) != bool(oracle.fullmatch(s))]
    assert wrong == []


def test_astral_code_point_escape_reaches_the_token_matcher():
    tokens = [b"\xf0", b"\xa0\xae", b"\xb7", b"x", None]
    compiled = compile_regex(r"\u{20BB7}x", TokenVocabulary(tokens, eos_token_ids=[4]))
    m = compiled.matcher()
    for t in (0, 1, 2, 3):
        m.advance(t)
    assert m.is_accepting()
    assert "\U00020bb7x".encode() == b"".join(tokens[:4])


@pytest.mark.parametrize(
    "pattern, named",
    [
        ("a^b", "'^'"),
        ("a$b", "'$'"),
        ("(^a)*", "'^'"),
        ("x(^a|b)", "'^'"),
        ("(a$|b)c", "'$'"),
        (r"\cé", "\\c"),
        (r"\u12", "\\u"),
        (r"\u{110000}", "\\u{"),
        (r"\u{D800}", "\\u{"),
        ("(?x)a b", "x"),
    ],
)
def test_unsupported_regex_constructs_are_refused_by_name(pattern, named):
    with pytest.raises(GrammarError) as e:
        regex_to_dfa(pattern)
    assert named in str(e.value)


@pytest.mark.parametrize(
    "flag, text, accepted", [("s", b"a\nb", True), ("u", b"a\nb", False), ("u", b"axb", True)]
)
def test_lark_regex_terminals_take_the_s_and_u_flags(flag, text, accepted):
    from grammar import compile_lark

    tokens = [bytes([c]) for c in b"abx\n"] + [None]
    compiled = compile_lark(f"start: X\nX: /a.b/{flag}", TokenVocabulary(tokens, eos_token_ids=[4]))
    m = compiled.matcher()
    try:
        m.advance_bytes(text)
    except GrammarError:
        assert not accepted
    else:
        assert m.is_accepting() == accepted
