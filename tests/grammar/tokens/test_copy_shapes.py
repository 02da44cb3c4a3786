"""Masks shared between DFA states of one shape along a long counted repetition (see
`grammar.tokens.shifts`) must equal a plain token walk from each state: near the start of a
long string, near its end (fewer copies left than the longest token), in its mandatory copies
(minLength) and its optional ones, inside an escape or a multi-byte character. And the ids of
a row when several ids share its bytes (the lookup that skips them for the usual one id)."""

from __future__ import annotations

import numpy as np
import pytest

from grammar import clear_caches, compile_json_schema
from grammar.tokens.index import TokenIndex
from grammar.tokens.vocab import TokenVocabulary
from tests.support.json_text import compact
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import brute_force_mask

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "string", "minLength": 70, "maxLength": 300},
        "b": {"type": ["string", "null"], "maxLength": 140},
        "c": {"type": "array", "items": {"type": "string", "maxLength": 90}},
    },
    "required": ["a"],
    "additionalProperties": False,
}
INSTANCES = [
    {"a": "Example content " * 8, "b": "short", "c": ["x y z", "caf\u00e9 \\ done"]},
    {"a": "q" * 75, "b": 'tab\there \u65e5\u672c\u8a9e and a quote " ' + "w" * 100},
    {"a": "\u00e9\u00e8" * 60 + " " * 40 + "end", "b": None, "c": ["-" * 85, "a\nb"]},
]


def _walk_all(grammar, tok) -> list[int]:
    """Every state the instances visit, with its mask computed in walk order (as a generator
    would ask for them)."""
    seen: list[int] = []
    for instance in INSTANCES:
        m = grammar.matcher()
        for t in tok.encode(compact(instance), add_special_tokens=False):
            m.bitmask()
            if m.state not in seen:
                seen.append(m.state)
            m.advance(t)
        assert m.is_accepting(), instance
    return seen


def test_shared_masks_equal_a_token_walk(monkeypatch):
    tok, vocab = deepseek_tokenizer(), deepseek_vocab()
    clear_caches()
    shared: list[tuple[int, int]] = []  # (state, copies left) of masks taken from a shape
    plain = TokenIndex._shifted

    def spy(self, state, words, dist):
        out = plain(self, state, words, dist)
        if out is not None:
            shared.append((state, dist))
        return out

    monkeypatch.setattr(TokenIndex, "_shifted", spy)
    grammar = compile_json_schema(SCHEMA, vocab)
    _walk_all(grammar, tok)
    assert len(shared) > 20  # the walks do take masks from shapes
    # far from the end (every token shared), in the partly shared range, at the edge
    dists = sorted({d for _, d in shared})
    picks = {d: next(s for s, x in shared if x == d) for d in dists}
    chosen = [picks[d] for d in dists[:: max(1, len(dists) // 8)]] + [picks[dists[-1]]]
    n = len(vocab)
    for state in dict.fromkeys(chosen):
        words = grammar.index.bitmask(state)
        got = np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)
        assert np.array_equal(got, brute_force_mask(grammar, state)), state


def test_states_along_a_long_string_share_one_shape():
    clear_caches()
    grammar = compile_json_schema({"type": "string", "maxLength": 400}, deepseek_vocab())
    dfa, shapes = grammar.dfa, grammar.index._shapes
    s = dfa.walk(1, b'"')
    keys, dists = set(), []
    for _ in range(200):
        s = dfa.walk(s, b"a")
        key, dist = shapes.shape(s)
        keys.add(key)
        dists.append(dist)
    assert len(keys) == 1
    assert dists == list(range(dists[0], dists[0] - 200, -1))  # one copy fewer a character
    # inside a two-byte character: another shape (the copy's middle state)
    mid = dfa.walk(s, b"\xc3")
    assert shapes.shape(mid)[0] not in keys


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 20}, {"type": "integer"}])
def test_no_shape_without_a_long_repetition(schema):
    clear_caches()
    grammar = compile_json_schema(schema, deepseek_vocab())
    dfa = grammar.dfa
    s = dfa.walk(1, b'"a' if schema["type"] == "string" else b"1")
    assert grammar.index._shapes is None or grammar.index._shapes.shape(s) is None


def test_ids_of_rows_keeps_every_id_of_a_repeated_byte_string():
    vocab = TokenVocabulary([b"a", b"b", b"a", b"cd", None], eos_token_ids=[4])
    prep = vocab.prepared()
    row_a = int(prep.id_to_unique[0])
    row_b = int(prep.id_to_unique[1])
    assert sorted(vocab.ids_of_rows(np.array([row_a, row_b])).tolist()) == [0, 1, 2]
    assert vocab.ids_of_rows(np.array([row_b])).tolist() == [1]
