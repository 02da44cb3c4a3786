"""A compiled constraint: byte DFA + token index + the compressed DFA for jump-forward."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from grammar.fsm import START, ByteDFA
from grammar.index import TokenIndex
from grammar.vocab import TokenVocabulary

if TYPE_CHECKING:
    from grammar.matcher import Matcher


class CompiledGrammar:
    """Immutable once built, except for caches that are filled lazily under a lock.

    Safe to share between threads; each sequence gets its own `matcher()`.
    """

    def __init__(self, dfa: ByteDFA, vocab: TokenVocabulary, source: str) -> None:
        self.dfa = dfa
        self.vocab = vocab
        self.source = source
        self.index = TokenIndex(dfa, vocab)
        # live bytes per state, from the class table (a class of k bytes counts k times)
        table = dfa.table
        sizes = np.bincount(dfa.byte_to_class, minlength=table.shape[1])
        first_byte = np.zeros(table.shape[1], dtype=np.int64)
        first_byte[dfa.byte_to_class[::-1]] = np.arange(255, -1, -1)
        n_live = np.zeros(table.shape[0], dtype=np.int64)
        only_cls = np.zeros(table.shape[0], dtype=np.int64)
        for c in range(table.shape[1]):
            live_c = table[:, c] != 0
            n_live += live_c * int(sizes[c])
            only_cls[live_c] = c
        self.can_continue: list[bool] = (n_live > 0).tolist()
        # the one byte a state forces (-1 if none): exactly one live byte and not accepting
        only = np.where((n_live == 1) & ~dfa.accepting, first_byte[only_cls], -1)
        self._forced_byte: list[int] = only.tolist()
        self._forced: dict[int, tuple[bytes, int]] = {}
        self._lock = threading.Lock()
        self.eos_token_ids = frozenset(vocab.eos_token_ids)

    @property
    def start_state(self) -> int:
        return START

    def matcher(self) -> Matcher:
        from grammar.matcher import Matcher

        return Matcher(self)

    def jump_forward(self, state: int) -> tuple[bytes, int]:
        """The compressed DFA: the longest byte string every continuation from `state` starts
        with, and the state after it (chains of single-successor states joined, cached)."""
        hit = self._forced.get(state)
        if hit is not None:
            return hit
        out = bytearray()
        s = state
        step, fb = self.dfa.step, self._forced_byte
        while fb[s] >= 0 and len(out) <= self.dfa.num_states:
            out.append(fb[s])
            s = step(s, fb[s])
        result = (bytes(out), s)
        with self._lock:
            self._forced[state] = result
        return result
