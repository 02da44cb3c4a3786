"""The lazy DFA's subset construction in C (`csrc/subset.c`): the interning of NFA state sets
and the expansion of a DFA state's 256-byte row, called by `lazy_dfa.LazyDFA` under its lock.

Python keeps the NFA's front end (its deferred pieces are built as walks read them) and hands
the core what an expansion needs: an expansion that meets a target whose closure the core lacks
returns those NFA states; `SubsetCore` fills them in Python (as the Python construction fills
what it reads), hands them over with the byte edges of each (a 256-bit mask in four 64-bit
words) and with them the filled states the next expansions would ask for (on an NFA of at
most _BULK_STATES states every filled state, in one flat call after the start state; on a
larger one up to _NEIGHBOURS states the asked ones reach), and expands again. `prepare` does that
for many states at once (a token walk's waiting rows: one round trip, not one per row). The
states of lazily filled blocks (`nfa_blocks`: embedded automata, copies of a counted piece) are
filled by the core itself from the block's description (registered as the NFA makes them), so
only deferred pieces cross over. The NFA's laziness is kept: only the states a walk reaches are
ever filled (handing over a filled state builds nothing).

The token trie walk (`grammar/tokens/native.py`) builds rows in C too: it is handed
`subset_inline`, which expands a state it meets unbuilt in place when the core has all it needs
(the DFA's arrays are bound to the core, `bind`, and written by it), so a first-visit mask
returns to Python only for NFA states not handed over yet, or for the table to grow.

Compiled on first use with the system C compiler (`grammar/native_build.py`: cached by the
source, flags, compiler and CPU) and called through ctypes, which releases the GIL. `new_core`
is None (and the lazy DFA keeps its Python construction) when SGL_GRAMMAR_NATIVE=0 or no
compiler is found or the build fails.
"""

from __future__ import annotations

import array
import ctypes
import itertools
import logging
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from grammar import native_build, settings
from grammar.automata.nfa import NFA
from grammar.automata.nfa_blocks import Embedded
from grammar.errors import GrammarError

logger = logging.getLogger(__name__)

OVER_BUDGET, NO_MEMORY, NO_ROOM = 2, 3, 4  # (csrc/subset.c's statuses)
NEW_PER_EXPAND = 256  # states one expansion may number: the table must have room for them
_MISSING_CAP = 4096  # NFA states one call asks for (the rest come with the next call)
_NEIGHBOURS = 64  # filled NFA states handed over with the asked ones, at most
# an NFA of at most this many states (reserved block ids included) is handed over whole as it
# fills: a larger one's eager part would go in one call (~1 us a state) though most of it may
# never be read. At 20,000, JSONSchemaBench's first 100 took ~1.4x the walk passes (NFAs of
# 20-100k states: one round trip per deferred piece, the neighbours of the asked states only)
_BULK_STATES = 100_000

_FLAGS = ("-O2", "-march=native", "-fPIC", "-std=gnu11")
UNITS = [
    native_build.Unit("subset", Path(__file__).parent / "csrc" / "subset.c", _FLAGS),
    native_build.Unit("product", Path(__file__).parent / "csrc" / "product.c", _FLAGS),
]
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
SIGNATURES: native_build.Signatures = {
    "subset_new": (_PTR, [_I64, _I64]),
    "subset_free": (None, [_PTR]),
    "subset_add": (_I64, [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR]),
    "subset_start": (_I64, [_PTR, _I64, _PTR, _I64]),
    "subset_intern_set": (_I64, [_PTR, _PTR, _I64]),
    "subset_states": (_I64, [_PTR, _I64, _PTR, _I64]),
    "subset_num_states": (_I64, [_PTR]),
    "subset_set_budget": (None, [_PTR, _I64]),
    "subset_bind": (None, [_PTR, _PTR, _I64, _PTR, _PTR, _PTR]),
    "subset_expand": (_I64, [_PTR, _I64, _PTR, _I64]),
    "subset_missing": (_I64, [_PTR, _PTR, _I64, _PTR, _I64]),
    "subset_inline": (_I64, [_PTR, _I64]),
    "subset_forced_run": (_I64, [_PTR, _I64, _I64, _PTR, _PTR]),
    "subset_add_embedded": (_I64, [_PTR, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64]),
    "subset_add_copies": (_I64, [_PTR, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64]),
    "subset_block_fills": (_I64, [_PTR]),
    "subset_expand_all": (_I64, [_PTR, _PTR, _PTR, _I64]),
    "product_explore": (_I64, [_I64, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64]),
    "live_states": (_I64, [_PTR, _I64, _I64, _PTR, _PTR]),
}
LIBRARY = native_build.OptionalLibrary(
    "grammar-subset", UNITS, SIGNATURES, "using the Python subset construction"
)


