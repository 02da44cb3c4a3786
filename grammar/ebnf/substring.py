"""XGrammar's `Substring(chunk, ...)`: every contiguous run of whole chunks (the empty one too),
as a byte DFA.

`Substring("abc", "de", "fg")` accepts "", "abc", "de", "abcde", "defg", "abcdefg", not "ab"
nor "cde": chunks are atomic. With one-character chunks it is the set of substrings of a text.

Built by subset construction over the positions of the chunk sequence: a position is (chunk i,
bytes of it read k); a run may start at any chunk boundary and may stop at any boundary. The
determinised automaton is the suffix automaton of the chunk sequence (spelled in bytes), linear
in the number of chunks; `MAX_STATES` bounds it.
"""

from __future__ import annotations

import functools

from grammar.automata.dfa_ops import from_rows
from grammar.automata.fsm import ByteDFA
from grammar.errors import GrammarError

MAX_STATES = 50_000


@functools.lru_cache(maxsize=64)
def substring_dfa(chunks: tuple[str, ...]) -> ByteDFA:
    """The ByteDFA of the runs of consecutive whole `chunks` (the empty run included)."""
    data = [c.encode("utf-8") for c in chunks]
    n = len(data)

    def settle(i: int) -> tuple[int, ...]:
        """Positions at the boundary before chunk i, skipping empty chunks (a boundary before
        chunk n is the end of the sequence)."""
        out = [i]
        while i < n and not data[i]:
            i += 1
            out.append(i)
        return tuple(out)

    # a position is i * width + k; k == 0 at a boundary; the boundary before chunk n ends
    width = max((len(d) for d in data), default=0) + 1
    start = frozenset(p * width for i in range(n + 1) for p in settle(i))
    ids = {start: 1}
    order = [start]
    rows: list[list[int]] = [[0] * 256]
    accepting = [False]
    while len(rows) <= len(order):
        current = order[len(rows) - 1]
        moves: dict[int, set[int]] = {}
        for pos in current:
            i, k = divmod(pos, width)
            if i < n and k < len(data[i]):
                if k + 1 == len(data[i]):
                    nxt = {p * width for p in settle(i + 1)}
                else:
                    nxt = {i * width + k + 1}
                moves.setdefault(data[i][k], set()).update(nxt)
        row = [0] * 256
        for byte, targets in moves.items():
            key = frozenset(targets)
            j = ids.get(key)
            if j is None:
                if len(order) >= MAX_STATES:
                    raise GrammarError(
                        f"Substring(...) of {n} chunks needs more than {MAX_STATES} DFA states"
                    )
                j = ids[key] = len(order) + 1
                order.append(key)
            row[byte] = j
        rows.append(row)
        # every reachable set sits at a boundary or inside a chunk; a boundary accepts
        accepting.append(any(pos % width == 0 for pos in current))
    return from_rows(rows, accepting)
