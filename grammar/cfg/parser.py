"""An LALR(1) parser over lark's own parse table, with interned, persistent stacks.

A parser configuration is a `StackNode`: an LR state and the node below it. Nodes are interned
per table (the same stack content is the same object), so results that depend on the whole stack
(which terminals it accepts, the token masks computed for it) are cached on the node itself and
shared by every sequence that reaches the same configuration.

`feed(node, terminal)` runs the reductions the table asks for and then shifts, exactly as lark's
`ParserState.feed_token` does, but without touching the input node; it returns None when the
terminal is a syntax error. LALR lookahead sets can over-approximate, so the set of terminals a
node really accepts is found by feeding each candidate (`acceptable_bits`).

Every result also records the lowest stack depth it read (`LRTable.reading` / `note`), so that
callers can cache what they derive from it by the top states alone (see CompiledCFG.bitmask).
"""

from __future__ import annotations

import threading
from typing import Any

END = "$END"


class StackNode:
    """One LR stack, as a linked list of states. Never mutate `state` / `parent`.

    Caches (filled lazily, shared across threads): `fed` terminal -> node or None,
    `acceptable` bitset of terminals that can be shifted next, `masks` lexer key -> bitmask."""

    __slots__ = (
        "state", "parent", "depth", "fed", "acceptable", "accepts_end", "masks", "forced",
        "low", "acc_known", "acc_yes",
    )  # fmt: skip

    def __init__(self, state: int, parent: StackNode | None) -> None:
        self.state = state
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.fed: dict[int, StackNode | None] | None = None
        self.acceptable: int | None = None
        self.accepts_end: bool | None = None
        self.masks: dict[Any, Any] | None = None
        self.forced: dict[Any, Any] | None = None
        # the lowest stack depth each cached result read: (kind, key) -> depth
        self.low: dict[Any, int] | None = None
        # terminals checked one by one (accepts_any): which were checked, which can be shifted
        self.acc_known = 0
        self.acc_yes = 0

    def states(self) -> list[int]:
        out, n = [], self
        while n is not None:
            out.append(n.state)
            n = n.parent
        return out[::-1]