def enabled() -> bool:
    """Whether the C construction may be used (SGL_GRAMMAR_NATIVE=0 turns it off)."""
    return settings.GRAMMAR_NATIVE.get()


def _load() -> ctypes.CDLL | None:
    return LIBRARY.get()


def live_states(table: np.ndarray, accepting: np.ndarray) -> np.ndarray | None:
    """The states of a DFA (table int32 [n, classes], accepting bool [n]) that can reach an
    accepting one, as bools (DEAD False), found in C; None when C is off or unavailable."""
    if not enabled():
        return None
    lib = _load()
    if lib is None:
        return None
    table = np.ascontiguousarray(table, dtype=np.int32)
    acc = np.ascontiguousarray(accepting, dtype=bool)
    live = np.empty(table.shape[0], dtype=bool)
    n, k = table.shape
    if lib.live_states(table.ctypes.data, n, k, acc.ctypes.data, live.ctypes.data):
        raise MemoryError("dead-end pruning: out of memory")
    return live


def product_rows(
    tables: list[np.ndarray], classes: np.ndarray, required: list[bool], start: list[int],
    max_states: int,
) -> tuple[np.ndarray, np.ndarray] | None:  # fmt: skip
    """The product of byte DFAs walked breadth first in C (dfa_ops' products): `tables` their
    class-indexed tables, `classes` [n, groups] the class each one reads for each byte group.
    Returns (rows [rows, groups]: row 0 dead, row 1 the start; states [rows, n]: each row's
    component states, DEAD for a dead optional one), or None when C is unavailable. Raises
    GrammarError past `max_states` states (as the Python walk)."""
    if not enabled():
        return None
    lib = _load()
    if lib is None:
        return None
    n, n_groups = classes.shape
    tabs = [np.ascontiguousarray(t, dtype=np.int32) for t in tables]
    addrs = np.array([t.ctypes.data for t in tabs], dtype=np.int64)
    n_cls = np.array([t.shape[1] for t in tabs], dtype=np.int64)
    gcls = np.ascontiguousarray(classes, dtype=np.int32)
    req = np.array(required, dtype=np.uint8)
    first = np.array(start, dtype=np.int32)
    cap = max_states + 1
    rows = np.empty((cap, n_groups), dtype=np.int32)  # (pages past the rows used: untouched)
    states = np.empty((cap, n), dtype=np.int32)
    count = lib.product_explore(
        n, addrs.ctypes.data, n_cls.ctypes.data, gcls.ctypes.data, n_groups, req.ctypes.data,
        first.ctypes.data, rows.ctypes.data, states.ctypes.data, cap,
    )  # fmt: skip
    if count == -1:
        raise GrammarError(f"product automaton exceeds its budget ({max_states})")
    if count < 0:
        raise MemoryError("product automaton: out of memory")
    return rows[:count].copy(), states[:count].copy()


