"""GBNF / EBNF grammars as token constraints, walked token by token with the DeepSeek tokenizer:
the eight llama.cpp-style grammars compile, accept their sentences, refuse the broken ones, and
constrain random generation to texts an independent oracle accepts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from benchmarks.grammar.gbnf_cases import CASES
from grammar import CompiledGrammar, GrammarError, compile_ebnf
from grammar.ebnf.compiler import CompiledEBNF
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab


def _ids(text: str) -> list[int]:
    return deepseek_tokenizer().encode(text, add_special_tokens=False)


def _walk(g, text: str) -> tuple[bool, object]:
    """(every token allowed and consumed, the matcher)."""
    m = g.matcher()
    for t in _ids(text):
        if not m.is_allowed(t):
            return False, m
        m.advance(t)
    return True, m


@pytest.mark.parametrize("name", list(CASES))
def test_gbnf_grammar_accepts_its_sentences_token_by_token(name: str) -> None:
    case = CASES[name]
    g = compile_ebnf(case.grammar, deepseek_vocab())
    assert isinstance(g, CompiledEBNF if case.recursive else CompiledGrammar)
    eos = deepseek_vocab().eos_token_ids[0]
    for text in case.accept:
        ok, m = _walk(g, text)
        assert ok and m.is_accepting(), text
        assert m.is_allowed(eos), text


@pytest.mark.parametrize("name", list(CASES))
def test_gbnf_grammar_refuses_broken_texts(name: str) -> None:
    case = CASES[name]
    g = compile_ebnf(case.grammar, deepseek_vocab())
    for text in case.refuse:
        ok, m = _walk(g, text)
        assert not (ok and m.is_accepting()), text


_CLOSERS = [")", "}", "]", ";", ".", "。", "\n", '"', " =", " = ", " "]


def _random_walk(g, rng: random.Random, free_steps: int, short: np.ndarray) -> str | None:
    """Generate under the constraint: random allowed tokens (short ones preferred) for
    `free_steps`, then random closing characters where allowed, so that structures end; EOS
    where allowed (with probability 1/3 in the free part). The text, or None if 150 steps
    were not enough."""
    tok = deepseek_tokenizer()
    vocab = deepseek_vocab()
    eos = vocab.eos_token_ids[0]
    closers = [
        t
        for t in range(len(vocab))
        if (vocab.token_bytes(t) or b"").decode("utf-8", "replace") in _CLOSERS
    ]
    m = g.matcher()
    out: list[int] = []
    for step in range(150):
        mask = m.mask()
        assert mask.any(), tok.decode(out)  # never a dead end
        finishing = step >= free_steps
        if mask[eos] and (finishing or rng.random() < 1 / 3):
            return tok.decode(out)
        closing = finishing and rng.random() < 0.7
        allowed = np.array([t for t in closers if mask[t]]) if closing else np.zeros(0)
        if allowed.size == 0:
            allowed = np.flatnonzero(mask & short)
        if allowed.size == 0 or (not finishing and rng.random() < 0.2):
            allowed = np.flatnonzero(mask)
        t = int(allowed[rng.randrange(allowed.size)])
        if t == eos:
            return tok.decode(out)
        m.advance(t)
        out.append(t)
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_generation_under_a_gbnf_grammar_satisfies_an_independent_oracle(name: str) -> None:
    case = CASES[name]
    vocab = deepseek_vocab()
    g = compile_ebnf(case.grammar, vocab)
    short = np.array([0 < len(vocab.token_bytes(i) or b"") <= 2 for i in range(len(vocab))])
    rng = random.Random(7)
    done = 0
    for _ in range(8):
        text = _random_walk(g, rng, 25, short)
        if text is not None:
            assert case.oracle(text), text
            done += 1
    assert done >= 4


def test_mask_allows_exactly_the_tokens_advance_accepts() -> None:
    """Along a JSON sentence, every token the mask allows advances and every other is refused
    (checked over a sample of the vocabulary)."""
    vocab = deepseek_vocab()
    g = compile_ebnf(CASES["json"].grammar, vocab)
    m = g.matcher()
    rng = random.Random(3)
    sample = rng.sample(range(len(vocab)), 3000)
    for t in _ids('{"key": [1, {"b": "x y"}], "z": null}'):
        mask = m.mask()
        for s in sample + [t]:
            probe = m.copy()
            try:
                probe.advance(s)
                accepted = True
            except GrammarError:
                accepted = False
            assert accepted == bool(mask[s]), (s, vocab.token_bytes(s))
        m.advance(t)


def test_left_recursion_and_ambiguity_parse() -> None:
    g = compile_ebnf('root ::= e\ne ::= e "+" e | e e | "a" | ""\n', deepseek_vocab(), root="root")
    for text in ["a", "a+a", "aa+a", "+", "a++a"]:
        ok, m = _walk(g, text)
        assert ok and m.is_accepting(), text


def test_any_rule_can_be_the_root() -> None:
    g = compile_ebnf(CASES["json"].grammar, deepseek_vocab(), root="array")
    ok, m = _walk(g, '[1, "a"]')
    assert ok and m.is_accepting()
    ok, m = _walk(g, '{"a": 1}')
    assert not ok


def test_dialect_escapes_classes_and_repetitions() -> None:
    text = r"""
