"""Blocks of NFA state ids filled on first read (`NFA.fill`): a lazy DFA reads only the states
its walks reach, so a piece that is large but mostly unvisited costs only its reservation.

Two kinds, each a contiguous range of ids [first, first + size) whose `eps` / `edges` entries
stay None until `fill(nfa, x)` writes state x:

- `Embedded`: the live states of a ByteDFA (a `DFANode` leaf: an exact product automaton);
  its accepting states continue at k.
- `Copies`: the copies of a self-contained block for base{lo,hi} (a string's maxLength 32767).
"""

from __future__ import annotations

from typing import Protocol


class NFA(Protocol):
    """What a block writes of the NFA it belongs to (`nfa.NFA`): per state id, its epsilon
    targets and its byte edges (flat: mask, target, mask, target, ...); None until filled."""

    eps: list[tuple[int, ...] | None]
    edges: list[tuple[int, ...] | None]


class Embedded:
    """A ByteDFA's states 1.. as ids first..; DFA state i (>= 1) is id first + i - 1."""

    __slots__ = ("first", "size", "dfa", "k")

    def __init__(self, first: int, dfa: object, k: int) -> None:
        self.first, self.dfa, self.k = first, dfa, k
        self.size = dfa.num_states - 1

    def fill(self, nfa: NFA, x: int) -> None:
        """State x's edges (grouped by target) and epsilon (to k when accepting)."""
        dfa = self.dfa
        i = x - self.first + 1
        masks = class_masks(dfa)
        by_target: dict[int, int] = {}
        # one row read (not `dfa.rows`: the whole table as lists, ~30x its size, for a large
        # product automaton of which walks read a few rows)
        for c, j in enumerate(dfa.table[i].tolist()):
            if j:
                by_target[j] = by_target.get(j, 0) | masks[c]
        off = self.first - 1
        nfa.edges[x] = tuple([v for j, m in by_target.items() for v in (m, j + off)])
        nfa.eps[x] = (self.k,) if dfa.accepting[i] else ()


def pairs(edges: tuple[int, ...]) -> zip:
    """A state's flat edges (mask, target, mask, target, ...) as (mask, target) pairs."""
    return zip(edges[::2], edges[1::2], strict=True)


def moved(edges: tuple[int, ...], hole: int, target: int, off: int) -> tuple[int, ...]:
    """Flat edges of a copy: each target shifted by off, the hole made `target`."""
    out = list(edges)
    for i in range(1, len(out), 2):
        y = out[i]
        out[i] = target if y == hole else y + off
    return tuple(out)


def class_masks(dfa: object) -> list[int]:
    """The bytes of each byte class of a ByteDFA, as 256-bit ints (kept on the automaton)."""
    masks = dfa.class_masks
    if masks is None:
        masks = [0] * dfa.num_classes
        for b, c in enumerate(dfa.classes):
            masks[c] |= 1 << b
        dfa.class_masks = masks
    return masks


class Copies:
    """The copies of a block for base{lo,hi} (`NFA._lazy_copies`), numbered from the last:
    copy c continues to copy c - 1 (copy 0 to k). The m = hi - lo last copies are optional:
    each has an entry state (epsilon to k or into its block) before its block; the others are
    the block alone. Ids: m units of 1 + n, then lo units of n (n: the template's states)."""

    __slots__ = ("first", "t_first", "t_start", "hole", "n", "m", "hi", "k", "size")

    def __init__(
        self, first: int, t_first: int, t_last: int, t_start: int, hole: int, m: int, hi: int,
        k: int,
    ) -> None:  # fmt: skip
        self.first, self.t_first, self.t_start, self.hole = first, t_first, t_start, hole
        self.n, self.m, self.hi, self.k = t_last - t_first, m, hi, k
        self.size = m * (self.n + 1) + (hi - m) * self.n

    def _block(self, c: int) -> int:
        """The id of copy c's first block state (the template's state t_first)."""
        if c < self.m:
            return self.first + c * (self.n + 1) + 1
        return self.first + self.m * (self.n + 1) + (c - self.m) * self.n

    def start(self, c: int) -> int:
        """Where copy c begins: its entry state, or its block's start."""
        if c < self.m:
            return self.first + c * (self.n + 1)
        return self._block(c) + self.t_start - self.t_first

    def fill(self, nfa: NFA, x: int) -> None:
        z = x - self.first
        if z < self.m * (self.n + 1):
            c, o = divmod(z, self.n + 1)
            if o == 0:  # an optional copy's entry: skip to k, or read the copy
                nfa.eps[x] = (self.k, self._block(c) + self.t_start - self.t_first)
                nfa.edges[x] = ()
                return
            o -= 1
        else:
            c, o = divmod(z - self.m * (self.n + 1), self.n)
            c += self.m
        t = self.t_first + o  # the template state x copies
        off = self._block(c) - self.t_first
        after = self.k if c == 0 else self.start(c - 1)
        hole = self.hole
        nfa.eps[x] = tuple([after if y == hole else y + off for y in nfa.eps[t]])
        nfa.edges[x] = moved(nfa.edges[t], hole, after, off)
