"""Byte-level DFA: subset construction over byte classes, dense numpy transition table.

State 0 is the dead state (every byte leads back to it); state 1 is the start state. Every other
state can still reach an accepting state (states that cannot are folded into the dead state).

The construction is built for large automata (a JSON string with maxLength 30000 is ~13 DFA
states per counted character: UTF-8 continuation and `\\uXXXX` paths; the default budget is 1M
states): a DFA state's row comes from a template (byte class -> which of its NFA edges fire),
shared by every DFA state whose NFA states have the same edge masks (the copies of a counted
character all do), so a row costs a few dict lookups and no per-class Python work; the table is
gathered from the templates with numpy at the end, and no Python list-of-rows copy is kept.
The cyclic GC is paused while building (millions of small containers).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import numpy as np

from grammar.automata import native_dfa
from grammar.automata.lazy_dfa import DEAD, START, LazyDFA, over_budget
from grammar.automata.lazy_dfa import byte_classes as _byte_classes
from grammar.automata.nfa import NFA
from grammar.automata.nfa_blocks import Embedded, class_masks
from grammar.errors import GrammarError

DEFAULT_MAX_STATES = 1_000_000


_C_FROM = 64  # NFAs with fewer states are determinised here: the C core's set-up costs more


def nfa_budget(max_states: int) -> int:
    """The NFA state budget for a DFA budget: 8x up to 400k NFA states, then 2x (an NFA state
    costs ~250 bytes while built; bench schemas need ~1.5 NFA states per DFA state)."""
    return min(8 * max_states, max(400_000, 2 * max_states))


class ByteDFA:
    """A DFA over bytes.

    table: int32 [n_states, n_classes]; byte_to_class: int32 [256]; accepting: bool [n_states].
    `classes` is byte_to_class as a list; `rows` (the table as Python lists) is made on first
    use only, as it costs ~30x the table's memory: scalar walks read a flat view instead.
    """

    __slots__ = (
        "table",
        "byte_to_class",
        "accepting",
        "classes",
        "class_masks",
        "_rows",
        "_flat",
        "_n_cls",
        "_out",
    )
    lazy = False

    def __init__(
        self,
        table: np.ndarray,
        byte_to_class: np.ndarray,
        accepting: np.ndarray,
        rows: list[list[int]] | None = None,
        classes: list[int] | None = None,
    ) -> None:
        self.table = np.ascontiguousarray(table, dtype=np.int32)
        self.byte_to_class = np.asarray(byte_to_class, dtype=np.int32)
        self.accepting = accepting
        self.classes = self.byte_to_class.tolist() if classes is None else classes
        self._rows = rows
        self.class_masks: list[int] | None = None  # bytes per class (made by the NFA builder)
        self._out: tuple[list[int], list[int]] | None = None
        self._n_cls = int(self.table.shape[1])
        # flat 1-D view of the table: indexing gives Python ints without a copy of the data
        self._flat = memoryview(self.table.reshape(-1)) if self.table.size else [DEAD] * 256

    def __reduce__(self) -> tuple:
        return (ByteDFA, (self.table, self.byte_to_class, self.accepting))

    def __repr__(self) -> str:
        return f"ByteDFA(states={self.num_states}, classes={self._n_cls})"

    @property
    def rows(self) -> list[list[int]]:
        if self._rows is None:
            self._rows = self.table.tolist()
        return self._rows

    @property
    def num_states(self) -> int:
        return int(self.table.shape[0])

    @property
    def num_classes(self) -> int:
        return self._n_cls

    def step(self, state: int, byte: int) -> int:
        return self._flat[state * self._n_cls + self.classes[byte]]

    def walk(self, state: int, data: bytes) -> int:
        """State after reading `data` from `state` (DEAD if it dies on the way)."""
        flat, classes, n = self._flat, self.classes, self._n_cls
        for b in data:
            state = flat[state * n + classes[b]]
            if state == DEAD:
                return DEAD
        return state

    def matches(self, data: bytes) -> bool:
        return bool(self.accepting[self.walk(START, data)])

    def byte_table(self) -> np.ndarray:
        """int32 [n_states, 256]: the transition table indexed by raw byte (n_states x 1 KiB:
        prefer `table` / `byte_to_class` for large automata)."""
        return self.table[:, self.byte_to_class]

    def byte_rows(self, states: np.ndarray | list[int]) -> np.ndarray:
        """int32 [len(states), 256]: byte-indexed rows of some states."""
        return self.table[np.asarray(states, dtype=np.int64)][:, self.byte_to_class]

    def byte_row(self, state: int) -> np.ndarray:
        """int32 [256]: the state's transitions by byte."""
        return self.table[state][self.byte_to_class]

    def row_list(self, state: int) -> list[int]:
        """The state's transitions by byte, as a Python list."""
        return self.byte_row(state).tolist()

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)

    def can_continue(self, state: int) -> bool:
        return self._out_info()[0][state] > 0

    def forced_byte(self, state: int) -> int:
        """The one byte `state` allows when it allows exactly one and is not accepting; -1."""
        return self._out_info()[1][state]

    def _out_info(self) -> tuple[list[int], list[int]]:
        """Per state: how many bytes live, and the one byte it forces (-1 if none); from the
        class table (a class of k bytes counts k times)."""
        if self._out is None:
            table = self.table
            sizes = np.bincount(self.byte_to_class, minlength=table.shape[1])
            first_byte = np.zeros(table.shape[1], dtype=np.int64)
            first_byte[self.byte_to_class[::-1]] = np.arange(255, -1, -1)
            n_live = np.zeros(table.shape[0], dtype=np.int64)
            only_cls = np.zeros(table.shape[0], dtype=np.int64)
            for c in range(table.shape[1]):
                live_c = table[:, c] != 0
                n_live += live_c * int(sizes[c])
                only_cls[live_c] = c
            only = np.where((n_live == 1) & ~self.accepting, first_byte[only_cls], -1)
            self._out = (n_live.tolist(), only.tolist())
        return self._out


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic GC off while an automaton is built: construction allocates millions of small
    acyclic containers, and the collections they trigger would each rescan all of them
    (more than halves the build time of a large automaton)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def regex_to_dfa(pattern: str, max_states: int = DEFAULT_MAX_STATES) -> ByteDFA:
    """Compile a regex (Python `re` syntax, full match) to a byte-level DFA."""
    with no_gc():
        nfa = NFA(max_states=nfa_budget(max_states))
        start = nfa.add_regex(pattern)
        return nfa_to_dfa(nfa, start, max_states)


