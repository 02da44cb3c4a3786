"""Masks shared along a long counted repetition (a string's maxLength 500): the DFA states at
character j and at character j + 1 of it differ, but a short token walks alike from both.

Such a repetition is an NFA block of copies (`nfa_blocks.Copies`): copy c is the same
sub-automaton as copy c - 1 with every id shifted by one copy's width, and it continues into
copy c - 1 (the last copy, 0, into the repetition's continuation k; an optional copy's entry
may also skip to k). Map every NFA state of copy c to the same state of copy c - d (d copies
on), and every state outside the block to itself. A path of the NFA from x that stays in the
block maps to a path from the image of x reading the same bytes, as long as neither runs out
of copies; a path that leaves the block (to k) leaves it at the same byte from both, and then
they are the same path. So for two DFA states (NFA state sets) that are such images of each
other, a byte string w reaches a non-empty set from one exactly when it does from the other,
provided no path runs out of copies while reading w.

When the block's sub-automaton matches no empty string, one byte moves a path down at most
one copy; a state whose lowest copy is `dist` copies above the end of its run of copies (copy
0, or the last mandatory one) then walks every token of at most `dist` bytes alike with every
other state of the same shape (the same NFA states outside the block, the same copies relative
to the lowest). `CopyShapes.shape` names that shape and `dist`; the token index keeps one mask
per shape and walks only the longer tokens afresh (none, 128 copies from the end).
"""

from __future__ import annotations

import bisect

from grammar.automata.nfa_blocks import Copies

Shape = tuple[tuple, int]  # (the shape's key, copies left below its lowest copy)


def _passes_a_byte(nfa: object, block: Copies) -> bool:
    """The block's sub-automaton (its template) cannot reach its end (`hole`) by epsilon
    edges from its start: every path through one copy reads a byte."""
    eps = nfa.eps
    seen = {block.t_start}
    todo = [block.t_start]
    while todo:
        x = todo.pop()
        if x == block.hole:
            return False
        nxt = eps[x]
        if nxt is None:  # not built: cannot tell
            return False
        for y in nxt:
            if y not in seen:
                seen.add(y)
                todo.append(y)
    return True


class CopyShapes:
    """The shape of a lazy DFA's states with respect to the NFA's blocks of copies."""

    def __init__(self, dfa: object) -> None:
        self._dfa = dfa
        self._nfa = getattr(dfa, "nfa", None)
        self._seen = 0  # blocks of the NFA looked at so far (a lazy NFA adds more as it fills)
        self._firsts: list[int] = []
        self._blocks: list[Copies | None] = []  # None: a block that is not usable copies

    def _refresh(self) -> None:
        blocks = getattr(self._nfa, "_blocks", None)
        if blocks is None or len(blocks) == self._seen:
            return
        for b in blocks[self._seen :]:
            ok = isinstance(b, Copies) and b.n > 0 and _passes_a_byte(self._nfa, b)
            self._firsts.append(b.first)
            self._blocks.append(b if ok else None)
        self._seen = len(blocks)

    def shape(self, state: int) -> Shape | None:
        """(key, dist) for a state that holds states of some blocks of copies; None for one
        that holds none (or spans two runs of one block: mandatory and optional copies)."""
        self._refresh()
        if not self._firsts:
            return None
        firsts, blocks = self._firsts, self._blocks
        lo = firsts[0]
        states = self._dfa.nfa_states(state)
        if not states or states[-1] < lo:  # (sorted) none in a block
            return None
        fixed: list[int] = []
        parts: dict[int, list[tuple[int, int, int]]] = {}  # block -> (run, copy, offset)
        for x in states:
            if x < lo:
                fixed.append(x)
                continue
            j = bisect.bisect_right(firsts, x) - 1
            b = blocks[j]
            if b is None or x >= b.first + b.size:
                fixed.append(x)
                continue
            z = x - b.first
            if z < b.m * (b.n + 1):  # an optional copy: entry state, then its block
                c, o = divmod(z, b.n + 1)
                run = 0
            else:
                c, o = divmod(z - b.m * (b.n + 1), b.n)
                c += b.m
                run = 1
            parts.setdefault(j, []).append((run, c, o))
        if not parts:
            return None
        dist = None
        key: list[object] = [tuple(fixed)]
        for j in sorted(parts):
            items = parts[j]
            run = items[0][0]
            if any(r != run for r, _, _ in items):
                return None
            low = min(c for _, c, _ in items)
            d = low - (0 if run == 0 else blocks[j].m)
            dist = d if dist is None else min(dist, d)
            key.append((j, run, tuple([(c - low, o) for _, c, o in items])))
        return tuple(key), dist
