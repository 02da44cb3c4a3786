"""Exact language operations on byte DFAs, and a regex-tree leaf that embeds one.

Used where a keyword combination is not a plain regex: a string `pattern` with minLength /
maxLength (the pattern DFA times a character counter), and `patternProperties` keys (pattern
DFAs intersected with / subtracted from the set of escape-free keys). ``DFANode`` puts the
result back into the regex tree; the NFA builder copies its states in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import numpy.ma  # noqa: F401  np.unique imports it on first use (~15 ms in a schema's compile)

from grammar.automata import native_dfa
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
    table, byte_to_class = _merge_columns(table, groups)
    return table, byte_to_class, order


def _merge_columns(table: np.ndarray, groups: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """A table by byte group made a table by byte class: groups whose columns are equal are
    one class (hashing columns: no sort of the table); returns it and each byte's class."""
    cls_of: dict[bytes, int] = {}
    group_cls = [cls_of.setdefault(table[:, c].tobytes(), len(cls_of)) for c in range(len(groups))]
    keep = [group_cls.index(k) for k in range(len(cls_of))]
    byte_to_class = np.zeros(256, dtype=np.int32)
    for g, k in zip(groups, group_cls, strict=True):
        byte_to_class[g] = k
    return np.ascontiguousarray(table[:, keep]), byte_to_class


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