def eager_rows(
    nfa: NFA, start: int, max_states: int, over_budget: Callable[[int], GrammarError]
) -> tuple[np.ndarray, np.ndarray] | None:
    """The whole DFA of `nfa` from `start` built in C (fsm.nfa_to_dfa's eager construction):
    (table int32 [n, 256], a view of a larger array: copy what is kept; accepting bool [n]),
    state 0 DEAD and 1 the start (n == 1: the start's closure is empty); None when C is off or
    unavailable. Deferred pieces are built first and every NFA state is handed over in one
    call; the states of lazily filled blocks are filled by the core, never in Python. Raises
    `over_budget(max_states)` past `max_states` states."""
    core = new_core(nfa, max_states) if enabled() else None
    if core is None:
        return None
    nfa.materialize(blocks=False)
    core.send_all()
    cap = 2 * NEW_PER_EXPAND
    arrays = _dfa_arrays(cap)
    arrays[0][0] = 0  # DEAD's row (the core numbers DEAD but never writes its row)
    core.bind(*arrays)
    if core.start(start) == -1:
        raise over_budget(max_states)
    at = ctypes.c_int64(1)
    while True:
        status = core._lib.subset_expand_all(
            core._ptr, ctypes.addressof(at), core._missing_ptr, _MISSING_CAP
        )
        if status == 0:
            break
        if status == -1 - NO_ROOM:  # room for NEW_PER_EXPAND more: the arrays doubled
            cap *= 2
            grown = _dfa_arrays(cap)
            n = core.num_states
            for old, new in zip(arrays, grown, strict=True):
                new[:n] = old[:n]
            arrays = grown
            core.bind(*arrays)
        elif status == -1 - OVER_BUDGET:
            raise over_budget(max_states)
        else:
            core._ask(status)
    n = core.num_states
    # (the table is not copied: the caller narrows it to byte classes, a smaller copy)
    return arrays[0][:n], arrays[1][:n].copy()


