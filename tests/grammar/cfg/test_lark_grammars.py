"""The example lark grammars as token constraints with real tokenizers, lark as the oracle."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from grammar import GrammarError, TokenVocabulary
from grammar.cfg.compiler import compile_lark
from tests.support.lark_sentences import (
    EXAMPLES,
    accepts_tokens,
    corruptions,
    grammar_text,
    lark_accepts,
    valid_sentences,
)
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab, smollm2_tokenizer

SENTENCES = 12


@functools.cache
def smollm2_vocab() -> TokenVocabulary:
    return TokenVocabulary.from_tokenizer(smollm2_tokenizer())


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("name", EXAMPLES)
def test_random_sentences_accepted_deepseek(name: str) -> None:
    g = compile_lark(grammar_text(name), deepseek_vocab())
    tok = deepseek_tokenizer()
    sentences = valid_sentences(name, SENTENCES, seed=1)
    assert len(sentences) >= SENTENCES // 2
    for s in sentences:
        assert accepts_tokens(g, _encode(tok, s)), s


@pytest.mark.parametrize("name", EXAMPLES)
def test_random_sentences_accepted_smollm2(name: str) -> None:
    g = compile_lark(grammar_text(name), smollm2_vocab())
    tok = smollm2_tokenizer()
    for s in valid_sentences(name, 6, seed=2):
        assert accepts_tokens(g, _encode(tok, s)), s


@pytest.mark.parametrize("name", EXAMPLES)
def test_corruptions_agree_with_lark(name: str) -> None:
    """A corrupted sentence is accepted exactly when lark parses it."""
    text = grammar_text(name)
    g = compile_lark(text, deepseek_vocab())
    tok = deepseek_tokenizer()
    refused = 0
    for i, s in enumerate(valid_sentences(name, 6, seed=3)):
        for bad in corruptions(s, 6, seed=i):
            expected = lark_accepts(text, bad)
            assert accepts_tokens(g, _encode(tok, bad)) == expected, (s, bad)
            refused += not expected
    assert refused > 0


@pytest.mark.parametrize("name", EXAMPLES)
def test_random_token_walks_parse_with_lark(name: str) -> None:
    """Sampling allowed tokens until EOS yields text that lark parses. Tokens are drawn mostly
    from those that tokenize valid sentences (so walks look like the language and end), else
    from the whole mask."""
    text = grammar_text(name)
    vocab = deepseek_vocab()
    tok = deepseek_tokenizer()
    g = compile_lark(text, vocab)
    eos = vocab.eos_token_ids[0]
    pool = sorted({t for s in valid_sentences(name, 20, seed=5) for t in _encode(tok, s)})
    rng = random.Random(4)
    finished = 0
    for _ in range(10):
        m = g.matcher()
        out = b""
        for step in range(80):
            mask = m.mask()
            allowed = np.flatnonzero(mask)
            assert allowed.size, out
            if mask[eos] and (step > 3 or allowed.size == 1) and rng.random() < 0.5:
                finished += 1
                assert lark_accepts(text, out.decode("utf-8")), out
                break
            typical = [t for t in pool if mask[t]]
            if typical and rng.random() < 0.9:
                t = rng.choice(typical)
            else:
                t = int(
                    rng.choice([a for a in allowed[:: max(1, allowed.size // 500)] if a != eos])
                )
            m.advance(t)
            out += vocab.token_bytes(t)
    assert finished >= 3


@pytest.mark.parametrize(
    ("grammar", "prefix", "forced"),
    [
        pytest.param('start: "call(" NAME ")"\nNAME: /[a-z]+/', "", "call(", id="literal-start"),
        pytest.param('start: "call(" NAME ")"\nNAME: /[a-z]+/', "call(ab", "", id="open-name"),
        pytest.param(
            'start: "SELECT" NAME "FROM" NAME\nNAME: /[a-z]+/\n%ignore " "',
            "SEL",
            "ECT",
            id="keyword-rest",
        ),
        pytest.param(grammar_text("json"), '{"a": tr', "ue", id="json-true"),
        pytest.param(grammar_text("json"), '{"a": [1, nu', "ll", id="json-null"),
        pytest.param(grammar_text("json"), '{"a": ', "", id="json-value"),
        pytest.param(grammar_text("arithmetic"), "(1+2", "", id="arith-open"),
        pytest.param('start: "a" "b" "c" "d"', "a", "bcd", id="chain"),
        pytest.param('start: "x" ("y" | "yz")', "x", "y", id="common-prefix"),
    ],
)
def test_forced_text(grammar: str, prefix: str, forced: str) -> None:
    m = compile_lark(grammar, deepseek_vocab()).matcher()
    m.advance_bytes(prefix.encode())
    assert m.forced_text() == forced
    if forced:
        m.advance_bytes(forced.encode())


def test_eos_only_at_sentence_end() -> None:
    vocab = deepseek_vocab()
    g = compile_lark(grammar_text("arithmetic"), vocab)
    m = g.matcher()
    eos = vocab.eos_token_ids[0]
    m.advance_bytes(b"1 +")
    assert not m.mask()[eos] and not m.is_accepting()
    m.advance_bytes(b" 2")
    assert m.mask()[eos] and m.is_accepting() and not m.is_dead()
    m.advance(eos)
    assert m.is_dead() and not m.mask().any()


def test_dead_when_sentence_cannot_grow() -> None:
    m = compile_lark('start: "ok"', deepseek_vocab()).matcher()
    m.advance_bytes(b"ok")
    assert m.is_accepting() and m.is_dead()


def test_copy_is_independent() -> None:
    m = compile_lark(grammar_text("json"), deepseek_vocab()).matcher()
    m.advance_bytes(b"[1")
    c = m.copy()
    c.advance_bytes(b"]")
    assert c.is_accepting() and not m.is_accepting()


def test_fill_bitmask_matches_mask() -> None:
    vocab = deepseek_vocab()
    m = compile_lark(grammar_text("sql_select"), vocab).matcher()
    m.advance_bytes(b"SELECT a FROM t WHERE ")
    out = np.zeros((len(vocab) + 31) // 32, dtype=np.int32)
    m.fill_bitmask(out)
    bits = np.unpackbits(out.view(np.uint8), bitorder="little")[: len(vocab)].astype(bool)
    assert (bits == m.mask()).all()


def test_compile_is_cached() -> None:
    vocab = deepseek_vocab()
    assert compile_lark(grammar_text("json"), vocab) is compile_lark(grammar_text("json"), vocab)


@pytest.mark.parametrize("name", ["json", "sql_select"])
def test_eager_walks_give_the_lazy_masks(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile-time vocabulary walks only fill caches: fully eager, capped and fully lazy
    compilations give the same mask at every token of every sentence."""
    import grammar.cfg.compiler as cfg

    vocab, tok = smollm2_vocab(), smollm2_tokenizer()
    compiled = []
    for cap in (cfg.MAX_EAGER_WALKS, 7, 0):
        monkeypatch.setattr(cfg, "MAX_EAGER_WALKS", cap)
        compiled.append(cfg.CompiledCFG(grammar_text(name), vocab))
    assert compiled[0].eager_walks > 7 and compiled[1].eager_walks == 7
    assert compiled[2].eager_walks == 0
    for s in valid_sentences(name, 4, seed=5):
        matchers = [g.matcher() for g in compiled]
        for t in _encode(tok, s):
            first = matchers[0].bitmask()
            for m in matchers[1:]:
                assert np.array_equal(m.bitmask(), first), s
            for m in matchers:
                m.advance(t)
        assert all(m.is_accepting() for m in matchers)


# ---- the byte matcher ends with the sentence --------------------------------------------------


@pytest.mark.parametrize(
    "grammar, sentence, longer",
    [
        ('start: "a" "b"', b"ab", b"abab"),
        ('start: "a"?', b"a", b"aa"),
        ("%import common.DIGIT\nstart: DIGIT", b"1", b"10"),
    ],
)
def test_byte_matcher_refuses_text_after_a_complete_sentence(grammar, sentence, longer):
    tokens = [bytes([c]) for c in b"ab0123456789"] + [None]
    compiled = compile_lark(grammar, TokenVocabulary(tokens, eos_token_ids=[len(tokens) - 1]))
    m = compiled.matcher()
    m.advance_bytes(sentence)
    assert m.is_accepting() and m.is_dead()
    m = compiled.matcher()
    with pytest.raises(GrammarError):
        m.advance_bytes(longer)
    assert lark_accepts(grammar, sentence.decode()) and not lark_accepts(grammar, longer.decode())
