"""A structural tag's `json_schema` content with a recursive schema goes through the
context-free path (`grammar.ebnf.lark_lower.json_schema_rules`): exact at any depth, in the
`json` style and as an XML style's JSON value, with the white space of `max_whitespace_cnt`
where the regex path puts it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import compile_structural_tag
from grammar.ebnf.lark_lower import json_schema_rules
from grammar.json_schema.lark import json_schema_to_lark

NODE = {
    "type": "object",
    "properties": {
        "v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
    },
    "required": ["v", "kids"],
}


def _node(depth: int) -> dict:
    node: dict = {"v": depth, "kids": []}
    for d in range(depth - 1, 0, -1):
        node = {"v": d, "kids": [{"v": 0, "kids": []}, node]}
    return node


@pytest.fixture(scope="module")
def walk():
    from grammar.tokens.vocab import TokenVocabulary
    from tests.support.tiny_models import smollm_tokenizer
    from tests.support.walks import accepts_text

    tok = smollm_tokenizer()
    vocab = TokenVocabulary.from_tokenizer(tok)

    def run(spec: dict, text: str) -> bool:
        return accepts_text(compile_structural_tag(spec, vocab), tok, text)

    return run


def _tag(content: dict) -> dict:
    fmt = {"type": "tag", "begin": "<a>", "content": content, "end": "</a>"}
    return {"type": "structural_tag", "format": fmt}


@pytest.mark.parametrize("cap", [None, 1])
def test_a_recursive_json_content_is_exact_at_depth_eight(walk, cap):
    content = {"type": "json_schema", "json_schema": NODE}
    if cap is not None:
        content["max_whitespace_cnt"] = cap
    deep = _node(8)
    jsonschema.validate(deep, NODE)
    compact = json.dumps(deep, separators=(",", ":"))
    assert walk(_tag(content), f"<a>{compact}</a>")
    spaced = json.dumps(deep)  # ", " and ": "
    assert walk(_tag(content), f"<a>{spaced}</a>") == (cap == 1)
    assert not walk(_tag(content), "<a>" + compact.replace('"kids":[]', '"kids":[{}]', 1) + "</a>")
    three = {"v": 1, "kids": [{"v": 2, "kids": []}] * 3}  # maxItems 2
    assert not walk(_tag(content), f"<a>{json.dumps(three, separators=(',', ':'))}</a>")


def test_a_recursive_value_in_an_xml_style(walk):
    schema = {"type": "object", "properties": {"tree": NODE}, "required": ["tree"]}
    content = {"type": "json_schema", "json_schema": schema, "style": "qwen_xml"}
    value = json.dumps(_node(6), separators=(",", ":"))
    assert walk(_tag(content), f"<a><parameter=tree>{value}</parameter></a>")
    assert not walk(_tag(content), '<a><parameter=tree>{"v":1}</parameter></a>')


def test_rules_only_for_recursive_schemas_and_white_space_where_the_regex_puts_it():
    flat = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json_schema_rules(flat, "p::") is None
    rules, start = json_schema_rules(NODE, "p::", whitespace="[ ]?")
    assert start == "p::start" and all(name.startswith("p::") for name in rules.rules)
    text = json_schema_to_lark(NODE, whitespace="[ ]?")
    assert "%ignore" not in text and r"/(?:[ ]?),(?:[ ]?)/" in text
