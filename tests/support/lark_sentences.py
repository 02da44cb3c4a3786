"""Helpers for the CFG tests and benchmark: the example grammars, a random sentence generator over
lark's rules, corruptions, and lark as the oracle."""

from __future__ import annotations

import functools
import random
from typing import Any

from grammar.automata.fsm import DEAD, START, ByteDFA
from tests.support.paths import REPO

GRAMMAR_DIR = REPO / "examples" / "grammars"
EXAMPLES = ("arithmetic", "json", "sql_select")


@functools.cache
def grammar_text(name: str) -> str:
    return (GRAMMAR_DIR / f"{name}.lark").read_text(encoding="utf-8")


@functools.cache
def lark_parser(text: str, start: str = "start") -> Any:
    from lark import Lark

    return Lark(text, parser="lalr", start=start)


def lark_accepts(text: str, sentence: str, start: str = "start") -> bool:
    from lark.exceptions import LarkError

    try:
        lark_parser(text, start).parse(sentence)
        return True
    except LarkError:
        return False


class SentenceGenerator:
    """Random sentences of a lark grammar: expands lark's compiled rules (depth-limited by the
    shortest derivations) and fills each terminal by a random walk of its byte DFA."""

    def __init__(self, text: str, start: str = "start", seed: int = 0) -> None:
        from grammar.cfg.terminals import build_terminal

        parser = lark_parser(text, start)
        self.start = start
        self.rng = random.Random(seed)
        self.rules: dict[str, list[list[tuple[bool, str]]]] = {}
        for r in parser.rules:
            self.rules.setdefault(r.origin.name, []).append(
                [(s.is_term, s.name) for s in r.expansion]
            )
        self.dfas: dict[str, ByteDFA] = {
            t.name: build_terminal(t.name, t.pattern, t.priority).dfa for t in parser.terminals
        }
        self.height = self._heights()
        self.dist = {n: _distance_to_accept(d) for n, d in self.dfas.items()}
        # per terminal and state: the live bytes
        self.live = {
            n: [[b for b, t in enumerate(row) if t != DEAD] for row in d.byte_table().tolist()]
            for n, d in self.dfas.items()
        }
        self.tables = {n: d.byte_table().tolist() for n, d in self.dfas.items()}

    def _heights(self) -> dict[str, int]:
        """Height of the shallowest derivation of each nonterminal."""
        inf = 1 << 30
        h = {n: inf for n in self.rules}
        changed = True
        while changed:
            changed = False
            for n, alts in self.rules.items():
                for alt in alts:
                    v = 1 + max((0 if t else h[s] for t, s in alt), default=0)
                    if v < h[n]:
                        h[n], changed = v, True
        return h

    def _alt_height(self, alt: list[tuple[bool, str]]) -> int:
        return 1 + max((0 if t else self.height[s] for t, s in alt), default=0)

    def terminals(self, max_depth: int = 8) -> list[tuple[str, str]]:
        """A random sequence of (terminal name, text)."""
        out: list[tuple[str, str]] = []
        stack: list[tuple[bool, str, int]] = [(False, self.start, 0)]
        while stack:
            is_term, name, depth = stack.pop()
            if is_term:
                out.append((name, self.terminal_text(name)))
                continue
            alts = self.rules[name]
            if depth < 2:  # start with the deepest alternatives, so sentences are not trivial
                deepest = max(self._alt_height(a) for a in alts)
                alts = [a for a in alts if self._alt_height(a) == deepest]
            elif depth >= max_depth:
                best = min(self._alt_height(a) for a in alts)
                alts = [a for a in alts if self._alt_height(a) == best]
            alt = self.rng.choice(alts)
            stack.extend((t, s, depth + 1) for t, s in reversed(alt))
        return out

    def terminal_text(self, name: str, max_len: int = 12) -> str:
        """A random string of a terminal: a DFA walk that prefers printable ASCII."""
        dfa = self.dfas[name]
        bt, dist = self.tables[name], self.dist[name]
        for _ in range(20):
            s, data = START, bytearray()
            while True:
                if dfa.accepting[s] and (len(data) >= max_len or self.rng.random() < 0.3):
                    break
                live = self.live[name][s]
                if not live:
                    break
                if len(data) >= max_len:  # head for acceptance
                    live = [b for b in live if dist[bt[s][b]] < dist[s]] or live
                ascii_live = [b for b in live if 0x20 <= b < 0x7F]
                pool = ascii_live if ascii_live and self.rng.random() < 0.95 else live
                b = self.rng.choice(pool)
                data.append(b)
                s = bt[s][b]
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                continue
        raise AssertionError(f"no UTF-8 text for terminal {name}")

    def sentence(self, max_depth: int = 8, p_space: float = 0.7) -> str:
        """Terminal texts joined by a space (probability p_space) or nothing."""
        out = ""
        for _, text in self.terminals(max_depth):
            out += (" " if out and self.rng.random() < p_space else "") + text
        return out


def _distance_to_accept(dfa: ByteDFA) -> list[int]:
    bt = dfa.byte_table()
    n = bt.shape[0]
    dist = [0 if dfa.accepting[s] else 1 << 30 for s in range(n)]
    changed = True
    while changed:
        changed = False
        for s in range(1, n):
            best = min((dist[t] for t in set(bt[s].tolist()) if t != DEAD), default=1 << 30)
            if best + 1 < dist[s]:
                dist[s], changed = best + 1, True
    return dist


def valid_sentences(name: str, n: int, seed: int = 0, max_depth: int = 8) -> list[str]:
    """n distinct random sentences that lark parses (space-separated where needed)."""
    text = grammar_text(name)
    gen = SentenceGenerator(text, seed=seed)
    out: list[str] = []
    for _ in range(n * 20):
        s = gen.sentence(max_depth=max_depth)
        if s not in out and lark_accepts(text, s):
            out.append(s)
        if len(out) == n:
            break
    return out


def corruptions(
    sentence: str, n: int, seed: int = 0, alphabet: str = "()[]{},:;\"'+-*/ 0aZ."
) -> list[str]:
    """Random one-edit corruptions: delete, insert or replace one character."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        i = rng.randrange(len(sentence) + 1)
        op = rng.choice(("delete", "insert", "replace"))
        if op == "delete" and i < len(sentence):
            out.append(sentence[:i] + sentence[i + 1 :])
        elif op == "replace" and i < len(sentence):
            out.append(sentence[:i] + rng.choice(alphabet) + sentence[i + 1 :])
        else:
            out.append(sentence[:i] + rng.choice(alphabet) + sentence[i:])
    return out


def accepts_tokens(grammar: Any, token_ids: list[int]) -> bool:
    """Every token in the packed mask and accepted by advance(), and EOS allowed at the end."""
    m = grammar.matcher()
    for t in token_ids:
        allowed = m.is_allowed(t)
        try:
            m.advance(t)
            advanced = True
        except ValueError:
            advanced = False
        assert allowed == advanced, f"mask and advance disagree on token {t}"
        if not advanced:
            return False
    eos = grammar.vocab.eos_token_ids
    return m.is_accepting() and (not eos or m.is_allowed(eos[0]))
