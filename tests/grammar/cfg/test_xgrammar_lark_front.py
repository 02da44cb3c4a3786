"""XGrammar's lark front end and EBNF rule options: `stop=` / `suffix=` markers (committed
shortest match), `stop_capture=`, nested `%lark { ... }` blocks, `%grammar_options`, `x{0}`,
grammars lark itself refuses read in the engines' dialect, and EBNF's `name[lazy] ::=`.
Oracles: `re` (with a hand-written "no proper prefix matches" rule for lazy ends) and
hand-written predicates, over every short string of a small alphabet."""

from __future__ import annotations

import itertools
import re

import pytest

from grammar import GrammarError, TokenVocabulary, compile_ebnf, compile_lark
from tests.support.walks import accepts_bytes

BYTES = TokenVocabulary([bytes([i]) for i in range(256)] + [None], [256])


def _strings(alphabet: str, up_to: int) -> list[str]:
    return ["".join(p) for n in range(up_to + 1) for p in itertools.product(alphabet, repeat=n)]


def _shortest(pattern: str, text: str) -> bool:
    """`text` matches `pattern` and none of its proper prefixes does (a lazy rule's end)."""
    rx = re.compile(pattern)
    return bool(rx.fullmatch(text)) and not any(rx.fullmatch(text[:i]) for i in range(len(text)))


def _language(g, alphabet: str, up_to: int) -> set[str]:
    return {s for s in _strings(alphabet, up_to) if accepts_bytes(g, s)}


MARKERS = [
    pytest.param('"b"', "b", "abc", id="string"),
    pytest.param("/!!+/", "!!+", "a!c", id="regex"),
    pytest.param("END\nEND: /!!+/ | \"??\"", "(?:!!+|\\?\\?)", "a!?c", id="terminal"),
    pytest.param('"AB"i', "(?i:AB)", "abABc", id="case-insensitive"),
]


@pytest.mark.parametrize(("marker", "marker_rx", "alphabet"), MARKERS)
def test_stop_and_suffix_end_at_the_first_marker(marker, marker_rx, alphabet) -> None:
    body = "[a-z]*"
    languages = []
    for attribute in ("stop", "suffix"):
        head, _, rest = marker.partition("\n")
        text = f'start: r "c"\nr[{attribute}={head}, stop_capture="m"]: /{body}/\n{rest}'
        languages.append(_language(compile_lark(text, BYTES), alphabet, 5))
    oracle = {
        s
        for s in _strings(alphabet, 5)
        if s.endswith("c") and _shortest(f"(?:{body})(?:{marker_rx})", s[:-1])
    }
    assert languages[0] == oracle
    assert languages[1] == oracle  # stop and suffix are the same language (XGrammar)


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        pytest.param('r[stop="a", suffix="b"]: "x"', "suffix= and stop=", id="both"),
        pytest.param('r[stop=""]: "x"', 'stop=""', id="empty-marker"),
        pytest.param('r[stop_capture="m"]: "x"', "stop_capture= needs", id="capture-alone"),
        pytest.param('r[stop=x]: "x"', "attribute 'stop'", id="rule-as-marker"),
        pytest.param('r[max_tokens=3]: "x"', "max_tokens", id="token-budget"),
    ],
)
def test_marker_misuse_is_a_grammar_error_naming_it(rule: str, named: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(named)):
        compile_lark(f"start: r\n{rule}\nx: \"x\"", BYTES)


