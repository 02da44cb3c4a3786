"""Free text that never contains given strings (TagDispatch's and a structural tag's triggers, a
tag's end string, `excludes`), as a byte DFA: an Aho-Corasick automaton over the strings' bytes
times a UTF-8 validator. Every state where the text is whole characters accepts; a byte that
completes one of the strings leads to the dead state. `free_text` wraps it as a grammar leaf
(a `DFANode` inside a `Regular`) so that it composes with the rest of a grammar."""

from __future__ import annotations

import functools
from collections import deque

from grammar.automata.dfa_ops import from_rows

_DEAD = -1
# UTF-8 validator: state -> {byte range: next state}; state 0 is "between characters"
_UTF8: tuple[tuple[tuple[int, int, int], ...], ...] = (
    (
        (0x00, 0x7F, 0),
        (0xC2, 0xDF, 1),
        (0xE0, 0xE0, 4),
        (0xE1, 0xEC, 2),
        (0xED, 0xED, 5),
        (0xEE, 0xEF, 2),
        (0xF0, 0xF0, 6),
        (0xF1, 0xF3, 3),
        (0xF4, 0xF4, 7),
    ),
    ((0x80, 0xBF, 0),),
    ((0x80, 0xBF, 1),),
    ((0x80, 0xBF, 2),),
    ((0xA0, 0xBF, 1),),
    ((0x80, 0x9F, 1),),
    ((0x90, 0xBF, 2),),
    ((0x80, 0x8F, 2),),
)


def _utf8_rows() -> list[list[int]]:
    rows = []
    for ranges in _UTF8:
        row = [_DEAD] * 256
        for lo, hi, nxt in ranges:
            for b in range(lo, hi + 1):
                row[b] = nxt
        rows.append(row)
    return rows


def _aho_corasick(words: list[bytes]) -> tuple[list[list[int]], list[bool]]:
    """The full transition function (every byte) of the automaton of `words`, and which states
    end one of them."""
    goto: list[dict[int, int]] = [{}]
    final = [False]
    for w in words:
        s = 0
        for b in w:
            nxt = goto[s].get(b)
            if nxt is None:
                nxt = len(goto)
                goto[s][b] = nxt
                goto.append({})
                final.append(False)
            s = nxt
        final[s] = True
    delta = [[0] * 256 for _ in goto]
    fail = [0] * len(goto)
    queue: deque[int] = deque()
    for b in range(256):
        t = goto[0].get(b)
        if t is not None:
            delta[0][b] = t
            queue.append(t)
    while queue:
        s = queue.popleft()
        final[s] = final[s] or final[fail[s]]
        for b in range(256):
            t = goto[s].get(b)
            if t is None:
                delta[s][b] = delta[fail[s]][b]
            else:
                fail[t] = delta[fail[s]][b]
                delta[s][b] = t
                queue.append(t)
    return delta, final


@functools.lru_cache(maxsize=1024)
def free_text_dfa(excluded: tuple[str, ...]):
    """The ByteDFA of UTF-8 text that contains none of `excluded` (empty strings ignored)."""
    words = sorted({w.encode("utf-8") for w in excluded if w})
    delta, final = _aho_corasick(words)
    utf8 = _utf8_rows()
    ids = {(0, 0): 1}
    order = [(0, 0)]
    rows: list[list[int]] = [[0] * 256]
    accepting = [False]
    i = 0
    while i < len(order):
        u, a = order[i]
        row = [0] * 256
        for b in range(256):
            u2 = utf8[u][b]
            if u2 == _DEAD:
                continue
            a2 = delta[a][b]
            if final[a2]:
                continue
            key = (u2, a2)
            j = ids.get(key)
            if j is None:
                j = ids[key] = len(order) + 1
                order.append(key)
            row[b] = j
        rows.append(row)
        accepting.append(u == 0)
        i += 1
    return from_rows(rows, accepting)
