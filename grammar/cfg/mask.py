"""Token masks for a (parser stack, lexer state) pair, from cached vocabulary decompositions.

A token read from lexer state q either stays inside the current terminal (it ends in a live
lexer state), or crosses terminal boundaries (the lexer cuts inside it: the next byte continues
no candidate, the text so far is a terminal). The first kind depends on the parser only through
which terminals it accepts; the second needs the parser to take the cut terminal and the rest of
the token to be lexed in the new context.

`Decomposition` is the parser-independent part, computed once per (lexer, q) by walking the
vocabulary vectorised with numpy:

    within[k] = (alive terminal bitset, packed mask of the tokens ending in such states)
    cuts[g]   = (terminal cut first, token rows, byte offset of the cut)   for tokens that cross

Evaluating a decomposition for a parser stack ORs the `within` masks whose terminals the stack
accepts, and for each cut group feeds the terminal to the parser and evaluates the group's
remainders (themselves decomposed once per next lexer) recursively. Tokens whose first byte is
already a cut (the terminal ended exactly at q) reuse the whole mask of the next stack, ANDed
with a per-first-byte mask, so the common case costs a few ORs of packed words.
"""

from __future__ import annotations

import numpy as np

from grammar.cfg.lexer import DEAD, ContextLexer
from grammar.cfg.native_walk import CutWalker
from grammar.tokens.vocab import TokenVocabulary


class TokenRows:
    """The distinct non-empty token byte strings, sorted, as a zero-padded column-major byte
    matrix: columns[p, r] is byte p of row r; lengths[r]; the rows starting with byte b are
    first_start[b]:first_start[b + 1]; id_to_unique[i] is the row of id i, or U (a row never
    allowed) for special / empty ids."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        data = [vocab.token_bytes(i) for i in range(len(vocab))]
        distinct = sorted({b for b in data if b})
        row_of = {b: r for r, b in enumerate(distinct)}
        width = max((len(b) for b in distinct), default=1)
        joined = np.frombuffer(b"".join(distinct), dtype=np.uint8)
        self.lengths = np.array([len(b) for b in distinct], dtype=np.int32)
        starts = np.cumsum(self.lengths) - self.lengths
        matrix = np.zeros((len(distinct), width), dtype=np.uint8)
        # scatter every byte to (row, position) without a Python loop over bytes
        row_idx = np.repeat(np.arange(len(distinct)), self.lengths)
        pos_idx = np.arange(joined.shape[0]) - np.repeat(starts, self.lengths)
        matrix[row_idx, pos_idx] = joined
        self.columns = np.ascontiguousarray(matrix.T)
        first = matrix[:, 0] if len(distinct) else np.zeros(0, dtype=np.uint8)
        self.first_start = np.searchsorted(first, np.arange(257), side="left").astype(np.int64)
        self.id_to_unique = np.array(
            [row_of[b] if b else len(distinct) for b in data], dtype=np.int32
        )


class VocabLayout:
    """The token rows plus packed masks per first byte (built once per vocabulary)."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        self.prepared = TokenRows(vocab)
        self.num_tokens = len(vocab)
        self.num_words = (len(vocab) + 31) // 32
        self.num_rows = int(self.prepared.lengths.shape[0])
        self.eos = np.array(vocab.eos_token_ids, dtype=np.int64)
        fs = self.prepared.first_start
        # rows -> token ids (CSR): ids_by_row[row_start[r]:row_start[r + 1]] have bytes of row r
        order = np.argsort(self.prepared.id_to_unique, kind="stable")
        self.ids_by_row = order.astype(np.int64)
        self.row_start = np.searchsorted(
            self.prepared.id_to_unique[order], np.arange(self.num_rows + 2)
        ).astype(np.int64)
        self.first_byte_masks = np.stack(
            [self.rows_to_words(np.arange(fs[b], fs[b + 1])) for b in range(256)]
        )  # [256, words]
        self.any_first = np.bitwise_or.reduce(self.first_byte_masks, axis=0)  # non-empty ids
        self.empty = np.zeros(self.num_words, dtype=np.int32)

    def rows_to_words(self, rows: np.ndarray) -> np.ndarray:
        """Packed token-id mask (int32 words) of every id whose bytes are one of `rows`."""
        if rows.shape[0] * 64 < self.num_rows:
            # few rows: set their ids' bits directly
            starts, ends = self.row_start[rows], self.row_start[rows + 1]
            counts = ends - starts
            offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts)
            ids = self.ids_by_row[np.arange(int(counts.sum()), dtype=np.int64) + offsets]
            words = np.zeros(self.num_words, dtype=np.uint32)
            np.bitwise_or.at(words, ids >> 5, np.left_shift(1, ids & 31).astype(np.uint32))
            return words.view(np.int32)
        allowed = np.zeros(self.num_rows + 1, dtype=bool)  # last row: specials, never allowed
        allowed[rows] = True
        bits = np.zeros(self.num_words * 32, dtype=bool)
        bits[: self.num_tokens] = allowed[self.prepared.id_to_unique]
        return np.packbits(bits, bitorder="little").view("<i4")

    def first_bytes_words(self, byte_set: np.ndarray) -> np.ndarray:
        """Packed mask of the tokens whose first byte is in `byte_set` (bool [256]): the bytes'
        masks ORed, or, for more than half the bytes, those of the others, complemented (no
        copy of every picked byte's row: ~1 ms for a lexer state's ~200 dead bytes at 129k
        tokens, cold)."""
        n = int(np.count_nonzero(byte_set))
        if not n:
            return self.empty
        few = byte_set if n <= 128 else ~byte_set
        out = self.empty.copy()
        for b in np.flatnonzero(few).tolist():
            np.bitwise_or(out, self.first_byte_masks[b], out=out)
        return out if n <= 128 else np.bitwise_and(self.any_first, ~out, out=out)


