"""Per-state token masks: which tokens keep a DFA alive from a state, as packed bitsets.

Masks are computed lazily, the first time a state is visited, and cached. One computation walks
every distinct token through the DFA in lockstep over byte position with numpy gathers (tokens
sorted longest first, so the ones still walking at position p are a contiguous prefix); once
few tokens survive, it walks only the survivors. Over a LazyDFA a gather may read a row not
built yet (UNEXPANDED, negative): those states are expanded and the gather redone.

Where a C compiler is found (`native`), the walks of a state's own tokens go through a trie of
the vocabulary in C instead (pruned where the DFA dies; the same bits): the generic walk, the
tokens `_like` does not borrow, and the tokens that leave a self-looping state (a trie of their
suffixes). The shared sets (transparent, chains, shapes, `_like`) stay: they skip most tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from grammar.automata.fsm import DEAD, ByteDFA
from grammar.automata.lazy_dfa import LazyDFA
from grammar.tokens import native
from grammar.tokens.chains import MAX_FOLLOW, Chains, chain_layout
from grammar.tokens.loops import Suffixes, loops_on_all_characters, transparent_set
from grammar.tokens.shifts import CopyShapes
from grammar.tokens.vocab import PreparedTokens, TokenVocabulary, csr_take

_DENSE_MIN_ROWS = 4096  # a lockstep walk over fewer rows than this goes on as a sparse one
_FEW_FIRST = 16  # live first bytes up to which a state's tokens are walked directly in C
_MAX_LIKE_DEPTH = 2  # a mask borrowed from a state whose own mask is borrowed, at most
# a state shaped like one whose mask is known (see `shifts`) takes that mask for the tokens of
# at most D bytes, D the largest of these within both states' copies left; walks the others
_SHARED_UP_TO = (16, 24, 32, 48, 64, 96, 128)


_least = np.minimum.reduce
_NO_ROWS = np.zeros(0, dtype=np.int64)
_AT_MOST = 1024  # bits set one by one up to this many; more: through a bool array, packed


def set_bits(words: np.ndarray, ids: np.ndarray) -> None:
    """Set bit id of packed uint32 `words` for every id in `ids` (in place)."""
    if ids.size <= _AT_MOST:
        np.bitwise_or.at(words, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
        return
    on = np.zeros(words.shape[0] * 32, dtype=bool)
    on[ids] = True
    words |= np.packbits(on, bitorder="little").view("<u4")


def clear_bits(words: np.ndarray, ids: np.ndarray) -> None:
    """Clear bit id of packed uint32 `words` for every id in `ids` (in place)."""
    if ids.size <= _AT_MOST:
        bit = np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32))
        np.bitwise_and.at(words, ids >> 5, ~bit)
        return
    on = np.zeros(words.shape[0] * 32, dtype=bool)
    on[ids] = True
    words &= ~np.packbits(on, bitorder="little").view("<u4")


class TokenIndex:
    """Token masks of one DFA over one vocabulary.

    bitmask(state) is an int32 array of ceil(V/32) words; bit b of word w allows token 32*w+b.
    EOS ids are allowed exactly in accepting states. A returned array is shared: never write it.
    """

    def __init__(self, dfa: ByteDFA | LazyDFA, vocab: TokenVocabulary) -> None:
        self.dfa = dfa
        self._lazy = dfa.lazy  # rows built on first read; the table grows (re-read it)
        self.vocab = vocab
        self.prepared = vocab.prepared()
        self.num_words = (len(vocab) + 31) // 32
        self._first_counts = np.diff(self.prepared.first_start)  # tokens per first byte
        # the class-indexed table (not a [n_states, 256] copy: a large automaton would need
        # n_states KiB): a byte b read in state s goes to flat[s * n_cls + class(b)]
        self.n_cls = dfa.num_classes
        self._flat = dfa.table.reshape(-1)  # eager DFAs only: a lazy one's table is replaced
        wide = self._flat.size >= 2**31  # int32 index arithmetic would overflow
        # a lazy table grows up to its state budget: int64 indices if that could overflow
        self._wide = self._lazy and getattr(dfa, "max_states", 0) * self.n_cls >= 2**31
        if wide:
            self._flat = self._flat.astype(np.int64)
        b2c = dfa.byte_to_class.astype(np.int64 if wide else np.int32)
        # byte p of each token as its class, for the tokens longer than p: built on first
        # use of a dense walk (ragged, ~1 MiB); sparse walks look up only their rows. A lazy
        # DFA's columns are the bytes themselves (None: no lookup)
        self._b2c = None if self._lazy else b2c
        self._ccols: list[np.ndarray | None] = [None] * self.prepared.columns.shape[0]
        self._eos = np.array(vocab.eos_token_ids, dtype=np.int64)
        self._masks: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._chains = Chains(dfa)
        # a scalar walk's verdict (a lazy DFA reads its table for states walked once)
        self._lives = dfa.lives if self._lazy else lambda s, data: dfa.walk(s, data) != DEAD
        self._shapes = CopyShapes(dfa) if self._lazy else None
        self._by_shape: dict[tuple, tuple[np.ndarray, int]] = {}  # shape key -> (mask, dist)
        self._trie = native.trie_of(vocab)  # None: no C walk (numpy walks only)
        # a front end's cheaper mask for some states (None: not one of them), asked before the
        # walk; e.g. `grammar.structural.forced_masks` for the states inside forced text
        self.shortcut: Callable[[int], np.ndarray | None] | None = None

    def bitmask(self, state: int, _depth: int = 0) -> np.ndarray:
        words = self._masks.get(state)
        if words is None:
            words = self._compute(state, _depth)
            with self._lock:
                words = self._masks.setdefault(state, words)
        return words

    def row(self, state: int) -> np.ndarray:
        """int32 [256]: the state's transitions by byte."""
        return self.dfa.byte_row(state)

    def _class_row(self, state: int) -> np.ndarray:
        """The state's transitions by byte class (a view: index it, never write it)."""
        if self._lazy:
            return self.dfa.byte_row(state)
        return self._flat[state * self.n_cls : (state + 1) * self.n_cls]

    def _cls(self, col: np.ndarray) -> np.ndarray:
        return col if self._b2c is None else self._b2c[col]

    def _gather(self, cur: np.ndarray, cls: np.ndarray) -> np.ndarray:
        """The states after reading byte classes `cls` from states `cur` (a new array)."""
        if not self._lazy:
            return self._flat[cur * self.n_cls + cls]
        # a lazy DFA's table is replaced as it grows (by any thread): read the current one for
        # each gather, never keep it (an older one may lack rows or room for newer states)
        if self._wide:
            cur = cur.astype(np.int64)
        at = cur * self.n_cls
        at += cls
        nxt = self.dfa.table.reshape(-1).take(at)
        if nxt.size and _least(nxt) < 0:  # rows not built yet: build them, read again
            bad = (nxt < 0).nonzero()[0]
            src = cur[bad]
            todo = np.zeros(self.dfa.num_states, dtype=bool)  # the distinct states, in O(n)
            todo[src] = True
            self.dfa.expand(np.flatnonzero(todo))
            nxt[bad] = self.dfa.table.reshape(-1)[src * self.n_cls + cls[bad]]
        return nxt

    def _live_count(self, state: int) -> int:
        """How many bytes leave `state` alive (a lazy DFA keeps the count per built row)."""
        if self._lazy:
            return self.dfa.live_bytes(state)
        return int(np.count_nonzero(self.row(state) != DEAD))

    @property
    def states_computed(self) -> int:
        return len(self._masks)

    def _transparent(self, state: int) -> tuple[np.ndarray, Suffixes | np.ndarray, tuple] | None:
        """Tokens that surely walk from `state` back to `state` (e.g. plain text inside a JSON
        string): every ASCII byte is a self-loop, and so is every whole non-ASCII character
        when the state loops on all of them. None when that is a small minority; else (their
        packed id bits, the other tokens: as Suffixes when few, else their rows). The sets
        depend only on which bytes loop, so they are kept per vocabulary (every JSON string in
        every schema has the same ones); the third item is their key there."""
        if self._lazy and self.dfa.live_bytes(state) < 64:  # (loops are live bytes: no row read)
            return None
        loops = self.row(state) == state
        if np.count_nonzero(loops[:128]) < 64:
            return None
        all_chars = loops_on_all_characters(self.dfa, state)
        key = ("transparent", np.packbits(loops[:128]).tobytes(), all_chars)
        words, others = self.vocab.derived(key, lambda: transparent_set(self, loops, all_chars))
        return words, others, key

    def _allowed(self, state: int, depth: int) -> tuple[np.ndarray | None, np.ndarray]:
        """The tokens that walk from `state` without dying: (packed id bits of a shared set,
        or None; more rows: ascending row numbers, or a bool per row when many). The rows
        are `_NO_ROWS` itself only with an array of this call's own (a C walk's: the caller
        may write it), never with a shared set."""
        prep = self.prepared
        transparent = self._transparent(state)
        if transparent is not None:
            words, others, key = transparent
            if not isinstance(others, Suffixes):
                if self._trie is not None:  # (many others: walked in C, the trie filtered)
                    only = self.vocab.derived(
                        (*key, "rows"), lambda: native.row_filter(self._trie, others)
                    )
                    mine = words.view("<u4").copy()
                    if native.walk(self._trie, self.dfa, state, mine, node_ok=only):
                        return mine.view("<i4"), _NO_ROWS
                return words, self._allowed_sparse(state, others)
            trie = None
            if self._trie is not None:  # the others' suffixes as a trie, walked in C
                trie = self.vocab.derived(
                    (*key, "trie"), lambda: native.suffix_trie(self._trie, others)
                )
            if trie is not None:
                words = words.view("<u4").copy()
                if native.walk(trie, self.dfa, state, words):
                    return words.view("<i4"), _NO_ROWS
                words = transparent[0]
            cur = self._class_row(state)[self._cls(others.columns[0])]
            alive = self._walk_rows(np.arange(cur.shape[0]), cur, 1, others)
            return words, csr_take(others.start, others.rows, alive)
        if self._trie is not None and self._live_count(state) <= _FEW_FIRST:
            # few first bytes live (an object key, a literal): the pruned C walk is cheap,
            # cheaper than borrowing a neighbour's mask (which may need its own computed)
            words = np.zeros(self.num_words, dtype=np.uint32)
            if native.walk(self._trie, self.dfa, state, words):
                return words.view("<i4"), _NO_ROWS
        like = self._like(state, depth) if depth < _MAX_LIKE_DEPTH else None
        if like is not None:
            return like
        chain = self._chain(state)
        if chain is not None:
            return chain
        if self._trie is not None:  # a pruned walk in C
            words = np.zeros(self.num_words, dtype=np.uint32)
            if native.walk(self._trie, self.dfa, state, words):
                return words.view("<i4"), _NO_ROWS
        # first bytes that live: if their tokens are few, walk only those
        live = self.row(state) != DEAD
        rows = self.vocab.derived(("first", np.packbits(live).tobytes()), lambda: self._led(live))
        if rows is not None:
            return None, self._allowed_sparse(state, rows)
        # position 0: every token, one gather from this state's row
        cur = self._class_row(state)[self._classes(0)]
        if np.count_nonzero(cur) * 8 < cur.shape[0]:  # few survive the first byte
            rows = np.flatnonzero(cur)
            return None, self._walk_rows(rows, cur[rows], 1)
        p = 1
        while p < prep.columns.shape[0]:
            n = int(prep.n_longer[p])  # tokens longer than p are the first n rows
            if n == 0:
                break
            # lockstep over a contiguous prefix: no compaction while most tokens live
            nxt = self._gather(cur[:n], self._classes(p))
            cur[:n] = nxt
            alive = int(np.count_nonzero(nxt))
            if alive == 0:
                break
            if alive * 8 < n or n < _DENSE_MIN_ROWS:  # few left: walk only the survivors
                out = cur != DEAD
                out[:n] = False
                out[self._walk_rows(np.flatnonzero(nxt), nxt[nxt != DEAD], p + 1)] = True
                return None, out
            p += 1
        return None, cur != DEAD

    def _like(self, state: int, depth: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Borrow the mask of the state most bytes lead to (`ref`): a token whose first byte
        b leads from `state` where it leads from `ref` walks alike from both, so its bit is
        ref's. Only tokens whose first byte goes elsewhere are walked (e.g. an object key:
        from the state after the quote, every byte but the property names' initials goes
        to the free-key loop). None when those are many, or `ref` is `state`."""
        row = self.row(state)
        targets = row[row != DEAD]
        if not targets.size:
            return None
        values, counts = np.unique(targets, return_counts=True)
        ref = int(values[np.argmax(counts)])
        if ref == state:
            return None
        ref_row = self.row(ref)
        differ = row != ref_row
        walked = differ & (row != DEAD)  # (a first byte dead from `state` allows nothing)
        prep = self.prepared
        counts = self._first_counts
        if int(counts[walked].sum()) * 8 >= prep.num_rows:
            return None  # many tokens start with a byte where the two rows differ
        # ref's tokens of the first bytes where the rows differ are dropped from the borrowed
        # mask one by one: when they outnumber the tokens it lends (a UTF-8 continuation state
        # beside a string's content state: nothing is shared), the state's own walk is cheaper
        lent = int(counts[~differ & (row != DEAD)].sum())
        if lent < int(counts[differ & (ref_row != DEAD)].sum()):
            return None
        words = self.bitmask(ref, depth + 1).view("<u4").copy()
        for e in self._eos.tolist():
            words[e >> 5] &= np.uint32(~(1 << (e & 31)) & 0xFFFFFFFF)
        # ref's tokens that start where the rows differ are not borrowed: cleared in the
        # C walk, which sets again those of them that walk from `state`
        if self._trie is not None:
            done = words.copy()
            if native.walk(self._trie, self.dfa, state, done, walked, clear_first=differ):
                return done.view("<i4"), _NO_ROWS
        gone = differ & (ref_row != DEAD)  # (ref's tokens of a first byte dead there: unset)
        clear_bits(words, self.vocab.ids_of_rows(self._led(gone, limit=False)))
        return words.view("<i4"), self._allowed_sparse(state, self._led(walked))

    def _chain(self, state: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The tokens from the first state of a counting chain (see `chains`): the pure ones
        of at most r characters as one shared set, the others walked from where their prefix
        lands; None when `state` starts no chain, or a short one (most tokens outlast it)."""
        with self._lock:  # chain steps are remembered per automaton
            start = self._chains.start(state)
            if start is None:
                return None
            c_set, all_chars = start
            key = ("chain", np.packbits(c_set).tobytes(), all_chars)
            layout = self.vocab.derived(key, lambda: chain_layout(self, c_set, all_chars))
            if layout is None:
                return None
            states, end = self._chains.follow(state, c_set, all_chars, MAX_FOLLOW)
        r = len(states) - 1
        loops = end == "loop"
        if end == "open" and layout.longer_than(r) * 8 >= self.prepared.num_rows:
            return None
        words = layout.pure_words(self, -1 if loops else r)
        others, group_q = layout.others, layout.group_q
        chain = np.asarray(states, dtype=np.int64)
        # the other tokens whose prefix ends inside the chain: walk their rest from there
        sel = np.arange(group_q.shape[0]) if loops else np.flatnonzero(group_q <= r)
        cur = self._gather(chain[np.minimum(group_q[sel], r)], self._cls(others.columns[0][sel]))
        alive = self._walk_rows(sel, cur, 1, others)
        parts = [csr_take(others.start, others.rows, alive)]
        if end == "open":  # tokens with more prefix characters than the chain: walk on
            long = layout.q > r
            # an ASCII one is r bytes into the chain at its end: walk the rest from there
            ascii_rows = np.flatnonzero(long & ~self.prepared.non_ascii)
            col = self.prepared.columns[r][ascii_rows]
            cur = self._gather(np.full(ascii_rows.shape[0], states[-1], np.int64), self._cls(col))
            parts.append(self._walk_rows(ascii_rows, cur, r + 1))
            parts.append(
                self._allowed_sparse(state, np.flatnonzero(long & self.prepared.non_ascii))
            )
        return words, np.concatenate(parts)

    def _classes(self, p: int) -> np.ndarray:
        """Byte p of every token longer than p, as its byte class (cached)."""
        col = self._ccols[p]
        if col is None:
            n = int(self.prepared.n_longer[p]) if p else self.prepared.num_rows
            col = self._ccols[p] = self._cls(self.prepared.columns[p][:n])
        return col

    def _led(self, live: np.ndarray, limit: bool = True) -> np.ndarray | None:
        """The rows of the tokens whose first byte is live (ascending), or None when they are
        more than an eighth of all (then a dense walk is cheaper) and `limit`."""
        prep = self.prepared
        first = np.flatnonzero(live)
        starts, ends = prep.first_start[first], prep.first_start[first + 1]
        if limit and int((ends - starts).sum()) * 8 >= prep.num_rows:
            return None
        parts = [prep.by_first[a:b] for a, b in zip(starts, ends, strict=True)]
        rows = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        rows.flags.writeable = False
        return rows

    def _allowed_sparse(self, state: int, rows: np.ndarray) -> np.ndarray:
        """The rows among `rows` (ascending) that walk from `state` without dying."""
        cur = self._class_row(state)[self._cls(self.prepared.columns[0][rows])]
        return self._walk_rows(rows, cur, 1)

    def _walk_rows(
        self,
        rows: np.ndarray,
        cur: np.ndarray,
        p: int,
        prep: PreparedTokens | Suffixes | None = None,
    ) -> np.ndarray:
        """Continue walking `rows` (ascending, in states `cur`) from byte position p; returns
        the surviving rows, ascending. `prep`: the byte layout (the vocabulary's by default)."""
        prep = prep or self.prepared
        n_longer, columns, width = prep.n_longer, prep.columns, prep.n_longer.shape[0]
        keep = cur.nonzero()[0]  # (DEAD is 0)
        if keep.size < cur.size:
            rows, cur = rows[keep], cur[keep]
        done: list[np.ndarray] = []
        while rows.size:
            # rows that end before byte p survived every byte: allowed
            cut = int(rows.searchsorted(n_longer[p])) if p < width else 0
            if cut < rows.size:
                done.append(rows[cut:])
                rows, cur = rows[:cut], cur[:cut]
            if not cut:
                break
            if rows.size <= 16:  # a few long tokens left: walk each one's rest in Python
                lives, cols, lengths = self._lives, prep.columns, prep.lengths
                ok = [
                    r
                    for r, c in zip(rows.tolist(), cur.tolist(), strict=True)
                    if lives(c, cols[p : lengths[r], r].tobytes())
                ]
                done.append(np.array(ok, dtype=np.int64))
                break
            cur = self._gather(cur, self._cls(columns[p].take(rows)))
            keep = cur.nonzero()[0]
            if keep.size < cur.size:
                rows, cur = rows[keep], cur[keep]
            p += 1
        if not done:
            return np.zeros(0, dtype=np.int64)
        # each chunk is ascending and holds longer tokens (smaller rows) than the one before
        return np.concatenate(done[::-1]) if len(done) > 1 else done[0]

    def pack(self, rows: np.ndarray, eos: np.ndarray | None = None) -> np.ndarray:
        """Packed id bits of a bool per prepared row, plus the `eos` ids."""
        prep = self.prepared
        full = np.zeros(prep.num_rows + 1, dtype=bool)  # last row: specials, never allowed
        full[:-1] = rows
        bits = np.zeros(self.num_words * 32, dtype=bool)
        bits[: prep.id_to_unique.shape[0]] = full[prep.id_to_unique]
        if eos is not None:
            bits[eos] = True
        return np.packbits(bits, bitorder="little").view("<i4")

    def _compute(self, state: int, depth: int = 0) -> np.ndarray:
        if state == DEAD:  # every byte loops on DEAD: it must not read as "transparent"
            return np.zeros(self.num_words, dtype=np.int32)
        if self.shortcut is not None:
            words = self.shortcut(state)
            if words is not None:
                return words
        if self._lazy:
            self.dfa.expand([state])
        shape = self._shapes.shape(state) if self._shapes is not None else None
        if shape is None:
            return self._computed(state, depth)
        key, dist = shape
        hit = self._by_shape.get(key)
        if hit is not None:
            words = self._shifted(state, hit[0], min(dist, hit[1]))
            if words is not None:
                return words
        words = self._computed(state, depth)
        if hit is None or dist > hit[1]:
            self._by_shape[key] = (words, dist)
        return words

    def _shifted(self, state: int, words: np.ndarray, dist: int) -> np.ndarray | None:
        """The mask of `state` from `words`, the mask of a state of its shape (both at least
        `dist` copies above the end of their copies): the tokens of at most D bytes as there,
        the longer ones walked. None when `dist` is too short to share much."""
        prep = self.prepared
        up_to = [d for d in _SHARED_UP_TO if d <= dist]
        if not up_to:
            return None
        d = up_to[-1]
        if d >= prep.columns.shape[0]:  # no token is longer
            return words
        n = int(prep.n_longer[d])  # the rows longer than d bytes: the first n
        longer = self.vocab.derived(("longer than", d), lambda: self.pack(prep.lengths > d))
        out = words.view("<u4") & ~longer.view("<u4")
        cur = self._class_row(state)[self._cls(prep.columns[0][:n])]
        ids = self.vocab.ids_of_rows(self._walk_rows(np.arange(n), cur, 1))
        set_bits(out, ids)
        return out.view("<i4")

    def _computed(self, state: int, depth: int) -> np.ndarray:
        """The mask of `state` by its own walk."""
        base, rows = self._allowed(state, depth)
        eos = self._eos if self.dfa.accepting[state] else self._eos[:0]
        if rows is _NO_ROWS:  # a C walk's own array (never a shared set): the EOS bits there
            words = base.view("<u4")
            for e in eos.tolist():
                words[e >> 5] |= np.uint32(1 << (e & 31))
            return base
        if rows.dtype == bool:  # most rows: one gather and a pack
            return self.pack(rows, eos)
        # a shared set plus a few rows, or only a few rows: set their bits directly
        if base is None:
            words = np.zeros(self.num_words, dtype=np.uint32)
        else:
            words = base.view("<u4").copy()
        set_bits(words, np.concatenate([self.vocab.ids_of_rows(rows), eos]))
        return words.view("<i4")


Layout = PreparedTokens | Suffixes  # byte columns of token rows, longest first