root ::= "\x41\u00e9\U0001F600" tab [^a-c\]] dot{2} num{1,3} more
  | "alt" # a comment
tab ::= "\t"
dot ::= .
num ::= [0-9]
more ::= "z"{2,}
"""
    g = compile_ebnf(text, deepseek_vocab())
    for good in ["Aé😀\td..1zz", "Aé😀\texy123zzzz", "alt"]:
        ok, m = _walk(g, good)
        assert ok and m.is_accepting(), good
    for bad in ["Aé😀\tb..1zz", "Aé😀\t]..1zz", "Aé😀\td..1234zz", "Aé😀\td..1z"]:
        ok, m = _walk(g, bad)
        assert not (ok and m.is_accepting()), bad


@pytest.mark.parametrize(
    ("text", "root", "words"),
    [
        ('root ::= item\nitem ::= "a" missing\n', "root", ["line 2", "missing"]),
        ('item ::= "a"\n', "root", ["root"]),
        ('root ::= "a\n', "root", ["line 1", "unterminated"]),
        ("root ::= [a-\n", "root", ["line", "'root'"]),
        ('root ::= "a" )\n', "root", ["line 1"]),
        ('root ::= "a"\nroot ::= "b"\n', "root", ["twice"]),
        ('root ::= x\nx ::= "a" x\n', "root", ["matches no text"]),
    ],
)
def test_grammar_errors_name_the_line_and_rule(text: str, root: str, words: list[str]) -> None:
    with pytest.raises(GrammarError) as err:
        compile_ebnf(text, deepseek_vocab(), root=root)
    for w in words:
        assert w in str(err.value)


def test_forced_text_and_rollback() -> None:
    g = compile_ebnf(
        'root ::= "{\\"name\\": " value "}"\nvalue ::= "[" value? "]"\n', deepseek_vocab()
    )
    m = g.matcher()
    assert m.forced_text() == '{"name": ['
    m.advance_bytes(b'{"name": [[')
    assert m.forced_text() == ""
    m.advance_bytes(b"]")
    assert m.forced_text() == "]}"
    m.rollback(1)
    assert m.forced_text() == ""
    m.rollback(1)
    assert m.forced_text() == '{"name": ['


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('root ::= "a" (= "b") "c"\n', ["lookahead", "line 1"]),
        ('root ::= Token(999999) "a"\n', ["Token(...)", "999999", "line 1"]),
        ('root[max_tokens=4] ::= "a"\n', ["max_tokens", "line 1"]),
        ('root ::= Regex("a", flags="x")\n', ["flags", "line 1"]),
        ('root ::= TagDispatch(("<a", r), excludes=("<",))\nr ::= "x"\n', ["prefix"]),
        ("root ::= " + "(" * 300 + '"a"' + ")" * 300 + "\n", ["nest deeper"]),
        ('root ::= "a"{20000}\n', ["limit"]),
    ],
)
def test_unsupported_or_oversized_constructs_are_refused_by_name(text: str, words) -> None:
    with pytest.raises(GrammarError) as err:
        compile_ebnf(text, deepseek_vocab())
    for w in words:
        assert w in str(err.value)