def test_nested_lark_has_its_own_names_ignore_and_options() -> None:
    g = compile_lark('start: item %lark {\n  start: item\n  item: "b"\n} item\nitem: "a"', BYTES)
    assert _language(g, "ab", 4) == {"aba"}
    ws = "[ \t\f\r\n]*"
    for options, lead in (("", ""), ('%grammar_options {"allow_initial_skip": true}', ws)):
        text = (
            'start: "[" %lark {\n'
            f"  {options}\n  %import common.WS\n  %ignore WS\n"
            '  start: "x" inner\n  inner: %lark { start: "y" }\n} "]"'
        )
        oracle = re.compile(rf"\[{lead}x{ws}y\]")  # inner ignore after "x" only; none outside
        got = _language(compile_lark(text, BYTES), "[]xy ", 6)
        assert got == {s for s in _strings("[]xy ", 6) if oracle.fullmatch(s)}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        pytest.param('start: %lark { x: "a" }', "no start rule", id="no-start"),
        pytest.param('start: "x" %lark', "%lark needs a grammar in braces", id="no-braces"),
        pytest.param('start: %lark { start: "a" ', "not closed", id="unclosed"),
        pytest.param('A: %lark { start: "a" }\nstart: A', "inside a terminal", id="in-terminal"),
        pytest.param("start: " + "%lark { start: " * 60 + '"a"' + " }" * 60, "nest deeper",
                     id="too-deep"),
        pytest.param('%grammar_options {"colour": true}\nstart: "a" "b"', "colour",
                     id="unknown-option"),
    ],
)  # fmt: skip
def test_nested_lark_errors_name_the_block(text: str, named: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(named)):
        compile_lark(text, BYTES)


def test_grammar_options_merge_like_llguidance_options() -> None:
    text = (
        '%grammar_options {"allow_initial_skip": false}\n'
        '%grammar_options {"allow_initial_skip": true, "no_forcing": false}\n'
        '%ignore " "\nstart: "a" "b"'
    )
    got = _language(compile_lark(text, BYTES), "ab ", 4)
    assert got == {s for s in _strings("ab ", 4) if re.fullmatch(" *a *b *", s)}


@pytest.mark.parametrize(
    ("text", "pattern", "alphabet"),
    [
        pytest.param('start: "" "a" ""', "a", "ab", id="empty-literals"),
        pytest.param("start: /(a|)b|c|/", "(a|)b|c|", "abc", id="nullable-terminal"),
        pytest.param("start: /a+?b??c/", "a+?b??c", "abc", id="lazy-quantifiers"),
        pytest.param(r"start: /\x61\u{62}+/", "ab+", "ab", id="hex-and-braced-escapes"),
        pytest.param('start: "a"{0} "b" "c"{0,0}', "b", "bc", id="zero-repeats"),
        pytest.param("%import common.C_COMMENT\nstart: C_COMMENT",
                     r"/\*(?:(?!\*/)[\s\S])*\*/", "/*a", id="common-c-comment"),
    ],
)  # fmt: skip
def test_grammars_lark_refuses_are_read_in_the_dialect(text, pattern, alphabet) -> None:
    got = _language(compile_lark(text, BYTES), alphabet, 5)
    assert got == {s for s in _strings(alphabet, 5) if re.fullmatch(pattern, s)}


def test_refused_in_both_readings_names_both() -> None:
    with pytest.raises(GrammarError, match="dialect") as e:
        compile_lark("start: /[a-z/", BYTES)
    assert "[a-z" in str(e.value)


def test_ebnf_lazy_rule_ends_at_its_first_possible_end() -> None:
    g = compile_ebnf('root ::= ("<" r ">")*\nr[lazy, capture] ::= [a-c] [a-c]* "!"?', BYTES)
    piece = re.compile("<(.*?)>")
    got = _language(g, "<>ab!", 6)
    oracle = set()
    for s in _strings("<>ab!", 6):
        parts = piece.findall(s)
        if "".join(f"<{p}>" for p in parts) == s and all(
            _shortest("[a-c][a-c]*!?", p) for p in parts
        ):
            oracle.add(s)
    assert got == oracle
    g = compile_ebnf('root ::= r "z"\nr[lazy] ::= Substring("ab")', BYTES)
    assert _language(g, "abz", 3) == {"z"}  # a body matching "" matches only ""


