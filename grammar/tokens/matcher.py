"""Matcher: the per-sequence cursor over a compiled constraint."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from grammar.automata.fsm import DEAD, START, ByteDFA
from grammar.automata.lazy_dfa import LazyDFA
from grammar.errors import GrammarError
from grammar.tokens.index import TokenIndex
from grammar.tokens.vocab import TokenVocabulary


class CompiledGrammar(Protocol):
    """What a cursor asks of its compiled constraint (`compiled.CompiledGrammar` is one)."""

    dfa: ByteDFA | LazyDFA
    vocab: TokenVocabulary
    index: TokenIndex
    eos_token_ids: frozenset[int]

    def jump_forward(self, state: int) -> tuple[bytes, int]: ...


def complete_utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` made of whole UTF-8 characters, decoded."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:  # e.start: the first byte that does not decode
        return data[: e.start].decode("utf-8")


class PackedMaskViews:
    """`mask()`, `fill_bitmask()`, `is_allowed()` and `forced_text()` over a matcher's packed
    `bitmask()` and `forced_bytes()`; shared by the regex `Matcher` and the lark `CFGMatcher`."""

    __slots__ = ()

    def bitmask(self) -> np.ndarray:
        raise NotImplementedError

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Copy the packed mask (int32 words, bit b of word w = token 32*w+b) into `out`."""
        np.copyto(np.asarray(out), self.bitmask(), casting="unsafe")

    def mask(self) -> np.ndarray:
        """Bool array of len(vocab): the token ids allowed now (EOS when accepting)."""
        bits = np.unpackbits(self.bitmask().view(np.uint8), bitorder="little")
        return bits[: len(self.grammar.vocab)].astype(bool)

    def forced_bytes(self) -> bytes:
        raise NotImplementedError

    def forced_text(self) -> str:
        """`forced_bytes()` as text: whole UTF-8 characters only (bytes that finish a
        character the last token split are left out, as is a character cut at the end)."""
        data = self.forced_bytes()
        head = 0
        while head < min(3, len(data)) and 0x80 <= data[head] < 0xC0:
            head += 1
        return complete_utf8_prefix(data[head:])

    def is_allowed(self, token_id: int) -> bool:
        w = self.bitmask()[token_id >> 5]
        return bool((int(w) >> (token_id & 31)) & 1)


class Matcher(PackedMaskViews):
    """One sequence's position in a constraint. Cheap to create and to copy; not thread-safe
    (one sequence is advanced by one thread), while its grammar is shared."""

    __slots__ = ("grammar", "_state", "_ended")

    def __init__(self, grammar: CompiledGrammar, state: int = START, ended: bool = False) -> None:
        self.grammar = grammar
        self._state = state
        self._ended = ended

    @property
    def state(self) -> int:
        return self._state

    def copy(self) -> Matcher:
        return Matcher(self.grammar, self._state, self._ended)

    def bitmask(self) -> np.ndarray:
        """The shared packed mask of the current state (read-only)."""
        if self._ended:
            return np.zeros(self.grammar.index.num_words, dtype=np.int32)
        return self.grammar.index.bitmask(self._state)

    def advance(self, token_id: int) -> None:
        """Consume one token; GrammarError (state unchanged) if the mask forbids it."""
        g = self.grammar
        if self._ended:
            raise GrammarError("the constraint already ended (EOS was consumed)")
        if token_id in g.eos_token_ids:
            if not g.dfa.accepting[self._state]:
                raise GrammarError(f"EOS token {token_id} not allowed: the match is incomplete")
            self._ended = True
            return
        if not 0 <= token_id < len(g.vocab):
            raise GrammarError(f"token id {token_id} outside the vocabulary")
        data = g.vocab.token_bytes(token_id)
        if not data:
            raise GrammarError(f"token {token_id} is special or empty: never allowed")
        nxt = g.dfa.walk(self._state, data)
        if nxt == DEAD:
            raise GrammarError(f"token {token_id} ({data!r}) is not allowed here")
        self._state = nxt

    def advance_bytes(self, data: bytes) -> None:
        """Consume raw bytes (e.g. forced text); GrammarError (state unchanged) if forbidden."""
        if self._ended and data:
            raise GrammarError("the constraint already ended (EOS was consumed)")
        nxt = self.grammar.dfa.walk(self._state, data)
        if nxt == DEAD:
            raise GrammarError(f"bytes {data[:80]!r} are not allowed here")
        self._state = nxt

    def is_accepting(self) -> bool:
        """The text so far is a complete match."""
        return bool(self.grammar.dfa.accepting[self._state])

    def is_dead(self) -> bool:
        """Nothing more can follow: EOS was consumed, or the match is complete and cannot grow
        (only EOS is allowed). The engine should stop the sequence."""
        return self._ended or not self.grammar.dfa.can_continue(self._state)

    def forced_bytes(self) -> bytes:
        """The longest byte string every valid continuation starts with (b"" if none)."""
        if self._ended:
            return b""
        return self.grammar.jump_forward(self._state)[0]
