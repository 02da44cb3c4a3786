"""A byte DFA determinised on demand: a state's row is built the first time a walk reads it.

A compiled constraint only ever reads the states that token walks reach: from each state a
sequence visits, the states every vocabulary token passes through. For a JSON object whose
other members may hold any JSON value, that is ~60 of ~870 states, so building the rest (the
eager subset construction of `fsm.nfa_to_dfa`) is most of a cold compile. Here a state is a set
of NFA states (as there), numbered when first seen as a target and expanded (its 256-byte row
computed) when first read. Rows are indexed by raw byte (no byte classes: they would need a pass
over the whole NFA first); unexpanded rows hold UNEXPANDED (-1), which vectorised walks detect
after a gather (`expand` then re-gather), and scalar walks see as a missing Python row.

Same contract as `ByteDFA` for what a compiled constraint uses: state 0 is DEAD, 1 is START,
every other state can reach acceptance (only NFAs without dead ends are built lazily: see
`NFA.dead_end_possible`), the state budget holds (it raises GrammarError when a walk would
number more states). Thread-safe: expansion is serialised; a row never changes once written, and
the table only grows (a reader holding an older array re-reads it when it sees UNEXPANDED).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Container

import numpy as np

from grammar.automata import native_dfa
from grammar.automata.nfa import NFA
from grammar.errors import GrammarError

DEAD = 0
START = 1
UNEXPANDED = -1


def byte_classes(masks: list[int]) -> list[int]:
    """Partition 0..255 into classes no mask splits; returns class bitsets."""
    classes = [(1 << 256) - 1]
    for m in masks:
        nxt = []
        for c in classes:
            a, b = c & m, c & ~m
            if a:
                nxt.append(a)
            if b:
                nxt.append(b)
        classes = nxt
    return classes


def over_budget(max_states: int) -> GrammarError:
    return GrammarError(
        f"DFA exceeds the state budget ({max_states} states); "
        "simplify the constraint (e.g. smaller maxLength / maxItems)"
    )


@functools.lru_cache(maxsize=8192)
def _template(masks: tuple[int, ...]) -> tuple[list[tuple[int, ...]], np.ndarray, int, int]:
    """For a DFA state's NFA edges (their byte masks, in order): the distinct sets of edges
    that fire together (slot 0: none), the slot of each byte, how many bytes fire some edge,
    and that byte when it is one (else -1). A pure function of the masks: shared by every
    automaton (JSON strings, digits, literals repeat across schemas)."""
    distinct = sorted(set(masks))
    classes = byte_classes(distinct)
    edges_of: dict[int, list[int]] = {}  # each distinct mask's edges (masks repeat often)
    for e, m in enumerate(masks):
        edges_of.setdefault(m, []).append(e)
    groups = [(m, edges_of[m]) for m in distinct]
    slots: list[tuple[int, ...]] = [()]
    slot_of: dict[tuple[int, ...], int] = {(): 0}
    cls_slot = []
    for c in classes:
        fire = tuple(sorted([e for m, es in groups if c & m for e in es]))
        j = slot_of.get(fire)
        if j is None:
            j = slot_of[fire] = len(slots)
            slots.append(fire)
        cls_slot.append(j)
    raw = b"".join(c.to_bytes(32, "little") for c in classes)
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    which = np.argmax(bits.reshape(len(classes), 256), axis=0)  # each byte's class
    byte_slot = np.asarray(cls_slot, dtype=np.int64)[which]
    byte_slot.flags.writeable = False
    live = np.flatnonzero(byte_slot)
    return slots, byte_slot, int(live.size), int(live[0]) if live.size == 1 else -1


class LazyDFA:
    """A DFA over bytes whose rows are computed on first read (see the module docstring).

    table: int32 [capacity, 256] (rows >= num_states unused, not even written); accepting:
    bool [capacity]; per state, its live byte count (-1: its row is not built) and forced
    byte, int32 [capacity] (kept private).
    The arrays are replaced when they grow: read the attribute afresh, never keep it.
    """

    lazy = True
    num_classes = 256

    def __init__(self, nfa: NFA, start: int, max_states: int) -> None:
        self.byte_to_class = np.arange(256, dtype=np.int32)
        self.classes = list(range(256))
        self._max_states = max_states
        self._nfa = nfa
        self._lock = threading.RLock()
        # NFA state sets as sorted tuples (not frozensets): the cyclic GC untracks tuples of
        # ints on its first pass, so a walk's thousands of states add nothing to what its
        # full collections rescan (they would come every few large walks, ~100 ms each)
        self._closures: dict[int, tuple[int, ...]] = {}
        self._index: dict[tuple[int, ...], int] = {(): DEAD}
        self._order: list[tuple[int, ...]] = [()]
        self._single: dict[int, int] = {}  # NFA state t -> id of closure(t)
        self._multi: dict[tuple[int, ...], int] = {}  # NFA targets -> id of their closure
        self.table = np.full((64, 256), UNEXPANDED, dtype=np.int32)
        self.table[DEAD] = DEAD
        self.accepting = np.zeros(64, dtype=bool)
        # Python rows for scalar walks (tuples: untracked by the GC, as the state sets)
        self._rows: dict[int, tuple[int, ...]] = {DEAD: (DEAD,) * 256}
        self._live = np.full(64, -1, dtype=np.int32)  # live bytes per state (-1: not built)
        self._live[DEAD] = 0
        self._forced = np.full(64, -1, dtype=np.int32)  # the one byte a state forces, or -1
        self._n = 1  # states numbered
        # the subset construction in C (`native_dfa`), or here when it is off or unavailable
        self._core = native_dfa.new_core(nfa, max_states)
        self._bound: np.ndarray | None = None  # the table the core writes (bound with the rest)
        if self._core is None:
            first = self._closure(start)
            if not first:
                raise GrammarError("the constraint matches nothing")
            self._state_id(first)
        else:
            self._order = None  # (the core holds the state sets)
            self._bind()
            j = self._core.start(start)
            if j == DEAD:
                raise GrammarError("the constraint matches nothing")
            if j != START:
                raise over_budget(max_states)
            self._n = 2
        self._expand(START)
        if self._live[START] == 0 and not self.accepting[START]:
            raise GrammarError("the constraint matches nothing")

    def __getstate__(self) -> dict:
        """What a pickle keeps (a compile worker ships lazy DFAs): with the C core, its state
        sets in order (the core is rebuilt from them on load, or the Python construction takes
        over where C is unavailable); never the arrays' addresses."""
        state = self.__dict__.copy()
        state["_bound"] = None
        if self._core is not None:
            state["_order"] = [self._core.states(j) for j in range(self._n)]
            state["_core"] = True
        return state

    def __setstate__(self, state: dict) -> None:
        native = state.pop("_core") is not None
        self.__dict__.update(state)
        self._core = None
        if not native:
            return
        core = native_dfa.new_core(self._nfa, self.max_states)
        if core is not None and core.restore(self._order):
            self._core, self._order = core, None
        else:  # the Python construction goes on from the same states
            self._index = {s: j for j, s in enumerate(self._order)}
            edges = self._nfa.edges
            for x in {x for s in self._order for x in s if edges[x] is None}:
                self._nfa.fill(x)  # (states the core filled from their blocks itself)

    def __repr__(self) -> str:
        expanded = int(np.count_nonzero(self._live[: self._n] >= 0))
        return f"LazyDFA(states={self.num_states}, expanded={expanded})"

    @property
    def num_states(self) -> int:
        """States numbered so far (expanded or not); grows as walks explore."""
        return self._n

    @property
    def max_states(self) -> int:
        """The state budget: a walk that would number more states raises the budget error."""
        return self._max_states

    @max_states.setter
    def max_states(self, value: int) -> None:
        self._max_states = value
        if getattr(self, "_core", None) is not None:
            self._core.set_budget(value)

    @property
    def native(self) -> bool:
        """Whether the subset construction runs in C (`native_dfa`)."""
        return self._core is not None

    @property
    def block_fills_in_c(self) -> int:
        """NFA states of lazily filled blocks the C core filled itself (the NFA's own lists
        keep None for them): with the states the NFA filled, how far the NFA was read."""
        return 0 if self._core is None else self._core.block_fills

    @property
    def nbytes(self) -> int:
        """Rough memory held now (it grows as walks build rows): the table, ~300 bytes per
        numbered state (its NFA state set, index entries), ~2.1 KB per Python row."""
        return int(self.table.nbytes) + 300 * self._n + 2100 * len(self._rows)

    @property
    def nfa(self) -> NFA:
        return self._nfa

    def nfa_states(self, state: int) -> tuple[int, ...]:
        """The NFA states (sorted) that a DFA state stands for."""
        if self._core is not None:
            return self._core.states(state)
        return self._order[state]

    # --- reads -------------------------------------------------------------------------

    def row_list(self, state: int) -> tuple[int, ...]:
        """The state's transitions by byte, as a Python tuple (made on first scalar read: mask
        walks, which build most rows, read the table only)."""
        r = self._rows.get(state)
        if r is None:
            self._built(state)
            r = self._rows[state] = tuple(self.table[state].tolist())
        return r

    def _built(self, state: int) -> None:
        if self._live[state] < 0:
            with self._lock:
                if self._live[state] < 0:
                    self._expand(state)

    def step(self, state: int, byte: int) -> int:
        return self.row_list(state)[byte]

    def walk(self, state: int, data: bytes) -> int:
        """State after reading `data` from `state` (DEAD if it dies on the way)."""
        rows = self._rows
        for b in data:
            r = rows.get(state)
            if r is None:
                r = self.row_list(state)
            state = r[b]
            if state == DEAD:
                return DEAD
        return state

    def lives(self, state: int, data: bytes) -> bool:
        """`walk(state, data) != DEAD`, reading the table for states without a Python row
        (a token walk passes through most of its states once: no row made for them)."""
        rows = self._rows
        for b in data:
            r = rows.get(state)
            if r is None:
                if self._live[state] < 0:
                    self._built(state)
                state = int(self.table[state, b])  # (the table as it is after any growth)
            else:
                state = r[b]
            if state == DEAD:
                return False
        return True

    def matches(self, data: bytes) -> bool:
        end = self.walk(START, data)  # first: the walk may grow (replace) `accepting`
        return bool(self.accepting[end])

    def expand(self, states: np.ndarray | list[int]) -> None:
        """Make sure every state in `states` has its row."""
        states = np.asarray(states, dtype=np.int64).reshape(-1)
        if states.size == 1:  # (most calls: a first-visit mask's own state; no sort)
            self._built(int(states[0]))
            return
        states = np.unique(states)
        todo = states[self._live[states] < 0]
        if not todo.size:
            return
        with self._lock:
            if self._core is not None and todo.size > 1:
                self._core.prepare(todo)  # what they all need, handed over at once
            for s in todo.tolist():
                if self._live[s] < 0:
                    self._expand(s)

    def walk_in_c(self, run: Callable[[np.ndarray, int | None, int | None], int]) -> int:
        """`run(table, expand, core)` under the lock, for a walk in C over the table (the token
        trie's): with the C core, `expand(core, state)` (a C function's address) builds a row
        the walk meets unbuilt, in place, when the core has all it needs (the table has room
        for several expansions); else `expand` and `core` are None. What C numbered is counted
        here after `run` returns. (A walk that fills the table's room stops there: the table
        grows and the walk resumes, as for rows C cannot build.)"""
        with self._lock:
            if self._core is None:
                return run(self.table, None, None)
            self._room(native_dfa.NEW_PER_EXPAND)
            try:
                return run(self.table, *self._core.inline)
            finally:
                self._n = self._core.num_states

    def byte_row(self, state: int) -> np.ndarray:
        """int32 [256]: the state's transitions by byte."""
        self._built(state)
        return self.table[state]

    def byte_rows(self, states: np.ndarray | list[int]) -> np.ndarray:
        """int32 [len(states), 256]: byte-indexed rows of some states."""
        self.expand(states)
        return self.table[np.asarray(states, dtype=np.int64)]

    def can_continue(self, state: int) -> bool:
        self._built(state)
        return bool(self._live[state] > 0)

    def live_bytes(self, state: int) -> int:
        """How many bytes lead from `state` to a state other than DEAD."""
        self._built(state)
        return int(self._live[state])

    def forced_byte(self, state: int) -> int:
        """The one byte `state` allows when it allows exactly one and is not accepting; -1."""
        self._built(state)
        return int(self._forced[state])

    def forced_run(
        self, state: int, limit: int, stop: Container[int]
    ) -> tuple[list[int], bytearray, int]:
        """From `state`, the states that each allow exactly one byte (`forced_byte` >= 0,
        their rows built) and those bytes, up to `limit` bytes or a state in `stop`; and the
        state after them. One lock for the run, no per-row call chain: a forced text's first
        visit builds up to `limit` rows in one mask."""
        path: list[int] = []
        text = bytearray()
        s = state
        with self._lock:
            if self._core is not None:  # the run's rows built and read in C, in one call
                self._room(native_dfa.NEW_PER_EXPAND)
                path, raw, s = self._core.forced_run(s, limit)
                self._n = self._core.num_states
                for k, x in enumerate(path):
                    if x in stop:  # (the run cut where the caller's text is known)
                        path, raw, s = path[:k], raw[:k], x
                        break
                text += raw
            while len(path) < limit and s not in stop:
                if self._live[s] < 0:
                    self._expand(s)
                b = int(self._forced[s])
                if b < 0:
                    break
                path.append(s)
                text.append(b)
                s = int(self.table[s, b])  # (the table as it is after any growth)
        return path, text, s

    # --- construction (under the lock) ------------------------------------------------

    def _closure(self, s: int) -> tuple[int, ...]:
        """NFA states reachable from s by epsilon edges that matter for a DFA state: those
        with byte edges, and the final state."""
        c = self._closures.get(s)
        if c is not None:
            return c
        nfa = self._nfa
        if nfa.edges[s] is None:
            nfa.fill(s)
        if nfa.eps[s]:
            c = tuple(sorted(nfa.eps_closure(s)))
        else:  # most targets: a state with byte edges and no epsilon
            c = (s,) if nfa.edges[s] or s == nfa.final else ()
        self._closures[s] = c
        return c

    def _state_id(self, target: tuple[int, ...]) -> int:
        j = self._index.get(target)
        if j is None:
            j = len(self._order)
            if j > self.max_states:
                raise over_budget(self.max_states)
            if j >= self.table.shape[0]:
                self._grow()
            self.table[j] = UNEXPANDED  # (rows past the numbered states are not written)
            self._index[target] = j
            self._order.append(target)
            self.accepting[j] = self._nfa.final in target
            self._live[j] = self._forced[j] = -1
            self._n = j + 1
        return j

    def _grow(self) -> None:
        """Double the capacity. The new rows stay unwritten until their states are numbered
        (`_state_id`): memory past the table's numbered states is never touched. Filling them
        at once doubled what a grow writes, all of it in one mask (a forked worker's grow at
        2048 rows: ~2 ms, ~950 page faults)."""
        cap = self.table.shape[0]
        table = np.empty((2 * cap, 256), dtype=np.int32)
        table[:cap] = self.table
        accepting = np.zeros(2 * cap, dtype=bool)
        accepting[:cap] = self.accepting
        live, forced = np.empty(2 * cap, dtype=np.int32), np.empty(2 * cap, dtype=np.int32)
        live[:cap], forced[:cap] = self._live, self._forced
        self._live, self._forced = live, forced
        self.accepting = accepting
        self.table = table

    def _single_id(self, t: int) -> int:
        j = self._single.get(t)
        if j is None:
            j = self._single[t] = self._state_id(self._closure(t))
        return j

    def _bind(self) -> None:
        """Hand the core the current arrays (after construction or growth)."""
        if self._bound is not self.table:
            self._core.bind(self.table, self.accepting, self._live, self._forced)
            self._bound = self.table

    def _room(self, n: int) -> None:
        """Room in the arrays for n states past the numbered ones (C writes in place)."""
        while self._n + n > self.table.shape[0]:
            self._grow()
        self._bind()

    def _expand_native(self, i: int) -> None:
        self._room(native_dfa.NEW_PER_EXPAND)  # room for every state one expansion may number
        ok = self._core.expand(i)
        self._n = self._core.num_states  # (with those numbered before the budget ran out)
        if not ok:
            raise over_budget(self.max_states)

    def _expand(self, i: int) -> None:
        if self._core is not None:
            self._expand_native(i)
            return
        edges = self._nfa.edges
        states = self._order[i]
        e = edges[states[0]]
        if len(states) == 1 and len(e) == 2:  # over half the rows: one NFA state, one edge
            masks, targets = (e[0],), (e[1],)
        else:
            # sorted by mask: a state set's edges in one canonical order, so sets of the same
            # shape (the copies of a counted character, the same key trie under other targets)
            # share their template
            pairs = []
            for s in states:
                e = edges[s]
                if len(e) == 2:  # most NFA states: one edge
                    pairs.append((e[0], e[1]))
                else:
                    pairs.extend(zip(e[::2], e[1::2], strict=True))
            pairs.sort()
            masks = tuple([m for m, _ in pairs])
            targets = [t for _, t in pairs]
        slots, byte_slot, n_live, only = _template(masks)
        ids = [DEAD]
        single = self._single
        for sl in slots[1:]:
            if len(sl) == 1:
                t = targets[sl[0]]
                j = single.get(t)
                ids.append(self._single_id(t) if j is None else j)
                continue
            ts = {targets[e] for e in sl}
            if len(ts) == 1:
                ids.append(self._single_id(next(iter(ts))))
                continue
            key = tuple(sorted(ts))
            j = self._multi.get(key)
            if j is None:
                union = set().union(*[self._closure(t) for t in key])
                j = self._multi[key] = self._state_id(tuple(sorted(union)))
            ids.append(j)
        # after any growth (the current table); the row before `_live` marks it built, as
        # readers check `_live` without the lock
        self.table[i] = np.asarray(ids, dtype=np.int32)[byte_slot]
        self._forced[i] = -1 if self.accepting[i] else only
        # no target is dead (an NFA without dead ends): the live bytes are the template's
        self._live[i] = n_live