def node_to_dfa(node: object, max_states: int = DEFAULT_MAX_STATES) -> ByteDFA:
    """Compile a regex syntax tree (grammar.automata.regex_ast) to a byte-level DFA."""
    with no_gc():
        nfa = NFA(max_states=nfa_budget(max_states))
        start = nfa.add_node(node)
        return nfa_to_dfa(nfa, start, max_states)


def node_to_lazy_dfa(node: object, max_states: int = DEFAULT_MAX_STATES) -> LazyDFA | ByteDFA:
    """A regex syntax tree (or regex text) to a DFA for a compiled constraint: determinised on
    demand (`LazyDFA`), or eagerly when some piece matches nothing (only the eager
    construction prunes the dead ends that leaves)."""
    with no_gc():
        nfa = NFA(max_states=nfa_budget(max_states))
        if isinstance(node, str):
            start = nfa.add_regex(node, lazy=True)
        else:
            start = nfa.add_node(node, lazy=True)
        if nfa.dead_end_possible:
            return nfa_to_dfa(nfa, start, max_states)
        return LazyDFA(nfa, start, max_states)


def _class_layout(edges: list) -> tuple[int, np.ndarray, dict[int, tuple[int, ...]]]:
    """The byte classes of an NFA's edge masks: (number of classes, byte -> class, mask -> the
    classes it covers)."""
    masks = sorted({m for es in edges for m in es[::2]})
    class_sets = _byte_classes(masks)
    b2c = [0] * 256
    for ci, c in enumerate(class_sets):
        while c:  # each set bit once
            low = c & -c
            b2c[low.bit_length() - 1] = ci
            c ^= low
    mask_classes = {m: tuple(ci for ci, c in enumerate(class_sets) if c & m) for m in masks}
    return len(class_sets), np.array(b2c, dtype=np.int32), mask_classes


