"""An Earley parser over a recursive transition network (`grammar.ebnf.lower.Network`), one
byte at a time.

An Earley set is immutable once built and points at the sets its items started in (their
origins), so a set is a whole parser configuration: a matcher keeps one per position, rollback
is keeping an older one, and the token-mask code builds hypothetical sets (a terminal completed
in the middle of a token) without touching the matcher.

Items are (rule, rule-DFA state, origin set). The items that are reading a terminal are kept per
(terminal, terminal-DFA state) with their continuations: what to add when the terminal
completes. Prediction, completion and nullable rules follow the usual Earley closure (a rule
completed empty in the current set also completes the callers that arrive later), so left
recursion and ambiguity are handled.

Token terminals (`grammar.ebnf.token_terminals`) read no byte: `advance_token` moves past them
when a token's id is in their set; forced text stops where one may be read.
"""

from __future__ import annotations

import numpy as np

from grammar.automata.fsm import DEAD, START
from grammar.ebnf.network import Network
from grammar.ebnf.token_terminals import TokenTerminal

_MAX_HYPOTHETICAL = 4096
Cont = tuple  # (rule id, rule-DFA state, origin ESet or None for the root's caller)


class ESet:
    """One Earley set. `scan[(terminal, state)]` lists the continuations of the items inside
    that terminal; `waiting[rule]` those of the items that called `rule` here; `accept`: the
    root completed over the whole text. The mask and forced-bytes caches live here too."""

    __slots__ = ("scan", "waiting", "accept", "words", "forced", "completed")

    def __init__(self) -> None:
        self.scan: dict[tuple[int, int], list[Cont]] = {}
        self.waiting: dict[int, list[Cont]] = {}
        self.accept = False
        self.words: np.ndarray | None = None
        self.forced: bytes | None = None
        self.completed: dict[tuple[int, int], ESet] | None = None  # see EarleyParser.complete

    @property
    def alive(self) -> bool:
        return bool(self.scan) or self.accept