def _native_rows(
    dfas: list[ByteDFA], required: list[bool], groups: list[list[int]], max_states: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The product of `dfas` walked in C (`native_dfa.product_rows`; a component not
    `required` may die while the others go on): (table by byte class, each byte's class, each
    row's component states), numbered as `_explore_rows` numbers them; None without C."""
    firsts = np.array([g[0] for g in groups], dtype=np.int64)
    classes = np.stack([d.byte_to_class[firsts] for d in dfas])
    out = native_dfa.product_rows(
        [d.table for d in dfas], classes, required, [START] * len(dfas), max_states
    )
    if out is None:
        return None
    rows, states = out
    table, byte_to_class = _merge_columns(rows, groups)
    return table, byte_to_class, states


def _split_at_once(
    keys: ByteDFA, parts: list[ByteDFA], max_states: int
) -> list[tuple[ByteDFA, tuple[bool, ...]]]:
    groups = _class_groups(keys, *parts)
    native = _native_rows([keys, *parts], [True] + [False] * len(parts), groups, max_states)
    if native is not None:
        table, byte_to_class, states = native
        key_acc = np.asarray(keys.accepting)[states[:, 0]]
        key_acc[DEAD] = False
        inside = np.zeros((states.shape[0], len(parts)), dtype=bool)
        for i, p in enumerate(parts):
            inside[:, i] = np.asarray(p.accepting)[states[:, i + 1]]
        rows = zip(key_acc, inside.tolist(), strict=True)
        sigs = [tuple(row) if ok else None for ok, row in rows]
        return _regions(table, byte_to_class, sigs)
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

    start = (START, tuple((i, START) for i in range(n)))
    table, byte_to_class, order = _explore_rows(start, step, max_states, groups)
    return _regions(table, byte_to_class, [signature(st) for st in order])


def _regions(
    table: np.ndarray, byte_to_class: np.ndarray, sigs: list[tuple[bool, ...] | None]
) -> list[tuple[ByteDFA, tuple[bool, ...]]]:
    """One automaton per signature some row has (its rows accepting), "in" before "not in"."""
    out = []
    into: list = []  # one reverse graph for every region's pruning (when not pruned in C)
    keys = sorted({g for g in sigs if g is not None}, key=lambda g: [not x for x in g])
    index = {g: i for i, g in enumerate(keys)}
    of_row = np.array([index.get(g, -1) for g in sigs], dtype=np.int64)  # one pass, not per key
    for i, sig in enumerate(keys):
        acc = of_row == i
        t, a = _prune_dead_ends(table, acc, into)
        out.append((ByteDFA(table=t, byte_to_class=byte_to_class, accepting=a), sig))
    return out


def _byte_groups(*keys: Callable[[int], object]) -> list[list[int]]:
    """Bytes grouped by the tuple of their keys (e.g. their byte class in each automaton)."""
    out: dict[tuple, list[int]] = {}
    for b in range(256):
        out.setdefault(tuple(k(b) for k in keys), []).append(b)
    return list(out.values())


def _class_groups(*dfas: ByteDFA) -> list[list[int]]:
    """`_byte_groups` of the automata's byte classes (the same groups, in the same order),
    keyed by each byte's row of the stacked class columns as bytes: 256 dict look-ups
    whatever the number of automata, not 256 x k calls."""
    cols = np.stack([np.asarray(d.byte_to_class, dtype=np.int32) for d in dfas], axis=1)
    raw, w = cols.tobytes(), 4 * len(dfas)
    out: dict[bytes, list[int]] = {}
    for b in range(256):
        out.setdefault(raw[b * w : (b + 1) * w], []).append(b)
    return list(out.values())


def product(a: ByteDFA, b: ByteDFA, keep_b: bool, max_states: int = DEFAULT_MAX_PRODUCT) -> ByteDFA:
    """L(a) & L(b) if keep_b else L(a) - L(b)."""
    groups = _class_groups(a, b)
    native = _native_rows([a, b], [True, keep_b], groups, max_states)
    if native is not None:
        table, byte_to_class, states = native
        acc = np.asarray(a.accepting)[states[:, 0]]
        acc &= np.asarray(b.accepting)[states[:, 1]] == keep_b
        acc[DEAD] = False
        table, acc = _prune_dead_ends(table, acc)
        return ByteDFA(table=table, byte_to_class=byte_to_class, accepting=acc)
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
    inside an escape sequence (`\\n`, `\\uXXXX` count once). Built layer by layer (layer n:
    the (content state, escape state) pairs reachable with n characters read), with numpy;
    layers repeat once the counter no longer changes which pairs are reachable, and those are
    laid out in one broadcast. Kept per (content automaton, lo, hi): schemas repeat them."""
    key = (
        content.table.tobytes(),
        content.byte_to_class.tobytes(),
        content.accepting.tobytes(),
        lo,
        hi,
        max_states,
    )
    with _LENGTH_LOCK:
        hit = _LENGTH_CACHE.get(key)
    if hit is None:
        hit = _counted(content, lo, hi, max_states)
        with _LENGTH_LOCK:
            if len(_LENGTH_CACHE) >= 64:
                _LENGTH_CACHE.pop(next(iter(_LENGTH_CACHE)))
            _LENGTH_CACHE[key] = hit
    return hit


_LENGTH_CACHE: dict[tuple, ByteDFA] = {}
_LENGTH_LOCK = threading.Lock()
_ESC = 11  # escape states of _char_step


def _counted(content: ByteDFA, lo: int, hi: int | None, max_states: int) -> ByteDFA:
    groups = _byte_groups(
        content.byte_to_class.item, lambda b: tuple(_char_step(e, b) for e in range(_ESC))
    )
    reps = [g[0] for g in groups]
    steps = [[_char_step(e, b) for b in reps] for e in range(_ESC)]
    esc2 = np.array([[x for x, _ in row] for row in steps], dtype=np.int64)  # [E, G]
    add = np.array([[a for _, a in row] for row in steps], dtype=np.int64)
    nxt = content.table[:, content.byte_to_class[reps]].astype(np.int64)  # [S, G]
    n_pairs, n_groups = content.num_states * _ESC, len(groups)
    # pair p = content state * E + escape state; per byte group: the next pair (-1: dead) and
    # whether a character starts there
    to = np.where(nxt[:, None, :] == DEAD, -1, nxt[:, None, :] * _ESC + esc2[None])
    to = to.reshape(n_pairs, n_groups)
    starts = np.broadcast_to(add[None], (content.num_states, _ESC, n_groups))
    starts = starts.reshape(n_pairs, n_groups) == 1
    top = lo if hi is None else hi  # layers 0..top; with no hi, layer lo counts "lo or more"

    def close(seed: np.ndarray, every_edge: bool) -> np.ndarray:
        """The pairs reachable from `seed` without starting a character (or by any byte)."""
        reach, frontier = seed.copy(), np.flatnonzero(seed)
        while frontier.size:
            t = to[frontier]
            ok = t >= 0 if every_edge else (t >= 0) & ~starts[frontier]
            cand = t[ok]
            cand = np.unique(cand[~reach[cand]])
            reach[cand] = True
            frontier = cand
        return reach

    seed = np.zeros(n_pairs, dtype=bool)
    seed[START * _ESC] = True
    runs = [[close(seed, hi is None and top == 0), 1]]  # [pairs of a layer, layers in a row]
    n = 0
    while n < top:
        src = np.flatnonzero(runs[-1][0])
        t = to[src]
        seed = np.zeros(n_pairs, dtype=bool)
        seed[t[(t >= 0) & starts[src]]] = True
        if not seed.any():
            break
        last = hi is None and n + 1 == top
        layer = close(seed, last)
        if not last and np.array_equal(layer, runs[-1][0]):
            # the same pairs from here on: every layer up to top (or the one before lo) is this
            more = (top if hi is not None else top - 1) - n
            runs[-1][1] += more
            n += more
        else:
            runs.append([layer, 1])
            n += 1
        if sum(int(r.sum()) * c for r, c in runs) > max_states:
            raise GrammarError(f"product automaton exceeds its budget ({max_states})")
    return _layer_table(content, runs, to, starts, lo, hi, groups)


def _layer_table(
    content: ByteDFA,
    runs: list[list],
    to: np.ndarray,
    starts: np.ndarray,
    lo: int,
    hi: int | None,
    groups: list[list[int]],
) -> ByteDFA:
    """The product's rows from its layers (row 0 dead; layer 0's first pair, the start, is
    row 1), accepting where content accepts outside an escape with at least lo characters."""
    blocks, acc_blocks = [np.zeros((1, to.shape[1]), dtype=np.int32)], [np.zeros(1, dtype=bool)]
    base, layer = 1, 0
    ranks = []
    for pairs, count in runs:
        rank = np.full(pairs.shape[0], -1, dtype=np.int64)
        rank[pairs] = np.arange(int(pairs.sum()))
        ranks.append((base, rank, int(pairs.sum()), count))
        base += int(pairs.sum()) * count
    saturating = hi is None
    for i, (pairs, count) in enumerate(runs):
        b0, rank, m, _ = ranks[i]
        src = np.flatnonzero(pairs)
        t, a = to[src], starts[src]
        dead = t < 0
        tt = np.where(dead, 0, t)
        # within the run: layer j's targets are layer j (no character) or j + 1
        same = b0 + rank[tt]
        inner = np.where(dead, DEAD, same + np.where(a, m, 0))
        lay = np.arange(count, dtype=np.int64)[:, None, None] * m
        rows = inner[None] + lay  # [count, m, G]
        rows[:, dead] = DEAD
        # the run's last layer: a new character goes to the next run's first layer, or dies
        # past hi, or stays (the saturating layer lo)
        end = layer + count - 1
        last = rows[-1]
        if i + 1 < len(runs):
            nb, nrank, _, _ = ranks[i + 1]
            last[a & ~dead] = (nb + nrank[tt])[a & ~dead]
        elif saturating and end == lo:
            last[a & ~dead] = (same + (count - 1) * m)[a & ~dead]
        else:
            last[a] = DEAD
        blocks.append(rows.reshape(-1, to.shape[1]).astype(np.int32))
        s_of, e_of = src // _ESC, src % _ESC
        ok = content.accepting[s_of] & ((e_of == 0) | (e_of == 9))
        n_of = layer + np.arange(count)[:, None]
        acc_blocks.append((ok[None] & (n_of >= lo)).reshape(-1))
        layer += count
    table = np.concatenate(blocks)
    acc = np.concatenate(acc_blocks)
    table, acc = _prune_dead_ends(table, acc)
    table, byte_to_class = _merge_columns(table, groups)
    return ByteDFA(table=table, byte_to_class=byte_to_class, accepting=acc)


__all__ = ["DFANode", "from_rows", "product", "split_regions", "with_length"]
