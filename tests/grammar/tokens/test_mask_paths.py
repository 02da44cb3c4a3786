"""The shortcut mask paths of TokenIndex against a token-by-token walk: masks borrowed from the
state most bytes lead to (`_like`: object keys beside property names) and counting chains
(`_chain`: strings with maxLength, bounded character classes), on the deepseek vocabulary."""

from __future__ import annotations

import pytest

from grammar import clear_caches, compile_json_schema
from grammar.tokens.index import TokenIndex
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import assert_masks_on_walks_match

CASES = [
    pytest.param(
        {"type": "string", "maxLength": 40},
        ["a short one", "x" * 40, "日本語 and ascii", 'quote " inside'],
        "_chain",
        id="maxLength-40",
    ),
    pytest.param(
        {"type": "string", "minLength": 3, "maxLength": 200},
        ["abc", "word " * 39, "emoji 🙂 ok"],
        "_chain",
        id="minLength-maxLength-long",
    ),
    pytest.param(
        {"type": "string", "pattern": "^[^x]{0,30}$"},
        ["hello world", "z" * 30, "ünïcode"],
        "_chain",
        id="bounded-class",
    ),
    pytest.param(
        {
            "type": "object",
            "properties": {"alpha": {"type": "integer"}, "beta": {"type": "string"}},
            "additionalProperties": {"type": "boolean"},
        },
        [{"alpha": 1, "beta": "b", "other": True}, {"abc": False}, {"beat": True}],
        "_like",
        id="free-keys-beside-names",
    ),
]


@pytest.mark.parametrize(("schema", "instances", "path"), CASES)
def test_shortcut_masks_equal_a_token_walk(schema, instances, path, monkeypatch):
    tok, vocab = deepseek_tokenizer(), deepseek_vocab()
    taken = []
    original = getattr(TokenIndex, path)

    def spy(self, *args):
        out = original(self, *args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(TokenIndex, path, spy)
    clear_caches()
    grammar = compile_json_schema(schema, vocab)
    assert_masks_on_walks_match(grammar, tok, instances, 10)
    assert any(taken), f"{path} never applied"
