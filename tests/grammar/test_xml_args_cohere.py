"""The `cohere_xml` argument style: nested `<cofl:value name=".." type="raw|dict|list|json">`
tags, checked against jsonschema on the arguments a small reader of the format (below, written
from the format's description) gets back from each text. The reader takes a `json` tag only
for values that have no tag of their own (numbers, booleans, null), as the format says."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from grammar import compile_structural_tag
from grammar.errors import GrammarError
from grammar.tokens.vocab import TokenVocabulary
from tests.support.walks import accepts_bytes

BYTES = TokenVocabulary([bytes([i]) for i in range(256)] + [None], [256])
OPEN = re.compile(r'\s*<cofl:value(?: name="([^"]*)")? type="(raw|dict|list|json)">')
CLOSE = "</cofl:value>"


def _compile(schema: dict, mode: str = "strict"):
    fmt = {"type": "json_schema", "json_schema": schema, "style": "cohere_xml"}
    spec = {"type": "structural_tag", "format": fmt}
    return compile_structural_tag(spec, BYTES, json_schema_mode=mode, whitespace="[ \n\t]*")


_accepts = accepts_bytes


def _tags(text: str, i: int, named: bool) -> tuple[list, int]:
    """The tags from `i` up to a closing tag or the end: [(name, value)], and where they end."""
    out = []
    while (m := OPEN.match(text, i)) is not None:
        if (m.group(1) is not None) != named:
            raise ValueError("a name where none belongs, or none where one does")
        kind, i = m.group(2), m.end()
        if kind == "raw":
            end = text.index(CLOSE, i)
            value, i = text[i:end], end
        elif kind == "json":
            end = text.index(CLOSE, i)
            value, i = json.loads(text[i:end]), end
            if isinstance(value, str | list | dict):
                raise ValueError("strings, objects and arrays have their own tag types")
        else:
            inner, i = _tags(text, i, kind == "dict")
            i = text.index(CLOSE, i) if text[i:].strip().startswith(CLOSE) else -1
            if i < 0:
                raise ValueError("unclosed")
            value = _as_dict(inner) if kind == "dict" else [v for _, v in inner]
        if not text.startswith(CLOSE, i):
            raise ValueError("unclosed")
        out.append((m.group(1), value))
        i += len(CLOSE)
    return out, i


def _as_dict(pairs: list) -> dict:
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("a repeated name")
    return dict(pairs)


def _valid(schema: dict, text: str) -> bool:
    try:
        pairs, end = _tags(text, 0, True)
        if text[end:].strip():
            return False
        args = _as_dict(pairs)
    except (ValueError, json.JSONDecodeError):
        return False
    return jsonschema.Draft202012Validator(schema).is_valid(args)


def _p(name: str | None, kind: str, body: str) -> str:
    head = "<cofl:value" + (f' name="{name}"' if name is not None else "")
    return f'{head} type="{kind}">{body}</cofl:value>'


NESTED = {
    "type": "object",
    "properties": {
        "config": {
            "type": "object",
            "properties": {"mode": {"type": "string"}, "on": {"type": "boolean"}},
            "required": ["mode"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
        "pick": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[a-z]+$"}]},
        "level": {"enum": ["low", 3]},
    },
    "required": ["config"],
    "additionalProperties": False,
}
TEXTS = [
    _p("config", "dict", _p("mode", "raw", "fast")),
    _p("config", "dict", _p("mode", "raw", "fast") + "\n" + _p("on", "json", "true")),
    _p("config", "dict", _p("on", "json", "true")),
    _p("config", "json", '{"mode": "fast"}'),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("tags", "list", _p(None, "raw", "x")),
    _p("config", "dict", _p("mode", "raw", "a"))
    + _p("tags", "list", _p(None, "raw", "x") + _p(None, "raw", "y") + _p(None, "raw", "z")),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("tags", "list", ""),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("tags", "list", _p("n", "raw", "x")),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("pick", "json", "12"),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("pick", "raw", "abc"),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("pick", "raw", "12"),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("level", "raw", "low"),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("level", "json", "3"),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("level", "raw", "3"),
    _p("config", "dict", _p("mode", "raw", "a")) + _p("extra", "raw", "x"),
]


@pytest.mark.parametrize("i", range(len(TEXTS)))
def test_nested_tags_accept_exactly_what_jsonschema_accepts(i):
    assert _accepts(_compile(NESTED), TEXTS[i]) == _valid(NESTED, TEXTS[i]), TEXTS[i]


def test_extras_in_a_nested_dict():
    schema = {
        "type": "object",
        "properties": {"foo": {"type": "integer"}},
        "required": ["foo"],
        "additionalProperties": {"type": "object", "properties": {"id": {"type": "integer"}},
                                 "required": ["id"]},
    }  # fmt: skip
    g = _compile(schema)
    for text in (
        _p("foo", "json", "1") + _p("bar", "dict", _p("id", "json", "2")),
        _p("foo", "json", "1") + _p("bar", "dict", ""),
        _p("foo", "json", "1") + _p("foo", "json", "2"),
        _p("foo", "json", "1") + _p("bar", "json", '{"id": 2}'),
    ):
        assert _accepts(g, text) == _valid(schema, text), text


def test_a_recursive_ref_is_refused_by_name():
    node = {"type": "object", "properties": {"kid": {"$ref": "#/$defs/N"}}}
    schema = {"type": "object", "$defs": {"N": node}, "properties": {"n": {"$ref": "#/$defs/N"}}}
    with pytest.raises(GrammarError, match="recursive"):
        _compile(schema)
