"""A first-visit mask in C: the vocabulary's distinct token byte strings as a trie, walked depth
first through a DFA's transition table, pruned where the DFA dies; every token whose bytes all
survive gets its id bits set. A pruned walk visits each live token prefix once (a handful of
nanoseconds a node), where the numpy walks pay ~10 calls per byte position.

Over a LazyDFA the entry a node reads may not be built yet (UNEXPANDED, negative, or a state
past the end of the table array read): with the lazy DFA's C core (`automata/native_dfa.py`)
the walk builds that row in place through the core's `subset_inline` hook, under the DFA's
lock (`LazyDFA.walk_in_c`); a row the core cannot build yet (NFA states not handed over, or no
room left in the table) skips that node's subtree, and the walk returns the (node, parent
state) pairs it skipped; `walk` builds those rows in Python (one batched handover), re-reads
the table (a lazy one is replaced as it grows) and resumes only the skipped subtrees, until
none is left. (Building only the entries read, not whole rows, was tried: no faster, as most
of those rows are read whole later.)

The C source is `csrc/trie.c`, compiled on first use with the system C compiler
(`grammar/native_build.py`, as runtime's CPU kernels are: cached under $SGL_NATIVE_CACHE, keyed
by the source, the flags, the compiler and the CPU) and called through ctypes, which releases
the GIL. `trie_of(vocab)` is None (and the token index keeps its numpy walks) when
SGL_GRAMMAR_NATIVE=0, when no compiler is found or the build fails, or when a token is longer
than the walk's stack.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grammar import native_build, settings
from grammar.tokens.loops import Suffixes
from grammar.tokens.vocab import TokenVocabulary, csr_take

logger = logging.getLogger(__name__)

MAX_DEPTH = 4096  # bytes of the longest token the walk's stack holds
_PENDING = 1 << 15  # skipped (node, state) pairs one pass may return; more: the numpy path

_FLAGS = ("-O2", "-march=native", "-fPIC", "-std=gnu11")
UNITS = [native_build.Unit("trie", Path(__file__).parent / "csrc" / "trie.c", _FLAGS)]
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
SIGNATURES: native_build.Signatures = {
    "trie_build": (_I64, [_PTR, _PTR, _PTR, _I64, _PTR, _I64]),
    "trie_compact": (None, [_PTR, _I64, _PTR, _PTR, _PTR, _PTR]),
    "trie_walk": (_I64, [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64,
                         _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR]),
    "trie_prefix": (_I64, [_PTR, _PTR, ctypes.c_char_p, _I64, _PTR, _PTR, _PTR]),
    "trie_prefixes": (None, [_PTR, _PTR, ctypes.c_char_p, _I64, _I64, _I64, _PTR]),
}  # fmt: skip
LIBRARY = native_build.OptionalLibrary(
    "grammar-trie", UNITS, SIGNATURES, "using numpy walks"
)
_load_lock = threading.Lock()  # guards _tries
_tries: weakref.WeakKeyDictionary[TokenVocabulary, TokenTrie | None] = weakref.WeakKeyDictionary()
NODE = np.dtype([("end", "<i4"), ("row", "<i4"), ("depth", "<i4"), ("byte", "<i4")])
WNODE = np.dtype([("end", "<i4"), ("depth", "<u2"), ("byte", "u1"), ("pad", "u1")])


def enabled() -> bool:
    """Whether the C walk may be used (SGL_GRAMMAR_NATIVE=0 turns it off; read on each call)."""
    return settings.GRAMMAR_NATIVE.get()


def _load() -> ctypes.CDLL | None:
    return LIBRARY.get()


@dataclass(slots=True, frozen=True)
class TokenTrie:
    """Distinct byte strings as a preorder trie (see csrc/trie.c's node_t): the vocabulary's
    tokens, or the suffixes of some of them; row_start / row_ids: the token ids of each
    node's string (`row` k: row_ids[row_start[k] : row_start[k + 1]]); compact: the
    walk's view of the nodes (csrc/trie.c's trie_compact: wn, wid)."""

    nodes: np.ndarray
    row_start: np.ndarray
    row_ids: np.ndarray
    lib: ctypes.CDLL
    # the addresses of nodes, row_start, row_ids (an array's .ctypes.data costs ~1 us a read)
    ptrs: tuple[int, int, int]
    compact: tuple[np.ndarray, np.ndarray]
    compact_ptrs: tuple[int, int]

    def walk_once(self, table: np.ndarray, b2c: int | None, ok: int | None, tasks: int,
                  n_tasks: int, words: int, out: int, expand: int | None = None,
                  core: int | None = None, node_ok: int | None = None,
                  clear: int | None = None) -> int:  # fmt: skip
        """One C pass over n_tasks (node, state) pairs at address `tasks` through `table`
        (int32, C order, [rows, n_cls]), setting bits in the uint32 words at `words`; writes
        the skipped pairs at `out` (room for _PENDING) and returns how many, or -1. `expand`,
        `core`: a lazy DFA's hook for rows met unbuilt (`LazyDFA.walk_in_c`), or None;
        `node_ok`: the address of a `row_filter`, or None; `clear`: the address of a uint8
        [256] whose first bytes' tokens have their bits cleared first (a root task), or None."""
        nodes, row_start, row_ids = self.ptrs
        wn, wid = self.compact_ptrs
        buf = _buffers
        if table is not buf.table:  # (a lazy DFA's table is walked many times between growths)
            buf.table, buf.table_ptr = table, table.ctypes.data
        return self.lib.trie_walk(
            nodes, wn, wid, buf.table_ptr, table.shape[0], table.shape[1], b2c, ok,
            row_start, row_ids, tasks, n_tasks, words, out, _PENDING, expand, core, node_ok, clear,
        )  # fmt: skip