class Decomposition:
    """The parser-independent split of a set of token (suffixes) read from one lexer state.
    A cut group is (terminal, token rows, byte offsets) from the numpy walk, or (terminal, trie
    nodes, None) from the C one (`native_decompose`)."""

    __slots__ = ("within", "cuts", "children", "children_len")

    def __init__(self) -> None:
        self.children_len: dict[int, int] = {}  # LR state -> top states its evaluation reads
        self.within: list[tuple[int, np.ndarray]] = []
        self.cuts: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.children: dict[tuple[int, int], Decomposition] = {}


def decompose(
    layout: VocabLayout, lexer: ContextLexer, q0: int, rows: np.ndarray, pos: np.ndarray
) -> Decomposition:
    """Walk token rows from byte offsets `pos` through `lexer` starting at state q0."""
    prep = layout.prepared
    width = prep.columns.shape[1]
    cols = prep.columns.reshape(-1)  # flat: byte p of row r at p * width + r
    table = lexer.table.reshape(-1)  # flat: state s, byte b at s * 256 + b
    winner = lexer.winner_arr
    lens = prep.lengths[rows].astype(np.int64)
    cur = np.full(rows.shape[0], q0, dtype=np.int64)
    end_rows, end_states, cut_rows, cut_pos, cut_terms = [], [], [], [], []
    while rows.size:
        # the next byte of every live token, and where it leads
        nxt = table[cur * 256 + cols[pos * width + rows]].astype(np.int64)
        dead = nxt == DEAD
        if dead.any():
            # a dead byte is a cut if the text so far is a terminal; else the token is refused
            w = winner[cur[dead]]
            ok = w >= 0
            cut_rows.append(rows[dead][ok])
            cut_pos.append(pos[dead][ok])
            cut_terms.append(w[ok])
            live = ~dead
            rows, cur, pos, lens = rows[live], nxt[live], pos[live] + 1, lens[live]
        else:
            cur, pos = nxt, pos + 1
        # tokens that end here stay inside a terminal: remember their end state
        ended = pos == lens
        if ended.any():
            end_rows.append(rows[ended])
            end_states.append(cur[ended])
            keep = ~ended
            rows, cur, pos, lens = rows[keep], cur[keep], pos[keep], lens[keep]
    d = Decomposition()
    if end_rows:
        er, es = np.concatenate(end_rows), np.concatenate(end_states)
        # group the end states by which terminals are still alive there
        alive_ids: dict[int, int] = {}
        state_group = np.array(
            [alive_ids.setdefault(a, len(alive_ids)) for a in lexer.alive], dtype=np.int64
        )
        groups = state_group[es]
        for alive, k in alive_ids.items():
            sel = groups == k
            if sel.any():
                d.within.append((alive, layout.rows_to_words(er[sel])))
    if cut_rows:
        cr, cp, ct = np.concatenate(cut_rows), np.concatenate(cut_pos), np.concatenate(cut_terms)
        for t in np.unique(ct).tolist():
            sel = ct == t
            # int32 (rows < 2**31, offsets < the longest token): the cut lists are most of the
            # memory a decomposition keeps
            d.cuts.append((int(t), cr[sel].astype(np.int32), cp[sel].astype(np.int32)))
    return d


def native_decompose(walker: CutWalker, lexer: ContextLexer, tasks: np.ndarray) -> Decomposition:
    """`decompose` by the C trie walk: the same masks; a cut group keeps trie nodes (each with
    its subtree, the rest of the tokens below it) instead of (row, offset) pairs, its third
    field None."""
    groups, alive = lexer.alive_groups()
    words, used, nodes, terms = walker.lexer(lexer.table, lexer.winner32, groups, len(alive), tasks)
    d = Decomposition()
    for k, g in enumerate(used.tolist()):
        d.within.append((alive[g], words[k]))
    if nodes.size:
        order = np.argsort(terms, kind="stable")
        terms, nodes = terms[order], nodes[order]
        bounds = np.flatnonzero(np.diff(terms)) + 1
        for part, t in zip(np.split(nodes, bounds), terms[np.r_[0, bounds]].tolist(), strict=True):
            d.cuts.append((int(t), part, None))
    return d


def top_decomposition(layout: VocabLayout, lexer: ContextLexer, q0: int) -> Decomposition:
    """Every token read from q0, except those whose first byte is already a cut."""
    fs = layout.prepared.first_start
    live_first = np.flatnonzero(~lexer.dead_bytes[q0])
    rows = (
        np.concatenate([np.arange(fs[b], fs[b + 1]) for b in live_first])
        if live_first.size
        else np.zeros(0, dtype=np.int64)
    )
    return decompose(layout, lexer, q0, rows.astype(np.int64), np.zeros(rows.shape[0], np.int64))
