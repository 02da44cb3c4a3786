"""Regex text -> byte-level NFA, built backwards with hash-consing.

The regex is parsed by ``interegular``; we build the automaton ourselves. ``build(node, k)``
returns a state from which ``node`` is matched and then control continues at state ``k``.
Memoising on (structure of node, k) means identical suffixes share states: the quadratic regex
a JSON object with optional properties needs becomes a linear NFA (and a small DFA).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable

from interegular import patterns as ip

from grammar.automata.utf8 import chars_to_ranges, utf8_sequences
from grammar.errors import GrammarError

_DOT_CLS = type(ip._DOT)
_EMPTY_CLS = type(ip._EMPTY)
_CHAR_GROUP = ip._CharGroup
_COPY_FROM = 8  # counted repetitions with more copies than this copy a built block
_LAZY_FROM = 64  # bounded ones with more copies than this make their copies on first read


def parse_regex(pattern: str) -> ip.Pattern:
    """Parse with interegular; unsupported constructs raise GrammarError naming them."""
    try:
        return ip.parse_pattern(pattern)
    except ip.Unsupported as e:
        raise GrammarError(f"regex construct not supported: {e} in {pattern[:200]!r}") from None
    except ip.InvalidSyntax as e:
        raise GrammarError(f"invalid regex syntax {e} in {pattern[:200]!r}") from None
    except RecursionError:
        raise GrammarError(f"regex too deeply nested: {pattern[:200]!r}") from None
    except Exception as e:  # interegular's parser raises bare errors on odd input
        raise GrammarError(f"invalid regex {pattern[:200]!r}: {e}") from None


@functools.lru_cache(maxsize=4096)
def _char_form(chars: frozenset[str], negated: bool) -> tuple[tuple[int, tuple], ...]:
    """A character class as UTF-8 byte paths: (first-byte mask, continuation byte ranges) per
    byte-range sequence (a pure function of the class: shared by every automaton)."""
    return tuple(
        (byte_mask(*seq[0]), seq[1:])
        for lo, hi in chars_to_ranges(chars, negated)
        for seq in utf8_sequences(lo, hi)
    )


def byte_mask(lo: int, hi: int) -> int:
    """A set of bytes lo..hi as a 256-bit integer."""
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)


class NFA:
    """States with epsilon edges and byte-set edges (a byte set is a 256-bit int).

    An embedded automaton (a DFANode) is a block of reserved state ids whose `eps` / `edges`
    entries stay None until `fill` reads them from the automaton's table: a lazy DFA only reads
    the few it reaches (the any-JSON-value automaton has ~800 states). `materialize` fills all.

    `dead_end_possible` is set when some piece matches nothing (an empty character class, an
    embedded automaton with an empty language): only then can a state fail to reach `final`.
    """

    def __init__(self, max_states: int) -> None:
        self.max_states = max_states
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int]]] = []  # (byte mask, target)
        self._memo: dict[tuple, int] = {}
        self._keys: dict[int, int] = {}  # id(node) -> structural key
        self._interned: dict[tuple, int] = {}
        self._nodes: list[object] = []  # keeps parsed nodes alive so ids stay unique
        self._cont_masks: dict[tuple[int, int], int] = {}
        self._block_first: list[int] = []  # first state id of each lazily filled block
        # (first id, its ByteDFA, continuation) or (first id, _Copies, None)
        self._blocks: list[tuple[int, object, int | None]] = []
        self.dead_end_possible = False
        self.final = self._new()

    def _new(self) -> int:
        if len(self.eps) >= self.max_states:
            raise GrammarError(f"regex automaton exceeds the state budget ({self.max_states})")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def add_regex(self, pattern: str) -> int:
        """Build the NFA for `pattern` ending in `final`; returns its start state."""
        return self.add_node(parse_regex(pattern))

    def add_node(self, tree: object) -> int:
        """Build the NFA for a parsed regex (interegular nodes, possibly a shared DAG)."""
        self._nodes.append(tree)
        try:
            return self._build(tree, self.final)
        except RecursionError:
            raise GrammarError("regex too deeply nested") from None

    def _key(self, node: object) -> int:
        """Structural identity of a parse node, interned to a small int (linear time)."""
        k = self._keys.get(id(node))
        if k is not None:
            return k
        if isinstance(node, ip._CharGroup):
            t: tuple = ("c", node.chars, node.negated)
        elif isinstance(node, ip._Repeated):
            t = ("r", self._key(node.base), node.min, node.max)
        elif isinstance(node, ip._Concatenation):
            t = ("&", *(self._key(p) for p in node.parts))
        elif isinstance(node, ip.Pattern):
            if node.added_flags or node.removed_flags:
                raise GrammarError(f"regex flags are not supported: {node.added_flags}")
            t = ("|", *(self._key(o) for o in node.options))
        elif isinstance(node, _DOT_CLS):
            t = (".",)
        elif isinstance(node, _EMPTY_CLS):
            t = ("e",)
        elif hasattr(node, "dfa") and type(node).__name__ == "DFANode":
            t = ("d", id(node.dfa))
        elif isinstance(node, ip._NonCapturing):
            kind = "lookbehind" if node.backwards else "lookahead"
            raise GrammarError(
                f"regex construct not supported: {kind} (?{'<' * node.backwards}...)"
            )
        else:
            raise GrammarError(f"regex construct not supported: {type(node).__name__}")
        k = self._interned.setdefault(t, len(self._interned))
        self._keys[id(node)] = k
        return k

    def _build(self, node: object, k: int) -> int:
        nk = self._keys.get(id(node))
        if nk is None:
            nk = self._key(node)
        memo_key = (nk, k)
        s = self._memo.get(memo_key)
        if s is None:
            if type(node) is _CHAR_GROUP:  # the commonest node: no dispatch
                s = self._chars(node.chars, node.negated, k)
            else:
                s = self._build_new(node, k)
            self._memo[memo_key] = s
        return s

    def _build_new(self, node: object, k: int) -> int:
        if isinstance(node, ip._CharGroup):
            return self._chars(node.chars, node.negated, k)
        if isinstance(node, _DOT_CLS):
            return self._chars(frozenset("\n"), True, k)
        if isinstance(node, _EMPTY_CLS):
            return k
        if isinstance(node, ip._Concatenation):
            for part in reversed(node.parts):
                k = self._build(part, k)
            return k
        if isinstance(node, ip.Pattern):
            if len(node.options) == 1:
                return self._build(node.options[0], k)
            s = self._new()
            self.eps[s] = [self._build(o, k) for o in node.options]
            return s
        if isinstance(node, ip._Repeated):
            return self._repeat(node, k)
        if type(node).__name__ == "DFANode":
            return self._embed_dfa(node.dfa, k)
        raise GrammarError(f"regex construct not supported: {type(node).__name__}")

    def _repeat(self, node: ip._Repeated, k: int) -> int:
        if node.max is not None and node.max < node.min:
            raise GrammarError(f"bad repetition {{{node.min},{node.max}}}")
        copies = node.min if node.max is None else node.max
        build = self._copier(node.base) if copies > _COPY_FROM else None
        if build is not None and node.max is not None and copies > _LAZY_FROM:
            return self._lazy_copies(build, node.min, node.max, k)
        if build is None:
            base = node.base

            def build(t: int) -> int:
                return self._build(base, t)

        if node.max is None:
            # loop: s -> k, s -> base -> s
            s = self._new()
            self.eps[s] = [k, self._build(node.base, s)]
        else:
            # (base (base (...)?)?)? : every optional copy may skip straight to k
            s = k
            for _ in range(node.max - node.min):
                opt = self._new()
                self.eps[opt] = [k, build(s)]
                s = opt
        for _ in range(node.min):
            s = build(s)
        return s

    def _copier(self, base: object) -> Callable[[int], int] | None:
        """For a long counted repetition: the base's states built once (towards a placeholder
        continuation), then each copy made by renumbering that block, with no per-node work.
        None when the base's automaton is not a self-contained block (then copies are built)."""
        hole = self._new()  # the placeholder continuation; it and the template stay unreachable
        first = len(self.eps)
        b = self._build(base, hole)
        last = len(self.eps)
        if not first <= b < last:
            return None
        if self._block_first and self._block_first[-1] >= first:
            return None  # holds an embedded automaton: its copies are embedded one by one
        eps, edges = self.eps, self.edges
        for x in range(first, last):
            if any(not (first <= y < last or y == hole) for y in eps[x]):
                return None
            if any(not (first <= t < last or t == hole) for _, t in edges[x]):
                return None

        def copy(target: int) -> int:
            """A copy of the block continuing to `target`; returns its start."""
            off = len(eps) - first
            if len(eps) + last - first > self.max_states:
                raise GrammarError(f"regex automaton exceeds the state budget ({self.max_states})")
            for x in range(first, last):
                eps.append([target if y == hole else y + off for y in eps[x]])
                edges.append([(m, target if t == hole else t + off) for m, t in edges[x]])
            return b + off

        copy.block = (first, last, b, hole)  # type: ignore[attr-defined]
        return copy

    def _lazy_copies(self, build: Callable[[int], int], lo: int, hi: int, k: int) -> int:
        """base{lo,hi} as reserved ids filled on first read (`_Copies`): a long bounded
        repetition (a string's maxLength 32767) costs only the copies a walk reaches."""
        first_t, last_t, b, hole = build.block  # type: ignore[attr-defined]
        copies = _Copies(len(self.eps), first_t, last_t, b, hole, hi - lo, hi, k)
        if copies.first + copies.size > self.max_states:
            raise GrammarError(f"regex automaton exceeds the state budget ({self.max_states})")
        self.eps.extend([None] * copies.size)
        self.edges.extend([None] * copies.size)
        self._block_first.append(copies.first)
        self._blocks.append((copies.first, copies, None))
        return copies.start(hi - 1)

    def _embed_dfa(self, dfa: object, k: int) -> int:
        """Reserve ids for a ByteDFA's live states (filled on first read); its accepting
        states continue at k. DFA state i (>= 1) is NFA state first + i - 1."""
        n = dfa.num_states - 1
        first = len(self.eps)
        if first + n > self.max_states:
            raise GrammarError(f"regex automaton exceeds the state budget ({self.max_states})")
        self.eps.extend([None] * n)
        self.edges.extend([None] * n)
        self._block_first.append(first)
        self._blocks.append((first, dfa, k))
        if not dfa.table[1].any() and not dfa.accepting[1]:
            self.dead_end_possible = True  # an automaton of the empty language
        return first

    def fill(self, x: int) -> None:
        """Give state x of an embedded automaton its edges (grouped by target) and epsilon."""
        first, dfa, k = self._blocks[bisect.bisect_right(self._block_first, x) - 1]
        if k is None:  # a block of lazy copies
            dfa.fill(self, x)
            return
        i = x - first + 1
        masks = _class_masks(dfa)
        by_target: dict[int, int] = {}
        for c, j in enumerate(dfa.rows[i]):
            if j:
                by_target[j] = by_target.get(j, 0) | masks[c]
        off = first - 1
        self.edges[x] = [(m, j + off) for j, m in by_target.items()]
        self.eps[x] = [k] if dfa.accepting[i] else []

    def eps_closure(self, s: int) -> list[int]:
        """The states reachable from s by epsilon edges that matter to a DFA state: those with
        byte edges, and `final` (states of embedded automata are filled as they are read)."""
        eps, edges, final = self.eps, self.edges, self.final
        seen, stack, keep = {s}, [s], []
        while stack:
            x = stack.pop()
            if edges[x] is None:
                self.fill(x)
            if edges[x] or x == final:
                keep.append(x)
            for y in eps[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return keep

    def materialize(self) -> None:
        """Fill every embedded automaton's states (for an eager subset construction)."""
        edges = self.edges
        for first, dfa, k in self._blocks:
            for x in range(first, first + (dfa.size if k is None else dfa.num_states - 1)):
                if edges[x] is None:
                    self.fill(x)

    def _chars(self, chars: frozenset[str], negated: bool, k: int) -> int:
        form = _char_form(chars, negated)
        s = self._new()
        if not form:
            self.dead_end_possible = True  # a character class that matches nothing
        if len(form) == 1 and not form[0][1]:
            self.edges[s] = [(form[0][0], k)]
            return s
        by_target: dict[int, int] = {}
        for mask, rest in form:
            t = self._suffix(rest, k) if rest else k
            by_target[t] = by_target.get(t, 0) | mask
        self.edges[s] = [(m, t) for t, m in by_target.items()]
        return s

    def _suffix(self, seq: tuple[tuple[int, int], ...], k: int) -> int:
        """State that reads continuation bytes `seq` then goes to k (shared between chars)."""
        key = ("u", seq, k)
        s = self._memo.get(key)
        if s is None:
            s = self._new()
            t = k if len(seq) == 1 else self._suffix(seq[1:], k)
            mask = self._cont_masks.get(seq[0])
            if mask is None:
                mask = self._cont_masks[seq[0]] = byte_mask(*seq[0])
            self.edges[s] = [(mask, t)]
            self._memo[key] = s
        return s


def _class_masks(dfa: object) -> list[int]:
    """The bytes of each byte class of a ByteDFA, as 256-bit ints (kept on the automaton)."""
    masks = dfa.class_masks
    if masks is None:
        masks = [0] * dfa.num_classes
        for b, c in enumerate(dfa.classes):
            masks[c] |= 1 << b
        dfa.class_masks = masks
    return masks


class _Copies:
    """The copies of a block for base{lo,hi} (`NFA._lazy_copies`), numbered from the last:
    copy c continues to copy c - 1 (copy 0 to k). The m = hi - lo last copies are optional:
    each has an entry state (epsilon to k or into its block) before its block; the others are
    the block alone. Ids: m units of 1 + n, then lo units of n (n: the template's states)."""

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
                nfa.eps[x] = [self.k, self._block(c) + self.t_start - self.t_first]
                nfa.edges[x] = []
                return
            o -= 1
        else:
            c, o = divmod(z - self.m * (self.n + 1), self.n)
            c += self.m
        t = self.t_first + o  # the template state x copies
        off = self._block(c) - self.t_first
        after = self.k if c == 0 else self.start(c - 1)
        hole = self.hole
        nfa.eps[x] = [after if y == hole else y + off for y in nfa.eps[t]]
        nfa.edges[x] = [(mask, after if y == hole else y + off) for mask, y in nfa.edges[t]]
