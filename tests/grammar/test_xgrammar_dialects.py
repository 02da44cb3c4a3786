"""XGrammar's dialects feature by feature (benchmarks/grammar/dialect_cases.py, written from its
documentation): every case compiles and accepts / refuses its texts token by token with the
DeepSeek tokenizer, or is refused by name when we do not support the feature."""

from __future__ import annotations

import pytest

from benchmarks.grammar.dialect_cases import CASES, DialectCase
from grammar import GrammarError, compile_ebnf, compile_structural_tag
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab


def _compile(case: DialectCase):
    if case.kind == "ebnf":
        return compile_ebnf(case.source, deepseek_vocab())
    return compile_structural_tag(case.source, deepseek_vocab())


def _accepts(g, text: str) -> bool:
    m = g.matcher()
    for t in deepseek_tokenizer().encode(text, add_special_tokens=False):
        if not m.is_allowed(t):
            return False
        m.advance(t)
    return m.is_accepting()


SUPPORTED = [pytest.param(c, id=c.feature) for c in CASES if not c.unsupported]
REFUSED = [pytest.param(c, id=c.feature) for c in CASES if c.unsupported]


@pytest.mark.parametrize("case", SUPPORTED)
def test_feature_accepts_and_refuses_as_documented(case: DialectCase) -> None:
    g = _compile(case)
    assert [t for t in case.accept if not _accepts(g, t)] == []
    assert [t for t in case.refuse if _accepts(g, t)] == []


@pytest.mark.parametrize("case", REFUSED)
def test_unsupported_feature_is_refused_by_name(case: DialectCase) -> None:
    with pytest.raises(GrammarError) as err:
        _compile(case)
    assert case.unsupported in str(err.value)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            {"type": "repeat", "min": 3, "max": 2, "content": {"type": "any_text"}},
            ["format", "max"],
        ),
        ({"type": "dispatch", "rules": []}, ["format.rules"]),
        ({"type": "dispatch", "rules": [["<a>"]]}, ["format.rules[0]"]),
        (
            {"type": "json_schema", "json_schema": {"type": "array"}, "style": "qwen_xml"},
            ["format.json_schema", "qwen_xml", "array"],
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "type": "object",
                    "properties": {"a": {"type": ["string", "integer"]}},
                },
                "style": "glm_xml",
            },
            ["/properties/a", "glm_xml"],
        ),
        ({"type": "any_text", "max_chars": -1}, ["format.max_chars"]),
        ({"type": "json_schema", "json_schema": {}, "any_order": True}, ["format.any_order"]),
    ],
)
def test_bad_new_format_fields_are_refused_naming_the_path(spec: dict, words: list[str]) -> None:
    with pytest.raises(GrammarError) as err:
        compile_structural_tag({"type": "structural_tag", "format": spec}, deepseek_vocab())
    assert all(w in str(err.value) for w in words), str(err.value)


def test_xml_arguments_jump_forward_over_the_forced_key_text() -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    content = {"type": "json_schema", "json_schema": schema, "style": "qwen_xml"}
    spec = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<tool_call>",
            "content": content,
            "end": "</tool_call>",
        },
    }
    m = compile_structural_tag(spec, deepseek_vocab()).matcher()
    assert m.forced_text() == "<tool_call>"
    m.advance_bytes(b"<tool_call><")
    assert m.forced_text() == "parameter=city>"
    m.advance_bytes(b"parameter=city>Paris</")
    assert m.forced_text() == ""  # raw text may hold "</" as long as it is not the closing tag
    m.advance_bytes(b"parameter>\n<")
    assert m.forced_text() == "parameter=days>"
    m.advance_bytes(b"parameter=days>3</parameter></tool_call>")
    assert m.is_accepting()