class _Buffers(threading.local):
    """Two task buffers per thread (a pass reads one and writes the other), made once; and
    the address of the last table walked (`.ctypes.data` costs ~1-2 us a read)."""

    def __init__(self) -> None:
        self.arrays = (np.empty((_PENDING, 2), np.int64), np.empty((_PENDING, 2), np.int64))
        self.ptrs = (self.arrays[0].ctypes.data, self.arrays[1].ctypes.data)
        self.table: np.ndarray | None = None  # the last table walked, and its address
        self.table_ptr = 0


_buffers = _Buffers()


def trie_of(vocab: TokenVocabulary) -> TokenTrie | None:
    """The vocabulary's trie (built once, ~0.2 s for 129k tokens), or None when the C walk is
    off or unavailable."""
    if not enabled():
        return None
    if vocab in _tries:
        return _tries[vocab]
    lib = _load()
    trie = None
    if lib is not None:
        prep = vocab.prepared()
        first_ids = prep.row_ids[prep.row_start[:-2]].tolist()  # one id of each row
        strings = [vocab.token_bytes(i) for i in first_ids]
        trie = _build_trie(strings, prep.row_start, prep.row_ids, lib)
    with _load_lock:
        return _tries.setdefault(vocab, trie)


def suffix_trie(trie: TokenTrie, suffixes: Suffixes) -> TokenTrie | None:
    """A trie of `suffixes` (see loops.Suffixes), each node's ids those of the token rows cut
    to its suffix; None when a suffix is empty or repeats (the numpy walk decides those)."""
    lengths = suffixes.lengths.tolist()
    if not all(lengths):
        return None
    cols = suffixes.columns
    strings = [cols[:n, k].tobytes() for k, n in enumerate(lengths)]
    if len(set(strings)) < len(strings):  # (a trie node holds one string's ids)
        return None
    # suffix k's ids: those of rows[start[k] : start[k + 1]], each row's ids in turn
    rows = suffixes.rows
    counts = trie.row_start[rows + 1] - trie.row_start[rows]
    ids = csr_take(trie.row_start, trie.row_ids, rows)
    ends = np.cumsum(counts)
    start = np.zeros(len(strings) + 1, dtype=np.int64)
    start[1:] = ends[suffixes.start[1:] - 1] if rows.size else 0
    return _build_trie(strings, start, ids.astype(np.int64), trie.lib)


