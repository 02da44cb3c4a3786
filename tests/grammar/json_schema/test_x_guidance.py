"""llguidance's `x-guidance` schema options (grammar.json_schema.guidance) honoured or refused
by name, `allOf` with two patterns on one string, and `multipleOf: 1024`, with `re` /
`jsonschema` as oracles."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from grammar import UnsupportedSchemaError, compile_json_schema
from grammar.errors import GrammarError
from tests.support.tokenizers import deepseek_vocab


def _accepts(schema, text: str, **kw) -> bool:
    m = compile_json_schema(schema, deepseek_vocab(), **kw).matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


ARRAY = {"type": "array", "items": {"type": "integer"}}


@pytest.mark.parametrize(
    ("options", "text", "accepted"),
    [
        pytest.param({"whitespace_flexible": True}, "[ 1 ,\n2 ]", True, id="flexible"),
        pytest.param({"whitespace_flexible": False}, "[1, 2]", False, id="compact-refuses"),
        pytest.param({"whitespace_flexible": False}, "[1,2]", True, id="compact"),
        pytest.param({"whitespace_pattern": "[ ]{1,2}"}, "[  1,2]", True, id="pattern"),
        pytest.param({"whitespace_pattern": "[ ]{1,2}"}, "[   1,2]", False, id="pattern-bound"),
        pytest.param({"item_separator": ",", "key_separator": ":"}, "[1,2]", True, id="seps"),
        pytest.param({"lenient": False, "coerce_one_of": False}, "[1]", True, id="defaults"),
    ],
)
def test_x_guidance_options_are_honoured(options: dict, text: str, accepted: bool) -> None:
    assert _accepts({"x-guidance": options, **ARRAY}, text) == accepted


def test_coerce_one_of_reads_one_of_as_any_of():
    one_of = {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}
    assert not _accepts(one_of, "1")  # both branches hold: oneOf refuses
    assert _accepts({"x-guidance": {"coerce_one_of": True}, **one_of}, "1")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        pytest.param({"item_separator": "[,"}, "item_separator", id="item-separator"),
        pytest.param({"key_separator": ""}, "key_separator", id="key-separator"),
        pytest.param({"lenient": True}, "lenient", id="lenient"),
        pytest.param({"json_allowed_escapes": "nrx"}, "json_allowed_escapes", id="escapes"),
        pytest.param({"json_allow_general_unicode_escapes": 1}, "unicode", id="unicode"),
        pytest.param(
            {"json_allowed_escapes": "n", "item_separator": '"'}, "item_separator", id="quote-sep"
        ),
        pytest.param({"whitespace_pattern": "("}, "whitespace_pattern", id="bad-pattern"),
        pytest.param({"colour": 1}, "colour", id="unknown"),
    ],
)
def test_x_guidance_options_refused_by_name(options: dict, named: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match=re.escape(named)) as e:
        compile_json_schema({"x-guidance": options, **ARRAY}, deepseek_vocab())
    assert e.value.keyword == "x-guidance"


def test_two_patterns_in_all_of_intersect():
    schema = {"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "[0-9]$"}]}
    validator = jsonschema.Draft202012Validator(schema)
    for s in ["a1", "ab9", "a", "b1", "1", "a12", "ba1", ""]:
        text = json.dumps(s)
        assert _accepts(schema, text) == validator.is_valid(s), s


@pytest.mark.parametrize("mode", ["exact", "strict"])
def test_multiple_of_1024_compiles_exactly(mode: str):
    # strict mode bounds an integer to I-JSON's +-(2**53 - 1): that range times the multiples
    schema = {"type": "integer", "multipleOf": 1024}
    validator = jsonschema.Draft202012Validator(schema)
    top = 2**53 - 1 if mode == "strict" else None
    for n in [0, 1024, -2048, 1023, 1025, 1048576, 3 * 1024 + 1, 10**12 * 1024, 2**53, 2**60]:
        expected = validator.is_valid(n) and (top is None or abs(n) <= top)
        assert _accepts(schema, str(n), json_schema_mode=mode) == expected, n


def _escapes_allowed(text: str, letters: str, general: bool) -> bool:
    """Every escape in the JSON text is one `letters` allow (`\\uXXXX`: below U+0020 unless
    `general`); outside strings valid JSON has no backslash."""
    for esc in re.findall(r"\\(u[0-9a-fA-F]{4}|.)", text):
        if esc[0] not in letters or (esc[0] == "u" and not general and int(esc[1:], 16) >= 0x20):
            return False
    return True


ESCAPE_TEXTS = [
    '"a"',
    '"\\n"',
    '"\\t"',
    '"\\/"',
    '"\\\\"',
    '"\\""',
    '"\\u001e"',
    '"\\u000A"',
    '"\\u00e9"',
    '"\\u0041"',
    '"\\uD83D\\uDE00"',
    '"é"',
    '["\\n","\\u001f"]',
    '{"\\n":1}',
    '{"\\t":1}',
    '{"k\\u00e9":"\\b"}',
    '{"known":0}',
    '{"\\/":1}',
    "[1]",
]


@pytest.mark.parametrize(
    ("letters", "general"),
    [("nt", True), ("n", False), ('nrbtf\\"u', False), ("/u", True), ("", False)],
)
def test_escape_options_narrow_every_string(letters: str, general: bool) -> None:
    schema = {
        "anyOf": [
            {"type": "string", "maxLength": 2},
            {"type": "array", "items": {"type": "string"}},
            {"type": "object", "properties": {"known": {"type": "integer"}}},
        ],
        "x-guidance": {
            "json_allowed_escapes": letters,
            "json_allow_general_unicode_escapes": general,
        },
    }
    plain = {k: v for k, v in schema.items() if k != "x-guidance"}
    validator = jsonschema.Draft202012Validator(plain)
    for text in ESCAPE_TEXTS:
        expected = validator.is_valid(json.loads(text)) and _escapes_allowed(text, letters, general)
        assert _accepts(schema, text) == expected, text


def test_one_escape_option_takes_llguidance_default_for_the_other():
    # one option given, the other takes llguidance's default: escapes nrbtf\\"u, \\u only for
    # control characters
    schema = {"type": "string", "x-guidance": {"json_allow_general_unicode_escapes": False}}
    assert _accepts(schema, '"\\u001e"') and _accepts(schema, '"\\n"')
    assert not _accepts(schema, '"\\u00e9"') and not _accepts(schema, '"\\/"')
    schema = {"type": "string", "x-guidance": {"json_allowed_escapes": '"\\/bfnrtu'}}
    assert _accepts(schema, '"\\/"') and not _accepts(schema, '"\\u0041"')


def test_escape_options_refused_with_a_recursive_schema():
    from grammar.json_schema.lark import json_schema_to_lark

    schema = {
        "type": "object",
        "properties": {"next": {"$ref": "#"}},
        "x-guidance": {"json_allowed_escapes": "n"},
    }
    with pytest.raises(UnsupportedSchemaError, match="escape options with a recursive schema"):
        json_schema_to_lark(schema)
