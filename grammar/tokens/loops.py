"""Self-looping states (JSON string content, a pattern's character class repeated): the tokens
that surely walk back to the state (every byte of them loops) are one packed set per
vocabulary and loop shape, shared by every automaton; the others are cut after their looping
prefix and walked only from where they may leave (`Suffixes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from grammar.automata.fsm import DEAD
from grammar.tokens.vocab import PreparedTokens, TokenVocabulary, byte_columns


class TokenIndex(Protocol):
    """What the loop and chain tables read of a token index (`index.TokenIndex` is one)."""

    vocab: TokenVocabulary
    prepared: PreparedTokens

    def pack(self, rows: np.ndarray, eos: np.ndarray | None = None) -> np.ndarray:
        """Packed id bits of a bool per prepared row, plus the `eos` ids."""
        ...


# a self-looping state's other tokens are cut into suffixes (a Python pass over them, once
# per vocabulary and loop) only when they are few, as for JSON string content (~3k of 129k,
# ~6k of 151k): at most this many, or a sixteenth of the vocabulary's rows
_MAX_SUFFIX_ROWS = 4096
# UTF-8's well-formed multi-byte sequences: (lead byte range, continuation byte ranges)
_UTF8_FORMS = (
    ((0xC2, 0xDF), ((0x80, 0xBF),)),
    ((0xE0, 0xE0), ((0xA0, 0xBF), (0x80, 0xBF))),
    ((0xE1, 0xEC), ((0x80, 0xBF), (0x80, 0xBF))),
    ((0xED, 0xED), ((0x80, 0x9F), (0x80, 0xBF))),
    ((0xEE, 0xEF), ((0x80, 0xBF), (0x80, 0xBF))),
    ((0xF0, 0xF0), ((0x90, 0xBF), (0x80, 0xBF), (0x80, 0xBF))),
    ((0xF1, 0xF3), ((0x80, 0xBF), (0x80, 0xBF), (0x80, 0xBF))),
    ((0xF4, 0xF4), ((0x80, 0x8F), (0x80, 0xBF), (0x80, 0xBF))),
)


@dataclass(slots=True, frozen=True)
class Suffixes:
    """The tokens that leave a self-looping state (see `TokenIndex._transparent`), cut at the
    first byte that may not loop: what is before it brings the walk back to the same state.
    Distinct suffixes laid out like PreparedTokens (longest first, column per byte position);
    the token rows of suffix k are rows[start[k] : start[k + 1]]."""

    columns: np.ndarray
    n_longer: np.ndarray
    start: np.ndarray
    rows: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, tokens: dict[bytes, list[int]]) -> Suffixes:
        order = sorted(tokens, key=lambda b: (-len(b), b))
        return cls.of_groups([(b, tokens[b]) for b in order])

    @classmethod
    def of_groups(cls, groups: list[tuple[bytes, list[int]]]) -> Suffixes:
        """From (suffix, its rows) groups already ordered longest suffix first (a suffix may
        repeat: groups that differ in something else, e.g. where their walk starts)."""
        columns, n_longer, lengths = byte_columns([b for b, _ in groups])
        counts = np.array([len(rows) for _, rows in groups], dtype=np.int64)
        start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        rows = np.array([r for _, rs in groups for r in rs], dtype=np.int64)
        return cls(columns, n_longer, start, rows, lengths)


def transparent_set(
    index: TokenIndex, loops: np.ndarray, all_chars: bool
) -> tuple[np.ndarray, Suffixes | np.ndarray]:
    """(packed id bits of the tokens that surely loop, the others: Suffixes when few, else
    their rows) for a state whose byte self-loops are `loops` (see TokenIndex._transparent)."""
    prep = index.prepared
    bits = np.packbits(loops[:128], bitorder="little").view("<u8")
    outside = ~bits
    ok = ((prep.ascii_bits[0] & outside[0]) == 0) & ((prep.ascii_bits[1] & outside[1]) == 0)
    if all_chars:
        ok &= ~prep.non_ascii | prep.whole_chars
    else:
        ok &= ~prep.non_ascii
    words = index.pack(ok)
    words.flags.writeable = False
    others = np.flatnonzero(~ok)
    if others.size > max(_MAX_SUFFIX_ROWS, prep.num_rows // 16):  # a narrow loop: as rows
        others.flags.writeable = False
        return words, others
    return words, loop_suffixes(index, others, loops[:128].tolist(), all_chars)


def loop_suffixes(
    index: TokenIndex, rows: np.ndarray, loops: list[bool], all_chars: bool
) -> Suffixes:
    """Each of `rows` cut after its longest prefix of bytes that loop (ASCII in `loops`;
    whole UTF-8 characters too when `all_chars`), grouped by what is left."""
    prep, vocab = index.prepared, index.vocab
    first_id = prep.row_ids[prep.row_start[rows]].tolist()
    out: dict[bytes, list[int]] = {}
    for r, i in zip(rows.tolist(), first_id, strict=True):
        b = vocab.token_bytes(i)
        p, n = 0, len(b)
        while p < n:
            c = b[p]
            if c < 128:
                if not loops[c]:
                    break
                p += 1
                continue
            k = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            if not all_chars or not _is_whole_char(b[p : p + k], k):
                break
            p += k
        out.setdefault(b[p:], []).append(r)
    return Suffixes.of(out)


def chars_lead_to(dfa, state: int, target: int) -> bool:
    """Every whole UTF-8 character (of the forms in `_UTF8_FORMS`) read from `state` ends in
    `target`."""
    row = dfa.byte_row  # (numpy rows, sliced: most of these states are read only here)
    first = row(state)
    for leads, conts in _UTF8_FORMS:
        states = set(first[leads[0] : leads[1] + 1].tolist())
        for lo, hi in conts:
            if DEAD in states:
                return False
            nxt: set[int] = set()
            for t in states:
                nxt.update(row(t)[lo : hi + 1].tolist())
            states = nxt
        if states != {target}:
            return False
    return True


def loops_on_all_characters(dfa, state: int) -> bool:
    """Every multi-byte UTF-8 character read from `state` comes back to `state`."""
    return chars_lead_to(dfa, state, state)


def _is_whole_char(b: bytes, k: int) -> bool:
    """`b` is one complete, valid UTF-8 character of k bytes."""
    if len(b) != k:
        return False
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
