"""Context-free first visits in C: the vocabulary's token trie (`grammar.tokens.native`'s, built
once per vocabulary) walked through one lark lexer's or one GBNF terminal's byte table, split into
the tokens that end inside the terminal (packed masks) and the trie nodes where a terminal
boundary cuts them. The numpy walks (`grammar.cfg.mask.decompose`, the GBNF compiler's
`decompose`) read every live token row at every byte position (~10 numpy calls a position); a
trie walk visits each live token prefix once, a few nanoseconds a node.

A cut is kept as a trie node (int32): the rest of every token below it is walked later, from the
next terminal's start, as a task of the C walk (csrc/cut_walk.c: a node >= 0 walks that node and
its subtree, `~node` its strict descendants), where the numpy walks keep (token row, byte offset)
pairs. The two give the same masks bit for bit (tests/grammar/cfg/test_native_walk.py).

The C source is compiled at first use like the grammar's other native code
(`grammar/native_build.py`) and called through ctypes, which releases the GIL. `trie_for(vocab)`
is None, and callers keep their numpy walks, when SGL_GRAMMAR_NATIVE=0, when no compiler is found
or the build fails, or when the vocabulary has no trie.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from pathlib import Path
from typing import NamedTuple

import numpy as np

from grammar import native_build
from grammar.tokens import native
from grammar.tokens.vocab import TokenVocabulary, csr_take

_FLAGS = ("-O2", "-march=native", "-fPIC", "-std=gnu11")
UNITS = [native_build.Unit("cut_walk", Path(__file__).parent / "csrc" / "cut_walk.c", _FLAGS)]
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
SIGNATURES: native_build.Signatures = {
    "walk_terminal": (
        _I64,
        [_PTR] * 7 + [_I64, _I64, _PTR, _PTR, _I64] + [_PTR] * 7 + [_I64, _PTR, _I64],
    ),
    "child_sigs": (None, [_PTR, _I64, _PTR]),
    "desc_sigs": (None, [_PTR, _I64, _PTR, _PTR]),
    "walk_lexer": (_I64, [_PTR] * 7 + [_I64, _PTR, _I64, _PTR, _PTR, _PTR, _I64]),
    "loop_states": (None, [_PTR, _I64] + [_PTR] * 3 + [_I64, _PTR, _PTR]),
}
LIBRARY = native_build.OptionalLibrary("grammar-cut-walk", UNITS, SIGNATURES, "using numpy walks")
ROOT = -1  # the task node of "every token" (~0: the root's descendants)
SKIP_FROM_START, SET_ACCEPTS = 1, 2  # walk_terminal's modes
_LOOP_LOCK = threading.Lock()


class LoopWalk(NamedTuple):
    """A loop set ready for `CutWalker.terminal` (the arrays held: the addresses stay valid):
    `words`, the mask of the tokens that stay in the set from its first state."""

    words: np.ndarray
    clean: np.ndarray
    index: np.ndarray
    clean_ptr: int
    index_ptr: int


SPARSE_WORDS = 64  # a walk that sets at most this many mask words returns them as SparseWords
_SPARSE_FROM = 2048  # ... with rows of this many words or more (smaller: dense is cheaper)


class SparseWords(NamedTuple):
    """A mask with few nonzero words (most remainder walks: a handful of tokens): the int64
    word indices (distinct) and their int32 words. A full row of a 151k vocabulary is 19 KB
    of fresh pages to fault in; this is tens of bytes."""

    index: np.ndarray
    values: np.ndarray

    def into(self, out: np.ndarray) -> np.ndarray:
        """OR into the packed mask `out` (its word indices are distinct: plain fancy |=)."""
        out[self.index] |= self.values
        return out


class CutWalker:
    """The C walks over one vocabulary's trie (see the module docstring)."""

    def __init__(self, trie: native.TokenTrie, lib: ctypes.CDLL, num_words: int) -> None:
        self.trie = trie
        self.lib = lib
        self.num_words = num_words
        self.sparse_words = SPARSE_WORDS if num_words >= _SPARSE_FROM else 0
        self.num_nodes = int(trie.nodes.shape[0])
        # per node, the bytes of its children (csrc/cut_walk.c's child_sigs: 3 x 64 bits)
        self.child_sig = np.empty((self.num_nodes, 3), dtype=np.uint64)
        lib.child_sigs(trie.ptrs[0], self.num_nodes, self.child_sig.ctypes.data)
        self._sig_ptr = self.child_sig.ctypes.data
        # per node, the bytes of every node below it (the same signatures)
        self.desc_sig = np.empty((self.num_nodes, 3), dtype=np.uint64)
        lib.desc_sigs(trie.ptrs[0], self.num_nodes, self._sig_ptr, self.desc_sig.ctypes.data)
        self._desc_ptr = self.desc_sig.ctypes.data
        # every node's token ids in preorder (a subtree's ids are one slice: clean subtrees)
        self.pre_start, self.pre_ids = preorder_ids(trie)
        self._pre_ptrs = (self.pre_start.ctypes.data, self.pre_ids.ctypes.data)
        self._terms: dict[tuple[int, int, int], tuple] = {}  # see _term_ptrs
        # loop state set -> (packed mask of the tokens that stay in it, `clean` per node)
        self._loops: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    @staticmethod
    def tasks(nodes: np.ndarray, state: int) -> np.ndarray:
        """The task pairs (node, state) of cut nodes, all from `state` (int64 [n, 2])."""
        out = np.empty((nodes.shape[0], 2), dtype=np.int64)
        out[:, 0] = nodes
        out[:, 1] = state
        return out

    def loop(self, sub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(packed int32 mask of the tokens whose every byte, read from the first state of a
        set S of a terminal's states, stays in S; uint8 per trie node: bit k when the node's
        byte read from S's state k, and every path of its subtree, stays in S). `sub`: int8
        [len(S) <= 8, 256], the index in S each byte leads to from each state (-1: out of S),
        as `loop_set` builds it. Cached per set (vocabulary-wide, ~1-2 ms a set at 129k
        tokens; see csrc/cut_walk.c's loop_states)."""
        sub = np.ascontiguousarray(sub, dtype=np.int8)
        key = sub.tobytes()
        hit = self._loops.get(key)
        if hit is None:
            words = np.zeros(self.num_words, dtype=np.uint32)
            clean = np.empty(self.num_nodes, dtype=np.uint8)
            nodes, row_start, row_ids = self.trie.ptrs
            self.lib.loop_states(
                nodes, self.num_nodes, row_start, row_ids, sub.ctypes.data, sub.shape[0],
                words.ctypes.data, clean.ctypes.data,
            )  # fmt: skip
            with _LOOP_LOCK:
                if len(self._loops) > 64:
                    self._loops.clear()
                hit = self._loops.setdefault(key, (words.view(np.int32), clean))
        return hit

    def prepare(self, sub: np.ndarray, index: np.ndarray) -> LoopWalk:
        """A loop set as `terminal` reads it (see `loop_set`)."""
        words, clean = self.loop(sub)
        index = np.ascontiguousarray(index, dtype=np.int8)
        return LoopWalk(words, clean, index, clean.ctypes.data, index.ctypes.data)

    def terminal(
        self, table: np.ndarray, accepting: np.ndarray, live: np.ndarray, starts: np.ndarray,
        state: int, in_set: LoopWalk | None = None, mode: int = 0,
    ) -> tuple[np.ndarray | SparseWords | None, np.ndarray]:  # fmt: skip
        """A GBNF terminal's walk (csrc/cut_walk.c's walk_terminal) of the cuts `starts`
        (int32, contiguous: ~i the descendants of node i, ROOT every token, i >= 0 a region)
        from `state`: (packed int32 mask of the tokens that end inside it, or None when none
        does; its own cuts, the same way). `table`: int32 [states, 256], C order;
        `accepting`, `live`: bool per state; `in_set`: a loop set (`prepare`), whose subtrees
        are not walked node by node; `mode`: SET_ACCEPTS when its states accept (its subtrees
        are region cuts), SKIP_FROM_START when `state` is its first and the caller has the
        mask of the tokens that stay in it from there (`in_set.words`). A mask of at most
        SPARSE_WORDS nonzero words comes back as SparseWords (vocabularies of 64k tokens or
        more: a smaller row costs less to OR and fault in than the sparse form's fancy
        indexing)."""
        scratch = _scratch
        words, words_ptr = scratch.mask_row(self.num_words)
        term = self._term_ptrs(table, accepting, live)
        clean, index = (None, None) if in_set is None else (in_set.clean_ptr, in_set.index_ptr)
        cuts = scratch.cuts(self.num_nodes)  # (reused: copied out below)
        nodes, row_start, row_ids = self.trie.ptrs
        while True:
            n = self.lib.walk_terminal(
                nodes, row_start, row_ids, *term, starts.ctypes.data, starts.shape[0], state,
                clean, index, mode, self._sig_ptr, self._desc_ptr, *self._pre_ptrs, words_ptr,
                scratch.inside_ptr, scratch.touched_ptr, self.sparse_words, scratch.ptr,
                cuts.shape[0],
            )  # fmt: skip
            if n >= 0:
                break
            words[:] = 0
            cuts = scratch.cuts(cuts.shape[0] * 2)
        if not scratch.inside[0]:
            return None, cuts[:n].copy()  # (the row is still all zeros: the next walk's)
        n_words = int(scratch.inside[1])
        if n_words <= self.sparse_words:  # the few words set, and the row zeroed for the next walk
            index = scratch.touched[:n_words].astype(np.int64)
            sparse = SparseWords(index, words[index].view(np.int32))
            words[index] = 0
            return sparse, cuts[:n].copy()
        scratch.rows_used += 1
        return words.view(np.int32), cuts[:n].copy()

    def prepare_terminal(self, table: np.ndarray, accepting: np.ndarray, live: np.ndarray) -> None:
        """Make a terminal's arrays ready for `terminal` now (while compiling)."""
        self._term_ptrs(table, accepting, live)

    def _term_ptrs(
        self, table: np.ndarray, accepting: np.ndarray, live: np.ndarray
    ) -> tuple[int, int, int]:
        """The addresses C reads a terminal's table and flags at (an array's .ctypes.data
        costs ~1 us a read: kept per terminal, with the arrays, so the addresses stay valid)."""
        key = (id(table), id(accepting), id(live))
        hit = self._terms.get(key)
        if hit is None:
            arrays = (
                np.ascontiguousarray(table, dtype=np.int32),
                _bytes_of(accepting),
                _bytes_of(live),
            )
            hit = (arrays[0].ctypes.data, arrays[1].ctypes.data, arrays[2].ctypes.data)
            with _LOOP_LOCK:
                if len(self._terms) > 4096:
                    self._terms.clear()
                # the inputs are held too: their ids stay theirs while the entry lives
                self._terms[key] = hit, (table, accepting, live, arrays)
            return hit
        return hit[0]

    def lexer(
        self, table: np.ndarray, winner: np.ndarray, group: np.ndarray, n_groups: int,
        tasks: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """A lark lexer's walk (csrc/cut_walk.c's walk_lexer): (packed int32 masks [k, words]
        of the tokens ending in a state of each of the k groups that have any; those groups'
        indices, int64 [k]; cut nodes, int32; the terminal each cut produces, int32). The walk
        writes into per-thread zeroed rows and buffers (fresh ones a walk would cost ~16 KB of
        page faults a group at 129k tokens, most of them left empty)."""
        scratch = _scratch
        words = scratch.lexer_rows(n_groups, self.num_words)
        used = np.zeros(n_groups, dtype=np.uint8)
        tasks = np.ascontiguousarray(tasks, dtype=np.int64)
        cap = self.num_nodes
        nodes, row_start, row_ids = self.trie.ptrs
        while True:
            cuts, terms = scratch.cuts(cap), scratch.cut_terms(cap)
            n = self.lib.walk_lexer(
                nodes, row_start, row_ids, table.ctypes.data, winner.ctypes.data,
                group.ctypes.data, tasks.ctypes.data, tasks.shape[0], words.ctypes.data,
                self.num_words, used.ctypes.data, cuts.ctypes.data, terms.ctypes.data, cap,
            )  # fmt: skip
            if n >= 0:
                picked = np.flatnonzero(used)
                out = words[picked].view(np.int32)
                words[picked] = 0  # (zeroed again for the next walk)
                return out, picked, cuts[:n].copy(), terms[:n].copy()
            words[:] = 0
            used[:] = 0
            cap *= 2


def preorder_ids(trie: native.TokenTrie) -> tuple[np.ndarray, np.ndarray]:
    """(pre_start: int64 [nodes + 1], pre_ids: int32): the token ids of every trie node in
    preorder, node i's from pre_start[i], so a subtree's ids are one contiguous slice."""
    rows = trie.nodes["row"].astype(np.int64)
    has = rows >= 0
    counts = np.zeros(rows.shape[0], dtype=np.int64)
    counts[has] = trie.row_start[rows[has] + 1] - trie.row_start[rows[has]]
    pre_start = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=pre_start[1:])
    pre_ids = csr_take(trie.row_start, trie.row_ids, rows[has]).astype(np.int32)
    return pre_start, np.ascontiguousarray(pre_ids)


MAX_SET = 8  # states of a loop set (csrc/cut_walk.c keeps one bit per state in a byte)


def loop_set(
    table: np.ndarray, accepting: np.ndarray, live: np.ndarray, q: int
) -> tuple[np.ndarray, np.ndarray]:
    """The loop set S of state q of a terminal (int32 table [states, 256], 0 = dead): the live
    states that accept as q does (or do not, as q does not) reachable from q, and back,
    through such states (a JSON string's body with its UTF-8 and escape states), q first, at
    most MAX_SET (any such subset is exact, a smaller one skips less). Returns (sub: int8
    [len(S), 256], the index in S each byte leads to, -1 outside; index: int8 per state, -1
    outside S)."""
    inner = (accepting == accepting[q]) & live
    inner[0] = False

    def reach(step) -> np.ndarray:
        seen = np.zeros(table.shape[0], dtype=bool)
        seen[q] = True
        frontier = [q]
        while frontier:
            nxt = step(np.asarray(frontier)) & inner & ~seen
            seen |= nxt
            frontier = np.flatnonzero(nxt).tolist()
        return seen

    def forward(states: np.ndarray) -> np.ndarray:
        out = np.zeros(table.shape[0], dtype=bool)
        out[table[states].reshape(-1)] = True
        return out

    def backward(states: np.ndarray) -> np.ndarray:
        return np.isin(table, states).any(axis=1)

    both = reach(forward) & reach(backward)
    order = [q] + [int(s) for s in np.flatnonzero(both) if s != q][: MAX_SET - 1]
    index = np.full(table.shape[0], -1, dtype=np.int8)
    index[order] = np.arange(len(order), dtype=np.int8)
    sub = index[table[order]]
    return sub, index


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _bytes_of(flags: np.ndarray) -> np.ndarray:
    """A bool array as the uint8 bytes C reads (a view when already contiguous)."""
    flags = np.ascontiguousarray(flags)
    return flags.view(np.uint8) if flags.dtype == np.bool_ else flags.astype(np.uint8)


_ROWS = 32  # mask rows allocated at a time for `terminal`'s results


class _Scratch(threading.local):
    """A cut buffer per thread, grown as needed (a fresh one a walk would cost an allocation
    of the trie's size), and the zeroed mask rows walks write into, handed out one by one
    (np.zeros and reading an address cost ~1 us each, a remainder walk ~10 us in all)."""

    def __init__(self) -> None:
        self.buffer = np.empty(0, dtype=np.int32)
        self.ptr = self.buffer.ctypes.data
        # walk_terminal's count of tokens inside and of the words it set, listed in `touched`
        self.inside = np.zeros(2, dtype=np.int64)
        self.inside_ptr = self.inside.ctypes.data
        self.touched = np.zeros(SPARSE_WORDS, dtype=np.int32)
        self.touched_ptr = self.touched.ctypes.data
        self.rows = np.zeros((0, 0), dtype=np.uint32)
        self.rows_ptr = 0
        self.rows_used = _ROWS
        self.terms = np.empty(0, dtype=np.int32)
        self.lex_rows = np.zeros((0, 0), dtype=np.uint32)

    def mask_row(self, num_words: int) -> tuple[np.ndarray, int]:
        """A zeroed row of num_words and its address; the caller counts it used
        (`rows_used += 1`) when it keeps it, else leaves it zeroed for the next walk."""
        if self.rows_used >= _ROWS or self.rows.shape[1] != num_words:
            self.rows = np.zeros((_ROWS, num_words), dtype=np.uint32)
            self.rows_ptr = self.rows.ctypes.data
            self.rows_used = 0
        i = self.rows_used
        return self.rows[i], self.rows_ptr + i * num_words * 4

    def cuts(self, n: int) -> np.ndarray:
        if self.buffer.shape[0] < n:
            self.buffer = np.empty(n, dtype=np.int32)
            self.ptr = self.buffer.ctypes.data
        return self.buffer

    def cut_terms(self, n: int) -> np.ndarray:
        """`walk_lexer`'s terminal per cut (beside `cuts`)."""
        if self.terms.shape[0] < n:
            self.terms = np.empty(n, dtype=np.int32)
        return self.terms

    def lexer_rows(self, n: int, num_words: int) -> np.ndarray:
        """n zeroed mask rows for `walk_lexer` (the caller zeroes what it wrote)."""
        if self.lex_rows.shape[0] < n or self.lex_rows.shape[1] != num_words:
            self.lex_rows = np.zeros((max(n, 8), num_words), dtype=np.uint32)
        return self.lex_rows[:n]


_scratch = _Scratch()


_walkers_lock = threading.Lock()
_walkers: weakref.WeakKeyDictionary[TokenVocabulary, CutWalker] = weakref.WeakKeyDictionary()


def walker_for(vocab: TokenVocabulary) -> CutWalker | None:
    """The vocabulary's C walker, or None (numpy walks) when native code is off or unavailable
    (SGL_GRAMMAR_NATIVE=0 is read on each call: a grammar decides when it is compiled)."""
    if not native.enabled():
        return None
    trie = native.trie_of(vocab)
    if trie is None:
        return None
    hit = _walkers.get(vocab)
    if hit is not None and hit.trie is trie:
        return hit
    lib = LIBRARY.get()
    if lib is None:
        return None
    with _walkers_lock:
        walker = _walkers.get(vocab)
        if walker is None or walker.trie is not trie:
            walker = _walkers[vocab] = CutWalker(trie, lib, (len(vocab) + 31) // 32)
    return walker
