"""Rules -> a recursive transition network: regular pieces as byte DFAs, the rest as calls.

A rule that reaches no cycle of rule references is regular: it is inlined as a regex tree
(`grammar.automata.regex_ast`). If the root is regular the whole grammar is one regex (the
caller compiles it as one). Otherwise every rule that is not regular becomes a small DFA over
symbols, a symbol being a *terminal* (a maximal regular piece of the rule's body: a run of
regular items in a sequence, or the regular options of an alternation, merged into one regex
and compiled to a byte DFA) or a *call* of another non-regular rule. The Earley parser
(`grammar.ebnf.earley`) runs over these DFAs; tokens inside one terminal cost a DFA walk.

Checks: an undefined rule or a missing root is a GrammarError naming the rule and the line; a
root that matches no text is one too. Left recursion is handled (Earley). A token terminal
(`TokenSet`: one token by id, `grammar.ebnf.token_terminals`) is never regular: a rule holding one,
and every rule reaching it, goes to the network.
"""

from __future__ import annotations

import threading

import numpy as np

from grammar.automata import regex_ast as rx
from grammar.automata.dfa_ops import DFANode, from_rows
from grammar.automata.fsm import DEAD, START, ByteDFA, node_to_dfa
from grammar.automata.utf8 import MAX_CODE_POINT
from grammar.ebnf.syntax import Alt, Chars, Grammar, Lit, Ref, Regular, Rep, Seq, TokenSet
from grammar.errors import GrammarError

_LARGE_CLASS = 600_000  # a class with more characters than this is written as a complement
_TERMINALS: dict[object, Terminal] = {}  # by regex text / leaf key: shared by every grammar
_TERMINALS_LOCK = threading.Lock()
_MAX_SHARED_TERMINALS = 4096


class Terminal:
    """A regular piece: its byte DFA as a 256-column table, which states accept, which can
    still read a byte."""

    __slots__ = ("dfa", "table", "accepting", "live", "nullable", "first_bytes", "key")

    def __init__(self, dfa: ByteDFA, key: object) -> None:
        self.dfa = dfa
        self.key = key
        self.table = np.ascontiguousarray(dfa.table[:, dfa.byte_to_class]).astype(np.int32)
        self.accepting = np.asarray(dfa.accepting, dtype=bool)
        self.live = (self.table != DEAD).any(axis=1)
        self.nullable = bool(self.accepting[START])
        self.first_bytes = self.table[START] != DEAD


def _code_points(ranges: tuple[tuple[int, int], ...]) -> int:
    return sum(hi - lo + 1 for lo, hi in ranges)


def chars_node(c: Chars) -> object | None:
    """A character class as a regex-tree node (None: it matches no character)."""
    ranges, negated = c.ranges, c.negated
    if _code_points(ranges) > _LARGE_CLASS:
        # the complement is smaller: list it instead
        comp, nxt = [], 0
        for lo, hi in ranges:
            if lo > nxt:
                comp.append((nxt, lo - 1))
            nxt = max(nxt, hi + 1)
        if nxt <= MAX_CODE_POINT:
            comp.append((nxt, MAX_CODE_POINT))
        ranges, negated = tuple(comp), not negated
        if _code_points(ranges) > _LARGE_CLASS:
            raise GrammarError(
                f"a character class of {_code_points(ranges)} characters (and its complement) "
                f"exceeds the limit of {_LARGE_CLASS} listed characters"
            )
    chars = frozenset(chr(p) for lo, hi in ranges for p in range(lo, hi + 1))
    if not chars and not negated:
        return None
    return rx.char_class(chars, negated)


