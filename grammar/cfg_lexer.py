"""The lexer of one parser context: the product DFA of the terminals lark's contextual lexer
would try there (the state's LALR lookaheads plus the %ignore terminals).

Lexing semantics (documented in grammar/cfg.py): maximal munch without backtracking. Bytes are
read while at least one candidate terminal can still continue; when the next byte can continue
none of them, the text read so far is one token whose terminal is the best-ranked candidate that
accepts it (lark's order: priority, literals before regexes, ...). If none accepts it, the input
is rejected.

A lexer state is a tuple of component states, numbered 0 (dead) / 1 (start) / 2.. . For each
state: `alive[s]` is the bitset of terminals that can still complete from s, `winner[s]` the
terminal a cut at s produces (-1 if none).
"""

from __future__ import annotations

import numpy as np

from grammar.cfg_terminals import TerminalSpec
from grammar.errors import GrammarError

DEAD = 0
START = 1
MAX_LEXER_STATES = 20_000


class ContextLexer:
    """Product DFA over `terminals` (global indices into `specs`)."""

    def __init__(self, specs: list[TerminalSpec], terminal_bits: int) -> None:
        self.terminal_bits = terminal_bits
        comps = [i for i in range(len(specs)) if terminal_bits >> i & 1]
        self.components = comps
        tables = [specs[i].dfa.byte_table() for i in comps]
        accepting = [specs[i].dfa.accepting for i in comps]
        ranks = [specs[i].rank for i in comps]
        k = len(comps)
        index: dict[tuple[int, ...], int] = {(0,) * k: DEAD, (1,) * k: START}
        order: list[tuple[int, ...]] = [(0,) * k, (1,) * k]
        rows: list[np.ndarray] = [np.zeros(256, dtype=np.int32)]
        i = START
        while i < len(order):
            cur = order[i]
            # next component states for all 256 bytes at once: [k, 256]
            nxt = np.stack([tables[c][cur[c]] for c in range(k)]) if k else np.zeros((0, 256))
            cols, inverse = np.unique(nxt.T, axis=0, return_inverse=True)
            ids = np.empty(len(cols), dtype=np.int32)
            for j, col in enumerate(cols):
                key = tuple(int(x) for x in col)
                if not any(key):
                    ids[j] = DEAD
                    continue
                s = index.get(key)
                if s is None:
                    s = len(order)
                    if s > MAX_LEXER_STATES:
                        raise GrammarError(
                            f"the lexer over {[specs[c].name for c in comps]} exceeds "
                            f"{MAX_LEXER_STATES} states"
                        )
                    index[key] = s
                    order.append(key)
                ids[j] = s
            rows.append(ids[inverse.reshape(-1)])
            i += 1
        self.table = np.stack(rows).astype(np.int32)  # [n_states, 256]
        self.rows: list[list[int]] = self.table.tolist()
        self.alive: list[int] = []
        self.winner: list[int] = []
        for key in order:
            bits, best, best_rank = 0, -1, None
            for c, s in enumerate(key):
                if s:
                    bits |= 1 << comps[c]
                    if accepting[c][s] and (best_rank is None or ranks[c] < best_rank):
                        best, best_rank = comps[c], ranks[c]
            self.alive.append(bits)
            self.winner.append(best)
        if self.winner[START] >= 0:
            raise GrammarError(f"terminal {specs[self.winner[START]].name} matches empty text")
        # per state, the bytes that no candidate can continue with: where a cut happens
        self.dead_bytes = self.table == DEAD  # [n_states, 256] bool

    @property
    def num_states(self) -> int:
        return self.table.shape[0]
