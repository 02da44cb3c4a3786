"""A lark grammar's `%json` writes integers plain (`1`, never `1.0`), as llguidance and XGrammar
generate them, on the regular and the recursive (`$ref` cycle) path; `compile_json_schema`'s
exact mode keeps the draft's `1.0`. Oracle: jsonschema on the parsed text, plus "no integer
was written with a fraction" (json.loads with parse_float kept apart)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import compile_json_schema, compile_lark
from grammar.errors import GrammarError
from tests.support.tokenizers import deepseek_vocab

FLAT = {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}
RECURSIVE = {
    "$defs": {
        "n": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/$defs/n"}}]}
    },
    "$ref": "#/$defs/n",
}
TEXTS = ["[1]", "[1.0]", '[-3,"a"]', "[2.50]", "[[3.0]]", "[[3],4]", "7", "7.00", "[]"]


class _Fraction(float):
    """A number written with a fraction or an exponent."""


def _walk(compiled, text: str) -> bool:
    m = compiled.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


def _plain_valid(schema: dict, text: str) -> bool:
    try:
        value = json.loads(text, parse_float=_Fraction)
    except json.JSONDecodeError:
        return False
    if not jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)):
        return False
    stack = [value]  # every number of these schemas must be an integer: none with a fraction
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, _Fraction):
            return False
    return True


@pytest.mark.parametrize("schema", [FLAT, RECURSIVE], ids=["flat", "recursive"])
def test_inline_json_writes_plain_integers(schema: dict) -> None:
    compiled = compile_lark("start: %json " + json.dumps(schema), deepseek_vocab())
    for text in TEXTS:
        assert _walk(compiled, text) == _plain_valid(schema, text), text


def test_compile_json_schema_exact_keeps_zero_fractions() -> None:
    compiled = compile_json_schema(FLAT, deepseek_vocab())
    validator = jsonschema.Draft202012Validator(FLAT)
    for text in ["[1.0]", "[1]", "[2.5]"]:
        assert _walk(compiled, text) == validator.is_valid(json.loads(text)), text