def _dfa_arrays(cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A DFA's arrays the core writes, with room for `cap` states: table, accepting, live,
    forced."""
    return (
        np.empty((cap, 256), dtype=np.int32), np.zeros(cap, dtype=bool),
        np.empty(cap, dtype=np.int32), np.empty(cap, dtype=np.int32),
    )  # fmt: skip


def new_core(nfa: NFA, max_states: int) -> SubsetCore | None:
    """A core for `nfa` (None when the C construction is off or unavailable)."""
    if not enabled():
        return None
    lib = _load()
    if lib is None:
        return None
    return SubsetCore(lib, nfa, max_states)


class SubsetCore:
    """One lazy DFA's interned state sets and expansions, in C (freed with this object).

    What must hold: calls are serialised (the lazy DFA's lock); before `expand`, the table and
    `accepting` have room for NEW_PER_EXPAND states past `num_states`."""

    def __init__(self, lib: ctypes.CDLL, nfa: NFA, max_states: int) -> None:
        self._lib = lib
        self._ptr = lib.subset_new(nfa.final, max_states)
        if not self._ptr:
            raise MemoryError("subset core")
        self._free = weakref.finalize(self, lib.subset_free, self._ptr)
        self._nfa = nfa
        self._sent: set[int] = set()  # NFA states the core has
        self._upto = 0  # (NFAs of at most _BULK_STATES) states below it checked and handed over
        self._bulk = False  # hand over filled states in bulk (from the first call after `start`:
        # a compile hands over only what its start state needs)
        self._missing = (ctypes.c_int64 * _MISSING_CAP)()
        self._missing_ptr = ctypes.addressof(self._missing)
        self._expand_c = lib.subset_expand
        self._states_buf = (ctypes.c_int64 * 1024)()
        self._run_states = (ctypes.c_int64 * 1)()  # (`forced_run`'s, grown to its limit)
        self._run_bytes = ctypes.create_string_buffer(1)
        # what the token trie walk calls for a row it meets unbuilt (`subset_inline`)
        self.inline = (ctypes.cast(lib.subset_inline, ctypes.c_void_p).value, self._ptr)
        self._n_blocks = 0  # the NFA's blocks registered (filled in C from then on)
        self._keep: list[np.ndarray] = []  # the arrays of registered embedded automata
        self._register_blocks()

    @property
    def block_fills(self) -> int:
        """NFA states the core filled from their blocks itself (Python's NFA lacks them)."""
        return int(self._lib.subset_block_fills(self._ptr))

    def _register_blocks(self) -> None:
        """Hand the core the NFA's blocks it has not seen (a fill may add some): it fills their
        states itself, as `nfa_blocks` would. A block it refuses is filled by Python."""
        blocks = self._nfa.blocks
        for block in blocks[self._n_blocks :]:
            if isinstance(block, Embedded):
                dfa = block.dfa
                table = np.ascontiguousarray(dfa.table, dtype=np.int32)
                b2c = np.ascontiguousarray(dfa.byte_to_class, dtype=np.int32)
                acc = np.ascontiguousarray(dfa.accepting, dtype=bool)
                self._keep += (table, b2c, acc)
                status = self._lib.subset_add_embedded(
                    self._ptr, block.first, block.size, table.ctypes.data, table.shape[1],
                    b2c.ctypes.data, acc.ctypes.data, block.k,
                )  # fmt: skip
            else:
                status = self._lib.subset_add_copies(
                    self._ptr, block.first, block.size, block.t_first, block.t_start,
                    block.hole, block.n, block.m, block.k,
                )  # fmt: skip
            if status == NO_MEMORY:
                raise MemoryError("subset core: out of memory")
        self._n_blocks = len(blocks)

    def bind(self, table: np.ndarray, accepting: np.ndarray, live: np.ndarray,
             forced: np.ndarray) -> None:  # fmt: skip
        """The lazy DFA's arrays the core writes (again after any of them is replaced):
        table int32 [capacity, 256], accepting bool, live and forced int32, all [capacity]."""
        self._lib.subset_bind(
            self._ptr, table.ctypes.data, table.shape[0], accepting.ctypes.data,
            live.ctypes.data, forced.ctypes.data,
        )  # fmt: skip

    @property
    def num_states(self) -> int:
        return int(self._lib.subset_num_states(self._ptr))

    def set_budget(self, max_states: int) -> None:
        """States past `max_states` are refused from now on (as at construction)."""
        self._lib.subset_set_budget(self._ptr, max_states)

    def start(self, s: int) -> int:
        """Number the closure of NFA state s (START, or DEAD when it is empty; its entries of
        the bound arrays written), -1 past the budget."""
        try:
            while True:
                j = self._lib.subset_start(self._ptr, s, self._missing_ptr, _MISSING_CAP)
                if j >= 0:
                    return int(j)
                self._ask(j)
                if j == -1 - OVER_BUDGET:
                    return -1
        finally:
            self._bulk = True

    def restore(self, sets: list[tuple[int, ...]]) -> bool:
        """Number `sets` (DFA state j's NFA states at j, DEAD's empty set first) as a fresh core's
        states, in order: a pickled lazy DFA's states, which keep their ids. False when one is
        not numbered as its index says (the caller falls back to the Python construction)."""
        self._send([], [x for s in sets for x in s])
        for j, states in enumerate(sets):
            buf = array.array("q", states)
            if self._lib.subset_intern_set(self._ptr, buf.buffer_info()[0], len(buf)) != j:
                return False
        return True

    def states(self, j: int) -> tuple[int, ...]:
        """The NFA states (sorted) of DFA state j."""
        buf = self._states_buf
        while True:
            n = self._lib.subset_states(self._ptr, j, ctypes.addressof(buf), len(buf))
            if n >= 0:
                return tuple(buf[:n])
            buf = self._states_buf = (ctypes.c_int64 * (16 * len(buf)))()  # (a large set)

    def expand(self, i: int) -> bool:
        """Write state i's row, live byte count and forced byte into the bound arrays (new
        states' rows UNEXPANDED, their entries set). False past the state budget (the row
        unwritten; states numbered before it stay numbered)."""
        while True:
            out = self._expand_c(self._ptr, i, self._missing_ptr, _MISSING_CAP)
            if out >= 0:
                return True
            if out == -1 - OVER_BUDGET:
                return False
            if out == -1 - NO_ROOM:
                raise AssertionError("subset core: the table has no room for an expansion")
            self._ask(out)

    def forced_run(self, i: int, limit: int) -> tuple[list[int], bytes, int]:
        """The forced states from state i (each allows exactly one byte), their rows built,
        at most `limit`: (those states, their bytes, the state reached). It stops at a state
        it cannot build without Python (NFA states missing, no room, the budget): the caller
        expands that one as usual. The table must have room for NEW_PER_EXPAND states (a
        forced state's expansion numbers at most one)."""
        if limit >= len(self._run_states):
            self._run_states = (ctypes.c_int64 * (limit + 1))()
            self._run_bytes = ctypes.create_string_buffer(limit + 1)
        states, raw = self._run_states, self._run_bytes
        n = self._lib.subset_forced_run(
            self._ptr, i, limit, ctypes.addressof(states), ctypes.addressof(raw)
        )
        return states[:n], raw.raw[:n], states[n]

    def prepare(self, states: np.ndarray) -> None:
        """Hand over every NFA state the expansions of `states` (int64, unexpanded ones) need,
        in as few round trips as their epsilon chains allow (not one per state)."""
        states = np.ascontiguousarray(states, dtype=np.int64)
        while True:
            n = self._lib.subset_missing(
                self._ptr, states.ctypes.data, states.size, self._missing_ptr, _MISSING_CAP
            )
            if n < 0:
                raise MemoryError("subset core: out of memory")
            if n == 0:
                return
            self._send(self._missing[:n])

    def send_all(self) -> None:
        """Hand over every NFA state filled so far (an eager construction: the states of
        lazily filled blocks the NFA has not filled are filled by the core)."""
        edges, sent = self._nfa.edges, self._sent
        ids = [x for x, e in enumerate(edges) if e is not None and x not in sent]
        sent.update(ids)
        self._hand_over(ids)
        self._upto = len(edges)

    def _ask(self, status: int) -> None:
        """Answer a call that stopped for missing states (status -(16 + n): hand them over);
        raise MemoryError for a call that ran out of memory."""
        if status == -1 - OVER_BUDGET:
            return
        if status > -16:
            raise MemoryError("subset core: out of memory")
        self._send(self._missing[: -16 - status])

    def _send(self, asked: list[int], filled: Iterable[int] = ()) -> None:
        """Hand over the NFA states `asked` (filled first when the NFA has not filled them, as
        the Python construction fills what it reads) and the states `filled` (all filled), and
        with them the filled states the next calls would ask for: on an NFA of at most
        _BULK_STATES states, every filled state not handed over yet (all of them on the first
        call: one flat call instead of a round trip per piece; then what the fills made); on a
        larger one (or before `start` returns), up to _NEIGHBOURS filled states the asked ones
        reach."""
        nfa = self._nfa
        eps, edges, sent = nfa.eps, nfa.edges, self._sent
        out: list[int] = [x for x in dict.fromkeys(filled) if x not in sent]
        for x in out:  # (a block's state the core filled before: filled here alike)
            if edges[x] is None:
                nfa.fill(x)
        for x in asked:
            if edges[x] is None:
                nfa.fill(x)
            out.append(x)
        sent.update(out)
        if self._bulk and len(edges) <= _BULK_STATES:  # every filled state since the last call
            new = [
                x for x in range(self._upto, len(edges)) if edges[x] is not None and x not in sent
            ]
            self._upto = len(edges)
            sent.update(new)
            self._hand_over(out + new)
            return
        # a walk over filled states from the asked ones (filling nothing: that stays lazy)
        todo = [y for x in out for y in (*eps[x], *edges[x][1::2])]
        limit = len(out) + _NEIGHBOURS
        while todo and len(out) < limit:
            y = todo.pop()
            if y in sent or edges[y] is None:
                continue
            sent.add(y)
            out.append(y)
            todo.extend(eps[y])
            todo.extend(edges[y][1::2])
        self._hand_over(out)

    def _hand_over(self, ids: list[int]) -> None:
        """Give the core NFA states `ids` (all filled), each one's epsilon targets and byte
        edges, as flat int64 lists and 32-byte masks in one call; and the NFA's new blocks."""
        nfa = self._nfa
        eps, edges = nfa.eps, nfa.edges
        e_of = [edges[x] for x in ids]
        p_of = [eps[x] for x in ids]
        flat = list(itertools.chain.from_iterable(e_of))
        eps_t = list(itertools.chain.from_iterable(p_of))
        masks = flat[::2]
        as_bytes = {m: m.to_bytes(32, "little") for m in set(masks)}
        raw = b"".join([as_bytes[m] for m in masks])
        # one int64 buffer: the states, their epsilon and edge counts, epsilon and edge targets
        buf = array.array("q", ids)
        buf.extend([len(p) for p in p_of])
        buf.extend([len(e) >> 1 for e in e_of])
        buf.extend(eps_t)
        buf.extend(flat[1::2])
        at, n = buf.buffer_info()[0], len(ids)
        status = self._lib.subset_add(
            self._ptr, n, at, at + 8 * n, at + 16 * n, at + 24 * n, raw,
            at + 8 * (3 * n + len(eps_t)),
        )  # fmt: skip
        if status:
            raise MemoryError("subset core: out of memory")
        if len(nfa.blocks) > self._n_blocks:  # (the fills made new blocks)
            self._register_blocks()
