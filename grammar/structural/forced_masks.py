"""Cheap masks for the states inside forced text (a tag's opening after the tool's name, its
end string, a JSON key): the token index's `shortcut` for structural tags.

A state that allows exactly one byte, and is not accepting, starts a forced text f: the bytes
every continuation from it begins with, up to a state that branches or may end. A token
walks from that state without dying exactly when it is a prefix of f, or starts with f and
goes on from the state after it. When no token of the vocabulary is longer than f and
starts with it, the mask is the tokens that are prefixes of f: a function of f and the
vocabulary alone, and of f only up to one byte past L, the length of the longest prefix of f
that begins a token (no token reaches past that cut). So the mask is kept per vocabulary by
f cut there (its key): every tool's opening ` <|constrain|>json<|message|>{` (gpt-oss) is the
same text after a different name, and Qwen3-Coder's `</parameter>\n<parameter=` + each
parameter's name differ only past the cut, so later states reuse the first one's mask. A
state where some token runs past f is left to the full walk (None).

L is found by walking f down the vocabulary's token trie in C (`native.prefix_lengths`), for
every state along a forced text in one call when the text is first met, so a later state on
it costs two dictionary look-ups; a new mask is the bits of the trie nodes on the cut's path
(`native.prefix_tokens`), written into a row of a block allocated ahead. Without the C trie,
bisection in the sorted token texts and dictionary look-ups answer the same.

f is read at most `LIMIT` bytes far: a token that long which starts with it sends the state to
the full walk too, so the cut changes no mask.

A state outside forced text that fewer than `NARROW` bytes leave (a number's digits, the white
space and separators after a value, a key's first letters, the `<` of an XML closing tag) gets
its mask from one pruned walk of the vocabulary trie in C (`native.walk`), EOS added where it
accepts. The token index's generic path would borrow the mask of the state most bytes lead to
(`_like`), computing that neighbour's mask, and its neighbour's, for one state: three walks and
the numpy passes between them (400-900 us for a number inside an XML parameter's JSON value),
where the one walk is 30-100 us. States more bytes leave (free text, string contents) stay with
the index, whose shared sets skip most of the vocabulary there. Without the C trie: None.

One kind of those is answered here too: free text that has begun a trigger which goes on with a
byte many tokens start with (gpt-oss's `<|channel|>commentary to=`: after "commentary" a space
continues the trigger, where free text's own space leads back to free text). The index borrows
the mask of the state most bytes lead to (free text) only when few tokens start with the bytes
where the two rows differ; here they are the space's tokens, and the full walk took 4.7 ms at
129k ids. A token's verdict from the state equals its verdict from the borrowed state when both
reach the same state after its first two bytes, so only the tokens of the one- and two-byte
prefixes where they part are walked (" t" here: a node filter of the trie, kept per vocabulary
and prefix set), their bits in the borrowed mask cleared first.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

import numpy as np

from grammar.automata.fsm import DEAD
from grammar.tokens import native
from grammar.tokens.vocab import TokenVocabulary

LIMIT = 64  # bytes of forced text read ahead
_MAX_MASKS = 1024  # masks kept per vocabulary (16 KB each at 129k ids)
_BLOCK = 16  # masks allocated at once (one zeroed block, its address read once)
_UNSEEN = object()
NARROW = 64  # live bytes under which a state outside forced text is walked in C directly
_MAX_PARTING = 4  # first bytes parting a state from the one it borrows from, at most


def _common(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


class _Texts:
    """Per vocabulary: the token trie (or the token texts sorted, and ids by text), and the
    masks by key."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        self.num_words = (len(vocab) + 31) // 32
        self.masks: dict[bytes, np.ndarray] = {}  # (insertion order: the oldest dropped first)
        self.lock = threading.Lock()
        self._block: np.ndarray | None = None  # rows not handed out yet, and the first's address
        self._next, self._at = _BLOCK, 0
        trie = native.trie_of(vocab)
        self.trie = None if trie is None else native.prefixes(trie)  # None: the sorted texts
        if self.trie is not None:
            return
        by_bytes: dict[bytes, list[int]] = {}
        for i in range(len(vocab)):
            b = vocab.token_bytes(i)
            if b:
                by_bytes.setdefault(b, []).append(i)
        self.ids = by_bytes
        self.sorted = sorted(by_bytes)

    def keys(self, text: bytes, n: int) -> list[bytes | None]:
        """For j < n: the key of the mask of forced text f = text[j : j + LIMIT] (f cut one
        byte past L), or None when a token is longer than f and starts with it (also when
        the forced text goes on past `text`: the walk answers those few)."""
        if self.trie is not None:
            lengths = native.prefix_lengths(self.trie, text, n, LIMIT)
        else:
            lengths = [self._shared(text[j : j + LIMIT]) for j in range(n)]
        return [None if n_ < 0 else text[j : j + n_ + 1] for j, n_ in enumerate(lengths)]

    def _shared(self, f: bytes) -> int:
        """L for `f` by bisection: a token that begins with a prefix of f sorts next to f, so
        L is f's longest common prefix with one of its two neighbours; -1 when the one after
        it is longer than f and starts with it."""
        texts = self.sorted
        i = bisect.bisect_right(texts, f)
        if i < len(texts) and texts[i].startswith(f):
            return -1
        before = _common(f, texts[i - 1]) if i else 0
        return max(before, _common(f, texts[i]) if i < len(texts) else 0)

    def words(self, key: bytes) -> np.ndarray:
        """Packed int32 words: the tokens that are non-empty prefixes of `key` (those of f)."""
        hit = self.masks.get(key)
        if hit is not None:
            return hit
        if self.trie is not None:
            at, words = self._row()
            native.prefix_tokens(self.trie, key, at)
        else:
            words = self._prefix_words(key)
        masks = self.masks
        if len(masks) >= _MAX_MASKS:
            with self.lock:
                while len(masks) >= _MAX_MASKS:
                    masks.pop(next(iter(masks)), None)
        return masks.setdefault(key, words.view("<i4"))

    def _row(self) -> tuple[int, np.ndarray]:
        """A zeroed row of words for a new mask, and its address."""
        with self.lock:
            if self._next == _BLOCK:
                # zeroed by writing, not by calloc: an untouched page is mapped on first read,
                # which made the first copy of a new mask ~2.5x a copy of a written one
                self._block = np.empty((_BLOCK, self.num_words), dtype=np.uint32)
                self._block.fill(0)
                self._next, self._at = 0, self._block.ctypes.data
            k = self._next
            self._next += 1
            return self._at + k * self.num_words * 4, self._block[k]

    def _prefix_words(self, f: bytes) -> np.ndarray:
        """The tokens f[:1] .. f (their bits gathered in Python ints and stored in one
        assignment: a numpy scalar update costs ~1.5 us a token)."""
        bits: dict[int, int] = {}
        get = self.ids.get
        for n in range(1, len(f) + 1):
            for t in get(f[:n], ()):
                w = t >> 5
                bits[w] = bits.get(w, 0) | (1 << (t & 31))
        words = np.zeros(self.num_words, dtype=np.uint32)
        if bits:
            words[list(bits)] = list(bits.values())
        return words