class Lowering:
    """The analysis of one grammar: references, recursion, regular rules as regex trees."""

    def __init__(self, g: Grammar, root: str) -> None:
        self.g = g
        self.root = root
        if root not in g.rules:
            raise GrammarError(
                f"GBNF grammar error: the root rule {root!r} is not defined "
                f"(rules: {', '.join(list(g.rules)[:12])})"
            )
        self.refs: dict[str, set[str]] = {}
        self.token_rules: set[str] = set()  # rules with a token terminal in their own body
        for name, body in g.rules.items():
            out: set[str] = set()
            if self._collect(name, body, out):
                self.token_rules.add(name)
            self.refs[name] = out
        self.reachable = self._reach(root)
        self.nonregular = self._nonregular()
        self._nodes: dict[str, object | None] = {}

    def _collect(self, rule: str, e: object, out: set[str]) -> bool:
        """Add the rules `e` references to `out`; whether it holds a token terminal."""
        if isinstance(e, Ref):
            if e.name not in self.g.rules:
                raise GrammarError(
                    f"GBNF grammar error at line {e.line}: rule {rule!r} references the "
                    f"undefined rule {e.name!r}"
                )
            out.add(e.name)
        elif isinstance(e, Seq):
            return any([self._collect(rule, i, out) for i in e.items])
        elif isinstance(e, Alt):
            return any([self._collect(rule, i, out) for i in e.options])
        elif isinstance(e, Rep):
            return self._collect(rule, e.item, out)
        return isinstance(e, TokenSet)

    def _reach(self, root: str) -> list[str]:
        seen, order, stack = {root}, [root], [root]
        while stack:
            for r in sorted(self.refs[stack.pop()]):
                if r not in seen:
                    seen.add(r)
                    order.append(r)
                    stack.append(r)
        return order

    def _nonregular(self) -> set[str]:
        """Rules on a reference cycle, and every rule that reaches one."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        on_stack: set[str] = set()
        stack: list[str] = []
        cyclic: set[str] = set()
        counter = [0]

        def strong(v: str) -> None:  # Tarjan, iterative over each node's sorted successors
            work = [(v, iter(sorted(self.refs[v])))]
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on_stack.add(v)
            while work:
                node, it = work[-1]
                nxt = next(it, None)
                if nxt is not None:
                    if nxt not in index:
                        index[nxt] = low[nxt] = counter[0]
                        counter[0] += 1
                        stack.append(nxt)
                        on_stack.add(nxt)
                        work.append((nxt, iter(sorted(self.refs[nxt]))))
                    elif nxt in on_stack:
                        low[node] = min(low[node], index[nxt])
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1 or node in self.refs[node]:
                        cyclic.update(comp)

        for v in self.reachable:
            if v not in index:
                strong(v)
        # reaching a cyclic rule makes a rule non-regular too, and so does a token terminal (it
        # matches a token id, which no byte automaton reads)
        out = {v for v in self.reachable if v in cyclic or v in self.token_rules}
        changed = True
        while changed:
            changed = False
            for v in self.reachable:
                if v not in out and self.refs[v] & out:
                    out.add(v)
                    changed = True
        return out

    def is_regular(self, e: object) -> bool:
        if isinstance(e, Ref):
            return e.name not in self.nonregular
        if isinstance(e, Seq):
            return all(self.is_regular(i) for i in e.items)
        if isinstance(e, Alt):
            return all(self.is_regular(i) for i in e.options)
        if isinstance(e, Rep):
            return self.is_regular(e.item)
        return not isinstance(e, TokenSet)

    def node(self, e: object) -> object | None:
        """The regex tree of a regular expression (None: it matches nothing)."""
        if isinstance(e, Lit):
            return rx.lit(e.text) if e.text else rx.EMPTY
        if isinstance(e, Chars):
            return chars_node(e)
        if isinstance(e, Regular):
            return e.node
        if isinstance(e, Ref):
            if e.name not in self._nodes:
                self._nodes[e.name] = None  # a guard: regular rules have no cycles
                self._nodes[e.name] = self.node(self.g.rules[e.name])
            return self._nodes[e.name]
        if isinstance(e, Seq):
            return rx.seq(*(self.node(i) for i in e.items))
        if isinstance(e, Alt):
            return rx.alt([self.node(i) for i in e.options])
        if isinstance(e, Rep):
            return rx.repeat(self.node(e.item), e.lo, e.hi)
        raise TypeError(f"not a grammar expression: {type(e).__name__}")

    def root_node(self) -> object | None:
        """The regex tree of the whole grammar when the root is regular, else None."""
        if self.root in self.nonregular:
            return None
        node = self.node(Ref(self.root))
        if node is None:
            raise GrammarError(f"GBNF grammar error: the root rule {self.root!r} matches no text")
        return node


def shortest_matches(dfa: ByteDFA) -> ByteDFA:
    """The strings of the language none of whose proper prefixes is in it (no transitions out
    of accepting states): a lazy lexeme's committed-shortest matches."""
    rows = dfa.byte_table().copy()
    rows[dfa.accepting] = DEAD
    return from_rows(rows.tolist(), list(dfa.accepting))


