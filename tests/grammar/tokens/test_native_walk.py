"""The C trie walk (grammar/tokens/native.py) against the numpy walks: the same mask bits on
lazy and eager automata, with rows built mid-walk, with the walk giving up, from several
threads, and the numpy path when the C walk is off or cannot be built."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

from grammar import TokenVocabulary, clear_caches, compile_json_schema
from grammar.automata import native_dfa
from grammar.automata.fsm import regex_to_dfa
from grammar.tokens import native
from grammar.tokens.index import TokenIndex
from tests.support.json_text import compact
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab

pytestmark = pytest.mark.skipif(native._load() is None, reason="no C compiler")

SCHEMAS = [
    pytest.param(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}},
            },
            "required": ["name"],
        },
        [{"name": "Ada Lovelace", "age": 36, "tags": ["math", "poet"]}, {"name": "日本"}],
        id="object-of-scalars",
    ),
    pytest.param(
        {
            "type": "object",
            "properties": {"alpha": {"type": "number"}, "beta": {"enum": ["x", "yy", None]}},
            "additionalProperties": {"type": "boolean"},
        },
        [{"alpha": -1.5e3, "beta": "yy", "other": True}, {"abc": False}],
        id="free-keys-beside-names",
    ),
    pytest.param(
        {"type": "array", "items": {"anyOf": [{"type": "string", "format": "date"}, {}]}},
        [["2024-01-31", {"k": [1, 2.5, None]}, "text \\" + '" quoted']],
        id="any-value",
    ),
    pytest.param(  # a loop whose leaving tokens are too many for suffixes: a trie of their rows
        {
            "type": "object",
            "properties": {"id": {"type": "string", "pattern": "^[A-Za-z0-9_ -]*$"}},
            "required": ["id"],
        },
        [{"id": "Ada_9 x-y"}, {"id": ""}],
        id="narrow-loop",
    ),
]

REGEXES = [
    pytest.param(r"(ab|a[0-9]{1,3})+c?", id="alternation"),
    pytest.param(r"\"[^\"\\]{0,12}\"", id="short-string"),
    pytest.param(r"[a-z ]+( [0-9]+)*", id="words-and-numbers"),
]


def _set_native(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1" if on else "0")


def _masks_along(schema: dict, instances: list, on: bool, monkeypatch) -> list[np.ndarray]:
    """The mask at every token of every instance, on a fresh compile (a fresh lazy DFA)."""
    tok, vocab = deepseek_tokenizer(), deepseek_vocab()
    _set_native(monkeypatch, on)
    clear_caches()
    grammar = compile_json_schema(schema, vocab)
    assert (grammar.index._trie is not None) == on
    out = []
    for instance in instances:
        m = grammar.matcher()
        for t in tok.encode(compact(instance), add_special_tokens=False):
            out.append(m.bitmask().copy())
            m.advance(t)
        out.append(m.bitmask().copy())
    return out


@pytest.mark.parametrize(("schema", "instances"), SCHEMAS)
def test_lazy_masks_equal_the_numpy_walk(schema, instances, monkeypatch):
    c_masks = _masks_along(schema, instances, True, monkeypatch)
    np_masks = _masks_along(schema, instances, False, monkeypatch)
    assert len(c_masks) == len(np_masks)
    for k, (a, b) in enumerate(zip(c_masks, np_masks, strict=True)):
        assert np.array_equal(a, b), k


@pytest.mark.parametrize("pattern", REGEXES)
def test_eager_masks_equal_the_numpy_walk(pattern, monkeypatch):
    vocab = deepseek_vocab()
    dfa = regex_to_dfa(pattern)
    assert not dfa.lazy
    _set_native(monkeypatch, True)
    c_index = TokenIndex(dfa, vocab)
    _set_native(monkeypatch, False)
    np_index = TokenIndex(dfa, vocab)
    assert c_index._trie is not None and np_index._trie is None
    for state in range(dfa.num_states):
        assert np.array_equal(c_index.bitmask(state), np_index.bitmask(state)), state


@pytest.mark.parametrize("bulk", [False, True], ids=["asked-states", "bulk-handover"])
def test_rows_are_built_mid_walk(monkeypatch, bulk):
    """From a fresh lazy DFA's start, the walk meets rows not built yet, returns them, and
    resumes their subtrees after Python builds them. With the small NFA handed over in bulk
    (`native_dfa._BULK_STATES`), the core has every state it needs: one pass, the same mask."""
    if not bulk:  # only the asked states and a few neighbours: the walk must come back
        monkeypatch.setattr(native_dfa, "_BULK_STATES", -1)
    vocab = deepseek_vocab()
    schema = {"type": "object", "properties": {"key": {"type": "string", "maxLength": 5}}}
    passes = []
    original = native.TokenTrie.walk_once

    def spy(self, *args):
        n = original(self, *args)
        passes.append(n)
        return n

    monkeypatch.setattr(native.TokenTrie, "walk_once", spy)
    _set_native(monkeypatch, True)
    clear_caches()
    dfa = compile_json_schema(schema, vocab).dfa
    trie = native.trie_of(vocab)
    words = np.zeros((len(vocab) + 31) // 32, dtype=np.uint32)
    assert native.walk(trie, dfa, 1, words)
    assert passes[-1] == 0
    if not bulk:
        assert len(passes) >= 2 and passes[0] > 0
    _set_native(monkeypatch, False)
    ref = TokenIndex(dfa, vocab).bitmask(1).view("<u4")  # (START does not accept: no EOS)
    assert np.array_equal(words, ref)


def test_a_walk_that_gives_up_falls_back_to_numpy(monkeypatch):
    schema, instances = SCHEMAS[0].values
    np_masks = _masks_along(schema, instances, False, monkeypatch)
    monkeypatch.setattr(native, "_PENDING", 1)  # a pass with two skipped nodes gives up
    c_masks = _masks_along(schema, instances, True, monkeypatch)
    for k, (a, b) in enumerate(zip(c_masks, np_masks, strict=True)):
        assert np.array_equal(a, b), k


def test_without_a_compiler_masks_come_from_numpy(monkeypatch, tmp_path):
    monkeypatch.setattr(native.LIBRARY, "_lib", None)  # built again: the compiler fails
    monkeypatch.setattr(native.LIBRARY, "_failed", False)
    monkeypatch.setattr(native, "_tries", weakref.WeakKeyDictionary())
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path / "cache"))
    _set_native(monkeypatch, True)
    assert native.trie_of(deepseek_vocab()) is None
    schema, instances = SCHEMAS[1].values
    masks = _masks_along(schema, instances, False, monkeypatch)
    assert masks and any(m.any() for m in masks)


def test_off_switch(monkeypatch):
    _set_native(monkeypatch, False)
    assert native.trie_of(deepseek_vocab()) is None


def test_duplicate_and_prefix_tokens_on_a_small_vocabulary(monkeypatch):
    """Ids sharing bytes, tokens that are prefixes of others, a split UTF-8 character."""
    tokens = [b"a", b"ab", b"abc", b"ab", b"b", b"\xc3", b"\xa9", b"\xc3\xa9", None, b"abcd"]
    vocab = TokenVocabulary(tokens, eos_token_ids=[8])
    dfa = regex_to_dfa("(ab|é)*c?")
    _set_native(monkeypatch, True)
    c_index = TokenIndex(dfa, vocab)
    _set_native(monkeypatch, False)
    np_index = TokenIndex(dfa, vocab)
    for state in range(dfa.num_states):
        assert np.array_equal(c_index.bitmask(state), np_index.bitmask(state)), state


def test_clear_first_drops_the_tokens_of_those_first_bytes_unless_they_walk(monkeypatch):
    """`walk(..., clear_first=)` over a mask with every bit set: a token whose first byte is
    marked keeps its bit only when it is walked (its first byte in first_ok) and lives; the
    others keep theirs. A brute-force oracle over a small vocabulary."""
    tokens = [b"a", b"ab", b"abc", b"b", b"ba", b"c", b"cab", b"x", b"xa", None]
    vocab = TokenVocabulary(tokens, eos_token_ids=[9])
    dfa = regex_to_dfa("(ab|c)*")
    _set_native(monkeypatch, True)
    trie = native.trie_of(vocab)
    clear, walked = np.zeros(256, bool), np.zeros(256, bool)
    clear[[ord("a"), ord("b"), ord("x")]] = True
    walked[[ord("a"), ord("b")]] = True  # x cleared, not walked
    words = np.full(1, 0xFFFFFFFF, dtype=np.uint32)
    assert native.walk(trie, dfa, 1, words, walked, clear_first=clear)
    for i, t in enumerate(tokens):
        bit = bool(words[0] >> i & 1)
        if t is None or not clear[t[0]]:
            assert bit, t  # untouched
        else:
            assert bit == (walked[t[0]] and dfa.walk(1, t) != 0), t


def test_masks_from_several_threads(monkeypatch):
    """Threads computing first-visit masks of one lazy index at once (rows built by whichever
    thread gets there first, the table replaced as it grows) get the numpy masks."""
    tok, vocab = deepseek_tokenizer(), deepseek_vocab()
    schema, instances = SCHEMAS[2].values
    texts = [compact(i) for i in instances] + ['["a",1,{"b":true}]', "[[[],{}],-0.5]"]
    _set_native(monkeypatch, True)
    clear_caches()
    grammar = compile_json_schema(schema, vocab)
    got: dict[tuple[int, int], np.ndarray] = {}
    errors = []

    def run(k: int) -> None:
        try:
            for text in texts[k % len(texts) :] + texts[: k % len(texts)]:
                m = grammar.matcher()
                for j, t in enumerate(tok.encode(text, add_special_tokens=False)):
                    got[texts.index(text), j] = m.bitmask()
                    m.advance(t)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    _set_native(monkeypatch, False)
    plain = TokenIndex(grammar.dfa, vocab)
    for (i, j), words in got.items():
        m = grammar.matcher()
        for t in tok.encode(texts[i], add_special_tokens=False)[:j]:
            m.advance(t)
        assert np.array_equal(words, plain.bitmask(m.state)), (i, j)


def test_the_tokens_leaving_a_string_walk_as_a_suffix_trie(monkeypatch):
    """Inside a JSON string most tokens loop (a shared set); the others are walked in C over a
    trie of their suffixes, not the vocabulary's."""
    tries = []
    original = native.walk

    def spy(trie, *args):
        tries.append(trie)
        return original(trie, *args)

    monkeypatch.setattr(native, "walk", spy)
    masks = _masks_along({"type": "string"}, ["plain text", 'with "quotes"'], True, monkeypatch)
    vocab_trie = native.trie_of(deepseek_vocab())
    assert any(t is not vocab_trie for t in tries)
    monkeypatch.setattr(native, "walk", original)
    plain = _masks_along({"type": "string"}, ["plain text", 'with "quotes"'], False, monkeypatch)
    for k, (a, b) in enumerate(zip(masks, plain, strict=True)):
        assert np.array_equal(a, b), k
