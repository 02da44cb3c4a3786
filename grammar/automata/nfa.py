"""Regex text -> byte-level NFA, built backwards with hash-consing.

The regex is parsed by ``interegular``; we build the automaton ourselves. ``build(node, k)``
returns a state from which ``node`` is matched and then control continues at state ``k``.
Memoising on (structure of node, k) means identical suffixes share states: the quadratic regex
a JSON object with optional properties needs becomes a linear NFA (and a small DFA).

States are flat tuples of ints (epsilon targets; byte masks and targets, alternating), which
the cyclic GC scans once and then leaves; the builder's tables go once nothing is deferred.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from grammar.automata import interegular_adapter as ip
from grammar.automata.nfa_blocks import Copies, Embedded, moved
from grammar.automata.nfa_keys import Structures, _matches_nothing
from grammar.automata.regex_syntax import parse_user_regex
from grammar.automata.utf8 import byte_mask, char_form
from grammar.errors import GrammarError

_COPY_FROM = 8  # counted repetitions with more copies than this copy a built block
_LAZY_FROM = 64  # bounded ones with more copies than this make their copies on first read
EAGER_STRUCTURES = 1500  # a lazy build of a tree of at most this many structures starts eager
EAGER_WORK = 20_000  # ... and builds at most this many nodes before it defers,
EAGER_STATES = 150_000  # or this many states; and it defers repetitions of over
EAGER_COPIES = 1000  # this many copies (a maxLength 32767 string's copies reserve ~1M ids)


def parse_regex(pattern: str) -> ip.Pattern:
    """Parse with interegular, in the dialect of `regex_syntax` (escapes, end anchors, flags);
    unsupported constructs raise GrammarError naming them."""
    return parsed_or_refused(parse_user_regex, pattern)


def parsed_or_refused(parse: Callable[[str], ip.Pattern], pattern: str) -> ip.Pattern:
    """`parse(pattern)`, with every parser failure as a GrammarError naming the pattern."""
    try:
        return parse(pattern)
    except GrammarError:
        raise
    except ip.Unsupported as e:
        raise GrammarError(f"regex construct not supported: {e} in {pattern[:200]!r}") from None
    except ip.InvalidSyntax as e:
        raise GrammarError(f"invalid regex syntax {e} in {pattern[:200]!r}") from None
    except RecursionError:
        raise GrammarError(f"regex too deeply nested: {pattern[:200]!r}") from None
    except Exception as e:  # interegular's parser raises bare errors on odd input
        raise GrammarError(f"invalid regex {pattern[:200]!r}: {e}") from None


class NFA:
    """States with epsilon edges and byte-set edges (a byte set is a 256-bit int).

    `eps[s]` is a tuple of states, `edges[s]` a flat tuple mask, target, mask, target, ...
    (`pairs(edges[s])` gives them as pairs). Lazily filled
    blocks (`nfa_blocks`: embedded automata, long repetitions) are
    ranges of reserved ids whose entries stay None until `fill` writes them: a lazy DFA only
    reads the few it reaches. `materialize` fills all.

    `dead_end_possible` is set when some piece matches nothing (an empty character class, an
    embedded automaton with an empty language): only then can a state fail to reach `final`
    """

    def __init__(self, max_states: int) -> None:
        self.max_states = max_states
        self.eps: list[tuple[int, ...] | None] = []
        self.edges: list[tuple[int, ...] | None] = []
        self._block_first: list[int] = []  # first state id of each lazily filled block
        self._blocks: list[Embedded | Copies] = []
        self.dead_end_possible = False
        self._lazy = False  # build ALT / REPEAT states on first read (add_node(lazy=True))
        self._work = 0  # nodes built (`_build_new`)
        self._defer_after = 0  # with `_lazy`: nodes built before alternations are deferred
        self._eager = 0  # > 0 while a block must be built whole (a copier's template)
        self._pending: dict[int, int] = {}  # state -> its (structure << 32) | continuation
        self._reset_tables()
        self.final = self._new()

    def _reset_tables(self) -> None:
        """The builder's tables: needed while a tree is built, dropped after."""
        self._memo: dict[tuple, int] = {}
        self._structures = Structures()  # the key pass's (`nfa_keys`): structures as ints,
        # so what is built later needs no parse node alive
        self._struct = self._structures.struct
        self._one_byte = self._structures.one_byte
        self._cont_masks: dict[tuple[int, int], int] = {}

    def _new(self) -> int:
        if len(self.eps) >= self.max_states:
            raise GrammarError(f"regex automaton exceeds the state budget ({self.max_states})")
        self.eps.append(())
        self.edges.append(())
        return len(self.eps) - 1

    def _reserve(self, n: int) -> int:
        """n ids for a lazily filled block; returns the first."""
        first = len(self.eps)
        if first + n > self.max_states:
            raise GrammarError(f"regex automaton exceeds the state budget ({self.max_states})")
        self.eps.extend([None] * n)
        self.edges.extend([None] * n)
        return first

    def _add_block(self, block: Embedded | Copies) -> None:
        self._block_first.append(block.first)
        self._blocks.append(block)

    def add_regex(self, pattern: str, lazy: bool = False) -> int:
        """Build the NFA for `pattern` ending in `final`; returns its start state."""
        return self.add_node(parse_regex(pattern), lazy)

    def add_node(self, tree: object, lazy: bool = False) -> int:
        """Build the NFA for a parsed regex (interegular nodes, possibly a shared DAG). A key
        pass first (`nfa_keys.Structures`: each structure as ints, so the tree may go once
        keyed) refuses what cannot be built and finds pieces that match nothing. With `lazy`
        (and no such piece) alternations, repetitions and `Deferred` nodes are built when
        first read (`fill`): a lazy DFA reads only what its walks reach. The states are the
        whole build's, numbered in another order (a repetition's entry one epsilon step
        before its first copy; a Deferred's subtree is keyed when it is built)."""
        try:
            structures = self._structures
            root = structures.key_tree(tree)
            self.dead_end_possible |= structures.dead_end_possible
            self._lazy = lazy and not self.dead_end_possible
            # a small tree is built whole now (up to a cap): no NFA building in its first masks
            small = len(self._struct) + structures.weight <= EAGER_STRUCTURES
            self._defer_after = EAGER_WORK if small and self._lazy else 0
            mark = len(self.eps), len(self._blocks)
            try:
                return self._build(root, self.final)
            except GrammarError as e:  # built whole, past the budget: again, all deferred
                if not self._defer_after or "state budget" not in str(e):
                    raise
                del self.eps[mark[0] :], self.edges[mark[0] :]
                del self._blocks[mark[1] :], self._block_first[mark[1] :]
                self._memo, self._pending, self._defer_after = {}, {}, 0
                return self._build(root, self.final)
        except RecursionError:
            raise GrammarError("regex too deeply nested") from None
        finally:
            self._structures.forget()  # ids of the tree's nodes: the tree may go
            if not self._pending:
                self._reset_tables()

    def _build(self, nk: int, k: int) -> int:
        """A state matching the structure keyed `nk`, then continuing at state k."""
        memo_key = (nk << 32) | k  # (structure, continuation) as one int: no tuple to hash
        s = self._memo.get(memo_key)
        if s is None:
            t = self._struct[nk]
            tag = t[0]
            if tag == "c":  # the commonest node: no dispatch
                mask = self._one_byte[nk]
                if mask:  # one state, one edge (ASCII classes, most of a schema)
                    s = len(self.eps)
                    if s >= self.max_states:
                        raise GrammarError(
                            f"regex automaton exceeds the state budget ({self.max_states})"
                        )
                    self.eps.append(())
                    self.edges.append((mask, k))
                else:
                    s = self._chars(t[1], t[2], k)
            elif (
                tag in "|rl"
                and self._lazy
                and not self._eager
                and (self._work >= self._defer_after or tag == "r" and (t[3] or 0) > EAGER_COPIES)
            ):
                if tag == "|" and len(t) == 2:
                    s = self._build(t[1], k)
                else:
                    s = self._new()
                    self.eps[s] = self.edges[s] = None  # type: ignore[assignment]
                    self._pending[s] = memo_key
            else:
                s = self._build_new(nk, t, k)
            self._memo[memo_key] = s
        return s

    def _fill_pending(self, x: int, nk: int, k: int) -> None:
        """A deferred alternation or repetition's state: its options, or its loop, built
        (their own alternations and repetitions deferred in turn)."""
        t = self._struct[nk]
        if t[0] == "l":
            self.eps[x] = (self._build(self._expand(nk), k),)
        elif t[0] == "|":
            self.eps[x] = tuple([self._build(o, k) for o in t[1:]])
        elif t[2] == 0 and t[3] is None:
            self.eps[x] = (k, self._build(t[1], x))  # the loop state itself, as eagerly
        else:
            self.eps[x] = (self._repeat(t[1], t[2], t[3], k),)
        self.edges[x] = ()

    def _build_new(self, nk: int, t: tuple, k: int) -> int:
        self._work += 1
        tag = t[0]
        if tag == "&":
            for part in t[:0:-1]:
                k = self._build(part, k)
            return k
        if tag == "|":
            if len(t) == 2:
                return self._build(t[1], k)
            targets = tuple([self._build(o, k) for o in t[1:]])
            s = self._new()
            self.eps[s] = targets
            return s
        if tag == "r":
            s = self._repeat(t[1], t[2], t[3], k)
            if self._defer_after and len(self.eps) > EAGER_STATES:
                self._defer_after = self._work  # the eager start ends here: the rest defers
            return s
        if tag == "c":
            return self._chars(t[1], t[2], k)
        if tag == ".":
            return self._chars(frozenset("\n"), True, k)
        if tag == "e":
            return k
        if tag == "l":
            return self._build(self._expand(nk), k)
        return self._embed_dfa(self._structures.dfas[nk], k)  # "d"

    def _expand(self, nk: int) -> int:
        """The key of what the Deferred keyed `nk` builds (keyed on first read)."""
        structures = self._structures
        out = structures.expand(nk)
        if structures.dead_end_possible and not self.dead_end_possible:
            if self._lazy:  # a lazy DFA cannot prune dead ends: the Deferred broke its contract
                raise GrammarError("internal: a deferred regex piece has one that matches nothing")
            self.dead_end_possible = True
        return out

    def _repeat(self, base: int, lo: int, hi: int | None, k: int) -> int:
        """base{lo,hi} (hi None: unbounded), base a structure key, then k."""
        copies = lo if hi is None else hi
        build = self._copier(base) if copies > _COPY_FROM else None
        if build is not None and hi is not None and copies > _LAZY_FROM:
            return self._lazy_copies(build, lo, hi, k)
        if build is None:

            def build(t: int) -> int:
                return self._build(base, t)

        if hi is None:
            # loop: s -> k, s -> base -> s
            s = self._new()
            self.eps[s] = (k, self._build(base, s))
        else:
            # (base (base (...)?)?)? : every optional copy may skip straight to k
            s = k
            for _ in range(hi - lo):
                opt = self._new()
                self.eps[opt] = (k, build(s))
                s = opt
        for _ in range(lo):
            s = build(s)
        return s

    def _copier(self, base: int) -> Callable[[int], int] | None:
        """For a long counted repetition: the base's states built once (towards a placeholder
        continuation), then each copy made by renumbering that block, with no per-node work.
        None when the base's automaton is not a self-contained block (then copies are built)."""
        hole = self._new()  # the placeholder continuation; it and the template stay unreachable
        first = len(self.eps)
        self._eager += 1  # the template is built whole: its copies are renumbered from it
        try:
            b = self._build(base, hole)
        finally:
            self._eager -= 1
        last = len(self.eps)
        if not first <= b < last:
            return None
        if self._block_first and self._block_first[-1] >= first:
            return None  # holds a lazily filled block: its copies are built one by one
        eps, edges = self.eps, self.edges
        for x in range(first, last):
            if any(not (first <= y < last or y == hole) for y in eps[x]):
                return None
            if any(not (first <= t < last or t == hole) for t in edges[x][1::2]):
                return None

        def copy(target: int) -> int:
            """A copy of the block continuing to `target`; returns its start."""
            off = len(eps) - first
            if len(eps) + last - first > self.max_states:
                raise GrammarError(f"regex automaton exceeds the state budget ({self.max_states})")
            for x in range(first, last):
                eps.append(tuple([target if y == hole else y + off for y in eps[x]]))
                edges.append(moved(edges[x], hole, target, off))
            return b + off

        copy.block = (first, last, b, hole)  # type: ignore[attr-defined]
        return copy

    def _lazy_copies(self, build: Callable[[int], int], lo: int, hi: int, k: int) -> int:
        """base{lo,hi} as reserved ids filled on first read (`Copies`): a long bounded
        repetition (a string's maxLength 32767) costs only the copies a walk reaches."""
        first_t, last_t, b, hole = build.block  # type: ignore[attr-defined]
        n = last_t - first_t
        copies = Copies(self._reserve(hi * n + (hi - lo)), first_t, last_t, b, hole, hi - lo, hi, k)
        self._add_block(copies)
        return copies.start(hi - 1)

    def _embed_dfa(self, dfa: object, k: int) -> int:
        """Reserve ids for a ByteDFA's live states (filled on first read); its accepting
        states continue at k. DFA state i (>= 1) is NFA state first + i - 1."""
        block = Embedded(self._reserve(dfa.num_states - 1), dfa, k)
        self._add_block(block)
        if _matches_nothing(dfa):
            self.dead_end_possible = True  # an automaton of the empty language
        return block.first

    def fill(self, x: int) -> None:
        """Give state x (deferred, or of a lazily filled block) its edges and epsilon targets."""
        pending = self._pending.pop(x, None)
        if pending is None:
            self._blocks[bisect.bisect_right(self._block_first, x) - 1].fill(self, x)
            return
        try:
            self._fill_pending(x, pending >> 32, pending & 0xFFFFFFFF)
        except (GrammarError, RecursionError) as e:  # e.g. the budget: a later read fails alike
            self._pending[x] = pending
            if isinstance(e, RecursionError):
                raise GrammarError("regex too deeply nested") from None
            raise
        # the node ids a Deferred's expansion keyed stay (their trees held, see
        # `Structures.expand`): the next expansion skips the pieces they share (the string
        # character, the hex tails of `\u` escapes), re-keyed from scratch otherwise
        if not self._pending:  # the whole tree is built: the builder's tables can go
            self._reset_tables()

    @property
    def blocks(self) -> list[Embedded | Copies]:
        """The lazily filled blocks, in id order (a list that only grows; never write it)."""
        return self._blocks

    def eps_closure(self, s: int) -> list[int]:
        """The states reachable from s by epsilon edges that matter to a DFA state: those with
        byte edges, and `final` (states of lazily filled blocks are filled as they are read)."""
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

    def materialize(self, blocks: bool = True) -> None:
        """Fill every deferred state and (with `blocks`) every lazily filled block's states
        (for an eager subset construction; the C one fills block states itself)."""
        self._eager += 1  # what the deferred states build is built whole
        try:
            while self._pending:
                self.fill(next(iter(self._pending)))
        finally:
            self._eager -= 1
        if not blocks:
            return
        edges = self.edges
        for block in self._blocks:
            for x in range(block.first, block.first + block.size):
                if edges[x] is None:
                    self.fill(x)

    def _chars(self, chars: frozenset[str], negated: bool, k: int) -> int:
        form = char_form(chars, negated)
        s = self._new()
        if not form:
            self.dead_end_possible = True  # a character class that matches nothing
        if len(form) == 1 and not form[0][1]:
            self.edges[s] = (form[0][0], k)
            return s
        by_target: dict[int, int] = {}
        for mask, rest in form:
            t = self._suffix(rest, k) if rest else k
            by_target[t] = by_target.get(t, 0) | mask
        self.edges[s] = tuple([x for t, m in by_target.items() for x in (m, t)])
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
            self.edges[s] = (mask, t)
            self._memo[key] = s
        return s
