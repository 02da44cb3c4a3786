"""Lazy lexemes in llguidance's lark dialect commit where they first match: a lexeme starting at
the same place as a lazy one never reads past a match of it (llguidance's lexer and XGrammar's
tool-call dispatch both read them so). Oracles: small hand-written scanners over every string
of a little alphabet."""

from __future__ import annotations

import itertools
import re

import pytest

from grammar import GrammarError, TokenVocabulary, compile_lark

VOCAB = TokenVocabulary([bytes([i]) for i in range(256)] + [None], [256])


def _accepts(g, text: str) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


def _strings(alphabet: str, up_to: int) -> list[str]:
    return ["".join(p) for n in range(up_to + 1) for p in itertools.product(alphabet, repeat=n)]


def _dispatch(text: str, triggers: dict[str, str]) -> bool:
    """Free text up to the first trigger; after it the trigger's payload regex (then free text
    again); text with no trigger left is the tail."""
    while True:
        hits = [(text.find(t), t) for t in triggers if t in text]
        if not hits:
            return True
        at, trig = min(hits, key=lambda h: (h[0], len(h[1])))
        text = text[at + len(trig) :]
        m = re.match(triggers[trig], text)
        if m is None:
            return False
        text = text[m.end() :]


def _check(source: str, alphabet: str, up_to: int, oracle) -> None:
    g = compile_lark(source, VOCAB)
    wrong = [s for s in _strings(alphabet, up_to) if _accepts(g, s) != oracle(s)]
    assert wrong == []


HEADS = {
    "text then trigger": 'head[lazy]: FREE "ab"',
    "regex ending in the trigger": "head[lazy]: /[abx;]*ab/",
    "suffix attribute": 'head[suffix="ab"]: FREE',
}


@pytest.mark.parametrize("head", HEADS.values(), ids=HEADS.keys())
def test_free_text_stops_at_the_trigger(head: str) -> None:
    source = f'start: call* rest\nrest: FREE\n{head}\ncall: head "x"+ ";"\nFREE: /[abx;]*/'
    _check(source, "abx;", 6, lambda s: _dispatch(s, {"ab": r"x+;"}))


def test_the_payload_may_hold_the_trigger() -> None:
    # the payload starts after the trigger, not beside it: nothing lazy competes with it there
    source = 'start: call* rest\nrest: FREE\nhead[lazy]: FREE "ab"\ncall: head BODY ";"\n'
    source += "BODY: /[abx]*/\nFREE: /[abx;]*/"
    g = compile_lark(source, VOCAB)
    assert _accepts(g, "xabxab;x")
    _check(source, "abx;", 6, lambda s: _dispatch(s, {"ab": r"[abx]*;"}))


def test_two_triggers_first_match_wins() -> None:
    source = (
        "start: (one | two)* rest\nrest: FREE\n"
        'one_hd[lazy]: FREE "ab"\none: one_hd "x" ";"\n'
        'two_hd[lazy]: FREE "ba"\ntwo: two_hd "y" ";"\n'
        "FREE: /[abxy;]*/"
    )
    g = compile_lark(source, VOCAB)
    assert not _accepts(g, "aba")  # "ab" matched first: "x;" must follow
    assert not _accepts(g, "abay;")
    assert _accepts(g, "bay;ab" + "x;")
    _check(source, "abxy;", 5, lambda s: _dispatch(s, {"ab": "x;", "ba": "y;"}))


def test_a_shared_trigger_keeps_both_tools() -> None:
    source = (
        "start: (foo | bar)* rest\nrest: FREE\n"
        'foo_hd[lazy]: FREE "<f"\nfoo: foo_hd "=a>" /[a-z]+/ "</f>"\n'
        'bar_hd[lazy]: FREE "<f"\nbar: bar_hd "=b>" /[0-9]+/ "</f>"\n'
        "FREE: /(.|\\n)*/"
    )
    g = compile_lark(source, VOCAB)
    assert _accepts(g, "hi <f=a>xy</f> and <f=b>12</f> bye")
    assert _accepts(g, "<g partial, then <")
    for bad in ("<f", "<f=c>xy</f>", "<f=a>12</f>", "x<f=b>1"):
        assert not _accepts(g, bad), bad


def test_other_places_keep_the_plain_language() -> None:
    # the lazy lexeme starts only after "<": the FREE before it is not cut at its match
    source = 'start: FREE "<" head "!"\nhead[lazy]: /[a-z]+/\nFREE: /[a-z]*/'
    g = compile_lark(source, VOCAB)
    assert _accepts(g, "abc<a!")
    assert not _accepts(g, "abc<ab!")  # the lazy lexeme itself stops at its first match
