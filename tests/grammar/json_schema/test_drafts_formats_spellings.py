"""Draft-dependent `$ref` siblings (ignored up to draft 7, kept from 2019-09), the spellings of
enum numbers (by value: `2` and `2.0`; draft 4 has no float spelling of an integer), and the
format / pattern regexes (date-time, ipv6, uri, uri-reference, inner end anchors, escaped
surrogate pairs), each checked against `jsonschema`, `re` or `ipaddress`. The cases come from
JSONSchemaBench instances (Github_medium o14421, o61348, o61349).
"""

from __future__ import annotations

import re

import jsonschema
import pytest

from grammar import json_schema_to_regex
from grammar.json_schema.formats import FORMAT_REGEXES

DRAFT4 = "http://json-schema.org/draft-04/schema#"


def _valid(schema: dict, instance: object) -> bool:
    return jsonschema.validators.validator_for(schema)(schema).is_valid(instance)


@pytest.mark.parametrize(
    "text, ok",
    [
        ("2022-01-01T12:00:00.000Z", True),  # Github_medium---o14421, test 0
        ("2022-01-01T12:00:00Z", True),  # Github_medium---o14421, test 1
        ("2024-02-29t05:29:60.5+05:30", True),  # 23:59:60 UTC
        ("2024-02-29t23:59:60.5+05:30", False),  # a leap second at 18:29:60 UTC
        ("2022-01-01T12:00:00.Z", False),
        ("2022-01-01T24:00:00Z", False),
        ("2023-02-29T12:00:00Z", False),
        ("2022-01-01T12:00:00", False),
        ("2022-01-01 12:00:00Z", False),
    ],
)
def test_date_time_format(text: str, ok: bool) -> None:
    assert (re.fullmatch(FORMAT_REGEXES["date-time"], text) is not None) is ok


# Github_medium---o14421: {"type": "string", "$ref": "#/datos"} under draft-04, where the
# keywords beside a $ref are ignored (draft-04..07); we conjoined them (2019-09 semantics)
REF_SIBLINGS = {
    "properties": {"a": {"type": "string", "$ref": "#/definitions/o"}},
    "definitions": {"o": {"type": "object", "properties": {"n": {"type": "integer"}}}},
}


def test_draft4_ref_ignores_siblings() -> None:
    schema = {"$schema": DRAFT4, **REF_SIBLINGS}
    rx = json_schema_to_regex(schema)
    for text, instance in [('{"a":{"n":1}}', {"a": {"n": 1}}), ('{"a":"x"}', {"a": "x"})]:
        assert (re.fullmatch(rx, text) is not None) is _valid(schema, instance), text


def test_2020_12_ref_keeps_siblings() -> None:
    rx = json_schema_to_regex(REF_SIBLINGS)  # no $schema: the latest draft, siblings apply
    assert not _valid(REF_SIBLINGS, {"a": {"n": 1}}) and not _valid(REF_SIBLINGS, {"a": "x"})
    assert re.fullmatch(rx, '{"a":{"n":1}}') is None
    assert re.fullmatch(rx, '{"a":"x"}') is None
    assert re.fullmatch(rx, "{}") is not None


# Github_medium---o61348 / ---o61349: {"enum": [2.0]} and the instance's `2`: equal numbers in
# JSON Schema, but the enum literal was only json.dumps(2.0) == "2.0"
@pytest.mark.parametrize(
    "schema",
    [
        {"enum": [2.0]},
        {"const": 2.0},
        {"enum": [2]},
        {"type": "object", "properties": {"since": {"enum": [2.0]}}},
        {"const": [1, {"x": 2.0}]},
        {"const": 2, "enum": [2.0, 3]},  # the const / enum intersection compares numbers
        {"enum": [1, 2.0], "not": {"enum": [2]}},  # so does a negated enum
    ],
)
def test_enum_number_spellings(schema: dict) -> None:
    rx = json_schema_to_regex(schema)
    texts = {
        "1": 1,
        "1.0": 1.0,
        "2": 2,
        "2.0": 2.0,
        '{"since":2}': {"since": 2},
        '{"since":2.0}': {"since": 2.0},
        '[1,{"x":2}]': [1, {"x": 2}],
        '[1.0,{"x":2.0}]': [1.0, {"x": 2.0}],
    }
    for text, instance in texts.items():
        assert (re.fullmatch(rx, text) is not None) is _valid(schema, instance), text


# draft 3 / 4 count only int spellings as integers: 2.0 is no instance of {"type": "integer"}
INT_TEXTS = [("2", 2), ("2.0", 2.0), ("[2]", [2]), ("[2.0]", [2.0]), ("[2.00]", [2.0])]


def test_draft4_integer_enum_has_no_float_spelling() -> None:
    schema = {"$schema": DRAFT4, "type": "integer", "enum": [2]}
    rx = json_schema_to_regex(schema)
    for text, instance in INT_TEXTS:
        assert (re.fullmatch(rx, text) is not None) is _valid(schema, instance), text


@pytest.mark.parametrize(
    "schema",
    [
        # 2.0 fails, yet 2 (equal to it) is an instance: the value is dropped whole
        {"$schema": DRAFT4, "type": "integer", "enum": [2.0]},
        # the float check sees only a top-level number: [2.0] slips in
        {"$schema": DRAFT4, "items": {"type": "integer"}, "enum": [[2]]},
    ],
)
def test_draft4_integer_enum_spellings_by_value(schema: dict) -> None:
    rx = json_schema_to_regex(schema)
    for text, instance in INT_TEXTS:
        assert (re.fullmatch(rx, text) is not None) is _valid(schema, instance), text


