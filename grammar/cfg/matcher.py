"""CFGMatcher: one sequence's cursor over a compiled lark grammar (a `MatcherBase`)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from grammar.cfg.mask import VocabLayout
from grammar.cfg.parser import StackNode
from grammar.tokens.matcher import MatcherBase
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


class CFGMatcher(MatcherBase):
    """One sequence's position in a lark grammar (a `grammar.Matcher`: `MatcherBase` with an
    LR stack and a lexer state). Cheap to create and to copy; not thread-safe."""

    __slots__ = ("_node", "_q")
    _whole = "sentence"

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

    def _step(self, data: bytes) -> bool:
        nxt = self.grammar.walk(self._node, self._q, data)
        if nxt is None:
            return False
        self._node, self._q = nxt
        return True

    def _live_bitmask(self) -> np.ndarray:
        return self.grammar.bitmask(self._node, self._q)

    def _empty_bitmask(self) -> np.ndarray:
        return self.grammar.layout.empty

    def _forced(self) -> bytes:
        return self.grammar.forced(self._node, self._q)

    def _cannot_grow(self) -> bool:
        return self.is_accepting() and not self.grammar.allowed_bytes(self._node, self._q)

    def is_accepting(self) -> bool:
        """The text so far is a sentence of the grammar."""
        return self.grammar.is_accepting(self._node, self._q)
