"""Token healing: a prompt that ends inside what the tokenizer would merge with what follows.

"The URL is http:" encodes as [..., " http", ":"], while "The URL is http://x" encodes as
[..., " http", "://", ...]. A model asked to continue the first sees a ":" token it has rarely
seen before "//" and tends to go elsewhere. Healing (`Engine.generate(token_healing=True)`)
backs the prompt off to where the merge would start and makes the first generated token(s)
spell the removed text before anything new, so the model picks "://" itself, as it would for
the unsplit text:

    1. `back_off`: the largest k <= MAX_BACKOFF whose last k prompt tokens spell a *healed
       prefix* that is a proper prefix of some vocabulary token (so the tokenizer could merge it
       with what follows). At least one prompt token stays; special tokens are never backed
       over; the prefix starts on a UTF-8 character boundary. No such k: nothing changes.
    2. `HealingMatcher`: while part of the prefix is unspelled (`rest`), a token is allowed when
       its bytes are a prefix of `rest` (it spells a piece of it) or start with `rest` and the
       request's own constraint (regex, JSON Schema, grammar...; none: anything) accepts the
       bytes after it. EOS and special tokens are not allowed then. Once spelled, the request's
       constraint alone decides (a request without one drops the wrapper: `unconstrained`).
    3. The request's text leaves the prefix out (the caller's prompt has it: `Request.heal_text`);
       its token ids include the tokens that spelled it (`max_new_tokens` counts them, as
       SGLang's programs expect: `max_tokens` bounds the tokens generated), its prompt ids are
       the backed-off ones.

The constraint therefore applies to the text after the healed prefix, whatever its kind: the
wrapper asks the inner matcher only `advance_bytes` on a copy (every matcher has both).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from grammar.errors import GrammarError
from runtime.scheduling.constrained import ConstraintState, TokenMatcher
from runtime.scheduling.request import Request

MAX_BACKOFF = 3  # prompt tokens healing may take back


class HealingTable:
    """The vocabulary's token bytes sorted, to find the tokens that start with given bytes and
    those that spell a prefix of them. Special tokens (and marker tokens) are left out: they
    never heal. Built once per vocabulary (`for_vocab`)."""

    def __init__(self, token_bytes: list[bytes | None], excluded: Iterable[int] = ()) -> None:
        skip = frozenset(excluded)
        self.size = len(token_bytes)
        self.num_words = (self.size + 31) // 32
        self._bytes = [None if i in skip else b or None for i, b in enumerate(token_bytes)]
        entries = sorted((b, i) for i, b in enumerate(self._bytes) if b)
        self._keys = [b for b, _ in entries]
        self._ids = np.array([i for _, i in entries], dtype=np.int64)
        self._lens = np.array([len(b) for b, _ in entries], dtype=np.int64)
        self._exact: dict[bytes, list[int]] = {}
        for b, i in entries:
            self._exact.setdefault(b, []).append(i)

    @classmethod
    def for_vocab(cls, vocab: Any, excluded: Iterable[int] = ()) -> HealingTable:
        """The table of a `grammar.TokenVocabulary`, kept with it (built on first use)."""
        skip = frozenset(excluded)
        build = lambda: cls([vocab.token_bytes(i) for i in range(len(vocab))], skip)  # noqa: E731
        return vocab.derived(("token_healing", skip), build)

    def token_bytes(self, token_id: int) -> bytes | None:
        """A token's bytes; None for special, marker and empty tokens (and unknown ids)."""
        return self._bytes[token_id] if 0 <= token_id < self.size else None

    def _range(self, prefix: bytes) -> tuple[int, int]:
        """Positions in the sorted keys of the tokens whose bytes start with `prefix`."""
        lo = bisect.bisect_left(self._keys, prefix)
        return lo, bisect.bisect_left(self._keys, _successor(prefix), lo)

    def starting_with(self, prefix: bytes) -> np.ndarray:
        """Ids of the tokens whose bytes start with `prefix` (itself included)."""
        lo, hi = self._range(prefix)
        return self._ids[lo:hi]

    def extending(self, prefix: bytes) -> np.ndarray:
        """Ids of the tokens whose bytes start with `prefix` and go on after it."""
        lo, hi = self._range(prefix)
        return self._ids[lo:hi][self._lens[lo:hi] > len(prefix)]

    def extends(self, prefix: bytes) -> bool:
        """Whether some token's bytes start with `prefix` and go on after it."""
        lo, hi = self._range(prefix)
        return hi - lo > len(self._exact.get(prefix, ()))

    def spelling_part_of(self, data: bytes) -> list[int]:
        """Ids of the tokens whose bytes are a non-empty prefix of `data` (`data` included)."""
        out: list[int] = []
        for n in range(1, len(data) + 1):
            out.extend(self._exact.get(data[:n], ()))
        return out


def _successor(prefix: bytes) -> bytes:
    """The smallest byte string above every string that starts with `prefix`."""
    head = prefix.rstrip(b"\xff")
    if not head:
        return b"\xff" * (len(prefix) + 256)  # above every token (tokens are shorter)
    return head[:-1] + bytes([head[-1] + 1])


@dataclass(frozen=True, slots=True)
class Healing:
    """A request's healing: the prefix its first tokens must spell, and how many prompt tokens
    were backed off to get it."""

    prefix: bytes
    backed_off: int
    table: HealingTable

    @property
    def text(self) -> str:
        return self.prefix.decode("utf-8")

    def matcher(self, inner: TokenMatcher | None) -> HealingMatcher:
        return HealingMatcher(self.table, self.prefix, inner)


