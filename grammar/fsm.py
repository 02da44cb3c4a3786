"""Byte-level DFA: subset construction over byte classes, dense numpy transition table.

State 0 is the dead state (every byte leads back to it); state 1 is the start state. Every other
state can still reach an accepting state (states that cannot are folded into the dead state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from grammar.errors import GrammarError
from grammar.nfa import NFA

DEAD = 0
START = 1
DEFAULT_MAX_STATES = 50_000


@dataclass(slots=True, eq=False)
class ByteDFA:
    """A DFA over bytes.

    table: int32 [n_states, n_classes]; byte_to_class: int32 [256]; accepting: bool [n_states].
    rows / classes are the same data as Python lists, for fast scalar walks.
    """

    table: np.ndarray
    byte_to_class: np.ndarray
    accepting: np.ndarray
    rows: list[list[int]] = field(repr=False)
    classes: list[int] = field(repr=False)

    @property
    def num_states(self) -> int:
        return int(self.table.shape[0])

    def walk(self, state: int, data: bytes) -> int:
        """State after reading `data` from `state` (DEAD if it dies on the way)."""
        rows, classes = self.rows, self.classes
        for b in data:
            state = rows[state][classes[b]]
            if state == DEAD:
                return DEAD
        return state

    def matches(self, data: bytes) -> bool:
        return bool(self.accepting[self.walk(START, data)])

    def byte_table(self) -> np.ndarray:
        """int32 [n_states, 256]: the transition table indexed by raw byte."""
        return self.table[:, self.byte_to_class]


def regex_to_dfa(pattern: str, max_states: int = DEFAULT_MAX_STATES) -> ByteDFA:
    """Compile a regex (Python `re` syntax, full match) to a byte-level DFA."""
    nfa = NFA(max_states=max_states * 8)
    start = nfa.add_regex(pattern)
    return nfa_to_dfa(nfa, start, max_states)


def node_to_dfa(node: object, max_states: int = DEFAULT_MAX_STATES) -> ByteDFA:
    """Compile a regex syntax tree (grammar.regex_ast) to a byte-level DFA."""
    nfa = NFA(max_states=max_states * 8)
    start = nfa.add_node(node)
    return nfa_to_dfa(nfa, start, max_states)


def _byte_classes(masks: list[int]) -> list[int]:
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


def nfa_to_dfa(nfa: NFA, start: int, max_states: int) -> ByteDFA:
    masks = sorted({m for es in nfa.edges for m, _ in es})
    class_sets = _byte_classes(masks)
    byte_to_class = np.zeros(256, dtype=np.int32)
    for ci, c in enumerate(class_sets):
        for b in range(256):
            if c >> b & 1:
                byte_to_class[b] = ci
    mask_classes = {m: [ci for ci, c in enumerate(class_sets) if c & m] for m in masks}
    n_classes = len(class_sets)

    # epsilon closure, keeping only states that matter for a DFA state: those with byte edges,
    # and the final state
    closures: dict[int, frozenset[int]] = {}
    eps, edges, final = nfa.eps, nfa.edges, nfa.final

    def closure(s: int) -> frozenset[int]:
        c = closures.get(s)
        if c is None:
            seen, stack, keep = {s}, [s], []
            while stack:
                x = stack.pop()
                if edges[x] or x == final:
                    keep.append(x)
                for y in eps[x]:
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
            c = closures[s] = frozenset(keep)
        return c

    start_set = closure(start)
    index: dict[frozenset[int], int] = {start_set: START}
    order: list[frozenset[int]] = [frozenset(), start_set]
    rows: list[list[int]] = [[DEAD] * n_classes]
    i = START
    while i < len(order):
        moves: dict[int, set[int]] = {}
        for s in order[i]:
            for m, t in edges[s]:
                for c in mask_classes[m]:
                    moves.setdefault(c, set()).add(t)
        row = [DEAD] * n_classes
        by_targets: dict[frozenset[int], int] = {}
        for c, ts in moves.items():
            key = frozenset(ts)
            j = by_targets.get(key)
            if j is None:
                target = frozenset().union(*(closure(t) for t in ts))
                j = index.get(target)
                if j is None:
                    j = len(order)
                    if j > max_states:
                        raise GrammarError(
                            f"DFA exceeds the state budget ({max_states} states); "
                            "simplify the constraint (e.g. smaller maxLength / maxItems)"
                        )
                    index[target] = j
                    order.append(target)
                by_targets[key] = j
            row[c] = j
        rows.append(row)
        i += 1

    accepting = np.array([final in s for s in order], dtype=bool)
    table = np.array(rows, dtype=np.int32).reshape(len(order), n_classes)
    table, accepting = _prune_dead_ends(table, accepting)
    if not table[START].any() and not accepting[START]:
        raise GrammarError("the constraint matches nothing")
    return ByteDFA(
        table=table,
        byte_to_class=byte_to_class,
        accepting=accepting,
        rows=table.tolist(),
        classes=byte_to_class.tolist(),
    )


def _prune_dead_ends(table: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send transitions into states that cannot reach acceptance to DEAD."""
    n = table.shape[0]
    src = np.repeat(np.arange(n), table.shape[1])
    dst = table.reshape(-1)
    order = np.argsort(dst, kind="stable")
    src_sorted, starts = src[order], np.searchsorted(dst[order], np.arange(n + 1))
    live = accepting.copy()
    live[DEAD] = False
    stack = list(np.nonzero(live)[0])
    while stack:
        x = stack.pop()
        for p in src_sorted[starts[x] : starts[x + 1]].tolist():
            if not live[p]:
                live[p] = True
                stack.append(p)
    if live[1:].all():
        return table, accepting
    table = np.where(live[table], table, DEAD).astype(np.int32)
    table[~live] = DEAD
    return table, accepting & live
