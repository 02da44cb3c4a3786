"""The lazy DFA's subset construction in C (`csrc/subset.c`): the interning of NFA state sets
and the expansion of a DFA state's 256-byte row, called by `lazy_dfa.LazyDFA` under its lock.

Python keeps the NFA (its deferred pieces and lazily filled blocks are filled as walks read
them) and hands the core what an expansion needs, a closure at a time: an expansion that meets
a target whose closure the core lacks returns those targets; `SubsetCore.expand` computes their
closures in Python (`closure(t)`, which fills the NFA), hands them over with the byte edges of
every state in them (each edge's bytes as a 256-bit mask in four 64-bit words), and expands
again. The NFA's laziness is kept: only the states a walk reaches are ever filled or handed.

Compiled on first use with the system C compiler (`grammar/native_build.py`: cached by the
source, flags, compiler and CPU) and called through ctypes, which releases the GIL. `new_core`
is None (and the lazy DFA keeps its Python construction) when SGL_GRAMMAR_NATIVE=0 or no
compiler is found or the build fails.
"""

from __future__ import annotations

import array
import ctypes
import logging
import weakref
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from grammar import native_build, settings
from grammar.automata.nfa import NFA

logger = logging.getLogger(__name__)

OVER_BUDGET, NO_MEMORY = 2, 3  # (csrc/subset.c's statuses)
NEW_PER_EXPAND = 256  # states one expansion may number: the table must have room for them
_MISSING_CAP = 4096  # NFA states one call asks for (the rest come with the next call)
_NEIGHBOURS = 64  # filled NFA states handed over with the asked ones, at most

_FLAGS = ("-O2", "-march=native", "-fPIC", "-std=gnu11")
UNITS = [native_build.Unit("subset", Path(__file__).parent / "csrc" / "subset.c", _FLAGS)]
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
SIGNATURES: native_build.Signatures = {
    "subset_new": (_PTR, [_I64, _I64]),
    "subset_free": (None, [_PTR]),
    "subset_add": (_I64, [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR]),
    "subset_start": (_I64, [_PTR, _I64, _PTR, _PTR, _I64]),
    "subset_intern_set": (_I64, [_PTR, _PTR, _I64]),
    "subset_states": (_I64, [_PTR, _I64, _PTR, _I64]),
    "subset_num_states": (_I64, [_PTR]),
    "subset_set_budget": (None, [_PTR, _I64]),
    "subset_expand": (_I64, [_PTR, _I64, _PTR, _PTR, _PTR, _I64]),
}
LIBRARY = native_build.OptionalLibrary(
    "grammar-subset", UNITS, SIGNATURES, "using the Python subset construction"
)


def enabled() -> bool:
    """Whether the C construction may be used (SGL_GRAMMAR_NATIVE=0 turns it off)."""
    return settings.GRAMMAR_NATIVE.get()


def _load() -> ctypes.CDLL | None:
    return LIBRARY.get()


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
        self._missing = (ctypes.c_int64 * _MISSING_CAP)()
        self._missing_ptr = ctypes.addressof(self._missing)
        self._expand_c = lib.subset_expand
        self._states_buf = (ctypes.c_int64 * 1024)()

    @property
    def num_states(self) -> int:
        return int(self._lib.subset_num_states(self._ptr))

    def set_budget(self, max_states: int) -> None:
        """States past `max_states` are refused from now on (as at construction)."""
        self._lib.subset_set_budget(self._ptr, max_states)

    def start(self, s: int, accepting: np.ndarray) -> int:
        """Number the closure of NFA state s (START, or DEAD when it is empty; its `accepting`
        entry written), -1 past the budget."""
        while True:
            j = self._lib.subset_start(
                self._ptr, s, accepting.ctypes.data, self._missing_ptr, _MISSING_CAP
            )
            if j >= 0:
                return int(j)
            self._ask(j)
            if j == -1 - OVER_BUDGET:
                return -1

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

    def expand(self, i: int, table: int, accepting: int) -> tuple[int, int, int] | None:
        """Write state i's row into the table at address `table` (new states' rows UNEXPANDED,
        their entries of the bool array at `accepting` set): (states numbered, bytes with an
        edge, the one such byte or -1). None past the state budget (the row unwritten; states
        numbered before it stay numbered)."""
        while True:
            out = self._expand_c(self._ptr, i, table, accepting, self._missing_ptr, _MISSING_CAP)
            if out >= 0:
                return out & 1023, (out >> 10) & 1023, (out >> 20) - 1
            if out == -1 - OVER_BUDGET:
                return None
            self._ask(out)

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
        the Python construction fills what it reads), and with them up to _NEIGHBOURS states
        already filled that they reach (the next calls would ask for most of them); and the
        states `filled` (all filled, none handed over yet)."""
        nfa = self._nfa
        eps, edges, sent = nfa.eps, nfa.edges, self._sent
        out: list[int] = [x for x in dict.fromkeys(filled) if x not in sent]
        for x in asked:
            if edges[x] is None:
                nfa.fill(x)
            out.append(x)
        sent.update(out)
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
        n_eps, n_edges, eps_t, masks, edge_t = [], [], [], [], []
        for x in out:
            e, p = edges[x], eps[x]
            n_eps.append(len(p))
            n_edges.append(len(e) >> 1)
            eps_t.extend(p)
            masks.extend(e[::2])
            edge_t.extend(e[1::2])
        raw = b"".join([m.to_bytes(32, "little") for m in masks])
        # one int64 buffer: the states, their epsilon and edge counts, epsilon and edge targets
        buf = array.array("q", out)
        buf.extend(n_eps)
        buf.extend(n_edges)
        buf.extend(eps_t)
        buf.extend(edge_t)
        at, n = buf.buffer_info()[0], len(out)
        status = self._lib.subset_add(
            self._ptr, n, at, at + 8 * n, at + 16 * n, at + 24 * n, raw,
            at + 8 * (3 * n + len(eps_t)),
        )  # fmt: skip
        if status:
            raise MemoryError("subset core: out of memory")
