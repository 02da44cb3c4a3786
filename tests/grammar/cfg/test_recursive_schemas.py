"""Recursive JSON Schemas through the CFG path, with jsonschema as the oracle."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.json_schema.lark import compile_json_schema_cfg, json_schema_to_lark
from tests.support.lark_sentences import accepts_tokens, corruptions
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab

TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer", "minimum": 0},
                "label": {"type": "string", "maxLength": 8},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}

LINKED_LIST = {
    "$defs": {
        "cell": {
            "type": "object",
            "properties": {
                "head": {"type": "string"},
                "tail": {"anyOf": [{"$ref": "#/$defs/cell"}, {"type": "null"}]},
            },
            "required": ["head", "tail"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/cell",
}

EXPR = {
    "$defs": {
        "expr": {
            "oneOf": [
                {"type": "number"},
                {
                    "type": "object",
                    "properties": {
                        "op": {"enum": ["+", "-", "*", "/"]},
                        "args": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/expr"},
                            "minItems": 2,
                            "maxItems": 3,
                        },
                    },
                    "required": ["op", "args"],
                    "additionalProperties": False,
                },
            ]
        }
    },
    "$ref": "#/$defs/expr",
}


def random_tree(rng: random.Random, depth: int) -> dict:
    node: dict = {"value": rng.randrange(0, 1000)}
    if rng.random() < 0.5:
        node["label"] = "".join(rng.choice("abc xyz") for _ in range(rng.randrange(0, 9)))
    if depth > 0:
        node["children"] = [random_tree(rng, depth - 1) for _ in range(rng.randrange(0, 3))]
    return node


def random_list(rng: random.Random, length: int) -> dict:
    cell: dict | None = None
    for _ in range(length):
        cell = {"head": rng.choice(["a", "bc", "", "é"]), "tail": cell}
    return cell or {"head": "", "tail": None}


def random_expr(rng: random.Random, depth: int) -> object:
    if depth == 0 or rng.random() < 0.3:
        return rng.choice([1, 2.5, -3, 0])
    n = rng.randrange(2, 4)
    return {"op": rng.choice("+-*/"), "args": [random_expr(rng, depth - 1) for _ in range(n)]}


CASES = [
    pytest.param(TREE, lambda rng: random_tree(rng, 6), id="tree"),
    pytest.param(LINKED_LIST, lambda rng: random_list(rng, rng.randrange(1, 40)), id="list"),
    pytest.param(EXPR, lambda rng: random_expr(rng, 6), id="expr"),
]


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _in_language(schema: dict, text: str) -> bool:
    """Valid against the schema and spelled compactly (what the grammar generates)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return _compact(value) == text and jsonschema.Draft202012Validator(schema).is_valid(value)


@pytest.mark.parametrize(("schema", "make"), CASES)
def test_deep_valid_instances_accepted(schema: dict, make) -> None:
    g = compile_json_schema_cfg(schema, deepseek_vocab())
    tok = deepseek_tokenizer()
    rng = random.Random(0)
    for _ in range(6):
        text = _compact(make(rng))
        assert _in_language(schema, text)
        assert accepts_tokens(g, tok.encode(text, add_special_tokens=False)), text


def test_very_deep_recursion_has_no_depth_limit() -> None:
    g = compile_json_schema_cfg(LINKED_LIST, deepseek_vocab())
    text = _compact(random_list(random.Random(1), 300))
    m = g.matcher()
    m.advance_bytes(text.encode())
    assert m.is_accepting()


@pytest.mark.parametrize(("schema", "make"), CASES)
def test_corruptions_agree_with_jsonschema(schema: dict, make) -> None:
    g = compile_json_schema_cfg(schema, deepseek_vocab())
    tok = deepseek_tokenizer()
    rng = random.Random(2)
    refused = 0
    for i in range(4):
        text = _compact(make(rng))
        for bad in corruptions(text, 8, seed=i, alphabet='{}[],:"0-1.ab '):
            expected = _in_language(schema, bad)
            got = accepts_tokens(g, tok.encode(bad, add_special_tokens=False))
            assert got == expected, bad
            refused += not expected
    assert refused > 0


@pytest.mark.parametrize(
    ("schema", "text"),
    [
        pytest.param(TREE, '{"value":-1}', id="tree-negative"),
        pytest.param(TREE, '{"value":1,"extra":2}', id="tree-extra-key"),
        pytest.param(TREE, '{"children":[]}', id="tree-missing-required"),
        pytest.param(TREE, '{"value":1,"label":"123456789"}', id="tree-label-too-long"),
        pytest.param(TREE, '{"value":1,"children":[{"value":"x"}]}', id="tree-deep-bad-type"),
        pytest.param(LINKED_LIST, '{"head":"a","tail":{"head":"b"}}', id="list-missing-tail"),
        pytest.param(EXPR, '{"op":"+","args":[1]}', id="expr-too-few-args"),
        pytest.param(EXPR, '{"op":"%","args":[1,2]}', id="expr-bad-op"),
        pytest.param(EXPR, '{"op":"+","args":[1,2,3,4]}', id="expr-too-many-args"),
    ],
)
def test_invalid_instances_refused(schema: dict, text: str) -> None:
    assert not _in_language(schema, text)
    g = compile_json_schema_cfg(schema, deepseek_vocab())
    assert not accepts_tokens(g, deepseek_tokenizer().encode(text, add_special_tokens=False))