def back_off(ids: list[int], table: HealingTable) -> tuple[list[int], Healing | None]:
    """The prompt ids to run and the healing of their end (None: the end is a boundary no token
    crosses, and `ids` stay as they are). See the module's step 1."""
    best: Healing | None = None
    tail = b""
    for k in range(1, min(MAX_BACKOFF, len(ids) - 1) + 1):
        data = table.token_bytes(ids[-k])
        if data is None:
            break  # a special token: nothing merges across it
        tail = data + tail
        if not _whole_characters(tail):
            continue  # starts (or, for a prompt of ids, ends) inside a UTF-8 character
        if table.extends(tail):
            best = Healing(tail, k, table)
    if best is None:
        return ids, None
    return ids[: -best.backed_off], best


def _whole_characters(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class HealingMatcher:
    """The constraint "spell `prefix`, then match `inner`" over tokens (module step 2); the
    `TokenMatcher` a healed request decodes through. Not thread-safe (one sequence's)."""

    __slots__ = ("table", "rest", "inner", "_mask")

    def __init__(self, table: HealingTable, rest: bytes, inner: TokenMatcher | None) -> None:
        self.table = table
        self.rest = rest  # the part of the prefix no token has spelled yet
        self.inner = inner
        self._mask: tuple[bytes, np.ndarray] | None = None  # (rest, its mask) while healing

    @property
    def unconstrained(self) -> bool:
        """Healed, and the request has no constraint of its own: nothing is left to enforce."""
        return not self.rest and self.inner is None

    def copy(self) -> HealingMatcher:
        inner = self.inner.copy() if self.inner is not None else None  # type: ignore[attr-defined]
        return HealingMatcher(self.table, self.rest, inner)

    def bitmask(self) -> np.ndarray:
        if not self.rest:
            if self.inner is not None:
                return self.inner.bitmask()
            return np.full(self.table.num_words, -1, dtype=np.int32)
        rest = self.rest
        if self._mask is not None and self._mask[0] == rest:
            return self._mask[1]  # the inner does not move while the prefix is spelled
        spelling = self.table.spelling_part_of(rest)
        longer = self.table.extending(rest)
        if self.inner is not None:
            longer = self._inner_accepts(longer.tolist())
        bits = np.zeros(self.table.num_words * 32, dtype=np.uint8)
        bits[np.asarray(spelling, dtype=np.int64)] = 1
        bits[np.asarray(longer, dtype=np.int64)] = 1
        mask = np.packbits(bits, bitorder="little").view(np.int32)
        self._mask = (rest, mask)
        return mask

    def _inner_accepts(self, ids: list[int]) -> list[int]:
        """The ids (tokens longer than `rest`) whose bytes after `rest` the inner constraint
        accepts from where it stands (one copy walked per distinct remainder; a first byte it
        refuses rules out the rest)."""
        cut = len(self.rest)
        refused_first: dict[int, bool] = {}
        seen: dict[bytes, bool] = {}
        out = []
        for i in ids:
            extra = self.table.token_bytes(i)[cut:]
            if extra not in seen:
                first = extra[0]
                if first not in refused_first:
                    refused_first[first] = not self._accepts(extra[:1])
                seen[extra] = not refused_first[first] and self._accepts(extra)
            if seen[extra]:
                out.append(i)
        return out

    def _accepts(self, data: bytes) -> bool:
        walk = self.inner.copy()  # type: ignore[union-attr]
        try:
            walk.advance_bytes(data)
        except GrammarError:
            return False
        return True

    def is_allowed(self, token_id: int) -> bool:
        w = self.bitmask()[token_id >> 5]
        return bool((int(w) >> (token_id & 31)) & 1)

    def advance(self, token_id: int) -> None:
        """Consume one token; GrammarError (state unchanged) if it is not allowed."""
        if not self.rest:
            if self.inner is not None:
                self.inner.advance(token_id)
            return
        data = self.table.token_bytes(token_id)
        if data is None:
            raise GrammarError(f"token {token_id} is special: the healed prefix {self.rest!r} "
                               "is not spelled yet")  # fmt: skip
        self.advance_bytes(data)

    def advance_bytes(self, data: bytes) -> None:
        """Consume bytes: first what is left of the prefix, the rest through the inner."""
        rest = self.rest
        if not rest:
            if self.inner is not None:
                self.inner.advance_bytes(data)
            return
        if rest.startswith(data):
            self.rest = rest[len(data) :]
            return
        if not data.startswith(rest):
            raise GrammarError(f"bytes {data[:80]!r} do not spell the healed prefix {rest!r}")
        if self.inner is not None:
            self.inner.advance_bytes(data[len(rest) :])  # raises before anything changed
        self.rest = b""

    def forced_bytes(self) -> bytes:
        # the prefix is never jumped over: which token spells it is the model's choice
        if self.rest or self.inner is None:
            return b""
        return self.inner.forced_bytes()

    def is_dead(self) -> bool:
        if self.rest:
            return False
        return self.inner.is_dead() if self.inner is not None else False

    def is_accepting(self) -> bool:
        if self.rest:
            return False
        return self.inner.is_accepting() if self.inner is not None else True


def attach(req: Request, healing: Healing, vocab: Any) -> None:
    """Make `req` heal: its constraint (attached first, if any) gets wrapped when it is ready;
    a request without one gets a constraint that is only the healing (no compile)."""
    req.heal_text = healing.text
    if req.constraint is None:
        ready: Future = Future()
        ready.set_result((None, vocab, 0.0))
        req.constraint = ConstraintState(ready, jump_forward=False, healing=healing)
    else:
        req.constraint.healing = healing  # type: ignore[attr-defined]