MAX_BUDGET_STATES = 20_000


def char_budget(dfa: ByteDFA, n: int, where: str) -> ByteDFA:
    """XGrammar's `max_chars=n`: once n characters (code points) are read, the text ends at
    the first place it can (the budget gives way until then). States: (state, characters read
    up to n); a GrammarError naming `where` past MAX_BUDGET_STATES of them."""
    table = dfa.byte_table()
    q = table.shape[0]
    if q * (n + 1) > MAX_BUDGET_STATES:
        raise GrammarError(
            f"{where}: max_chars={n} over a body of {q} states needs more than "
            f"{MAX_BUDGET_STATES} states"
        )
    lead = (np.arange(256) & 0xC0) != 0x80  # the bytes that start a character
    acc = np.asarray(dfa.accepting, dtype=bool)
    rows = []
    for c in range(n + 1):  # state (s, c) is row c * q + s: row 0 dead, row 1 start
        nxt = np.minimum(c + lead, n).astype(np.int64)[None, :] * q + table
        block = np.where(table == DEAD, DEAD, nxt)
        block[DEAD] = DEAD
        if c == n:
            block[acc] = DEAD  # out of budget where the body may end: it ends
        rows.append(block)
    return from_rows(np.concatenate(rows), np.tile(acc, n + 1).tolist())


def commit_lazy_rules(g: Grammar, source: str) -> Grammar:
    """XGrammar's `name[lazy] ::= body`: the rule ends at the first place its body can (its
    language: `shortest_matches` of the body's), so a body that may match the empty text
    matches only that; `name[max_chars=N]`: `char_budget`. The body must be regular (no
    recursion, no token terminal): a GrammarError naming the rule and option otherwise. The
    rules with each such body replaced."""
    out = Grammar(dict(g.rules), dict(g.lines))
    for name in sorted(g.lazy, key=lambda n: g.lines.get(n, 0)):
        at = f"GBNF grammar error at line {g.lines.get(name, 0)}, rule {name!r}"
        lazy, budget = g.lazy[name]
        what = "lazy" if lazy else "max_chars"
        low = Lowering(out, name)
        if name in low.nonregular:
            raise GrammarError(
                f"{at}: rule option {what!r} needs a regular body (no recursion, no token)"
            )
        node = low.node(Ref(name))
        if node is None:
            raise GrammarError(f"{at}: the rule matches no text")
        dfa = node_to_dfa(node)
        if lazy:
            dfa = shortest_matches(dfa)
        if budget is not None:
            dfa = char_budget(dfa, budget, at)
        out.rules[name] = Regular(DFANode(dfa, what, f"rule {name!r}"), (what, source, name))
    return out


def shared_terminal(key: object, node: object) -> Terminal:
    """The terminal of a regex tree, shared between grammars by `key`."""
    with _TERMINALS_LOCK:
        hit = _TERMINALS.get(key)
    if hit is not None:
        return hit
    t = Terminal(node_to_dfa(node), key)
    with _TERMINALS_LOCK:
        if len(_TERMINALS) >= _MAX_SHARED_TERMINALS:
            _TERMINALS.clear()
        return _TERMINALS.setdefault(key, t)


def clear_shared_terminals() -> None:
    with _TERMINALS_LOCK:
        _TERMINALS.clear()
