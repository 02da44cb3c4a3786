"""The non-regular rules as DFAs over symbols (terminals and calls): `NetworkBuilder` turns each
rule's body into a Thompson NFA over symbols, determinises it and prunes what cannot complete.
See `grammar.ebnf.lower` for what becomes a terminal; a `TokenSet` becomes a token terminal
(`grammar.ebnf.token_terminals`), resolved in the vocabulary given."""

from __future__ import annotations

from dataclasses import dataclass, field

from grammar.automata import regex_ast as rx
from grammar.automata.fsm import node_to_dfa
from grammar.ebnf.lower import Lowering, Terminal, shared_terminal
from grammar.ebnf.syntax import Alt, Ref, Regular, Rep, Seq, TokenSet
from grammar.ebnf.token_terminals import TokenTerminal, token_terminal
from grammar.errors import GrammarError
from grammar.tokens.vocab import TokenVocabulary


@dataclass(slots=True)
class RuleDFA:
    """One non-regular rule as a DFA over symbols: per state, the terminal edges
    [(terminal id, target)], the call edges [(rule id, target)], and whether it accepts."""

    name: str
    terms: list[list[tuple[int, int]]] = field(default_factory=list)
    calls: list[list[tuple[int, int]]] = field(default_factory=list)
    accepting: list[bool] = field(default_factory=list)


@dataclass(slots=True)
class Network:
    rules: list[RuleDFA]
    terminals: list[Terminal | TokenTerminal]
    root: int


