"""Cheap masks for the states inside forced text (a tag's opening after the tool's name, its
end string, a JSON key): the token index's `shortcut` for structural tags.

A state that allows exactly one byte, and is not accepting, starts a forced text f: the bytes
every continuation from it begins with, up to a state that branches or may end. A token
walks from that state without dying exactly when it is a prefix of f, or starts with f and
goes on from the state after it. When no token of the vocabulary is longer than f and
starts with it (looked up by bisection in the sorted token texts), the mask is the tokens
that are prefixes of f: a function of f and the vocabulary alone. So it is built from at
most len(f) dictionary look-ups instead of a walk over the vocabulary, and kept per
vocabulary by f: every tool's opening ` <|constrain|>json<|message|>{` (gpt-oss) is the same
text after a different name, so the second tool's states reuse the first one's masks. It is
also kept by f cut one byte past the longest prefix f shares with a token (its two neighbours
in sorted order): no token reaches past that cut, so texts that differ only after it
(Qwen3-Coder's `</parameter>\n<parameter=` + each parameter's name) share one mask. A
state where some token runs past f is left to the full walk (None).

f is read at most `LIMIT` bytes far: a token that long which starts with it sends the state to
the full walk too, so the cut changes no mask.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict

import numpy as np

from grammar.tokens.vocab import TokenVocabulary

LIMIT = 64  # bytes of forced text read ahead
_MAX_MASKS = 1024  # masks kept per vocabulary (16 KB each at 129k ids)
_UNSEEN = object()


def _common(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


class _Texts:
    """Per vocabulary: token ids by their bytes, the texts sorted, masks by forced text."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        by_bytes: dict[bytes, list[int]] = {}
        for i in range(len(vocab)):
            b = vocab.token_bytes(i)
            if b:
                by_bytes.setdefault(b, []).append(i)
        self.ids = by_bytes
        self.sorted = sorted(by_bytes)
        self.num_words = (len(vocab) + 31) // 32
        self.masks: OrderedDict[bytes, np.ndarray | None] = OrderedDict()
        self.lock = threading.Lock()

    def mask(self, f: bytes) -> np.ndarray | None:
        """Packed int32 words: the tokens that are non-empty prefixes of `f`; None when some
        token is longer than `f` and starts with it."""
        hit = self.masks.get(f, _UNSEEN)
        if hit is not _UNSEEN:
            return hit
        texts = self.sorted
        i = bisect.bisect_right(texts, f)
        if i < len(texts) and texts[i].startswith(f):
            return self._keep(f, None)
        # a token that is a prefix of f sorts just before f: no prefix of f is a token past
        # the longest common prefix of f and that neighbour
        shared = _common(f, texts[i - 1]) if i else 0
        # no token starts with `cut` (else one of f's two neighbours would): the tokens that
        # are prefixes of f are those of cut, so texts that differ past it share one mask
        # (`</parameter>\n<parameter=` then each tool's own parameter name)
        after = _common(f, texts[i]) if i < len(texts) else 0
        cut = f[: max(shared, after) + 1]
        words = self.masks.get(cut)
        if words is None:
            words = self._prefix_words(f, shared)
            self._keep(cut, words)
        return self._keep(f, words)

    def _prefix_words(self, f: bytes, shared: int) -> np.ndarray:
        """Packed int32 words: the tokens f[:1] .. f[:shared] (their bits gathered in Python
        ints and stored in one assignment: a numpy scalar update costs ~1.5 us a token)."""
        bits: dict[int, int] = {}
        get = self.ids.get
        for n in range(1, shared + 1):
            for t in get(f[:n], ()):
                w = t >> 5
                bits[w] = bits.get(w, 0) | (1 << (t & 31))
        words = np.zeros(self.num_words, dtype=np.uint32)
        if bits:
            words[list(bits)] = list(bits.values())
        return words.view("<i4")

    def _keep(self, f: bytes, out: np.ndarray | None) -> np.ndarray | None:
        with self.lock:
            if len(self.masks) >= _MAX_MASKS:
                self.masks.popitem(last=False)
            return self.masks.setdefault(f, out)


class ForcedMasks:
    """`shortcut(state)` for a compiled structural tag over a lazy DFA: the state's mask when
    it is inside forced text that no token runs past, else None."""

    def __init__(self, dfa: object, vocab: TokenVocabulary) -> None:
        self._dfa = dfa
        self._texts: _Texts = vocab.derived(("forced text masks",), lambda: _Texts(vocab))
        self._forced: dict[int, bytes] = {}  # state -> the forced text from it (LIMIT bytes)

    def __call__(self, state: int) -> np.ndarray | None:
        if self._dfa.forced_byte(state) < 0:
            return None
        f = self._forced.get(state)
        if f is None:
            f = self._follow(state)
        return self._texts.mask(f)

    def _follow(self, state: int) -> bytes:
        """The forced text from `state`, recorded for every state on the way."""
        dfa, known = self._dfa, self._forced
        path: list[int] = []
        text = bytearray()
        tail = b""
        s = state
        while len(text) < LIMIT:
            hit = known.get(s)
            if hit is not None:
                tail = hit
                break
            b = dfa.forced_byte(s)  # (builds the state's row)
            if b < 0:
                break
            path.append(s)
            text.append(b)
            s = int(dfa.table[s, b])
        whole = bytes(text) + tail
        for k, p in enumerate(path):
            known.setdefault(p, whole[k : k + LIMIT])
        return known[state]
