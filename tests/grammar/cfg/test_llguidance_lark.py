"""llguidance's lark dialect (grammar.ebnf.lark_lower): the documented cases of
benchmarks/grammar/llguidance_cases.py token by token, refusals by name, the route between the
LALR and Earley paths, and the new operators against oracles (lark's Earley parser, `re`,
`jsonschema`) over every short string of a small alphabet."""

from __future__ import annotations

import itertools
import json
import re

import jsonschema
import lark
import pytest

from benchmarks.grammar.llguidance_cases import LLGUIDANCE_CASES, DialectCase
from grammar import CompiledCFG, GrammarError, compile_lark
from grammar.ebnf.lark_lower import chunk_words, uses_llguidance_syntax
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab


def _accepts(g, text: str) -> bool:
    m = g.matcher()
    for t in deepseek_tokenizer().encode(text, add_special_tokens=False):
        if not m.is_allowed(t):
            return False
        m.advance(t)
    return m.is_accepting()


def _accepts_bytes(g, text: str) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


def _strings(alphabet: str, up_to: int) -> list[str]:
    return ["".join(p) for n in range(up_to + 1) for p in itertools.product(alphabet, repeat=n)]


SUPPORTED = [pytest.param(c, id=c.feature) for c in LLGUIDANCE_CASES if not c.unsupported]
REFUSED = [pytest.param(c, id=c.feature) for c in LLGUIDANCE_CASES if c.unsupported]


@pytest.mark.parametrize("case", SUPPORTED)
def test_feature_accepts_and_refuses_as_documented(case: DialectCase) -> None:
    g = compile_lark(case.source, deepseek_vocab())
    assert [t for t in case.accept if not _accepts(g, t)] == []
    refused_by_us = [t for t in case.refuse if not _accepts(g, t)]
    if "superset" in case.notes:  # a lexing rule of llguidance's we do not apply (see notes)
        assert refused_by_us == []
    else:
        assert refused_by_us == list(case.refuse)


@pytest.mark.parametrize("case", REFUSED)
def test_unsupported_feature_is_refused_by_name(case: DialectCase) -> None:
    with pytest.raises(GrammarError, match=re.escape(case.unsupported)):
        compile_lark(case.source, deepseek_vocab())


@pytest.mark.parametrize(
    ("text", "dialect"),
    [
        pytest.param('start: "a" "b"', False, id="plain"),
        pytest.param('start: "a" ~ 2..3', False, id="lark-repeat-tilde"),
        pytest.param('start: "a"{2,3}', True, id="braces"),
        pytest.param("start: A\nA: /a/ & /./", True, id="and"),
        pytest.param("start: A\nA: ~/a/", True, id="not"),
        pytest.param("start: x\nx[lazy]: /a+/", True, id="attribute"),
        pytest.param('start: "a" // note', True, id="slash-comment"),
        pytest.param('start: "//" "/a//"', False, id="slashes-inside-strings"),
        pytest.param('start: "a" # note', False, id="hash-comment"),
        pytest.param('start: my-x\nmy-x: "a"', True, id="dash-name"),
        pytest.param('%llguidance {}\nstart: "a"', True, id="options"),
        pytest.param("start: <|x|>", True, id="special"),
        pytest.param('start: %json {"type": "null"}', True, id="json"),
    ],
)
def test_route_by_dialect(text: str, dialect: bool) -> None:
    assert uses_llguidance_syntax(text) is dialect


def test_plain_lark_keeps_the_lalr_path_and_its_meaning():
    vocab = deepseek_vocab()
    plain = compile_lark('%ignore " "\nstart: "a" "b"', vocab)
    assert isinstance(plain, CompiledCFG)
    assert _accepts_bytes(plain, " a b")  # lark skips ignored text before the first token too
    dialect = compile_lark('%llguidance {}\n%ignore " "\nstart: "a" "b"', vocab)
    assert not isinstance(dialect, CompiledCFG)
    assert not _accepts_bytes(dialect, " a b")  # llguidance: not before the first lexeme
    assert _accepts_bytes(dialect, "a b ")


@pytest.mark.parametrize(
    ("ours", "lark_text"),
    [
        pytest.param(
            'start: ("a" | "b"){1,3} "c"{2,}',
            'start: ("a" | "b") ~ 1..3 "c" "c" "c"*',
            id="ranges",
        ),
        pytest.param(
            '%llguidance {}\nstart: s\ns: "a" s "b" | "c" | s "c"',
            'start: s\ns: "a" s "b" | "c" | s "c"',
            id="recursive-ambiguous",
        ),
        pytest.param(
            'start: my-a{2} B{,2}\nmy-a: "a" | "ab"\nB: "b"',
            'start: my_a my_a B? B?\nmy_a: "a" | "ab"\nB: "b"',
            id="dash-names",
        ),
    ],
)
def test_language_matches_lark_earley(ours: str, lark_text: str) -> None:
    g = compile_lark(ours, deepseek_vocab())
    oracle = lark.Lark(lark_text, parser="earley", lexer="dynamic")

    def in_lark(s: str) -> bool:
        try:
            oracle.parse(s)
        except lark.exceptions.LarkError:
            return False
        return True

    wrong = [s for s in _strings("abc", 6) if _accepts_bytes(g, s) != in_lark(s)]
    assert wrong == []


