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


def test_a_state_that_shares_nothing_does_not_borrow(monkeypatch):
    """Inside a JSON string, the state after a UTF-8 lead byte goes on only by continuation
    bytes, all to the string's content state, where they are dead: borrowing that state's
    mask would lend no token and drop nearly all of them, so `_like` declines and the state
    walks its own tokens; its mask, and the next one's, equal the token-by-token walk."""
    import numpy as np

    from tests.support.walks import brute_force_mask

    vocab = deepseek_vocab()
    clear_caches()
    grammar = compile_json_schema({"type": "string"}, vocab)
    dfa = grammar.dfa
    index = TokenIndex(dfa, vocab)
    content = dfa.walk(1, b'"')
    lead = dfa.walk(content, "日".encode()[:1])
    assert lead not in (0, content)
    lent = []
    original = TokenIndex._like

    def spy(self, state, depth):
        out = original(self, state, depth)
        lent.append((state, out is not None))
        return out

    monkeypatch.setattr(TokenIndex, "_like", spy)
    for state in (content, lead, dfa.walk(content, "日".encode()[:2])):
        got = np.unpackbits(index.bitmask(state).view(np.uint8), bitorder="little")
        assert np.array_equal(got[: len(vocab)].astype(bool), brute_force_mask(grammar, state))
    assert (lead, False) in lent
