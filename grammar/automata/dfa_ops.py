"""Exact language operations on byte DFAs, and a regex-tree leaf that embeds one.

Used where a keyword combination is not a plain regex: a string `pattern` with minLength /
maxLength (the pattern DFA times a character counter), and `patternProperties` keys (pattern
DFAs intersected with / subtracted from the set of escape-free keys). ``DFANode`` puts the
result back into the regex tree; the NFA builder copies its states in.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from grammar.automata.fsm import DEAD, START, ByteDFA, _prune_dead_ends
from grammar.errors import GrammarError

DEFAULT_MAX_PRODUCT = 50_000


class DFANode:
    """A regex-tree leaf matching exactly the language of `dfa`.

    It has no regex text form: ``regex_ast.to_text`` raises UnsupportedSchemaError naming
    `keyword` and `pointer` (the schema place that needed it); compiling to a DFA honours it."""

    __slots__ = ("dfa", "keyword", "pointer", "text")

    def __init__(self, dfa: ByteDFA, keyword: str, pointer: str, text: str | None = None) -> None:
        self.dfa = dfa
        self.keyword = keyword
        self.pointer = pointer
        self.text = text  # a regex of the same language, when there is one


def from_rows(rows: list[list[int]], accepting: list[bool]) -> ByteDFA:
    """A ByteDFA from 256-column rows (row 0 dead, row 1 start), with byte classes and pruning."""
    table256 = np.array(rows, dtype=np.int32).reshape(len(rows), 256)
    cols, byte_to_class = np.unique(table256.T, axis=0, return_inverse=True)
    table = np.ascontiguousarray(cols.T).astype(np.int32)
    byte_to_class = byte_to_class.reshape(-1).astype(np.int32)
    acc = np.array(accepting, dtype=bool)
    acc[DEAD] = False
    table, acc = _prune_dead_ends(table, acc)
    return ByteDFA(
        table=table,
        byte_to_class=byte_to_class,
        accepting=acc,
        rows=table.tolist(),
        classes=byte_to_class.tolist(),
    )


def _explore(
    start: tuple,
    step: Callable[[tuple, int], tuple | None],
    accept: Callable[[tuple], bool],
    max_states: int,
    groups: list[list[int]] | None = None,
) -> ByteDFA:
    """BFS over composite states; `step` returns None for the dead state. `groups`: bytes
    that `step` treats alike (it is called once per group, with the group's first byte)."""
    table, byte_to_class, order = _explore_rows(start, step, max_states, groups)
    acc = np.array([False] + [accept(s) for s in order[1:]], dtype=bool)
    table, acc = _prune_dead_ends(table, acc)
    return ByteDFA(table=table, byte_to_class=byte_to_class, accepting=acc)


def _explore_rows(
    start: tuple,
    step: Callable[[tuple, int], tuple | None],
    max_states: int,
    groups: list[list[int]] | None,
) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
    """_explore's BFS: the table by byte class (row 0 dead; the groups are the classes, the
    ones with equal columns merged), each byte's class, and the composite state of each row."""
    groups = groups or [[b] for b in range(256)]
    index: dict[tuple, int] = {start: START}
    order: list[tuple] = [(), start]
    rows: list[list[int]] = [[DEAD] * len(groups)]
    firsts = [g[0] for g in groups]
    i = START
    while i < len(order):
        st = order[i]
        row = [DEAD] * len(groups)
        for c, b in enumerate(firsts):
            nxt = step(st, b)
            if nxt is None:
                continue
            j = index.get(nxt)
            if j is None:
                j = len(order)
                if j > max_states:
                    raise GrammarError(f"product automaton exceeds its budget ({max_states})")
                index[nxt] = j
                order.append(nxt)
            row[c] = j
        rows.append(row)
        i += 1
    table = np.array(rows, dtype=np.int32).reshape(len(rows), len(groups))
    # groups whose columns are equal are one class (hashing columns: no sort of the table)
    cls_of: dict[bytes, int] = {}
    group_cls = [cls_of.setdefault(table[:, c].tobytes(), len(cls_of)) for c in range(len(groups))]
    keep = [group_cls.index(k) for k in range(len(cls_of))]
    byte_to_class = np.zeros(256, dtype=np.int32)
    for g, k in zip(groups, group_cls, strict=True):
        byte_to_class[g] = k
    return np.ascontiguousarray(table[:, keep]), byte_to_class, order


def split_regions(
    keys: ByteDFA, parts: list[ByteDFA], max_states: int = DEFAULT_MAX_PRODUCT
) -> list[tuple[ByteDFA, tuple[bool, ...]]]:
    """The non-empty regions of L(keys) cut by every L(parts[i]): for each signature (in part
    i or not, for every i) that some key has, the keys with exactly that signature. One
    product over all automata at once (a state: the key state and the live parts' states);
    regions in the order of their signatures, "in" before "not in" part by part. When that
    product outgrows the budget, the regions are cut one part at a time instead."""
    try:
        return _split_at_once(keys, parts, max_states)
    except GrammarError:
        pass
    regions: list[tuple[ByteDFA, tuple[bool, ...]]] = [(keys, ())]
    for dfa in parts:
        regions = [
            (part, (*inside, keep))
            for region, inside in regions
            for keep in (True, False)
            if (part := product(region, dfa, keep, max_states)).accepting.any()
        ]
    return regions


def _split_at_once(
    keys: ByteDFA, parts: list[ByteDFA], max_states: int
) -> list[tuple[ByteDFA, tuple[bool, ...]]]:
    tk = keys.byte_table().tolist()
    tp = [p.byte_table().tolist() for p in parts]
    n = len(parts)

    def step(st: tuple, byte: int) -> tuple | None:
        k = tk[st[0]][byte]
        if k == DEAD:
            return None
        live = []
        for i, s in st[1]:
            x = tp[i][s][byte]
            if x != DEAD:
                live.append((i, x))
        return (k, tuple(live))

    def signature(st: tuple) -> tuple[bool, ...] | None:
        if st == () or not keys.accepting[st[0]]:
            return None
        inside = [False] * n
        for i, s in st[1]:
            inside[i] = bool(parts[i].accepting[s])
        return tuple(inside)

    groups = _byte_groups(keys.byte_to_class.item, *(p.byte_to_class.item for p in parts))
    start = (START, tuple((i, START) for i in range(n)))
    table, byte_to_class, order = _explore_rows(start, step, max_states, groups)
    sigs = [signature(st) for st in order]
    out = []
    for sig in sorted({g for g in sigs if g is not None}, key=lambda g: [not x for x in g]):
        acc = np.array([g == sig for g in sigs], dtype=bool)
        t, a = _prune_dead_ends(table, acc)
        out.append((ByteDFA(table=t, byte_to_class=byte_to_class, accepting=a), sig))
    return out


def _byte_groups(*keys: Callable[[int], object]) -> list[list[int]]:
    """Bytes grouped by the tuple of their keys (e.g. their byte class in each automaton)."""
    out: dict[tuple, list[int]] = {}
    for b in range(256):
        out.setdefault(tuple(k(b) for k in keys), []).append(b)
    return list(out.values())


def product(a: ByteDFA, b: ByteDFA, keep_b: bool, max_states: int = DEFAULT_MAX_PRODUCT) -> ByteDFA:
    """L(a) & L(b) if keep_b else L(a) - L(b)."""
    ta, tb = a.byte_table().tolist(), b.byte_table().tolist()

    def step(st: tuple, byte: int) -> tuple | None:
        x = ta[st[0]][byte]
        if x == DEAD:
            return None
        y = tb[st[1]][byte]
        if y == DEAD and keep_b:
            return None
        return (x, y)

    def accept(st: tuple) -> bool:
        return bool(a.accepting[st[0]]) and bool(b.accepting[st[1]]) == keep_b

    groups = _byte_groups(a.byte_to_class.item, b.byte_to_class.item)
    return _explore((START, START), step, accept, max_states, groups)


# escape tracking inside JSON string content: 0 normal, 1 after '\', 2..5 hex digits left (4..1)
def _char_step(esc: int, byte: int) -> tuple[int, int]:
    """(new escape state, characters started) for one byte of JSON string content.

    States: 0 plain; 1 after a backslash; 2..5 inside `\\uXXXX` (2: after `u`); 6: after
    `\\uD`, 7 and 8: inside a high surrogate; 9: after one (its low half follows); 10: a
    backslash after a high surrogate. A surrogate pair counts as one character."""
    if esc in (0, 9):
        if byte == 0x5C:
            return (10, 0) if esc == 9 else (1, 1)
        return 0, 0 if 0x80 <= byte <= 0xBF else 1
    if esc == 1:
        return (2 if byte == 0x75 else 0), 0
    if esc == 10:  # `\\u` continues the pair; another escape is a character of its own
        return (2, 0) if byte == 0x75 else (0, 1)
    if esc == 2:
        return (6 if byte in b"dD" else 3), 0
    if esc == 6:
        return (7 if byte in b"89abAB" else 4), 0
    if esc in (7, 8):
        return (esc + 1), 0
    return (esc + 1 if esc < 5 else 0), 0


def with_length(
    content: ByteDFA, lo: int, hi: int | None, max_states: int = DEFAULT_MAX_PRODUCT
) -> ByteDFA:
    """The strings of `content` (valid JSON string content) whose decoded length is in lo..hi.

    A decoded character starts at every byte that is not a UTF-8 continuation byte and not
    inside an escape sequence (`\\n`, `\\uXXXX` count once)."""
    t = content.byte_table().tolist()
    cap = lo if hi is None else hi + 1

    def step(st: tuple, byte: int) -> tuple | None:
        s, esc, n = st
        x = t[s][byte]
        if x == DEAD:
            return None
        esc2, add = _char_step(esc, byte)
        n2 = min(n + add, cap)
        if hi is not None and n2 > hi:
            return None
        return (x, esc2, n2)

    def accept(st: tuple) -> bool:
        s, esc, n = st
        return bool(content.accepting[s]) and esc in (0, 9) and n >= lo

    groups = _byte_groups(
        content.byte_to_class.item, lambda b: tuple(_char_step(e, b) for e in range(11))
    )
    return _explore((START, 0, 0), step, accept, max_states, groups)


__all__ = ["DFANode", "from_rows", "product", "split_regions", "with_length"]