class _NFA:
    """Thompson NFA over symbols ('t', terminal) / ('r', rule) with epsilon edges."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[tuple[str, int], int]]] = []

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1


class NetworkBuilder:
    def __init__(
        self, low: Lowering, vocab: TokenVocabulary | None = None, num_words: int = 0
    ) -> None:
        self.low = low
        self.vocab = vocab  # token terminals are resolved in it
        self.num_words = num_words
        self.rule_ids = {name: i for i, name in enumerate(sorted(low.nonregular))}
        self.terminals: list[Terminal | TokenTerminal] = []
        self._term_ids: dict[object, int] = {}

    def token_terminal(self, e: TokenSet) -> int:
        if self.vocab is None:
            raise GrammarError(f"{e.where or 'a token'}: matching tokens by id needs a vocabulary")
        t = token_terminal(e, self.vocab, self.num_words)
        tid = self._term_ids.get(t.key)
        if tid is None:
            tid = self._term_ids[t.key] = len(self.terminals)
            self.terminals.append(t)
        return tid

    def terminal(self, e: object) -> int | None:
        """The id of the terminal for regular expression e (None: it matches nothing; -1: it
        matches only the empty string)."""
        node = self.low.node(e)
        if node is None:
            return None
        if node is rx.EMPTY:
            return -1
        key: object
        if isinstance(e, Regular):
            key = ("leaf", e.key)
        else:
            try:
                key = ("regex", rx.to_text(node))
            except (GrammarError, TypeError):
                key = ("node", id(node))
        tid = self._term_ids.get(key)
        if tid is None:
            t = shared_terminal(key, node) if key[0] != "node" else Terminal(node_to_dfa(node), key)
            tid = self._term_ids[key] = len(self.terminals)
            self.terminals.append(t)
        return tid

    def _build(self, nfa: _NFA, e: object, a: int, b: int) -> None:
        low = self.low
        if low.is_regular(e):
            t = self.terminal(e)
            if t == -1:
                nfa.eps[a].append(b)
            elif t is not None:
                nfa.edges[a].append((("t", t), b))
            return
        if isinstance(e, Ref):
            nfa.edges[a].append((("r", self.rule_ids[e.name]), b))
        elif isinstance(e, TokenSet):
            nfa.edges[a].append((("t", self.token_terminal(e)), b))
        elif isinstance(e, Seq):
            runs: list[object] = []
            pending: list[object] = []
            for item in e.items:
                if low.is_regular(item):
                    pending.append(item)
                else:
                    if pending:
                        runs.append(pending[0] if len(pending) == 1 else Seq(tuple(pending)))
                        pending = []
                    runs.append(item)
            if pending:
                runs.append(pending[0] if len(pending) == 1 else Seq(tuple(pending)))
            cur = a
            for i, item in enumerate(runs):
                nxt = b if i == len(runs) - 1 else nfa.new()
                self._build(nfa, item, cur, nxt)
                cur = nxt
        elif isinstance(e, Alt):
            regular = [o for o in e.options if low.is_regular(o)]
            if regular:
                self._build(nfa, regular[0] if len(regular) == 1 else Alt(tuple(regular)), a, b)
            for o in e.options:
                if not low.is_regular(o):
                    self._build(nfa, o, a, b)
        elif isinstance(e, Rep):
            self._repeat(nfa, e, a, b)
        else:
            raise TypeError(f"not a grammar expression: {type(e).__name__}")

    def _repeat(self, nfa: _NFA, e: Rep, a: int, b: int) -> None:
        cur = a
        for _ in range(e.lo):
            nxt = nfa.new()
            self._build(nfa, e.item, cur, nxt)
            cur = nxt
        if e.hi is None:
            loop = nfa.new()
            nfa.eps[cur].append(loop)
            back = nfa.new()
            self._build(nfa, e.item, loop, back)
            nfa.eps[back].append(loop)
            nfa.eps[loop].append(b)
            return
        for _ in range(e.hi - e.lo):
            nxt = nfa.new()
            nfa.eps[cur].append(b)
            self._build(nfa, e.item, cur, nxt)
            cur = nxt
        nfa.eps[cur].append(b)

    def rule(self, name: str) -> RuleDFA:
        nfa = _NFA()
        a, b = nfa.new(), nfa.new()
        self._build(nfa, self.low.g.rules[name], a, b)
        return _determinise(nfa, a, b, name)

    def build(self) -> Network:
        rules = [RuleDFA("")] * len(self.rule_ids)
        for name, i in self.rule_ids.items():
            rules[i] = self.rule(name)
        _prune(rules)
        root = self.rule_ids[self.low.root]
        if not rules[root].accepting or not _productive_rules(rules)[root]:
            raise GrammarError(
                f"GBNF grammar error: the root rule {self.low.root!r} matches no text"
            )
        return Network(rules, self.terminals, root)


def _determinise(nfa: _NFA, start: int, final: int, name: str) -> RuleDFA:
    def closure(states: frozenset[int]) -> frozenset[int]:
        out, stack = set(states), list(states)
        while stack:
            for t in nfa.eps[stack.pop()]:
                if t not in out:
                    out.add(t)
                    stack.append(t)
        return frozenset(out)

    first = closure(frozenset((start,)))
    ids = {first: 0}
    order = [first]
    rd = RuleDFA(name)
    i = 0
    while i < len(order):
        cur = order[i]
        moves: dict[tuple[str, int], set[int]] = {}
        for s in cur:
            for sym, t in nfa.edges[s]:
                moves.setdefault(sym, set()).add(t)
        terms, calls = [], []
        for sym in sorted(moves):
            target = closure(frozenset(moves[sym]))
            j = ids.get(target)
            if j is None:
                j = ids[target] = len(order)
                order.append(target)
            (terms if sym[0] == "t" else calls).append((sym[1], j))
        rd.terms.append(terms)
        rd.calls.append(calls)
        rd.accepting.append(final in cur)
        i += 1
    return rd


def _productive_rules(rules: list[RuleDFA]) -> list[bool]:
    """Which rules derive some text (a call of a rule that derives none is a dead edge)."""
    prod = [False] * len(rules)
    changed = True
    while changed:
        changed = False
        for i, rd in enumerate(rules):
            if prod[i]:
                continue
            good = [rd.accepting[s] for s in range(len(rd.accepting))]
            moved = True
            while moved and not good[0]:
                moved = False
                for s in range(len(good)):
                    if good[s]:
                        continue
                    if any(good[t] for _, t in rd.terms[s]) or any(
                        prod[r] and good[t] for r, t in rd.calls[s]
                    ):
                        good[s] = moved = True
            if good[0]:
                prod[i] = changed = True
    return prod


def _prune(rules: list[RuleDFA]) -> None:
    """Drop the calls of rules that derive no text and the edges into states that cannot reach
    acceptance (so every Earley item can still complete)."""
    prod = _productive_rules(rules)
    for rd in rules:
        n = len(rd.accepting)
        for s in range(n):
            rd.calls[s] = [(r, t) for r, t in rd.calls[s] if prod[r]]
        good = list(rd.accepting)
        moved = True
        while moved:
            moved = False
            for s in range(n):
                if not good[s] and any(good[t] for _, t in rd.terms[s] + rd.calls[s]):
                    good[s] = moved = True
        for s in range(n):
            rd.terms[s] = [(x, t) for x, t in rd.terms[s] if good[t]]
            rd.calls[s] = [(x, t) for x, t in rd.calls[s] if good[t]]
