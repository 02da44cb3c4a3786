"""ECMA-262 character escapes in `pattern` / `patternProperties`: `\\p{...}` / `\\P{...}`
General_Category classes against `unicodedata` (on a sample of code points, as classes and
through compiled patterns), refusals naming other properties, `\\s` / `\\S` as ECMA-262 has
them, and classes of several negated items."""

from __future__ import annotations

import functools
import json
import random
import sys
import unicodedata

import pytest

from grammar import UnsupportedSchemaError
from grammar.automata.ecma_regex import category_ranges, ecma_space, property_class
from grammar.automata.fsm import node_to_lazy_dfa
from grammar.json_schema.schema import json_schema_to_node
from tests.support.json_text import compact


@functools.cache
def _dfa(schema_text: str):
    return node_to_lazy_dfa(json_schema_to_node(json.loads(schema_text)))


def _matches(schema: dict, text: str) -> bool:
    return _dfa(json.dumps(schema)).matches(text.encode())


_NAMES = {  # a \p{...} body -> the two-letter categories it stands for
    "L": {"Lu", "Ll", "Lt", "Lm", "Lo"},
    "Letter": {"Lu", "Ll", "Lt", "Lm", "Lo"},
    "LC": {"Lu", "Ll", "Lt"},
    "Cased_Letter": {"Lu", "Ll", "Lt"},
    "Lu": {"Lu"},
    "gc=Lu": {"Lu"},
    "General_Category=Uppercase_Letter": {"Lu"},
    "Ll": {"Ll"},
    "Lo": {"Lo"},
    "M": {"Mn", "Mc", "Me"},
    "Combining_Mark": {"Mn", "Mc", "Me"},
    "Nd": {"Nd"},
    "digit": {"Nd"},
    "N": {"Nd", "Nl", "No"},
    "P": {"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"},
    "S": {"Sm", "Sc", "Sk", "So"},
    "Zs": {"Zs"},
    "Z": {"Zs", "Zl", "Zp"},
    "Cc": {"Cc"},
    "Co": {"Co"},
    "Cn": {"Cn"},
    "Unassigned": {"Cn"},
    "C": {"Cc", "Cf", "Cs", "Co", "Cn"},
    "Other": {"Cc", "Cf", "Cs", "Co", "Cn"},
}
_SAMPLE = sorted(
    set(random.Random(7).sample(range(sys.maxunicode + 1), 3000))
    | set(range(0x80))
    | {0xA0, 0xAA, 0x2028, 0x3000, 0x4E00, 0xD800, 0xE000, 0xFFFF, 0x1F600, 0x10FFFF}
)


@pytest.mark.parametrize("name", list(_NAMES))
@pytest.mark.parametrize("negated", [False, True], ids=["p", "P"])
def test_property_class_matches_unicodedata(name: str, negated: bool) -> None:
    group = property_class(name, negated)
    for cp in _SAMPLE:
        c = chr(cp)
        inside = (c in group.chars) != group.negated
        assert inside == ((unicodedata.category(c) in _NAMES[name]) != negated), (name, hex(cp))


# characters a pattern can match unescaped in JSON text (no surrogates, controls, " or \)
_PLAIN = [
    chr(cp) for cp in _SAMPLE if cp >= 0x20 and chr(cp) not in '"\\' and not 0xD800 <= cp <= 0xDFFF
]


@pytest.mark.parametrize(
    ("pattern", "categories"),
    [
        pytest.param(r"^\p{Letter}$", {"Lu", "Ll", "Lt", "Lm", "Lo"}, id="letter"),
        pytest.param(r"^\p{Lu}$", {"Lu"}, id="upper"),
        pytest.param(r"^[\p{Nd}\p{Zs}]$", {"Nd", "Zs"}, id="class-of-two"),
        pytest.param(r"^[^\p{L}]$", {"M", "N", "P", "S", "Z", "C"}, id="negated-class"),
        pytest.param(r"^\P{L}$", {"M", "N", "P", "S", "Z", "C"}, id="capital-P"),
        pytest.param(r"^[\P{L}\P{N}]$", {"L", "M", "N", "P", "S", "Z", "C"}, id="two-negated"),
        pytest.param(r"^[\D\S]$", {"L", "M", "N", "P", "S", "Z", "C"}, id="two-negated-short"),
        pytest.param(r"^[^\P{L}\p{Lu}]$", {"Ll", "Lt", "Lm", "Lo"}, id="letter-but-upper"),
    ],
)
def test_pattern_with_property_escapes(pattern: str, categories: set[str]) -> None:
    schema = {"type": "string", "pattern": pattern}
    for c in _PLAIN:
        cat = unicodedata.category(c)
        expected = cat in categories or cat[0] in categories
        assert _matches(schema, compact(c)) is expected, (pattern, hex(ord(c)))


def test_property_escape_in_pattern_properties() -> None:
    schema = {
        "type": "object",
        "patternProperties": {r"^\p{Lu}+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert _matches(schema, '{"ΠΣ":1}')
    assert not _matches(schema, '{"Πσ":1}')


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        pytest.param(r"\p{Script=Greek}", "script", id="script"),
        pytest.param(r"\p{sc=Grek}", "script", id="script-short"),
        pytest.param(r"\p{scx=Grek}", "script", id="script-extensions"),
        pytest.param(r"\p{Alphabetic}", "binary", id="binary"),
        pytest.param(r"\p{Letters}", "binary", id="unknown-value"),
        pytest.param(r"\p{gc=Letters}", "unknown general_category value", id="unknown-gc-value"),
        pytest.param(r"\pL", "braced", id="unbraced"),
        pytest.param(r"[\p{L}-z]", "range", id="range-of-a-class"),
        pytest.param(r"^a{,3}$", "{,n}", id="python-only-quantifier"),
    ],
)
def test_other_property_escapes_are_refused(pattern: str, named: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match="pattern") as e:
        json_schema_to_node({"type": "string", "pattern": pattern})
    assert named in str(e.value).lower()


@pytest.mark.parametrize(
    ("pattern", "text", "ok"),
    [
        pytest.param(r"^\s$", "\u00a0", True, id="s-nbsp"),
        pytest.param(r"^\s$", "\u3000", True, id="s-ideographic-space"),
        pytest.param(r"^\s$", "\ufeff", True, id="s-zwnbsp"),
        pytest.param(r"^\s$", "\u2029", True, id="s-paragraph-separator"),
        pytest.param(r"^\s$", "\u200b", False, id="s-not-zero-width-space"),
        pytest.param(r"^\S$", "\u00a0", False, id="S-nbsp"),
        pytest.param(r"^\S$", "\u2003", False, id="S-em-space"),
        pytest.param(r"^\S$", "x", True, id="S-letter"),
        pytest.param(r"^[^\s]$", "\u3000", False, id="not-s-class"),
        pytest.param(r"^[\S\d]$", "\u205f", False, id="S-in-class"),
    ],
)
def test_whitespace_escapes_are_ecma_262s(pattern: str, text: str, ok: bool) -> None:
    assert _matches({"type": "string", "pattern": pattern}, compact(text)) is ok


def test_ecma_space_holds_every_space_separator() -> None:
    zs = {chr(c) for lo, hi in category_ranges("Zs") for c in range(lo, hi + 1)}
    assert ecma_space() == zs | set("\t\n\v\f\r \u00a0\ufeff\u2028\u2029")