class EarleyParser:
    def __init__(self, network: Network) -> None:
        self.net = network
        rules = network.rules
        self._accepting = [rd.accepting for rd in rules]
        self._terms = [rd.terms for rd in rules]
        self._calls = [rd.calls for rd in rules]
        terms = network.terminals
        self._nullable = [t.nullable for t in terms]
        self._rows = [t.table.tolist() for t in terms]
        self._acc = [t.accepting.tolist() for t in terms]
        self._live = [t.live.tolist() for t in terms]
        self._at = [
            [
                (
                    bool(rd.accepting[s]),
                    [((t, START), target, self._nullable[t]) for t, target in rd.terms[s]],
                    rd.calls[s],
                )
                for s in range(len(rd.terms))
            ]
            for rd in rules
        ]
        self._hypothetical: dict[int, tuple[list, ESet]] = {}  # see complete
        # token terminals (grammar.ebnf.token_terminals): which ids each one takes
        self.token_terms: dict[int, np.ndarray] = {
            i: t.member for i, t in enumerate(terms) if isinstance(t, TokenTerminal)
        }

    def initial(self) -> ESet:
        e = ESet()
        self._close(e, [(self.net.root, 0, None)])
        return e

    def _close(self, e: ESet, items: list[Cont]) -> None:
        # per rule state (`_at`): accepting, the terminals it reads as (scan key, target,
        # nullable), its calls; `seen` holds the items themselves (an origin set hashes and
        # compares by identity)
        at = self._at
        scan, waiting = e.scan, e.waiting
        seen: set[Cont] = set()
        done_here: set[int] = set()
        predicted: set[int] = set()
        work = list(items)
        while work:
            item = work.pop()
            if item in seen:
                continue
            seen.add(item)
            r, s, o = item
            acc, reads, calls = at[r][s]
            if acc:
                if o is None:
                    e.accept = True
                elif o is e:
                    done_here.add(r)
                    work.extend(waiting.get(r, ()))
                else:
                    work.extend(o.waiting.get(r, ()))
            for key, target, nullable in reads:
                c = (r, target, o)
                lst = scan.get(key)
                if lst is None:
                    scan[key] = [c]
                else:
                    lst.append(c)
                if nullable:
                    work.append(c)
            for a, target in calls:
                c = (r, target, o)
                lst = waiting.get(a)
                if lst is None:
                    waiting[a] = [c]
                else:
                    lst.append(c)
                if a in done_here:
                    work.append(c)
                if a not in predicted:
                    predicted.add(a)
                    work.append((a, 0, e))

    def step(self, e: ESet, byte: int, extra: list[Cont] | None = None) -> ESet | None:
        """The set after one more byte, or None if no item can read it; `extra`: items that
        completed a token terminal ending at the same place (see advance_token)."""
        rows, acc, live = self._rows, self._acc, self._live
        items: list[Cont] = list(extra) if extra else []
        scan: dict[tuple[int, int], list[Cont]] = {}
        for (t, q), conts in e.scan.items():
            q2 = rows[t][q][byte]
            if q2 == DEAD:
                continue
            if acc[t][q2]:
                items.extend(conts)
            if live[t][q2]:
                lst = scan.get((t, q2))
                if lst is None:
                    # shared with e, except where the closure may append (the start state)
                    scan[(t, q2)] = conts if q2 != START else list(conts)
                else:
                    scan[(t, q2)] = _merge(lst, conts)
        if not items and not scan:
            return None
        nxt = ESet()
        nxt.scan = scan
        if items:
            self._close(nxt, items)
        return nxt if nxt.alive else None

    def walk(self, e: ESet, data: bytes) -> ESet | None:
        cur: ESet | None = e
        for b in data:
            cur = self.step(cur, b)  # type: ignore[arg-type]
            if cur is None:
                return None
        return cur

    def token_items(self, e: ESet, token_id: int) -> list[Cont]:
        """The continuations of the token terminals at `e` that take `token_id`."""
        items: list[Cont] = []
        terms = self.token_terms
        for (t, _), conts in e.scan.items():
            member = terms.get(t)
            if member is not None and member[token_id]:
                items.extend(conts)
        return items

    def advance_token(self, e: ESet, token_id: int, data: bytes | None) -> ESet | None:
        """The set after one token: through the token terminals that take its id, and (for a
        text token) through its bytes as well; None if neither can."""
        items = self.token_items(e, token_id) if self.token_terms else []
        if not items:
            return self.walk(e, data) if data else None
        if data:
            before = self.walk(e, data[:-1]) if len(data) > 1 else e
            if before is not None:
                nxt = self.step(before, data[-1], items)
                if nxt is not None:
                    return nxt
        nxt = ESet()
        self._close(nxt, items)
        return nxt if nxt.alive else None

    def has_token_terminal(self, e: ESet) -> bool:
        terms = self.token_terms
        return bool(terms) and any(t in terms for t, _ in e.scan)

    def complete(self, e: ESet, key: tuple[int, int]) -> ESet:
        """The hypothetical set right after the terminal being read at `e.scan[key]` completes
        (in the middle of a token): its continuations, closed. Cached on `e`."""
        if e.completed is None:
            e.completed = {}
        hit = e.completed.get(key)
        if hit is None:
            conts = e.scan[key]
            # the same continuation list is carried from set to set while a terminal goes on
            # (and is never changed once its set is built): its closure is computed once
            shared = self._hypothetical.get(id(conts))
            if shared is not None and shared[0] is conts:
                hit = shared[1]
            else:
                hit = ESet()
                self._close(hit, list(conts))
                if len(self._hypothetical) >= _MAX_HYPOTHETICAL:
                    self._hypothetical.clear()
                self._hypothetical[id(conts)] = (conts, hit)
            e.completed[key] = hit
        return hit

    def allowed_bytes(self, e: ESet) -> list[int]:
        allowed = np.zeros(256, dtype=bool)
        for t, q in e.scan:
            allowed |= self.net.terminals[t].table[q] != DEAD
        return np.flatnonzero(allowed).tolist()

    def forced(self, e: ESet, limit: int) -> bytes:
        """The longest byte string every continuation of `e` starts with (stops where the text
        may end)."""
        if e.forced is not None:
            return e.forced
        out = bytearray()
        cur = e
        while len(out) < limit and not cur.accept and not self.has_token_terminal(cur):
            only = self.allowed_bytes(cur)
            if len(only) != 1:
                break
            nxt = self.step(cur, only[0])
            if nxt is None:
                break
            out.append(only[0])
            cur = nxt
        e.forced = bytes(out)
        return e.forced


def _merge(a: list[Cont], b: list[Cont]) -> list[Cont]:
    seen = {(r, s, id(o)) for r, s, o in a}
    out = list(a)
    for c in b:
        k = (c[0], c[1], id(c[2]))
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out