def test_additional_properties_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "additionalProperties": {"type": "integer"},
    }
    g = compile_json_schema_cfg(schema, deepseek_vocab())
    for text, ok in [('{"a":"x","b":1}', True), ('{"b":1}', True), ('{"a":"x","a":1}', False),
                     ('{"ab":2}', True), ('{"b":"x"}', False)]:  # fmt: skip
        assert _in_language(schema, text) == ok
        m = g.matcher()
        try:
            m.advance_bytes(text.encode())
            got = m.is_accepting()
        except GrammarError:
            got = False
        assert got == ok, text


def test_whitespace_option_accepts_pretty_json() -> None:
    g = compile_json_schema_cfg(TREE, deepseek_vocab(), whitespace=True)
    m = g.matcher()
    m.advance_bytes(json.dumps(random_tree(random.Random(3), 3), indent=2).encode())
    assert m.is_accepting()


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        pytest.param({"not": {"type": "string"}}, "not", id="not"),
        pytest.param({"type": "array", "uniqueItems": True}, "uniqueItems", id="uniqueItems"),
        pytest.param(
            {"type": "object", "patternProperties": {"a": {}}}, "patternProperties", id="pattern"
        ),
        pytest.param({"$ref": "http://x/y.json"}, "$ref", id="remote-ref"),
        pytest.param(
            {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]},
            "oneOf",
            id="overlapping-oneOf",
        ),
    ],
)
def test_unsupported_keywords(schema: dict, keyword: str) -> None:
    with pytest.raises(UnsupportedSchemaError) as e:
        json_schema_to_lark(schema)
    assert e.value.keyword == keyword


def test_forced_text_for_jump_forward() -> None:
    """Keys the schema requires are forced (jump-forward appends them in one step)."""
    m = compile_json_schema_cfg(LINKED_LIST, deepseek_vocab()).matcher()
    assert m.forced_text() == '{"head":"'
    m.advance_bytes(b'{"head":"x"')
    assert m.forced_text() == ',"tail":'
    m.advance_bytes(b',"tail":nu')
    assert m.forced_text() == "ll}"


def test_additional_keys_cannot_spell_a_property_name_with_escapes() -> None:
    """`{"\\u0061":"x"}` decodes to {"a": "x"}: the extra-key language must not hold it."""
    import lark

    from grammar.json_schema.lark import json_schema_to_lark

    parser = lark.Lark(
        json_schema_to_lark({"type": "object", "properties": {"a": {"type": "integer"}}}),
        parser="lalr",
    )
    parser.parse('{"a":1}')
    parser.parse('{"b":"x"}')
    with pytest.raises(lark.exceptions.LarkError):
        parser.parse('{"\\u0061":"x"}')


def _alive(g, text: str) -> bool:
    """Whether the CFG constraint can still complete `text` (the mask's view)."""
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return not m.is_dead()


def test_strict_mode_bounds_numbers_and_closes_objects_on_the_lark_path() -> None:
    from grammar.json_schema.number_text import FLOAT64_FRACTION_DIGITS, FLOAT64_INT_DIGITS

    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "number"},
                    "n": {"type": "integer"},
                    "any": {},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    }
    strict = compile_json_schema_cfg(schema, deepseek_vocab(), json_schema_mode="strict")
    exact = compile_json_schema_cfg(schema, deepseek_vocab())
    fraction = '{"v":1.' + "0" * FLOAT64_FRACTION_DIGITS
    integer = '{"v":1,"kids":[{"v":' + "1" * FLOAT64_INT_DIGITS
    looping_any = '{"v":1,"any":[2.' + "0" * FLOAT64_FRACTION_DIGITS
    for text in (fraction, integer, looping_any):
        assert _alive(strict, text) and _alive(exact, text)
        assert not _alive(strict, text + "0")  # one digit past a float64's: cut
        assert _alive(exact, text + "0" * 200)  # exact mode: the schema's own language
    # integers within I-JSON's range; objects closed to their declared properties
    assert _alive(strict, '{"v":1,"n":9007199254740991')
    assert not _alive(strict, '{"v":1,"n":9007199254740992')
    assert not _alive(strict, '{"v":1,"extra"') and _alive(exact, '{"v":1,"extra"')
