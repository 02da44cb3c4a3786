"""CFGMatcher: one sequence's cursor over a compiled lark grammar (the `Matcher` interface)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from grammar.cfg.mask import VocabLayout
from grammar.cfg.parser import StackNode
from grammar.errors import GrammarError
from grammar.tokens.matcher import PackedMaskViews
from grammar.tokens.vocab import TokenVocabulary

Position = tuple[StackNode, int]  # (LR stack, lexer state)


class ParsedGrammar(Protocol):
    """What a cursor asks of its compiled grammar (`compiler.CompiledCFG` is one)."""

    vocab: TokenVocabulary
    eos_token_ids: frozenset[int]
    layout: VocabLayout

    def bitmask(self, node: StackNode, q: int) -> np.ndarray: ...

    def walk(self, node: StackNode, q: int, data: bytes) -> Position | None: ...

    def is_accepting(self, node: StackNode, q: int) -> bool: ...

    def allowed_bytes(self, node: StackNode, q: int) -> list[int]: ...

    def forced(self, node: StackNode, q: int) -> bytes: ...


class CFGMatcher(PackedMaskViews):
    """One sequence's position in a lark grammar; the interface of `grammar.tokens.matcher.Matcher`.
    Cheap to create and to copy; not thread-safe (one sequence, one thread)."""

    __slots__ = ("grammar", "_node", "_q", "_ended")

    def __init__(
        self, grammar: ParsedGrammar, node: StackNode, q: int, ended: bool = False
    ) -> None:
        self.grammar = grammar
        self._node = node
        self._q = q
        self._ended = ended

    @property
    def state(self) -> tuple[tuple[int, ...], int]:
        """(LR state stack, lexer state): for debugging and tests."""
        return tuple(self._node.states()), self._q

    def copy(self) -> CFGMatcher:
        return CFGMatcher(self.grammar, self._node, self._q, self._ended)

    def bitmask(self) -> np.ndarray:
        """The shared packed mask of the current state (read-only)."""
        if self._ended:
            return self.grammar.layout.empty
        return self.grammar.bitmask(self._node, self._q)

    def advance(self, token_id: int) -> None:
        """Consume one token; GrammarError (state unchanged) if the grammar forbids it."""
        g = self.grammar
        if self._ended:
            raise GrammarError("the constraint already ended (EOS was consumed)")
        if token_id in g.eos_token_ids:
            if not self.is_accepting():
                raise GrammarError(f"EOS token {token_id} not allowed: the sentence is incomplete")
            self._ended = True
            return
        if not 0 <= token_id < len(g.vocab):
            raise GrammarError(f"token id {token_id} outside the vocabulary")
        data = g.vocab.token_bytes(token_id)
        if not data:
            raise GrammarError(f"token {token_id} is special or empty: never allowed")
        nxt = g.walk(self._node, self._q, data)
        if nxt is None:
            raise GrammarError(f"token {token_id} ({data!r}) is not allowed here")
        self._node, self._q = nxt

    def advance_bytes(self, data: bytes) -> None:
        """Consume raw bytes (e.g. forced text); GrammarError (state unchanged) if forbidden."""
        if self._ended and data:
            raise GrammarError("the constraint already ended (EOS was consumed)")
        if not data:
            return
        nxt = self.grammar.walk(self._node, self._q, data)
        if nxt is None:
            raise GrammarError(f"bytes {data[:80]!r} are not allowed here")
        self._node, self._q = nxt

    def is_accepting(self) -> bool:
        """The text so far is a sentence of the grammar."""
        return self.grammar.is_accepting(self._node, self._q)

    def is_dead(self) -> bool:
        """EOS was consumed, or the sentence is complete and no byte can extend it."""
        if self._ended:
            return True
        return self.is_accepting() and not self.grammar.allowed_bytes(self._node, self._q)

    def forced_bytes(self) -> bytes:
        """The longest byte string every valid continuation starts with (b"" if none)."""
        if self._ended:
            return b""
        return self.grammar.forced(self._node, self._q)