def test_draft4_ref_ignores_sibling_enum() -> None:
    schema = {
        "$schema": DRAFT4,
        "properties": {"a": {"$ref": "#/definitions/x", "enum": ["q"]}},
        "definitions": {"x": {"type": "string"}},
    }
    rx = json_schema_to_regex(schema)
    for text, instance in [('{"a":"q"}', {"a": "q"}), ('{"a":"z"}', {"a": "z"})]:
        assert (re.fullmatch(rx, text) is not None) is _valid(schema, instance), text


IPV6_CASES = [
    "::", "::1", "1::", "fe80::1", "2001:db8::8a2e:370:7334", "::ffff:192.168.0.1",
    "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "1::2:3:4:5:6:7", "1:2:3:4:5:6:1.2.3.4",
    "::1.2.3.4", "1:2:3:4:5:6:7:8:9", "1:::2", ":1::", "1::2::3", "12345::",
    "1:2:3:4:5:6:7:1.2.3.4", "::01.2.3.4", "1:2:3:4:5::1.2.3.4", "fe80::1%eth0", "",
]  # fmt: skip


def test_ipv6_format_agrees_with_ipaddress() -> None:
    import ipaddress
    import random

    rx = re.compile(FORMAT_REGEXES["ipv6"])

    def valid(text: str) -> bool:
        try:  # jsonschema's check: no zone id
            return not ipaddress.IPv6Address(text).scope_id
        except ValueError:
            return False

    for text in IPV6_CASES:
        assert (rx.fullmatch(text) is not None) is valid(text), text
    rng = random.Random(7)
    for _ in range(3000):
        bits = rng.getrandbits(128) & rng.choice([2**128 - 1, 2**64 - 1, 2**32 - 1, 0xFFFF << 100])
        address = ipaddress.IPv6Address(bits)
        for text in (str(address), address.exploded):
            assert rx.fullmatch(text), text


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("http://a.b/c?d=1#e", True),
        ("mailto:x@y", True),
        ("urn:isbn:0451450523", True),
        ("http://x/%20", True),
        ("http://x/%zz", False),  # a percent sign starts two hex digits
        ("a:b#c#d", False),  # one fragment
        ("http://x/a b", False),
        ("no-scheme", False),
        # the authority after "//": [userinfo "@"] host [":" port], port digits only
        ("http://user:pw@host:8080/p?q#f", True),
        ("file:///etc/hosts", True),
        ("http://host:", True),
        ("http://host:port", False),
        ("http://a@b@c", False),
        ("http://[::1]:80/", True),  # an IP literal host
        ("http://[::1/", False),
    ],
)
def test_uri_format(text: str, ok: bool) -> None:
    assert (re.fullmatch(FORMAT_REGEXES["uri"], text) is not None) is ok


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("//host:80/p", True),
        ("/abs/path", True),
        ("rel/a:b", True),
        ("?q#f", True),
        ("", True),
        ("//host:x", False),
        ("a b", False),
        (":x", False),  # a first segment with ":" would read as a scheme
    ],
)
def test_uri_reference_format(text: str, ok: bool) -> None:
    assert (re.fullmatch(FORMAT_REGEXES["uri-reference"], text) is not None) is ok


@pytest.mark.parametrize(
    "pattern", [r"^(\/?((\.{2})|([a-z0-9\-]*))($|\/))*$", r"a($|b)", r"^(x$|y)z?", r"(a$)*b"]
)
def test_inner_end_anchor_patterns_agree_with_re(pattern: str) -> None:
    """`$` inside a group (Github_hard---o69430): exact, as an automaton."""
    import itertools

    from grammar.automata import regex_ast as ra
    from grammar.automata.fsm import node_to_dfa
    from grammar.automata.pattern import pattern_to_content
    from grammar.json_schema.schema import STRING_CHAR_TEXT

    dfa = node_to_dfa(pattern_to_content(pattern, ra.parsed(STRING_CHAR_TEXT)))
    for n in range(6):
        for chars in itertools.product("ab/.xz", repeat=n):
            text = "".join(chars)
            assert dfa.matches(text.encode()) is (re.search(pattern, text) is not None), text


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "minLength": 2},
        {"type": "string", "maxLength": 1},
        {"type": "string", "minLength": 2, "maxLength": 2},
        {"type": "string", "pattern": "^a", "minLength": 2},
    ],
)
def test_escaped_surrogate_pair_is_one_character(schema: dict) -> None:
    """`\\ud83d\\ude00` decodes to one character; lone surrogate escapes are not generated."""
    import json

    from grammar.automata.fsm import node_to_dfa
    from grammar.json_schema.schema import json_schema_to_node

    dfa = node_to_dfa(json_schema_to_node(schema))
    texts = ['"\\ud83d\\ude00"', '"a\\ud83d\\ude00"', '"ab"', '"a"', '"\\u0041b"']
    for text in texts:
        assert dfa.matches(text.encode()) is _valid(schema, json.loads(text)), text
    assert not dfa.matches(b'"\\ud83d"') and not dfa.matches(b'"a\\ude00"')