class _RowTemplates:
    """Rows come from templates: the classes -> "which of the DFA state's NFA edges fire" map
    depends only on the edges' masks, so DFA states of the same shape (the copies of a counted
    character, say) share it, and their row is one C-level gather of target ids.

    `sig[s]`: the id of NFA state s's tuple of edge masks (-1 until `edge_info(s)`), `tgt[s]`:
    its edges' targets; `slots_of_class[tid]`: for template tid, the slot of each byte class."""

    __slots__ = ("edges", "n_classes", "mask_classes", "sig", "tgt", "sig_ids", "sig_masks",
                 "templates", "slots_of_class")  # fmt: skip

    def __init__(self, edges: list, n_classes: int, mask_classes: dict) -> None:
        self.edges = edges
        self.n_classes = n_classes
        self.mask_classes = mask_classes
        self.sig: list[int] = [-1] * len(edges)
        self.tgt: list[tuple[int, ...] | None] = [None] * len(edges)
        self.sig_ids: dict[tuple[int, ...], int] = {}
        self.sig_masks: list[tuple[int, ...]] = []
        self.templates: dict[tuple[int, ...], tuple[int, list[tuple[int, ...]]]] = {}
        self.slots_of_class: list[list[int]] = []

    def template(self, key: tuple[int, ...]) -> tuple[int, list[tuple[int, ...]]]:
        """(template id, the edge positions that fire in each slot; slot 0 fires none)."""
        hit = self.templates.get(key)
        if hit is not None:
            return hit
        fire: list[list[int]] = [[] for _ in range(self.n_classes)]
        e = 0
        for sid in key:
            for m in self.sig_masks[sid]:
                for c in self.mask_classes[m]:
                    fire[c].append(e)
                e += 1
        slot_of: dict[tuple[int, ...], int] = {(): 0}
        slots: list[tuple[int, ...]] = [()]
        cls_slot = []
        for f in fire:
            k = tuple(f)
            j = slot_of.get(k)
            if j is None:
                j = slot_of[k] = len(slots)
                slots.append(k)
            cls_slot.append(j)
        hit = self.templates[key] = (len(self.slots_of_class), slots)
        self.slots_of_class.append(cls_slot)
        return hit

    def edge_info(self, s: int) -> int:
        es = self.edges[s]  # flat: mask, target, mask, target, ...
        if len(es) == 2:
            k: tuple[int, ...] = (es[0],)
            self.tgt[s] = (es[1],)
        else:
            k = es[::2]
            self.tgt[s] = es[1::2]
        x = self.sig_ids.get(k)
        if x is None:
            x = self.sig_ids[k] = len(self.sig_masks)
            self.sig_masks.append(k)
        self.sig[s] = x
        return x


def _gather_table(
    n: int, n_classes: int, row_tpl: list[int], row_off: list[int], slot_ids: list[int],
    slots_of_class: list[list[int]],
) -> np.ndarray:  # fmt: skip
    """The dense table from each row's template and the offset of its slot ids, gathered per
    template with numpy (rows with template -1 stay DEAD)."""
    table = np.zeros((n, n_classes), dtype=np.int32)
    tpl_arr = np.array(row_tpl, dtype=np.int64)
    off_arr = np.array(row_off, dtype=np.int64)
    ids_arr = np.array(slot_ids, dtype=np.int32)
    order_by_tpl = np.argsort(tpl_arr, kind="stable")
    bounds = np.searchsorted(tpl_arr[order_by_tpl], np.arange(len(slots_of_class) + 1))
    for tid, cls_slot in enumerate(slots_of_class):
        slot_of_class = np.array(cls_slot, dtype=np.int64)[None, :]
        for lo in range(int(bounds[tid]), int(bounds[tid + 1]), 1 << 16):  # bounded temporaries
            rows_t = order_by_tpl[lo : min(lo + (1 << 16), int(bounds[tid + 1]))]
            table[rows_t] = ids_arr[off_arr[rows_t][:, None] + slot_of_class]
    return table


