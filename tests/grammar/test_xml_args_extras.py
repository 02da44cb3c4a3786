"""The XML argument styles' parameters beyond the declared properties: additionalProperties,
patternProperties, propertyNames and min/maxProperties, checked against jsonschema on the
arguments read back (`runtime.server.tools.call_format.xml_value` decodes each value)."""

from __future__ import annotations

import re

import jsonschema
import pytest

from grammar import compile_structural_tag
from grammar.errors import GrammarError
from grammar.tokens.vocab import TokenVocabulary
from runtime.server.tools.call_format import xml_value
from tests.support.walks import accepts_bytes

BYTES = TokenVocabulary([bytes([i]) for i in range(256)] + [None], [256])
WRAP = {
    "qwen_xml": ("<parameter={k}>{v}</parameter>", r"<parameter=([^>]*)>(.*?)</parameter>"),
    "minimax_xml": (
        '<parameter name="{k}">{v}</parameter>',
        r'<parameter name="([^"]*)">(.*?)</parameter>',
    ),
    "glm_xml": (
        "<arg_key>{k}</arg_key><arg_value>{v}</arg_value>",
        r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>",
    ),
}


def _compile(schema: dict, style: str, mode: str = "strict"):
    fmt = {"type": "json_schema", "json_schema": schema, "style": style}
    spec = {"type": "structural_tag", "format": fmt}
    return compile_structural_tag(spec, BYTES, json_schema_mode=mode, whitespace="[ \n\t]*")


_accepts = accepts_bytes


def _read_back(style: str, text: str, schema: dict) -> dict | None:
    """The arguments a text holds, or None when some parameter repeats a name."""
    out: dict = {}
    for key, raw in re.findall(WRAP[style][1], text, re.S):
        if key in out:
            return None
        props = schema.get("properties", {})
        sub = props.get(key)
        if sub is None:
            hits = [s for p, s in schema.get("patternProperties", {}).items() if re.search(p, key)]
            if not hits and not re.fullmatch("[a-zA-Z_][a-zA-Z0-9_]*", key):
                return None  # additional names are XML names (XGrammar's), a narrowing
            sub = hits[0] if hits else schema.get("additionalProperties", {})
        out[key] = xml_value(raw, sub if isinstance(sub, dict) else {})
    return out


def _valid(schema: dict, args: dict | None) -> bool:
    return args is not None and jsonschema.Draft202012Validator(schema).is_valid(args)


def _text(style: str, pairs: list[tuple[str, str]]) -> str:
    return "".join(WRAP[style][0].format(k=k, v=v) for k, v in pairs)


PERSON = {"name": {"type": "string"}, "age": {"type": "integer"}}
CASES = [
    ({"type": "object", "properties": PERSON, "required": ["name"], "additionalProperties": True},
     [[("name", "Bo")], [("name", "Bo"), ("age", "3"), ("city", "Rome")],
      [("name", "Bo"), ("city", "Rome"), ("zip", "[1]")], [("name", "Bo"), ("age", "x")],
      [("name", "Bo"), ("name", "Al")], [("city", "Rome")], [("name", "Bo"), ("1x", "a")]]),
    ({"type": "object", "properties": PERSON, "additionalProperties": {"type": "integer"}},
     [[("extra", "4")], [("extra", "four")], [("age", "1"), ("n2", " 7 ")], [("age", "1"),
                                                                              ("age", "2")]]),
    ({"type": "object", "patternProperties": {"^x_[a-z]+$": {"type": "integer"}},
      "additionalProperties": False},
     [[("x_key", "3")], [("x_key", "three")], [("bad", "3")], [("x_a", "1"), ("x_b", "2")]]),
    ({"type": "object", "patternProperties": {"^x_": {"type": "integer"}},
      "additionalProperties": {"type": "string", "maxLength": 2}, "properties": PERSON},
     [[("x_long_name", "3")], [("x_long_name", "abc")], [("other", "ab")],
      [("other", "abc")], [("name", "n"), ("x_q", "1"), ("zz", "")]]),
    ({"type": "object", "propertyNames": {"pattern": "^[a-z_]+$"}},
     [[("x_key", "v")], [("Bad", "v")], [("a", "1"), ("b", "{}")]]),
    ({"type": "object", "propertyNames": {"maxLength": 3}, "properties": PERSON,
      "additionalProperties": True},
     [[("age", "1")], [("name", "n")], [("abc", "1")], [("abcd", "1")]]),
    ({"type": "object", "properties": {**PERSON, "ID": {"type": "integer"},
                                       "ok": {"type": "boolean"}},
      "minProperties": 2, "maxProperties": 3},
     [[("age", "25")], [("age", "25"), ("ok", "true")], [("name", "a"), ("age", "1"), ("ID", "2")],
      [("name", "a"), ("age", "1"), ("ID", "2"), ("ok", "false")]]),
    ({"type": "object", "properties": PERSON, "required": ["name"],
      "additionalProperties": {"type": "boolean"}, "maxProperties": 2},
     [[("name", "a"), ("t", "true")], [("name", "a"), ("age", "1"), ("t", "true")],
      [("name", "a"), ("t", "true"), ("u", "false")]]),
]  # fmt: skip


@pytest.mark.parametrize("style", sorted(WRAP))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_extras_accept_exactly_what_jsonschema_accepts(style, case):
    schema, texts = CASES[case]
    grammar = _compile(schema, style)
    for pairs in texts:
        text = _text(style, pairs)
        expected = _valid(schema, _read_back(style, text, schema))
        assert _accepts(grammar, text) == expected, (schema, text)


def test_exact_mode_opens_an_object_without_additional_properties():
    schema = {"type": "object", "properties": PERSON, "required": ["name"]}
    text = _text("qwen_xml", [("name", "a"), ("city", "b")])
    assert _accepts(_compile(schema, "qwen_xml", "exact"), text)
    assert not _accepts(_compile(schema, "qwen_xml", "strict"), text)


def test_deepseek_and_kimi_extras_carry_their_attributes():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    ds = _compile(schema, "deepseek_xml")
    assert _accepts(ds, '<｜DSML｜parameter name="n" string="false">3</｜DSML｜parameter>')
    assert not _accepts(ds, '<｜DSML｜parameter name="n" string="false">x</｜DSML｜parameter>')
    kimi = _compile(schema, "kimi_k3_xml")
    assert _accepts(kimi, '<|open|>argument key="n" type="number"<|sep|>3<|close|>argument<|sep|>')
    assert not _accepts(
        kimi, '<|open|>argument key="n" type="string"<|sep|>3<|close|>argument<|sep|>'
    )


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "object", "properties": {"x_a": {"type": "string"}},
          "patternProperties": {"^x_": {"type": "integer"}}}, "patternProperties"),
        ({"type": "object", "patternProperties": {"^a": {"type": "integer"},
                                                  "b$": {"type": "string"}}}, "patternProperties"),
        ({"type": "object", "propertyNames": {"enum": ["a"]}}, "propertyNames"),
    ],
)  # fmt: skip
def test_what_does_not_map_is_refused_by_name(schema, keyword):
    with pytest.raises(GrammarError, match=keyword):
        _compile(schema, "qwen_xml")
