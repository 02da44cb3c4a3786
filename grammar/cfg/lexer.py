"""The lexer of one parser context: the product DFA of the terminals lark's contextual lexer
would try there (the state's LALR lookaheads plus the %ignore terminals).

Lexing semantics (see grammar/cfg/compiler.py): maximal munch without backtracking. Bytes
are read while at least one candidate terminal can still continue; when the next byte can
continue none of them, the text read so far is one token whose terminal is the best-ranked
candidate that accepts it (lark's order: priority, literals before regexes, ...). If none
accepts it, the input is rejected.

A lexer state is a tuple of component states, numbered 0 (dead) / 1 (start) / 2.. . For each
state: `alive[s]` is the bitset of terminals that can still complete from s, `winner[s]` the
terminal a cut at s produces (-1 if none).
"""

from __future__ import annotations

import numpy as np

from grammar.cfg.terminals import TerminalSpec
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
        dfas = {t: specs[t].dfa for t in comps}
        # joint byte classes: bytes that every component treats alike
        joint = np.stack([dfas[t].byte_to_class for t in comps], axis=1) if comps else None
        if joint is None:
            reps, byte_class = np.zeros(1, dtype=np.int64), np.zeros(256, dtype=np.int64)
        else:
            _, reps, byte_class = np.unique(joint, axis=0, return_index=True, return_inverse=True)
        byte_class = byte_class.reshape(-1)
        cls_of = {t: [dfas[t].classes[int(b)] for b in reps] for t in comps}
        # a state is its signature: the live components and their states (dead ones dropped)
        start_sig = tuple((t, 1) for t in comps)
        index: dict[tuple, int] = {(): DEAD}
        if start_sig:  # with no candidate (only the end may follow) START leads nowhere
            index[start_sig] = START
        order: list[tuple] = [(), start_sig]
        class_rows: list[list[int]] = [[DEAD] * len(reps)]
        i = START
        while i < len(order):
            sig = order[i]
            row = []
            for c in range(len(reps)):
                nxt = []
                for t, st in sig:
                    n = dfas[t].rows[st][cls_of[t][c]]
                    if n:
                        nxt.append((t, n))
                key = tuple(nxt)
                j = index.get(key)
                if j is None:
                    j = len(order)
                    if j > MAX_LEXER_STATES:
                        raise GrammarError(
                            f"the lexer over {[specs[t].name for t in comps]} exceeds "
                            f"{MAX_LEXER_STATES} states"
                        )
                    index[key] = j
                    order.append(key)
                row.append(j)
            class_rows.append(row)
            i += 1
        # [n_states, 256], C order (the C walk reads it flat)
        self.table = np.ascontiguousarray(np.array(class_rows, dtype=np.int32)[:, byte_class])
        self.rows: list[list[int]] = self.table.tolist()
        # what the future of a state depends on: its live components (terminal, state); two
        # states of different lexers with the same signature read every text the same way
        self.signature: list[tuple[tuple[int, int], ...]] = order
        self.alive: list[int] = []
        self.winner: list[int] = []
        for sig in order:
            bits, best, best_rank = 0, -1, None
            for t, st in sig:
                bits |= 1 << t
                if dfas[t].accepting[st] and (best_rank is None or specs[t].rank < best_rank):
                    best, best_rank = t, specs[t].rank
            self.alive.append(bits)
            self.winner.append(best)
        if self.winner[START] >= 0:
            raise GrammarError(f"terminal {specs[self.winner[START]].name} matches empty text")
        # per state, the bytes that no candidate can continue with: where a cut happens
        self.dead_bytes = self.table == DEAD  # [n_states, 256] bool
        self.winner_arr = np.array(self.winner, dtype=np.int64)
        self.winner32 = self.winner_arr.astype(np.int32)
        self._groups: tuple[np.ndarray, list[int]] | None = None

    def alive_groups(self) -> tuple[np.ndarray, list[int]]:
        """(group of each state, int32; the alive bitset of each group): states grouped by
        which terminals are still alive there."""
        if self._groups is None:
            ids: dict[int, int] = {}
            group = np.array([ids.setdefault(a, len(ids)) for a in self.alive], dtype=np.int32)
            self._groups = (group, list(ids))
        return self._groups

    @property
    def num_states(self) -> int:
        return self.table.shape[0]
