"""The per-sequence cursor over a compiled constraint: the `Matcher` protocol, `MatcherBase`
(the checks and the `advance` every matcher shares) and `DFAMatcher` (regular constraints);
`grammar.cfg.matcher.CFGMatcher` and `grammar.ebnf.compiler.EBNFMatcher` derive from the base."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from grammar.automata.fsm import DEAD, START, ByteDFA
from grammar.automata.lazy_dfa import LazyDFA
from grammar.errors import GrammarError
from grammar.tokens.index import TokenIndex
from grammar.tokens.vocab import TokenVocabulary


class DFAGrammar(Protocol):
    """What a `DFAMatcher` asks of its compiled constraint (`compiled.CompiledGrammar`)."""

    dfa: ByteDFA | LazyDFA
    vocab: TokenVocabulary
    index: TokenIndex
    eos_token_ids: frozenset[int]

    def jump_forward(self, state: int) -> tuple[bytes, int]: ...


class Matcher(Protocol):
    """One sequence's cursor over a compiled constraint: what decoding, speculation and the
    tests ask of every matcher (regex / JSON Schema, lark, GBNF and structural tags, tool
    calls; token healing's wrapper too). `MatcherBase` implements it for the compiled kinds."""

    def bitmask(self) -> np.ndarray: ...

    def is_allowed(self, token_id: int) -> bool: ...

    def advance(self, token_id: int) -> None: ...

    def advance_bytes(self, data: bytes) -> None: ...

    def forced_bytes(self) -> bytes: ...

    def is_accepting(self) -> bool: ...

    def is_dead(self) -> bool: ...

    def copy(self) -> Matcher: ...


def complete_utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` made of whole UTF-8 characters, decoded."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:  # e.start: the first byte that does not decode
        return data[: e.start].decode("utf-8")


class MatcherBase:
    """The `Matcher` every compiled constraint hands out: the EOS, special-token and range
    checks and the shared `advance` / `advance_bytes`, plus the views over a packed mask
    (`mask`, `fill_bitmask`, `is_allowed`, `forced_text`). A subclass keeps its position
    (a DFA state, an LR stack and lexer state, an Earley set) and supplies `_step` (move past
    some bytes; False, unmoved, when they are not allowed), `_live_bitmask`, `_empty_bitmask`,
    `_forced`, `is_accepting` and `_cannot_grow`; `_take_token` lets a grammar read a token by
    id (GBNF token terminals, where `_by_id`) and `_record` keep a history (called at EOS;
    `_step` records its own moves).
    Not thread-safe (one sequence, one thread); the compiled grammar is shared."""

    __slots__ = ("grammar", "_ended")
    _whole = "match"  # what an EOS before acceptance leaves incomplete, in its error
    _by_id = False  # whether `_take_token` may consume a token before its bytes are walked

    grammar: Any

    # ---- what a subclass supplies -------------------------------------------------------------
    def _step(self, data: bytes) -> bool:
        raise NotImplementedError

    def _live_bitmask(self) -> np.ndarray:
        raise NotImplementedError

    def _empty_bitmask(self) -> np.ndarray:
        raise NotImplementedError

    def _forced(self) -> bytes:
        raise NotImplementedError

    def _cannot_grow(self) -> bool:
        raise NotImplementedError

    def is_accepting(self) -> bool:
        raise NotImplementedError

    def _take_token(self, token_id: int) -> bool:
        """Consume a token the grammar reads by id (True), else leave it to the byte walk."""
        return False

    def _record(self) -> None:
        """Called before EOS ends the matcher (a history for rollback)."""

    # ---- the shared part ----------------------------------------------------------------------
    def advance(self, token_id: int) -> None:
        """Consume one token; GrammarError (state unchanged) if the constraint forbids it."""
        g = self.grammar
        if self._ended:
            raise GrammarError("the constraint already ended (EOS was consumed)")
        if self._by_id and self._take_token(token_id):
            return
        if token_id in g.eos_token_ids:
            if not self.is_accepting():
                raise GrammarError(
                    f"EOS token {token_id} not allowed: the {self._whole} is incomplete"
                )
            self._record()
            self._ended = True
            return
        if not 0 <= token_id < len(g.vocab):
            raise GrammarError(f"token id {token_id} outside the vocabulary")
        data = g.vocab.token_bytes(token_id)
        if not data:
            raise GrammarError(f"token {token_id} is special or empty: never allowed")
        if not self._step(data):
            raise GrammarError(f"token {token_id} ({data!r}) is not allowed here")

    def advance_bytes(self, data: bytes) -> None:
        """Consume raw bytes (e.g. forced text); GrammarError (state unchanged) if forbidden."""
        if self._ended and data:
            raise GrammarError("the constraint already ended (EOS was consumed)")
        if not data:
            return
        if not self._step(data):
            raise GrammarError(f"bytes {data[:80]!r} are not allowed here")

    def is_dead(self) -> bool:
        """Nothing more can follow: EOS was consumed, or the text is complete and cannot grow
        (only EOS is allowed). The engine should stop the sequence."""
        return self._ended or self._cannot_grow()

    def bitmask(self) -> np.ndarray:
        """The shared packed mask of the current state (read-only): int32 words, bit b of
        word w = token 32*w+b, EOS set where the text is complete."""
        if self._ended:
            return self._empty_bitmask()
        return self._live_bitmask()

    def forced_bytes(self) -> bytes:
        """The longest byte string every valid continuation starts with (b"" if none)."""
        if self._ended:
            return b""
        return self._forced()

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Copy the packed mask (int32 words, bit b of word w = token 32*w+b) into `out`."""
        np.copyto(np.asarray(out), self.bitmask(), casting="unsafe")

    def mask(self) -> np.ndarray:
        """Bool array of len(vocab): the token ids allowed now (EOS when accepting)."""
        bits = np.unpackbits(self.bitmask().view(np.uint8), bitorder="little")
        return bits[: len(self.grammar.vocab)].astype(bool)

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


class DFAMatcher(MatcherBase):
    """One sequence's position in a regular constraint (regex, JSON Schema, choices, a
    regular GBNF grammar or structural tag): a state of its byte DFA. Cheap to copy."""

    __slots__ = ("_state",)

    def __init__(self, grammar: DFAGrammar, state: int = START, ended: bool = False) -> None:
        self.grammar = grammar
        self._state = state
        self._ended = ended

    @property
    def state(self) -> int:
        return self._state

    def copy(self) -> DFAMatcher:
        return DFAMatcher(self.grammar, self._state, self._ended)

    def _step(self, data: bytes) -> bool:
        nxt = self.grammar.dfa.walk(self._state, data)
        if nxt == DEAD:
            return False
        self._state = nxt
        return True

    def _live_bitmask(self) -> np.ndarray:
        return self.grammar.index.bitmask(self._state)

    def _empty_bitmask(self) -> np.ndarray:
        return np.zeros(self.grammar.index.num_words, dtype=np.int32)

    def _forced(self) -> bytes:
        return self.grammar.jump_forward(self._state)[0]

    def _cannot_grow(self) -> bool:
        return not self.grammar.dfa.can_continue(self._state)

    def is_accepting(self) -> bool:
        """The text so far is a complete match."""
        return bool(self.grammar.dfa.accepting[self._state])
