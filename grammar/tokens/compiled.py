"""A compiled constraint: byte DFA (usually a LazyDFA) + token index + the compressed DFA for
jump-forward."""

from __future__ import annotations

import threading

from grammar.automata.fsm import START, ByteDFA
from grammar.automata.lazy_dfa import LazyDFA
from grammar.tokens.index import TokenIndex
from grammar.tokens.matcher import DFAMatcher
from grammar.tokens.vocab import TokenVocabulary


class CompiledGrammar:
    """Immutable once built, except for caches that are filled lazily under a lock.

    Safe to share between threads; each sequence gets its own `matcher()`.
    """

    def __init__(self, dfa: ByteDFA | LazyDFA, vocab: TokenVocabulary, source: str) -> None:
        self.dfa = dfa
        self.vocab = vocab
        self.source = source
        self.index = TokenIndex(dfa, vocab)
        self._forced: dict[int, tuple[bytes, int]] = {}
        self._lock = threading.Lock()
        self.eos_token_ids = frozenset(vocab.eos_token_ids)

    @property
    def start_state(self) -> int:
        return START

    @property
    def admits_nothing(self) -> bool:
        """No text satisfies the constraint: the start is not accepting and every byte leads
        to DEAD (a schema with no instance). A lazy DFA is never empty (its pieces all match)."""
        d = self.dfa
        return not d.lazy and not d.accepting[START] and not d.table[START].any()

    def portable(self) -> tuple:
        """What another process needs to rebuild this constraint around its own copy of the
        vocabulary (`from_portable`): the automaton, the masks and forced texts built so far."""
        return self.dfa, self.source, dict(self.index._masks), dict(self._forced)

    @classmethod
    def from_portable(cls, state: tuple, vocab: TokenVocabulary) -> CompiledGrammar:
        dfa, source, masks, forced = state
        out = cls(dfa, vocab, source)
        out.index._masks.update(masks)
        out._forced.update(forced)
        return out

    def matcher(self) -> DFAMatcher:
        return DFAMatcher(self)

    def jump_forward(self, state: int) -> tuple[bytes, int]:
        """The compressed DFA: the longest byte string every continuation from `state` starts
        with, and the state after it (chains of single-successor states joined, cached)."""
        hit = self._forced.get(state)
        if hit is not None:
            return hit
        out = bytearray()
        s = state
        step, forced = self.dfa.step, self.dfa.forced_byte
        b = forced(s)
        while b >= 0 and len(out) <= self.dfa.num_states:
            out.append(b)
            s = step(s, b)
            b = forced(s)
        result = (bytes(out), s)
        with self._lock:
            self._forced[state] = result
        return result
