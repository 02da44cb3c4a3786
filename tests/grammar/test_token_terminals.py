"""Tokens matched by id (grammar.ebnf.token_terminals): llguidance's `<|name|>` / `<[ids]>` in
lark, XGrammar's `Token` / `ExcludeToken` / `TokenTagDispatch` in EBNF. The mask holds exactly the
ids where the parser can take the terminal; the text of a token is not the token."""

from __future__ import annotations

import numpy as np
import pytest

from grammar import GrammarError, TokenVocabulary, compile_ebnf, compile_lark
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab, smollm2_tokenizer

IM_START, IM_END = 1, 2  # SmolLM2: <|im_start|>, <|im_end|> (its EOS)


@pytest.fixture(scope="module")
def smol() -> TokenVocabulary:
    return TokenVocabulary.from_tokenizer(smollm2_tokenizer())


def _allowed(m, n: int) -> set[int]:
    bits = np.unpackbits(m.bitmask().view(np.uint8), bitorder="little")[:n]
    return set(np.flatnonzero(bits).tolist())


def _ids(text: str) -> list[int]:
    return smollm2_tokenizer().encode(text, add_special_tokens=False)


def test_special_tokens_by_name_are_the_only_tokens_allowed_there(smol) -> None:
    g = compile_lark('start: <|im_start|> "user" /[a-z ]+/ <|im_end|>', smol)
    m = g.matcher()
    assert _allowed(m, len(smol)) == {IM_START}
    m.advance(IM_START)
    assert m.forced_bytes() == b"user"
    m.advance_bytes(b"user hello")
    allowed = _allowed(m, len(smol))
    assert IM_END in allowed and IM_START not in allowed
    assert not m.is_accepting()
    m.advance(IM_END)  # SmolLM2's EOS, named by the grammar: read as the terminal
    assert m.is_accepting() and m.is_dead()


def test_token_ids_ranges_negation_and_wildcard(smol) -> None:
    n = len(smol)
    m = compile_lark('start: "a" <[3-5,9]>', smol).matcher()
    m.advance_bytes(b"a")
    assert _allowed(m, n) == {3, 4, 5, 9}
    m = compile_lark('start: "a" <[^3,5-9]>', smol).matcher()
    m.advance_bytes(b"a")
    assert _allowed(m, n) == set(range(n)) - {3, 5, 6, 7, 8, 9, IM_END}  # never EOS
    m = compile_lark("start: <[*]>{2}", smol).matcher()
    assert len(_allowed(m, n)) == n - 1
    m.advance(IM_START)
    m.advance(_ids("hello")[0])
    assert m.is_accepting() and _allowed(m, n) == {IM_END}


def test_a_token_named_by_id_is_not_its_text() -> None:
    """DeepSeek's `<｜tool▁calls▁begin｜>` is an added token with bytes: spelled by other tokens
    (or as raw bytes) it does not match the terminal."""
    vocab, tok = deepseek_vocab(), deepseek_tokenizer()
    begin = "<｜tool▁calls▁begin｜>"
    tid = tok.convert_tokens_to_ids(begin)
    g = compile_lark(f'start: {begin} "x"', vocab)
    m = g.matcher()
    assert _allowed(m, len(vocab)) == {tid}
    with pytest.raises(GrammarError):
        m.advance_bytes(begin.encode())
    m.advance(tid)
    assert m.forced_bytes() == b"x"
    # the same text as a string literal is matched as text, by any tokens that spell it
    m = compile_lark(f'start: "{begin}" "x"', vocab).matcher()
    m.advance_bytes(begin.encode()[:3])
    m.advance_bytes(begin.encode()[3:])
    assert m.forced_bytes() == b"x"


def test_a_text_token_in_a_token_set_also_goes_on_as_text(smol) -> None:
    ab = smollm2_tokenizer().convert_tokens_to_ids("ab")
    assert smol.token_bytes(ab) == b"ab"
    g = compile_ebnf(f'root ::= Token({ab}) "!" | "a" "b" "?"', smol)
    m = g.matcher()
    m.advance(ab)
    allowed = _allowed(m, len(smol))
    assert {_ids("!")[0], _ids("?")[0]} <= allowed
    m.advance(_ids("?")[0])
    assert m.is_accepting()
    m.rollback(2)
    assert _allowed(m, len(smol)) >= {ab}


def test_forced_text_stops_before_a_token_terminal(smol) -> None:
    m = compile_ebnf('root ::= "abc" Token(1) "d"', smol).matcher()
    assert m.forced_bytes() == b"abc"
    m.advance_bytes(b"abc")
    assert m.forced_bytes() == b"" and _allowed(m, len(smol)) == {IM_START}
    m.advance(IM_START)
    assert m.forced_bytes() == b"d"
    m.rollback(1)
    assert _allowed(m, len(smol)) == {IM_START}


def test_exclude_token_and_token_tag_dispatch(smol) -> None:
    n = len(smol)
    m = compile_ebnf("root ::= ExcludeToken(0, 1)+", smol).matcher()
    assert _allowed(m, n) == set(range(n)) - {0, 1, IM_END}
    for t in _ids("free text"):
        m.advance(t)
    assert m.is_accepting() and IM_END in _allowed(m, n)

    g = compile_ebnf(
        'root ::= TokenTagDispatch((1, call), excludes=(0,))\ncall ::= "{" [a-z]* "}"', smol
    )
    m = g.matcher()
    assert IM_START in _allowed(m, n) and 0 not in _allowed(m, n)
    for t in _ids("say"):
        m.advance(t)
    m.advance(IM_START)
    assert m.forced_bytes() == b"{"
    m.advance_bytes(b"{ab}")
    assert m.is_accepting()
    for t in _ids(" more"):
        m.advance(t)
    assert m.is_accepting()


