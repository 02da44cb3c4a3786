"""Counting chains (a string with maxLength, a bounded repeat of a character class): states
t_0 -> t_1 -> ... where every byte of one set C (and, for text, every whole UTF-8 character)
leads from t_j to t_{j+1}. A token made only of such characters, q of them, lands on t_q; so
from t_0 it lives exactly when q <= r (the chain's length), or always when the chain ends in a
self-loop. Its mask is then a per-vocabulary set (the pure tokens of at most r characters)
plus the few other tokens, cut after their C-prefix and walked from where that prefix lands.

What depends on the vocabulary and C only (each token's prefix length, whether it is pure, the
distinct suffixes of the others) is built once per vocabulary (`ChainLayout`); the chain itself
is followed per automaton, one step per state, remembered (`Chains`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from grammar.automata.fsm import DEAD
from grammar.tokens.loops import Suffixes, TokenIndex, chars_lead_to

# a chain is followed this many characters at most (a step costs ~9 row expansions, its UTF-8
# paths; the few tokens longer than that are walked on from its last state, one row a byte)
MAX_FOLLOW = 16
CLOSED = -1  # a chain's end where every one of its characters dies
_LEAD_LO, _LEAD_HI = 0xC2, 0xF4  # the lead bytes of multi-byte UTF-8 characters
# a chain's other tokens (not made of its characters) are cut into suffixes only when few
_MAX_OTHER_ROWS = 8192
_CONT_LO, _CONT_HI = 0x80, 0xBF


@dataclass(slots=True)
class ChainLayout:
    """For one C (ASCII bytes) and `all_chars` (whole UTF-8 characters count as steps too):
    q[row] the characters of the row's longest C-prefix, pure[row] the row is all prefix,
    `others` the other rows as (q, suffix) groups (group_q[k] for group k), and the pure sets
    by r, packed (built on first use)."""

    q: np.ndarray
    pure: np.ndarray
    sorted_q: np.ndarray
    others: Suffixes
    group_q: np.ndarray
    words: dict[int, np.ndarray] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pure_words(self, index: TokenIndex, r: int) -> np.ndarray:
        """Packed id bits of the pure rows of at most r characters (r = -1: any number)."""
        hit = self.words.get(r)
        if hit is None:
            rows = self.pure if r < 0 else self.pure & (self.q <= r)
            hit = index.pack(rows)
            hit.flags.writeable = False
            with self.lock:
                hit = self.words.setdefault(r, hit)
        return hit

    def longer_than(self, r: int) -> int:
        """How many rows have more than r prefix characters."""
        return int(self.sorted_q.shape[0] - np.searchsorted(self.sorted_q, r, side="right"))


def chain_layout(index: TokenIndex, c_set: np.ndarray, all_chars: bool) -> ChainLayout | None:
    """The layout for C = `c_set` (bool [128]); None when the other tokens are too many."""
    prep = index.prepared
    n = prep.num_rows
    lut = np.zeros(256, dtype=bool)  # a byte that may be part of the C-prefix
    lut[:128] = c_set
    if all_chars:
        lut[128:] = True  # inside a token of whole characters, any byte >= 0x80 is in one
    whole = prep.whole_chars if all_chars else np.ones(n, dtype=bool)
    q_bytes = np.zeros(n, dtype=np.int64)  # bytes of the prefix
    q = np.zeros(n, dtype=np.int64)  # characters of the prefix
    going = np.ones(n, dtype=bool)  # the prefix has not ended before byte p
    for p in range(prep.columns.shape[0]):
        k = int(prep.n_longer[p])  # rows longer than p: the first k
        if k == 0:
            break
        col = prep.columns[p][:k]
        step = going[:k] & lut[col]
        going[:k] = step
        going[k:] = False
        q_bytes[:k] += step
        q[:k] += step & ((col < _CONT_LO) | (col > _CONT_HI))
    # a token with a split character: no prefix (walked whole from t_0)
    split = ~whole
    q_bytes[split] = 0
    q[split] = 0
    pure = (q_bytes == prep.lengths) & whole
    other_rows = np.flatnonzero(~pure)
    if other_rows.size > _MAX_OTHER_ROWS:
        return None
    groups: dict[tuple[int, bytes], list[int]] = {}
    first_id = prep.row_ids[prep.row_start[other_rows]].tolist()
    for r, i, qb, qc in zip(
        other_rows.tolist(),
        first_id,
        q_bytes[other_rows].tolist(),
        q[other_rows].tolist(),
        strict=True,
    ):
        groups.setdefault((qc, index.vocab.token_bytes(i)[qb:]), []).append(r)
    order = sorted(groups, key=lambda k: (-len(k[1]), k[1], k[0]))
    others = Suffixes.of_groups([(k[1], groups[k]) for k in order])
    group_q = np.array([k[0] for k in order], dtype=np.int64)
    q.flags.writeable = False
    pure.flags.writeable = False
    return ChainLayout(q, pure, np.sort(q), others, group_q)


class Chains:
    """The chain steps of one automaton: for a state, (C key, all_chars, next state) when its
    C bytes (and characters) all lead to one state, else None. Remembered per state."""

    def __init__(self, dfa) -> None:
        self.dfa = dfa
        self._step: dict[int, tuple[bytes, bool, int] | None] = {}

    def start(self, state: int) -> tuple[np.ndarray, bool] | None:
        """C and all_chars for a chain from `state` (a state that does not self-loop on most
        ASCII), or None: C is the ASCII bytes that go where most printable ones go."""
        row = self.dfa.row_list(state)
        succ = [t for t in row[0x20:0x7F] if t != DEAD]
        if len(succ) < 64:
            return None
        nxt = max(set(succ), key=succ.count)
        if nxt == state:
            return None
        c_set = np.array([t == nxt for t in row[:128]], dtype=bool)
        if np.count_nonzero(c_set) < 64:
            return None
        return c_set, chars_lead_to(self.dfa, state, nxt)

    def step(self, state: int, c_idx: list[int], key: bytes, all_chars: bool) -> int:
        """The state after one chain character from `state`; when `state` ends the chain,
        CLOSED if every chain character dies there, else DEAD (some live on elsewhere)."""
        hit = self._step.get(state)
        if hit is not None and hit[0] == key and hit[1] == all_chars:
            return hit[2]
        row = self.dfa.row_list(state)
        nxt = row[c_idx[0]]
        if any(row[c] != nxt for c in c_idx):
            nxt = DEAD
        elif nxt == DEAD:  # every C byte dies: closed if every character does too
            if not all_chars or not any(row[_LEAD_LO : _LEAD_HI + 1]):
                nxt = CLOSED
        elif all_chars and not chars_lead_to(self.dfa, state, nxt):
            nxt = DEAD
        self._step[state] = (key, all_chars, nxt)
        return nxt

    def follow(
        self, state: int, c_set: np.ndarray, all_chars: bool, limit: int
    ) -> tuple[list[int], str]:
        """t_0 = state, t_1, ... up to `limit` steps; (the states, how the chain ends after the
        last: "loop" (it loops on every chain character), "closed" (they all die there), or
        "open" (unknown: tokens longer than the chain must be walked))."""
        key = np.packbits(c_set).tobytes()
        c_idx = np.flatnonzero(c_set).tolist()
        states = [state]
        while len(states) <= limit:
            nxt = self.step(states[-1], c_idx, key, all_chars)
            if nxt == CLOSED:
                return states, "closed"
            if nxt == DEAD:
                return states, "open"
            if nxt == states[-1]:
                return states, "loop"
            states.append(nxt)
        return states, "open"
