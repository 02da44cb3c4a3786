"""Per-state token masks: which tokens keep a DFA alive from a state, as packed bitsets.

Masks are computed lazily, the first time a state is visited, and cached. One computation walks
every candidate token through the DFA in lockstep over byte position with numpy gathers: only
tokens whose first byte is live are candidates, and tokens drop out as soon as they die or end.
"""

from __future__ import annotations

import threading

import numpy as np

from grammar.fsm import DEAD, ByteDFA
from grammar.vocab import TokenVocabulary


class TokenIndex:
    """Token masks of one DFA over one vocabulary.

    bitmask(state) is an int32 array of ceil(V/32) words; bit b of word w allows token 32*w+b.
    EOS ids are allowed exactly in accepting states. A returned array is shared: never write it.
    """

    def __init__(self, dfa: ByteDFA, vocab: TokenVocabulary) -> None:
        self.dfa = dfa
        self.vocab = vocab
        self.prepared = vocab.prepared()
        self.num_words = (len(vocab) + 31) // 32
        self.byte_table = np.ascontiguousarray(dfa.byte_table())  # [n_states, 256]
        self._flat = self.byte_table.reshape(-1)
        self._eos = np.array(vocab.eos_token_ids, dtype=np.int64)
        self._masks: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def bitmask(self, state: int) -> np.ndarray:
        words = self._masks.get(state)
        if words is None:
            words = self._compute(state)
            with self._lock:
                words = self._masks.setdefault(state, words)
        return words

    @property
    def states_computed(self) -> int:
        return len(self._masks)

    def allowed_rows(self, state: int) -> np.ndarray:
        """Rows of the prepared (distinct) tokens that walk from `state` without dying."""
        prep, flat = self.prepared, self._flat
        row = self.byte_table[state]
        # candidates: the contiguous runs of tokens whose first byte is live here
        live_first = np.flatnonzero(row)
        starts = prep.first_start[live_first]
        counts = prep.first_start[live_first + 1] - starts
        total = int(counts.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64)
        offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
        idx = np.arange(total, dtype=np.int64) + offsets
        cur = row[prep.columns[0][idx]].astype(np.int64)
        lens = prep.lengths[idx]
        done = []
        pos = 1
        while True:
            # tokens that end here survived every byte: allowed
            ended = lens == pos
            if ended.any():
                done.append(idx[ended])
                keep = ~ended
                idx, cur, lens = idx[keep], cur[keep], lens[keep]
            if idx.size == 0:
                break
            # advance the rest by their next byte; drop those that die
            nxt = flat[cur * 256 + prep.columns[pos][idx]]
            alive = nxt != DEAD
            idx, cur, lens = idx[alive], nxt[alive].astype(np.int64), lens[alive]
            pos += 1
            if idx.size == 0:
                break
        return np.concatenate(done) if done else np.zeros(0, dtype=np.int64)

    def _compute(self, state: int) -> np.ndarray:
        prep = self.prepared
        allowed = np.zeros(prep.lengths.shape[0] + 1, dtype=bool)  # last row: never allowed
        allowed[self.allowed_rows(state)] = True
        bits = np.zeros(self.num_words * 32, dtype=bool)
        bits[: prep.id_to_unique.shape[0]] = allowed[prep.id_to_unique]
        if self.dfa.accepting[state] and self._eos.size:
            bits[self._eos] = True
        return np.packbits(bits, bitorder="little").view("<i4")