@pytest.mark.parametrize(
    ("kind", "text", "words"),
    [
        ("lark", "start: <|no_such_token|>", ["<|no_such_token|>", "line 1"]),
        ("lark", "start: <[5-2]>", ["5-2", "reversed"]),
        ("lark", "start: <[1,x]>", ["'x'"]),
        ("lark", "start: <[99999999]>", ["99999999", "outside the vocabulary"]),
        ("lark", "start: A\nA: <|im_end|>", ["special token", "inside a terminal"]),
        ("ebnf", "root ::= Token()", ["Token()", "token ids"]),
        ("ebnf", "root ::= ExcludeToken(-1)", ["ExcludeToken()"]),
        ("ebnf", "root ::= Token(1, x=2)", ["named"]),
        ("ebnf", 'root ::= TokenTagDispatch((1, r), excludes=(1,))\nr ::= "a"', ["also excluded"]),
        ("ebnf", "root ::= TokenTagDispatch((1, 2))", ["rule name"]),
    ],
)
def test_bad_token_references_are_refused_by_name(smol, kind: str, text: str, words) -> None:
    with pytest.raises(GrammarError) as err:
        (compile_lark if kind == "lark" else compile_ebnf)(text, smol)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize(
    ("fmt", "words"),
    [
        ({"type": "token", "token": -1}, ["format.token"]),
        ({"type": "token", "token": "<|nope|>"}, ["format", "'<|nope|>'"]),
        ({"type": "exclude_token", "exclude_tokens": [True]}, ["format.exclude_tokens[0]"]),
        ({"type": "any_tokens", "max_tokens": 20_000}, ["format.max_tokens", "limit"]),
        (
            {"type": "token_triggered_tags", "trigger_tokens": [1], "tags": [
                {"type": "tag", "begin": "<a>", "content": {"type": "any_tokens"}, "end": "</a>"}
            ]},
            ["format.tags[0].begin"],
        ),
        (
            {"type": "triggered_tags", "triggers": ["<"], "tags": [
                {"type": "tag", "begin": {"type": "token", "token": 1},
                 "content": {"type": "any_text"}, "end": ">"}
            ]},
            ["format.tags[0].begin"],
        ),
        ({"type": "token_dispatch", "rules": [[1.5, {"type": "any_tokens"}]]}, ["rules[0][0]"]),
        ({"type": "any_text", "max_tokens": 5}, ["format.max_tokens"]),
    ],
)  # fmt: skip
def test_bad_token_level_formats_are_refused_naming_the_field(smol, fmt: dict, words) -> None:
    from grammar import compile_structural_tag

    with pytest.raises(GrammarError) as err:
        compile_structural_tag({"type": "structural_tag", "format": fmt}, smol)
    for w in words:
        assert w in str(err.value)


def test_a_token_end_is_excluded_from_the_tokens_inside_its_tag(smol) -> None:
    from grammar import compile_structural_tag

    spec = {
        "type": "tag",
        "begin": {"type": "token", "token": "<|im_start|>"},
        "content": {"type": "any_tokens", "exclude_tokens": [0]},
        "end": {"type": "token", "token": "<|im_end|>"},
    }
    m = compile_structural_tag(spec, smol).matcher()
    assert _allowed(m, len(smol)) == {IM_START}
    m.advance(IM_START)
    inside = _allowed(m, len(smol))
    assert IM_END in inside and 0 not in inside and len(inside) == len(smol) - 1
    for t in _ids("some text"):
        m.advance(t)
    m.advance(IM_END)  # the tag's end (never another token of the content)
    assert m.is_accepting() and _allowed(m, len(smol)) == {IM_END}


def test_token_names_travel_to_the_compile_workers() -> None:
    """The served vocabulary keeps the token names, and a compile worker gets them too: a lark
    grammar naming `<|im_start|>` compiles there and comes back matching it by id."""
    from grammar import Constraint
    from runtime.scheduling.compile_pool import CompilePool
    from runtime.scheduling.constrained import constraint_vocabulary

    vocab = constraint_vocabulary(smollm2_tokenizer())
    assert vocab.token_names["<|im_start|>"] == IM_START
    pool = CompilePool(lambda: vocab, workers=1, timeout_s=120, prebuild=False)
    try:
        g = pool.compile(Constraint.of("grammar", 'start: <|im_start|> "hi"'))
        m = g.matcher()
        assert _allowed(m, len(vocab)) == {IM_START}
        m.advance(IM_START)
        m.advance_bytes(b"hi")
        assert m.is_accepting()
    finally:
        pool.shutdown()


def test_llama_cpp_token_references_in_gbnf(smol) -> None:
    """llama.cpp's GBNF tokens: `<[id]>`, `<text>` (the token of that text), `!<...>`."""
    n = len(smol)
    g = compile_ebnf("root ::= <|im_start|> body <[2]>\nbody ::= !<[0]>*", smol)
    m = g.matcher()
    assert _allowed(m, n) == {IM_START}
    m.advance(IM_START)
    assert _allowed(m, n) == set(range(1, n))  # any token but 0 (and EOS: the end token)
    for t in _ids("thinking"):
        m.advance(t)
    m.advance(IM_END)
    assert m.is_accepting()
    with pytest.raises(GrammarError, match="<\\[x\\]>"):
        compile_ebnf("root ::= <[x]>", smol)
    with pytest.raises(GrammarError, match="<nope>"):
        compile_ebnf('root ::= "a" <nope>', smol)