class LRTable:
    """lark's LALR table with terminals and nonterminals renamed to small ints.

    actions[state][terminal index] = (is_shift, target state | (rule length, nonterminal));
    goto[state][nonterminal] = state; the end symbol is terminal index `end`."""

    def __init__(self, parse_table: Any, start: str, terminal_index: dict[str, int]) -> None:
        from lark.parsers.lalr_analysis import Shift

        self.end = len(terminal_index)
        self.actions: dict[int, dict[int, tuple]] = {}
        self.goto: dict[int, dict[str, int]] = {}
        for state, acts in parse_table.states.items():
            row: dict[int, tuple] = {}
            gotos: dict[str, int] = {}
            for sym, (action, arg) in acts.items():
                if sym == END:
                    idx = self.end
                elif sym in terminal_index:
                    idx = terminal_index[sym]
                else:
                    if action is Shift:
                        gotos[str(sym)] = arg
                    continue
                if action is Shift:
                    row[idx] = (True, arg)
                else:
                    row[idx] = (False, (len(arg.expansion), str(arg.origin.name)))
            self.actions[state] = row
            self.goto[state] = gotos
        # the terminals lark's contextual lexer considers in each state (its LALR lookaheads)
        self.lookahead_bits: dict[int, int] = {
            s: sum(1 << t for t in row if t != self.end) for s, row in self.actions.items()
        }
        self.start_state = parse_table.start_states[start]
        self.end_state = parse_table.end_states[start]
        self._interned: dict[tuple[int, int], StackNode] = {}
        self._acc_depth: dict[int, int] = {}  # top state -> stack depth acceptable_bits reads
        self._acc_cache: dict[tuple[int, ...], int] = {}  # top states -> acceptable bits
        self._lock = threading.Lock()
        self._tl = threading.local()  # read-depth watermark of the computation in progress
        self.root = StackNode(self.start_state, None)

    def _push(self, parent: StackNode, state: int) -> StackNode:
        key = (state, id(parent))
        node = self._interned.get(key)
        if node is None:
            with self._lock:
                node = self._interned.setdefault(key, StackNode(state, parent))
        return node

    # ----- read-depth tracking -----
    def note(self, depth: int) -> None:
        """Record that the computation in progress read the stack down to `depth`."""
        tl = self._tl
        if depth < getattr(tl, "low", depth + 1):
            tl.low = depth

    def begin_read(self, depth: int) -> int:
        """Start tracking for a computation at a node of `depth`; returns the outer watermark."""
        tl = self._tl
        outer = getattr(tl, "low", 1 << 30)
        tl.low = depth
        return outer

    def end_read(self, outer: int) -> int:
        """Finish tracking: returns this computation's watermark and folds it into the outer."""
        tl = self._tl
        low = tl.low
        tl.low = min(outer, low)
        return low

    @staticmethod
    def _remember(node: StackNode, key: Any, low: int) -> None:
        if node.low is None:
            node.low = {}
        node.low[key] = low

    # ----- parsing -----
    def _reduce(self, node: StackNode, length: int, nonterminal: str) -> StackNode | None:
        for _ in range(length):
            node = node.parent  # type: ignore[assignment]
        self.note(node.depth)
        target = self.goto[node.state].get(nonterminal)
        return None if target is None else self._push(node, target)

    def feed(self, node: StackNode, terminal: int) -> StackNode | None:
        """The stack after shifting `terminal` (reductions first), or None on a syntax error."""
        if node.fed is None:
            node.fed = {}
        hit = node.fed.get(terminal, False)
        if hit is not False:
            self.note(node.low[("fed", terminal)])  # type: ignore[index]
            return hit  # type: ignore[return-value]
        outer = self.begin_read(node.depth)
        cur: StackNode | None = node
        while cur is not None:
            act = self.actions[cur.state].get(terminal)
            if act is None:
                cur = None
                break
            is_shift, arg = act
            if is_shift:
                cur = self._push(cur, arg)
                break
            cur = self._reduce(cur, *arg)
        node.fed[terminal] = cur
        self._remember(node, ("fed", terminal), self.end_read(outer))
        return cur

    def accepts_end(self, node: StackNode) -> bool:
        """Whether the input may end here (lark: reduce on $END until the end state)."""
        if node.accepts_end is None:
            outer = self.begin_read(node.depth)
            cur: StackNode | None = node
            ok = False
            while cur is not None:
                if cur.state == self.end_state:
                    ok = True
                    break
                act = self.actions[cur.state].get(self.end)
                if act is None or act[0]:
                    break
                cur = self._reduce(cur, *act[1])
            node.accepts_end = ok
            self._remember(node, "end", self.end_read(outer))
        else:
            self.note(node.low["end"])  # type: ignore[index]
        return node.accepts_end

    def acceptable_bits(self, node: StackNode) -> int:
        """Bitset of the terminals that `feed` accepts at this node (exact, not LALR's).

        The answer depends only on the top few states (as deep as the reductions reach), so it
        is also cached by that many top states, shared between stacks that agree there."""
        if node.acceptable is not None:
            self.note(node.low["acc"])  # type: ignore[index]
            return node.acceptable
        d = self._acc_depth.get(node.state)
        if d is not None and node.depth + 1 >= d:
            bits = self._acc_cache.get(self._top_states(node, d))
            if bits is not None:
                node.acceptable = bits
                self._remember(node, "acc", node.depth - d + 1)
                self.note(node.depth - d + 1)
                return bits
        bits, deepest = 0, 1
        for t in self.actions[node.state]:
            if t != self.end:
                ok, reached = self._can_shift(node, t)
                deepest = max(deepest, reached)
                if ok:
                    bits |= 1 << t
        self._acc_depth[node.state] = max(d or 0, deepest)
        self._acc_cache[self._top_states(node, deepest)] = bits
        node.acceptable = bits
        self._remember(node, "acc", node.depth - deepest + 1)
        self.note(node.depth - deepest + 1)
        return bits

    def accepts_any(self, node: StackNode, bits: int) -> bool:
        """Whether the stack can shift at least one of the terminals in `bits` (checking only
        as many as needed, each once per node)."""
        if node.acceptable is not None:
            self.note(node.low["acc"])  # type: ignore[index]
            return bool(node.acceptable & bits)
        todo = bits & self.lookahead_bits[node.state]
        low = node.depth
        while todo:
            t = (todo & -todo).bit_length() - 1
            todo &= todo - 1
            if node.acc_known >> t & 1:
                ok = bool(node.acc_yes >> t & 1)
                reached = node.low[("acc", t)]  # type: ignore[index]
            else:
                ok, n_read = self._can_shift(node, t)
                reached = node.depth - n_read + 1
                node.acc_known |= 1 << t
                if ok:
                    node.acc_yes |= 1 << t
                self._remember(node, ("acc", t), reached)
            low = min(low, reached)
            if ok:
                self.note(low)
                return True
        self.note(low)
        return False

    @staticmethod
    def _top_states(node: StackNode, d: int) -> tuple[int, ...]:
        out = []
        n: StackNode | None = node
        for _ in range(d):
            if n is None:
                break
            out.append(n.state)
            n = n.parent
        return tuple(out)

    def _can_shift(self, node: StackNode, terminal: int) -> tuple[bool, int]:
        """Whether `feed` would succeed, simulated on a scratch list (no nodes created), and
        how many of the stack's top states the simulation read."""
        actions, goto = self.actions, self.goto
        above: list[int] = []  # states pushed above `node` by the simulated reductions
        reached = 1
        while True:
            act = actions[above[-1] if above else node.state].get(terminal)
            if act is None:
                return False, reached
            if act[0]:
                return True, reached
            length, nonterminal = act[1]
            k = min(length, len(above))
            del above[len(above) - k :]
            for _ in range(length - k):
                node = node.parent  # type: ignore[assignment]
                reached += 1
            target = goto[above[-1] if above else node.state].get(nonterminal)
            if target is None:
                return False, reached
            above.append(target)