def test_intersection_and_negation_match_re():
    g = compile_lark('start: T\nT: /[ab\\n]*/ & ~/(?s:.*)\\n\\n(?s:.*)/ & ~"ab"', deepseek_vocab())
    for s in _strings("ab\n", 6):
        expected = "\n\n" not in s and s != "ab"
        assert _accepts_bytes(g, s) == expected, repr(s)


@pytest.mark.parametrize(
    ("attribute", "body", "suffix"),
    [
        pytest.param("lazy", "/[ab]*b/", "", id="lazy"),
        pytest.param('suffix="ba"', "/[ab]*/", "ba", id="suffix"),
    ],
)
def test_lazy_lexemes_are_the_shortest_matches(attribute: str, body: str, suffix: str) -> None:
    g = compile_lark(f"start: x\nx[{attribute}]: {body}", deepseek_vocab())
    full = re.compile(body.strip("/") + re.escape(suffix))
    for s in _strings("ab", 6):
        shortest = full.fullmatch(s) and not any(full.fullmatch(s[:i]) for i in range(len(s)))
        assert _accepts_bytes(g, s) == bool(shortest), s


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"type": "array", "items": {"type": "integer"}, "maxItems": 2}, id="array"),
        pytest.param(
            {
                "type": "object",
                "properties": {"k": {"type": "boolean"}},
                "required": ["k"],
                "additionalProperties": False,
            },
            id="object",
        ),
    ],
)
def test_inline_json_against_jsonschema(schema: dict) -> None:
    g = compile_lark(f'start: "=" %json {json.dumps(schema)}', deepseek_vocab())
    texts = ["[]", "[1]", "[1, 2]", "[1,2,3]", "[ 1 ]", '{"k":true}', '{ "k" : false }',
             '{"k":1}', "{}", '{"k":true,"x":1}', "[1.5]"]  # fmt: skip
    for t in texts:
        assert _accepts_bytes(g, "=" + t) == jsonschema.Draft202012Validator(schema).is_valid(
            json.loads(t)
        ), t


def test_substring_words_split_like_llguidance():
    assert chunk_words("foo bar. baz") == ["foo", " ", "bar", ".", " ", "baz"]
    assert chunk_words("a  b__c!?") == ["a", "  ", "b__c", "!?"]


def test_common_imports():
    g = compile_lark(
        '%llguidance {}\nstart: SIGNED_NUMBER " " ESCAPED_STRING " " CNAME\n'
        "%import common (SIGNED_NUMBER, ESCAPED_STRING)\n%import common.CNAME",
        deepseek_vocab(),
    )
    assert _accepts_bytes(g, '-1.5e3 "a\\"b" _x1')
    assert not _accepts_bytes(g, '1 "a" 1x')


@pytest.mark.parametrize(
    ("text", "named"),
    [
        pytest.param("%llguidance {}\nstart: (", "line 2", id="syntax-error"),
        pytest.param("%llguidance {}\nstart: missing", "missing", id="undefined-rule"),
        pytest.param("%llguidance {}\nstart: MISSING", "MISSING", id="undefined-terminal"),
        pytest.param("start: x\nx[colour=1]: /a/", "colour", id="unknown-attribute"),
        pytest.param('%llguidance {"no_forcing": true}\nstart: "a"', "no_forcing", id="option"),
        pytest.param('%llguidance {"bogus": 1}\nstart: "a"', "bogus", id="unknown-option"),
        pytest.param('start: %regex {"substring_words": 1}', "substring_words", id="bad-regex"),
        pytest.param('start: %regex {"type": "number"}', "%regex", id="planned-regex"),
        pytest.param('start: A\nA: "a" A{1,2}', "A", id="recursive-terminal"),
        pytest.param('start: A\nA: /a/ & x\nx: "a"', "'x'", id="rule-inside-and"),
        pytest.param("start: A\nA: <|im_end|>", "special token", id="special-in-terminal"),
        pytest.param('start: x\nx[lazy]: "a" y\ny: "b"', "'y'", id="lazy-over-a-rule"),
        pytest.param("start: A\nA: /a/x\n%llguidance {}", "flag", id="regex-flag"),
        pytest.param('start: "a"{3,2}', "below the minimum", id="reversed-range"),
        pytest.param("%declare X\nstart: X{1}", "%declare", id="declare"),
    ],
)
def test_errors_name_the_construct(text: str, named: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(named)):
        compile_lark(text, deepseek_vocab())
