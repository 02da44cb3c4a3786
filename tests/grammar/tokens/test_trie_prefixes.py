"""Prefix look-ups in the C token trie (`native.prefixes`, `prefix_tokens`, `prefix_lengths`)
against brute force over a small vocabulary whose tokens share first bytes (the look-up
tables of the first two levels) and go deeper (siblings scanned), with non-ASCII bytes; and the
forced-text masks (`grammar.structural.forced_masks`) built on them equal to those of the
sorted-text path used without the C trie."""

from __future__ import annotations

import random

import numpy as np
import pytest

from grammar import TokenVocabulary
from grammar.structural import forced_masks
from grammar.tokens import native

pytestmark = pytest.mark.skipif(native._load() is None, reason="no C compiler")

ALPHABET = b"ab<>/=\n\xc3\xa9"


def _vocab() -> tuple[TokenVocabulary, list[bytes | None]]:
    rng = random.Random(7)
    tokens = {bytes([b]) for b in range(256)}  # every byte, as byte-level vocabularies have
    while len(tokens) < 600:
        n = rng.choice((2, 2, 3, 4, 6, 9))
        tokens.add(bytes(rng.choice(ALPHABET) for _ in range(n)))
    toks: list[bytes | None] = sorted(tokens)
    toks += [b"ab<", b"ab<"]  # two ids with one text (one trie row)
    toks.append(None)  # EOS
    return TokenVocabulary(toks, [len(toks) - 1]), toks


def _brute(toks: list[bytes | None], f: bytes) -> tuple[int, set[int]]:
    """(L, or -1 when a longer token starts with f; the ids of the tokens that prefix f)."""
    if any(t is not None and len(t) > len(f) and t.startswith(f) for t in toks):
        return -1, set()
    longest = max(
        (next((k for k in range(min(len(t), len(f))) if t[k] != f[k]), min(len(t), len(f)))
         for t in toks if t),
        default=0,
    )  # fmt: skip
    return longest, {i for i, t in enumerate(toks) if t and f.startswith(t)}


def _texts(n: int) -> list[bytes]:
    rng = random.Random(11)
    out = [b"", b"\xff\xfe", b"ab<" * 5]
    while len(out) < n:
        out.append(bytes(rng.choice(ALPHABET) for _ in range(rng.randint(1, 14))))
    return out


def test_prefix_look_ups_equal_brute_force() -> None:
    vocab, toks = _vocab()
    p = native.prefixes(native.trie_of(vocab))
    words = np.zeros((len(toks) + 31) // 32, dtype=np.uint32)
    for f in _texts(300):
        want_len, want_ids = _brute(toks, f)
        assert native.prefix_tokens(p, f) == want_len, f
        if want_len < 0:
            continue
        words[:] = 0
        assert native.prefix_tokens(p, f, words.ctypes.data) == want_len
        got = {
            int(i) for i in np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        }
        assert got == want_ids, f
    for f in _texts(40):  # every start of f at once, each read at most 5 bytes far
        n = len(f)
        assert native.prefix_lengths(p, f, n, 5) == [
            _brute(toks, f[j : j + 5])[0] for j in range(n)
        ]
    with pytest.raises(ValueError, match="n must be"):
        native.prefix_lengths(p, b"ab", 3, 5)


def test_forced_text_masks_equal_with_and_without_the_c_trie(monkeypatch) -> None:
    vocab, toks = _vocab()
    with_c = forced_masks._Texts(vocab)
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "0")
    without = forced_masks._Texts(vocab)
    assert with_c.trie is not None and without.trie is None
    for text in _texts(120):
        if not text:
            continue
        keys = with_c.keys(text, len(text))
        assert keys == without.keys(text, len(text)), text
        for j, key in enumerate(keys):
            want_len, want_ids = _brute(toks, text[j : j + forced_masks.LIMIT])
            assert (key is None) == (want_len < 0)
            if key is None:
                continue
            for texts in (with_c, without):
                bits = np.unpackbits(texts.words(key).view(np.uint8), bitorder="little")
                assert set(np.flatnonzero(bits).tolist()) == want_ids, (text, j)


# a forced text longer than `forced_masks.LIMIT`, then a branch, then more forced text
_HEAD = (b"ab<>/=\n" * 14)[:90]
_TAIL = b"=/<ba\n" * 3


def _forced_vocab() -> tuple[TokenVocabulary, list[bytes | None]]:
    """`_vocab`'s tokens plus some that run far into the forced text: 20 and 40 bytes, past
    `LIMIT` bytes, and to the branch (so the walk answers there)."""
    _, toks = _vocab()
    extra = [_HEAD[:20], _HEAD[:40], _HEAD[3:75], _HEAD[50:], _HEAD[61:] + b"x", _TAIL[:13]]
    toks = toks[:-1] + extra + [None]
    return TokenVocabulary(toks, [len(toks) - 1]), toks


def _const(text: str) -> dict:
    return {"type": "const_string", "value": text}


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
def test_forced_masks_in_any_order_equal_the_full_walk(order: str) -> None:
    """Whichever order the states are first asked in (a later one first: its text is read
    from there, and an earlier one's reading stops at it): at every state along a forced
    text longer than `LIMIT`, a branch and more forced text, the shortcut's mask equals the
    index's own walk; it answers only where no token runs past the forced text (brute
    force), and at most of those states."""
    from grammar import compile_structural_tag

    vocab, toks = _forced_vocab()
    spec = {
        "type": "sequence",
        "elements": [
            _const(_HEAD.decode()),
            {"type": "or", "elements": [_const("x"), _const("y")]},
            _const(_TAIL.decode()),
        ],
    }
    g = compile_structural_tag(spec, vocab)
    states, s, want = [], g.matcher().state, set()
    for at, b in enumerate(_HEAD + b"x" + _TAIL):
        states.append(s)
        # the forced text from here: to the branch, or to the end (at most LIMIT bytes)
        f = _HEAD[at:] if at < len(_HEAD) else _TAIL[at - len(_HEAD) - 1 :]
        if f and _brute(toks, f[: forced_masks.LIMIT])[0] >= 0:
            want.add(s)  # no token runs past it
        s = g.dfa.step(s, b)
    if order == "backward":
        states.reverse()
    elif order == "shuffled":
        random.Random(5).shuffle(states)
    fm = forced_masks.ForcedMasks(g.dfa, vocab)
    answered = set()
    for s in states:
        words = fm(s)
        if words is None:
            continue
        answered.add(s)
        full = g.index._computed(s, 0)
        assert np.array_equal(words.view(np.uint32), full.view(np.uint32)), (order, s)
    # (the branch states outside forced text are answered by one C walk: `_narrow`)
    forced = {s for s in answered if g.dfa.forced_byte(s) >= 0}
    assert forced <= want and len(forced) >= 0.75 * len(want)
    assert len(want) >= 60 and len(set(states)) - len(want) >= 10