class ForcedMasks:
    """`shortcut(state)` for a compiled structural tag over a lazy DFA: the state's mask when
    it is inside forced text that no token runs past, or when fewer than `NARROW` bytes leave
    it (one C walk); else None."""

    def __init__(self, dfa: object, vocab: TokenVocabulary, index: Any = None) -> None:
        self._dfa = dfa
        self._vocab = vocab
        self._index = index  # the compiled grammar's TokenIndex (None: no borrowed masks)
        self._borrowing = False  # (a borrowed mask is never borrowed in turn)
        if index is not None:  # tokens per first byte, and in all
            self._firsts = np.diff(index.prepared.first_start)
            self._rows = index.prepared.num_rows
        self._texts: _Texts = vocab.derived(("forced text masks",), lambda: _Texts(vocab))
        self._forced: dict[int, bytes] = {}  # state -> the forced text from it (LIMIT bytes)
        self._keys: dict[int, bytes | None] = {}  # state -> its mask's key (None: walk it)
        self._trie = native.trie_of(vocab)  # None: no C walk (the index answers)
        self._eos = vocab.eos_token_ids

    def __call__(self, state: int) -> np.ndarray | None:
        key = self._keys.get(state, _UNSEEN)
        if key is _UNSEEN:
            if self._dfa.forced_byte(state) < 0:
                return self._narrow(state)
            self._follow(state)
            key = self._keys[state]
        return None if key is None else self._texts.words(key)

    def _narrow(self, state: int) -> np.ndarray | None:
        """The mask of a state outside forced text by one C walk when fewer than `NARROW`
        bytes leave it; None otherwise, without the C trie, or when the walk gives up."""
        dfa = self._dfa
        if self._trie is None:
            return None
        if dfa.live_bytes(state) >= NARROW:
            return self._borrowed(state)
        words = np.zeros(self._texts.num_words, dtype=np.uint32)
        if not native.walk(self._trie, dfa, state, words):
            return None
        if dfa.accepting[state]:
            for e in self._eos:
                words[e >> 5] |= np.uint32(1 << (e & 31))
        return words.view("<i4")

    def _borrowed(self, state: int) -> np.ndarray | None:
        """The mask of a state many bytes leave, from the mask of the state most of them
        lead to (`ref`), when the tokens whose first byte parts the two are many but those
        whose first two bytes part them are few; None otherwise (the index answers)."""
        index, dfa = self._index, self._dfa
        if index is None or self._borrowing:
            return None
        row = dfa.byte_row(state)
        counts = np.bincount(row)
        counts[DEAD] = 0
        ref = int(counts.argmax())  # (the state most bytes lead to)
        if ref == state:  # (a self-loop, as string contents: the index's shared sets)
            return None
        ref_row = dfa.byte_row(ref)
        differ = np.flatnonzero(row != ref_row)
        if differ.shape[0] > _MAX_PARTING or int(self._firsts[differ].sum()) * 8 < self._rows:
            return None  # few tokens part them at the first byte: the index's own borrow
        prefixes: list[bytes] = []
        for b in differ.tolist():
            s1, r1 = int(row[b]), int(ref_row[b])
            if DEAD in (s1, r1):
                prefixes.append(bytes([b]))
                continue
            second = np.flatnonzero(dfa.byte_row(s1) != dfa.byte_row(r1)).tolist()
            prefixes.extend(bytes([b, c]) for c in second)
        key = ("tokens under prefixes", tuple(prefixes))
        under = self._vocab.derived(key, lambda: _under(index, self._trie, prefixes))
        if under is None:
            return None
        node_ok, gone = under
        self._borrowing = True
        try:
            words = index.bitmask(ref).view(np.uint32) & ~gone
        finally:
            self._borrowing = False
        for e in self._eos:  # (EOS bits as `state` accepts, not as `ref` does)
            words[e >> 5] &= np.uint32(~(1 << (e & 31)) & 0xFFFFFFFF)
        if not native.walk(self._trie, dfa, state, words, node_ok=node_ok):
            return None
        if dfa.accepting[state]:
            for e in self._eos:
                words[e >> 5] |= np.uint32(1 << (e & 31))
        return words.view("<i4")

    def _follow(self, state: int) -> None:
        """The forced text from `state`, and its mask's key, recorded for every state on the
        way (up to one already recorded: its text goes on from there)."""
        dfa, known = self._dfa, self._forced
        # (one lock for the run, no call chain per row: a first visit builds up to LIMIT rows)
        path, text, s = dfa.forced_run(state, LIMIT, known)
        tail = known[s] if len(path) < LIMIT and s in known else b""
        whole = bytes(text) + tail
        keys = self._texts.keys(whole, len(path))
        for k, p in enumerate(path):
            known.setdefault(p, whole[k : k + LIMIT])
            self._keys.setdefault(p, keys[k])


def _under(index: Any, trie: Any, prefixes: list[bytes]) -> tuple | None:
    """The tokens that start with one of `prefixes` (one or two bytes each): a node filter of
    the trie for `native.walk` and their packed id bits; None when they are an eighth of the
    vocabulary or more (the full walk is as cheap)."""
    prep = index.prepared
    sel = np.zeros(prep.num_rows, dtype=bool)
    for p in prefixes:
        rows = prep.by_first[prep.first_start[p[0]] : prep.first_start[p[0] + 1]]
        if len(p) == 2:
            rows = rows[(prep.lengths[rows] > 1) & (prep.columns[1][rows] == p[1])]
        sel[rows] = True
    if np.count_nonzero(sel) * 8 >= prep.num_rows:
        return None
    return native.row_filter(trie, np.flatnonzero(sel)), index.pack(sel).view(np.uint32)