def nfa_to_dfa(nfa: NFA, start: int, max_states: int) -> ByteDFA:
    """The whole DFA of `nfa` from `start`: built in C (`native_dfa.eager_rows`) when the NFA
    has at least _C_FROM states, else (or when C is off or unavailable) here."""
    if len(nfa.eps) >= _C_FROM:
        rows = native_dfa.eager_rows(nfa, start, max_states, over_budget)
        if rows is not None:
            return _from_byte_rows(nfa, *rows)
    return _nfa_to_dfa_py(nfa, start, max_states)


def _from_byte_rows(nfa: NFA, table: np.ndarray, accepting: np.ndarray) -> ByteDFA:
    """A ByteDFA from the byte-indexed table of `nfa`'s DFA (state 0 DEAD, 1 the start): the
    byte classes of the NFA's masks (as the Python construction's); dead ends pruned when some
    NFA piece matches nothing."""
    if table.shape[0] < 2:
        raise GrammarError("the constraint matches nothing")
    masks = {m for es in nfa.edges if es for m in es[::2]}
    for block in nfa.blocks:  # (their states were filled by the core, not in `edges`)
        if isinstance(block, Embedded):
            masks.update(class_masks(block.dfa))
    class_sets = _byte_classes(sorted(masks))
    byte_to_class = np.zeros(256, dtype=np.int32)
    first = np.zeros(len(class_sets), dtype=np.int64)  # a byte of each class
    for ci, c in enumerate(class_sets):
        first[ci] = (c & -c).bit_length() - 1
        while c:
            low = c & -c
            byte_to_class[low.bit_length() - 1] = ci
            c ^= low
    table = np.ascontiguousarray(table[:, first])
    if nfa.dead_end_possible:
        table, accepting = _prune_dead_ends(table, accepting)
    if not table[START].any() and not accepting[START]:
        raise GrammarError("the constraint matches nothing")
    return ByteDFA(table=table, byte_to_class=byte_to_class, accepting=accepting)


