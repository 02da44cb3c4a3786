"""x-guidance `item_separator` / `key_separator` (regexes written between items and between a
key and its value) and enum / const objects and arrays spelled with the schema's white space.
The oracle for what each text means is `json.loads` + `jsonschema`; the spelling rules are the
options' own."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import GrammarError, UnsupportedSchemaError, compile_json_schema, compile_lark
from tests.support.tokenizers import deepseek_vocab

PAIR = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
    "additionalProperties": False,
}


def _walk(g, text: str) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


def _schema(options: dict, base: dict = PAIR) -> dict:
    return {**base, "x-guidance": options}


@pytest.mark.parametrize(
    ("options", "text", "accepted"),
    [
        ({"item_separator": "; ", "whitespace_flexible": False}, '{"x":3; "y":4}', True),
        ({"item_separator": "; ", "whitespace_flexible": False}, '{"x":3;"y":4}', False),
        ({"item_separator": "; ", "whitespace_flexible": False}, '{"x":3,"y":4}', False),
        ({"key_separator": " = ", "whitespace_flexible": False}, '{"x" = 3,"y" = 4}', True),
        ({"key_separator": " = ", "whitespace_flexible": False}, '{"x":3,"y":4}', False),
        # separators are regexes: up to two spaces after the comma, none before
        ({"item_separator": ", {0,2}", "whitespace_flexible": False}, '{"x":3,  "y":4}', True),
        ({"item_separator": ", {0,2}", "whitespace_flexible": False}, '{"x":3,   "y":4}', False),
        ({"item_separator": ", {0,2}", "whitespace_flexible": False}, '{"x":3 ,"y":4}', False),
        # flexible white space goes around the separator, the separator itself stays
        ({"item_separator": "; ", "whitespace_flexible": True}, '{ "x" :3 ;  "y":4 }', True),
        ({"item_separator": "; ", "whitespace_flexible": True}, '{"x":3 ;\n"y":4}', False),
    ],
)
def test_separators_are_honoured(options: dict, text: str, accepted: bool) -> None:
    g = compile_json_schema(_schema(options), deepseek_vocab())
    assert _walk(g, text) == accepted


def test_separators_reach_arrays_and_values_of_any_type() -> None:
    schema = {"type": "array", "x-guidance": {"item_separator": " & "}}
    g = compile_json_schema(schema, deepseek_vocab())
    assert _walk(g, '[1 & {"a":[2 & 3]} & "s"]')
    assert not _walk(g, '[1,{"a":[2 & 3]}]')
    assert not _walk(g, '[1 & {"a":[2,3]}]')


def test_separators_in_an_inline_lark_json() -> None:
    grammar = 'start: "<" %json ' + json.dumps(_schema({"item_separator": "; "})) + ' ">"'
    g = compile_lark(grammar, deepseek_vocab())
    assert _walk(g, '<{"x": 1; "y": 2}>')
    assert not _walk(g, '<{"x": 1, "y": 2}>')


def test_custom_separators_with_a_recursive_schema_are_refused_by_name() -> None:
    tree = {
        "$defs": {"t": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
        "$ref": "#/$defs/t",
        "x-guidance": {"item_separator": ";"},
    }
    grammar = "start: %json " + json.dumps(tree)
    with pytest.raises(GrammarError, match="x-guidance"):
        compile_lark(grammar, deepseek_vocab())


@pytest.mark.parametrize("bad", ["(", ""])
def test_a_separator_that_is_no_regex_is_refused(bad: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match="item_separator"):
        compile_json_schema(_schema({"item_separator": bad}), deepseek_vocab())


ENUMS = [
    {"enum": [[1, 2], {"k": "v", "n": [True, None]}, "s"]},
    {"const": {"a": {"b": [1]}, "c": 2}},
    {"type": "object", "enum": [{"p": 1, "q": 2}, {}]},
    {"type": "array", "const": [[], [0]]},
]
SPELLINGS = [
    "[1, 2]",
    "[ 1,2 ]",
    '{ "k" : "v" , "n" : [ true , null ] }',
    '{"n":[true,null],"k":"v"}',
    '{"c": 2, "a": {"b": [ 1 ]}}',
    '{"a":{"b":[1]},"c":2}',
    '{ "q": 2, "p": 1 }',
    "{ }",
    "[ [ ], [0] ]",
    '"s"',
    "[1 2]",
    '{"k" "v"}',
    "[1, 2,]",
]


@pytest.mark.parametrize("schema", ENUMS)
@pytest.mark.parametrize("whitespace", [None, r"[ \n]*"])
def test_enum_and_const_values_take_the_schema_white_space(schema, whitespace) -> None:
    g = compile_json_schema(schema, deepseek_vocab(), whitespace=whitespace)
    validator = jsonschema.Draft202012Validator(schema)
    for text in SPELLINGS:
        try:
            valid = validator.is_valid(json.loads(text))
        except json.JSONDecodeError:
            valid = False
        compact = json.dumps(json.loads(text), separators=(",", ":")) if valid else None
        expected = valid and (whitespace is not None or compact == text)
        assert _walk(g, text) == expected, text