def test_ebnf_lazy_needs_a_regular_body() -> None:
    with pytest.raises(GrammarError, match="'lazy' needs a regular body"):
        compile_ebnf('root ::= r\nr[lazy] ::= "(" r ")" | "x"', BYTES)
    with pytest.raises(GrammarError, match="max_tokens"):
        compile_ebnf('root ::= r\nr[max_tokens=3] ::= "x"', BYTES)


def test_named_grammars_are_nested_grammars() -> None:
    named = {"pair": 'start: @item ":" @item', "item": "start: /[ab]/"}
    g = compile_lark('start: @pair %lark { start: "," @item }*', BYTES, named_grammars=named)
    oracle = re.compile(r"[ab]:[ab](,[ab])*")
    assert _language(g, "ab:,", 6) == {s for s in _strings("ab:,", 6) if oracle.fullmatch(s)}


@pytest.mark.parametrize(
    ("named", "message"),
    [
        pytest.param({"a": "start: @b", "b": "start: @a"}, "@a -> @b -> @a", id="cycle"),
        pytest.param({"b": 'start: "b"'}, "grammar reference @a", id="unknown"),
        pytest.param(None, "grammar reference @a", id="none-given"),
        pytest.param({"a b": 'start: "b"'}, "invalid grammar name 'a b'", id="bad-name"),
        pytest.param({"a": 1}, "named_grammars['a']", id="bad-value"),
        pytest.param({"a": "start: @b @b", **{f"{c}": f"start: @{chr(ord(c) + 1)} "
                      f"@{chr(ord(c) + 1)}" for c in "bcdefghijklmnopqrstuvw"}, "x": 'start: "x"'},
                     "expand past", id="too-large"),
    ],
)  # fmt: skip
def test_named_grammar_errors_name_the_reference(named, message: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(message)):
        compile_lark("start: @a", BYTES, named_grammars=named)


def _budgeted(pattern: str, n: int, text: str) -> bool:
    """`text` matches `pattern` and no proper prefix of n or more characters does (the rule
    ends at its first possible end once n characters are read)."""
    rx = re.compile(pattern)
    return bool(rx.fullmatch(text)) and not any(
        rx.fullmatch(text[:i]) for i in range(n, len(text))
    )


@pytest.mark.parametrize("n", [0, 1, 2])
@pytest.mark.parametrize("front", ["ebnf", "lark"])
def test_max_chars_ends_the_rule_at_its_first_end_past_the_budget(front: str, n: int) -> None:
    body = "(ab|é)+b?"  # é: two bytes, one character
    if front == "ebnf":
        g = compile_ebnf(f'root ::= s "!"\ns[max_chars={n}] ::= ("ab" | "é")+ "b"?', BYTES)
    else:
        g = compile_lark(f'start: s "!"\ns[max_chars={n}, capture]: /{body}/', BYTES)
    oracle = {s for s in _strings("abé!", 5) if s.endswith("!") and _budgeted(body, n, s[:-1])}
    assert _language(g, "abé!", 5) == oracle


@pytest.mark.parametrize(
    ("front", "text", "named"),
    [
        pytest.param("ebnf", 'root ::= s\ns[max_chars=x] ::= "x"', "max_chars takes", id="bad"),
        pytest.param("ebnf", 'root ::= s\ns[max_chars=20000] ::= [a-z]*', "more than", id="big"),
        pytest.param("ebnf", 'root ::= s\ns[max_chars=3] ::= "(" s ")" | "x"', "regular body",
                     id="recursive"),
        pytest.param("lark", 'start: s\ns[max_chars=2, suffix="x"]: /a+/', "suffix= / stop=",
                     id="with-marker"),
        pytest.param("lark", "start: s\ns[max_chars=-1]: /a+/", "max_chars takes", id="negative"),
    ],
)  # fmt: skip
def test_max_chars_errors_name_it(front: str, text: str, named: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(named)):
        (compile_ebnf if front == "ebnf" else compile_lark)(text, BYTES)