def row_filter(trie: TokenTrie, rows: np.ndarray) -> np.ndarray:
    """A node filter for `walk` over the vocabulary's trie that walks only the token rows
    `rows` (e.g. the tokens that may leave a self-looping state, when too many to cut into
    suffixes): uint8 per node, bit 1 when its subtree holds one of them, bit 2 when it is one.
    O(nodes) in numpy (~1 ms at 151k ids): no trie is built."""
    nodes = trie.nodes
    n = nodes.shape[0]
    at = np.flatnonzero(nodes["row"] >= 0)
    node_of_row = np.empty(int(nodes["row"].max()) + 1, dtype=np.int64)
    node_of_row[nodes["row"][at]] = at
    marked = np.zeros(n, dtype=np.int64)
    marked[node_of_row[rows]] = 1
    counts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(marked, out=counts[1:])
    inside = counts[nodes["end"]] > counts[:-1]  # a marked node in [i, end)
    out = inside.astype(np.uint8) | (marked.astype(np.uint8) << 1)
    out.flags.writeable = False
    return out


def _build_trie(strings: list[bytes], id_start: np.ndarray, ids: np.ndarray,
                lib: ctypes.CDLL) -> TokenTrie | None:  # fmt: skip
    """The trie of distinct non-empty `strings`, string k's ids ids[id_start[k] :
    id_start[k + 1]]; None when one is longer than the walk's stack."""
    if max(map(len, strings), default=0) > MAX_DEPTH:
        return None
    order = sorted(range(len(strings)), key=strings.__getitem__)
    data = np.frombuffer(b"".join(strings[k] for k in order), dtype=np.uint8)
    off = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum([len(strings[k]) for k in order], out=off[1:])
    keys = np.asarray(order, dtype=np.int64)
    cap = int(data.size) + 1
    nodes = np.zeros(cap, dtype=NODE)
    n = lib.trie_build(data.ctypes.data, off.ctypes.data, keys.ctypes.data, keys.size,
                       nodes.ctypes.data, cap)  # fmt: skip
    if n < 0:
        return None
    nodes = nodes[:n].copy()
    id_start = np.ascontiguousarray(id_start, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    ptrs = (nodes.ctypes.data, id_start.ctypes.data, ids.ctypes.data)
    compact = (np.empty(n, WNODE), np.empty(n, np.int32))
    compact_ptrs = (compact[0].ctypes.data, compact[1].ctypes.data)
    lib.trie_compact(ptrs[0], n, ptrs[1], ptrs[2], *compact_ptrs)
    return TokenTrie(nodes, id_start, ids, lib, ptrs, compact, compact_ptrs)


def walk(
    trie: TokenTrie,
    dfa,
    state: int,
    words: np.ndarray,
    first_ok: np.ndarray | None = None,
    node_ok: np.ndarray | None = None,
    clear_first: np.ndarray | None = None,
) -> bool:
    """Set in `words` (uint32, contiguous, in place) the bit of every token that walks from
    `state` (its row built) without dying, and whose first byte is `first_ok` (bool [256];
    None: any), and, given `node_ok` (a `row_filter` of `trie`), that is one of its rows. EOS
    ids are not set. Given `clear_first` (bool [256]), the bits of every token whose first
    byte it marks are cleared before (so a copied mask's tokens of those bytes are dropped
    unless they walk). False when the walk gave up (too many skipped subtrees):
    `words` is then partial and the caller computes the mask another way."""
    if words.dtype != np.uint32 or not words.flags.c_contiguous:
        raise ValueError("words must be a contiguous uint32 array")
    ok = None if first_ok is None else np.ascontiguousarray(first_ok, dtype=bool).view(np.uint8)
    ok_ptr = None if ok is None else ok.ctypes.data
    clear = (
        None if clear_first is None
        else np.ascontiguousarray(clear_first, dtype=bool).view(np.uint8)
    )  # fmt: skip
    clear_ptr = None if clear is None else clear.ctypes.data
    node_ptr = None if node_ok is None else node_ok.ctypes.data
    arrays, ptrs = _buffers.arrays, _buffers.ptrs
    arrays[0][0] = (0, state)
    cur, n = 0, 1
    lazy = dfa.lazy
    b2c_arr = None if lazy else np.ascontiguousarray(dfa.byte_to_class, dtype=np.int32)
    b2c = None if b2c_arr is None else b2c_arr.ctypes.data
    words_ptr = words.ctypes.data
    while True:

        def one_pass(
            table: np.ndarray, expand: int | None, core: int | None, cur: int = cur, n: int = n
        ) -> int:
            if not table.flags.c_contiguous or table.dtype != np.int32:
                return -2  # (not a table this walk reads; both kinds of DFA keep one)
            return trie.walk_once(
                table, b2c, ok_ptr, ptrs[cur], n, words_ptr, ptrs[1 - cur], expand, core, node_ptr,
                clear_ptr,
            )  # fmt: skip

        # a lazy table is read afresh for each pass (it is replaced as it grows), under its
        # lock: rows the walk meets unbuilt are built by the C core in place where it can
        n = dfa.walk_in_c(one_pass) if lazy else one_pass(dfa.table, None, None)
        if n <= 0:
            return n == 0
        cur = 1 - cur  # the skipped pairs are the next pass's tasks
        if not lazy:  # an eager table has every row: a pending pair means a corrupt table
            raise AssertionError("unexpanded row in an eager DFA")
        dfa.expand(arrays[cur][:n, 1])  # the rows of the waiting nodes' parent states


@dataclass(slots=True, frozen=True)
class Prefixes:
    """A trie read by prefix (`prefix_tokens`, `prefix_lengths`): its first two levels as
    tables (`jumps`, int32: the root's children by byte at [0, 256), the depth-2 nodes by
    their two bytes at 256 + (b0 << 8 | b1); -1: none), so a look-up does not scan the root's
    hundreds of children spread over the node array."""

    trie: TokenTrie
    jumps: np.ndarray
    ptr: int  # jumps' address


def prefixes(trie: TokenTrie) -> Prefixes:
    """`trie`'s look-up tables (O(nodes) in numpy, a few ms at 129k ids)."""
    nodes = trie.nodes
    depth, byte = nodes["depth"], nodes["byte"].astype(np.int64)
    one, two = np.flatnonzero(depth == 1), np.flatnonzero(depth == 2)
    jumps = np.full(256 + 65536, -1, dtype=np.int32)
    jumps[byte[one]] = one
    parent = one[np.searchsorted(one, two) - 1]  # (preorder: the depth-1 node before it)
    jumps[256 + (byte[parent] << 8 | byte[two])] = two
    return Prefixes(trie, jumps, jumps.ctypes.data)


def prefix_tokens(p: Prefixes, text: bytes, words: int | None = None) -> int:
    """`text` down the trie in one C call: -1 when some string of the trie is longer than
    `text` and starts with it; else L, the length of the longest prefix of `text` that begins
    one of them (none begins text[: L + 1]). Given `words` (the address of uint32 words, room
    for every id), sets there the bits of the ids of the strings that are non-empty prefixes
    of `text` (all of them when L >= 0)."""
    nodes, row_start, row_ids = p.trie.ptrs
    return p.trie.lib.trie_prefix(nodes, p.ptr, text, len(text), row_start, row_ids, words)


class _Lengths(threading.local):
    """`prefix_lengths`' output, one per thread, made once (its address read once)."""

    def __init__(self) -> None:
        self.array = np.empty(MAX_DEPTH, np.int64)
        self.ptr = self.array.ctypes.data


_lengths = _Lengths()


def prefix_lengths(p: Prefixes, text: bytes, n: int, limit: int) -> list[int]:
    """`prefix_tokens(p, text[j : j + limit])` for each j < n (at most MAX_DEPTH), in one
    C call."""
    if not 0 <= n <= min(len(text), MAX_DEPTH):
        raise ValueError(f"n must be in [0, {min(len(text), MAX_DEPTH)}]")
    out = _lengths
    p.trie.lib.trie_prefixes(p.trie.ptrs[0], p.ptr, text, len(text), n, limit, out.ptr)
    return out.array[:n].tolist()