def _nfa_to_dfa_py(nfa: NFA, start: int, max_states: int) -> ByteDFA:
    nfa.materialize()
    eps, edges, final = nfa.eps, nfa.edges, nfa.final
    n_classes, byte_to_class, mask_classes = _class_layout(edges)

    # epsilon closure, keeping only states that matter for a DFA state: those with byte edges,
    # and the final state
    closures: dict[int, frozenset[int]] = {}
    empty: list[int] = []  # NFA states with an empty closure: ways into dead ends

    def closure(s: int) -> frozenset[int]:
        c = closures.get(s)
        if c is None:
            if not eps[s]:
                if edges[s] or s == final:
                    c = closures[s] = frozenset((s,))
                else:
                    c = closures[s] = frozenset()
                    empty.append(s)
                return c
            keep = nfa.eps_closure(s)
            c = closures[s] = frozenset(keep)
            if not keep:
                empty.append(s)
        return c

    index: dict[frozenset[int], int] = {frozenset(): DEAD}
    order: list[frozenset[int]] = [frozenset()]

    def state_id(target: frozenset[int]) -> int:
        j = index.get(target)
        if j is None:
            j = len(order)
            if j > max_states:
                raise over_budget(max_states)
            index[target] = j
            order.append(target)
        return j

    single: dict[int, int] = {}  # NFA state t -> DFA id of closure(t)

    def single_id(t: int) -> int:
        j = single.get(t)
        if j is None:
            j = single[t] = state_id(closure(t))
        return j

    rows = _RowTemplates(edges, n_classes, mask_classes)
    sig, tgt, template, edge_info = rows.sig, rows.tgt, rows.template, rows.edge_info
    multi: dict[frozenset[int], int] = {}  # a set of NFA targets -> DFA id of their closure

    if state_id(closure(start)) != START:
        raise GrammarError("the constraint matches nothing")
    # per DFA state: its template and where its slot ids start in `slot_ids` (slot 0: DEAD);
    # the table is gathered from them at the end, per template, with numpy
    row_tpl: list[int] = [-1]
    row_off: list[int] = [0]
    slot_ids: list[int] = [DEAD]
    i = START
    while i < len(order):
        st = order[i]
        i += 1
        key = []
        targets: list[int] = []
        for s in st:
            x = sig[s]
            if x < 0:
                if not edges[s]:
                    continue
                x = edge_info(s)
            key.append(x)
            targets.extend(tgt[s])
        if not key:
            row_tpl.append(-1)
            row_off.append(0)
            continue
        tid, slots = template(tuple(key))
        row_tpl.append(tid)
        row_off.append(len(slot_ids))
        ids = slot_ids
        ids.append(DEAD)
        for sl in slots[1:]:
            if len(sl) == 1:
                ids.append(single_id(targets[sl[0]]))
                continue
            ts = frozenset(targets[e] for e in sl)
            if len(ts) == 1:
                ids.append(single_id(next(iter(ts))))
                continue
            j = multi.get(ts)
            if j is None:
                j = multi[ts] = state_id(frozenset().union(*(closure(t) for t in ts)))
            ids.append(j)

    n = len(order)
    accepting = np.zeros(n, dtype=bool)
    for j, st in enumerate(order):
        if final in st:
            accepting[j] = True
    for d in (index, closures, single, multi, rows.templates):
        d.clear()
    order.clear()
    table = _gather_table(n, n_classes, row_tpl, row_off, slot_ids, rows.slots_of_class)
    del row_tpl, row_off, slot_ids
    # An NFA built from a regex tree sends every piece on to its continuation, and embedded
    # automata come pruned: a DFA state can be a dead end only if some NFA state had nothing
    # in its closure (a character class that matches nothing, say)
    if empty:
        table, accepting = _prune_dead_ends(table, accepting)
    if not table[START].any() and not accepting[START]:
        raise GrammarError("the constraint matches nothing")
    return ByteDFA(table=table, byte_to_class=byte_to_class, accepting=accepting)


def _prune_dead_ends(
    table: np.ndarray, accepting: np.ndarray, into: list | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Send transitions into states that cannot reach acceptance to DEAD. The live states are
    found in C (`native_dfa.live_states`), else by a walk back over the table's `edges_into`;
    `into`, a list: that reverse graph kept in it when made (several pruning passes over one
    table share it)."""
    alive = native_dfa.live_states(table, accepting)
    if alive is None:
        if into is None:
            into = []
        if not into:
            into.append(edges_into(table))
        alive = _live_by_walk(*into[0], accepting)
    if alive[1:].all():
        return table, accepting
    table = np.where(alive[table], table, DEAD).astype(np.int32)
    table[~alive] = DEAD
    return table, accepting & alive


def _live_by_walk(src_sorted: np.ndarray, starts: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """The states that reach an accepting one (DEAD never), by a walk back from the accepting
    states over Python lists (a numpy slice per state costs more than its few edges)."""
    sources, bounds = src_sorted.tolist(), starts.tolist()
    live = accepting.tolist()
    live[DEAD] = False
    stack = [x for x in np.flatnonzero(accepting).tolist() if x != DEAD]
    while stack:
        x = stack.pop()
        for p in sources[bounds[x] : bounds[x + 1]]:
            if not live[p]:
                live[p] = True
                stack.append(p)
    return np.array(live, dtype=bool)


def edges_into(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The table's edges by target, each (source, target) pair once and none into DEAD (what
    pruning follows): (sources sorted by target, where each target's start)."""
    n, n_cls = table.shape
    flat = table.reshape(-1).astype(np.int64)
    keep = np.flatnonzero(flat)  # edges into DEAD never make a state live
    pairs = np.unique(flat[keep] * n + keep // n_cls)  # by target, then source
    dst = pairs // n
    return pairs - dst * n, np.searchsorted(dst, np.arange(n + 1))
