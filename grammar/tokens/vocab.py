"""TokenVocabulary: every token id to its exact bytes, EOS and special ids kept apart."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grammar.errors import GrammarError

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPIECE_SPACE = "\u2581"
_MAX_DERIVED = 256
_MISSING = object()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


@dataclass(slots=True, frozen=True)
class PreparedTokens:
    """Distinct non-empty token byte strings, longest first, laid out for lockstep DFA walks.

    columns: uint8 [L, U]; columns[p] holds byte p of every token (row order = longest first,
    zero past a token's end), so the tokens still walking at position p are exactly the first
    n_longer[p] rows. id_to_unique: int32 [V], the row of each id, or U (a row that is never
    allowed) for special / empty tokens.
    """

    columns: np.ndarray
    n_longer: np.ndarray
    id_to_unique: np.ndarray
    ascii_bits: np.ndarray  # uint64 [2, U]: which ASCII bytes each token contains
    non_ascii: np.ndarray  # bool [U]: the token has a byte >= 0x80
    whole_chars: np.ndarray  # bool [U]: the token is valid UTF-8 (no split character)
    # rows by first byte: by_first[first_start[b] : first_start[b + 1]] (ascending rows)
    by_first: np.ndarray
    first_start: np.ndarray
    # ids by row: row_ids[row_start[r] : row_start[r + 1]] (several ids may share bytes)
    row_ids: np.ndarray
    row_start: np.ndarray
    lengths: np.ndarray  # int64 [U]: bytes per row

    @property
    def num_rows(self) -> int:
        return int(self.columns.shape[1])


class TokenVocabulary:
    """Token id -> bytes. ``None`` bytes mark ids that a constraint never allows (specials)."""

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        eos_token_ids: Iterable[int],
        special_token_ids: Iterable[int] = (),
        token_names: Mapping[str, int] | None = None,
    ) -> None:
        self._bytes: list[bytes | None] = list(token_bytes)
        # added / special tokens by their text, for grammars that name a token (`<|im_end|>`)
        self.token_names: dict[str, int] = dict(token_names or {})
        self.eos_token_ids: tuple[int, ...] = tuple(sorted(set(eos_token_ids)))
        specials = set(special_token_ids) | set(self.eos_token_ids)
        for i in specials:
            if 0 <= i < len(self._bytes):
                self._bytes[i] = None
        self.special_token_ids: frozenset[int] = frozenset(specials)
        if any(not 0 <= i < len(self._bytes) for i in self.eos_token_ids):
            raise GrammarError(f"EOS ids {self.eos_token_ids} outside the vocabulary")
        h = hashlib.sha256()
        h.update(json.dumps(self.eos_token_ids).encode())
        for b in self._bytes:
            h.update(b"\xff\x00" if b is None else len(b).to_bytes(2, "little") + b)
        if self.token_names:
            h.update(json.dumps(sorted(self.token_names.items())).encode())
        self.hash: str = h.hexdigest()
        self._prepared: PreparedTokens | None = None
        self._single_ids: tuple[np.ndarray, np.ndarray] | None = None  # see ids_of_rows
        self._lock = threading.Lock()
        self._derived: dict[tuple, Any] = {}  # per-vocabulary token sets (see `derived`)

    def __len__(self) -> int:
        return len(self._bytes)

    def __repr__(self) -> str:
        return f"TokenVocabulary({len(self)} ids, eos={self.eos_token_ids}, hash={self.hash[:12]})"

    def token_bytes(self, token_id: int) -> bytes | None:
        """The exact bytes of a token, or None for special tokens."""
        return self._bytes[token_id]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenVocabulary:
        """From a `transformers` tokenizer (byte-level BPE or SentencePiece-style)."""
        size = len(tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
        byte_level = _is_byte_level(tokenizer)
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        specials = set(getattr(tokenizer, "all_special_ids", []) or [])
        specials |= {i for i, t in added.items() if getattr(t, "special", False)}
        out: list[bytes | None] = []
        for i, piece in enumerate(pieces):
            if piece is None or i in specials:
                out.append(None)
            elif i in added:
                out.append(str(added[i].content).encode("utf-8"))
            elif byte_level:
                out.append(_byte_level_bytes(piece))
            else:
                out.append(_sentencepiece_bytes(piece))
        eos = tokenizer.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        names = {str(t.content): i for i, t in added.items() if i < size}
        for text in getattr(tokenizer, "all_special_tokens", []) or []:
            i = tokenizer.convert_tokens_to_ids(text)
            if isinstance(i, int) and 0 <= i < size:
                names.setdefault(text, i)
        return cls(out, eos_ids, specials, names)

    def prepared(self) -> PreparedTokens:
        """The token layout used by every mask computation (built once, thread-safe)."""
        if self._prepared is None:
            with self._lock:
                if self._prepared is None:
                    self._prepared = self._prepare()
        return self._prepared

    def derived(self, key: tuple, build: Callable[[], Any]) -> Any:
        """A token set that depends on the vocabulary and `key` only (never on a constraint),
        built once and kept: e.g. the tokens that stay inside a JSON string. Bounded."""
        hit = self._derived.get(key, _MISSING)
        if hit is _MISSING:
            hit = build()
            with self._lock:
                if len(self._derived) >= _MAX_DERIVED:
                    self._derived.pop(next(iter(self._derived)))
                hit = self._derived.setdefault(key, hit)
        return hit

    def ids_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Every token id whose bytes are one of the prepared `rows` (int64)."""
        prep = self.prepared()
        single = self._single_ids
        if single is None:  # each row's first id, and which rows have more than one
            counts = np.diff(prep.row_start)
            # (-1 past the end: the last row, of ids with no bytes, may hold none)
            padded = np.append(prep.row_ids, np.int64(-1))
            single = (padded[prep.row_start[:-1]], counts > 1)
            self._single_ids = single
        first, multi = single
        if not multi[rows].any():  # (all but a vocabulary's duplicate byte strings)
            return first[rows]
        return csr_take(prep.row_start, prep.row_ids, rows)

    def _prepare(self) -> PreparedTokens:
        distinct = sorted({b for b in self._bytes if b}, key=lambda b: (-len(b), b))
        row_of = {b: r for r, b in enumerate(distinct)}
        u = len(distinct)
        columns, n_longer, lengths = byte_columns(distinct)
        width = columns.shape[0]
        id_to_unique = np.array([row_of[b] if b else u for b in self._bytes], dtype=np.int32)
        ascii_bits = np.zeros((2, u), dtype=np.uint64)
        non_ascii = np.zeros(u, dtype=bool)
        for p in range(width):
            col = columns[p][: n_longer[p]].astype(np.uint64)
            low, high = col < 64, (col >= 64) & (col < 128)
            one = np.uint64(1)
            ascii_bits[0, : n_longer[p]] |= np.where(low, one << (col & np.uint64(63)), 0)
            ascii_bits[1, : n_longer[p]] |= np.where(high, one << (col & np.uint64(63)), 0)
            non_ascii[: n_longer[p]] |= col >= 128
        whole_chars = np.array([_is_utf8(b) for b in distinct], dtype=bool)
        by_first = np.argsort(columns[0], kind="stable").astype(np.int64)
        first_start = np.searchsorted(columns[0][by_first], np.arange(257)).astype(np.int64)
        row_ids = np.argsort(id_to_unique, kind="stable").astype(np.int64)
        row_start = np.searchsorted(id_to_unique[row_ids], np.arange(u + 2)).astype(np.int64)
        return PreparedTokens(
            columns,
            n_longer,
            id_to_unique,
            ascii_bits,
            non_ascii,
            whole_chars,
            by_first,
            first_start,
            row_ids,
            row_start,
            lengths,
        )


def byte_columns(strings: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte strings sorted longest first, laid out for lockstep walks: uint8 columns [L, n]
    (column p holds byte p of each string, zero past its end), n_longer [L + 1] (the strings
    longer than p are the first n_longer[p]), lengths [n]."""
    width = max((len(b) for b in strings), default=1)
    flat = np.frombuffer(b"".join(b.ljust(width, b"\0") for b in strings), dtype=np.uint8)
    columns = np.ascontiguousarray(flat.reshape(len(strings), width).T)
    lengths = np.array([len(b) for b in strings], dtype=np.int64)
    n_longer = np.array([int(np.count_nonzero(lengths > p)) for p in range(width + 1)])
    return columns, n_longer, lengths


def csr_take(start: np.ndarray, values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """values[start[k] : start[k + 1]] for every k in `keys`, concatenated (vectorised)."""
    starts = start[keys]
    counts = start[keys + 1] - starts
    if not keys.size or int(counts.max()) == 1:
        return values[starts]
    ends = np.cumsum(counts)
    offsets = np.repeat(starts - (ends - counts), counts) + np.arange(int(ends[-1]))
    return values[offsets]


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # each part's own JSON (not the whole tokenizer's: for a 262k vocabulary that string
        # and its parse are ~200 MB held for a moment)
        parts = (backend.decoder, backend.pre_tokenizer)
        return any(p is not None and b"ByteLevel" in p.__getstate__() for p in parts)
    return False


def _byte_level_bytes(piece: str) -> bytes:
    try:
        return bytes(_UNICODE_TO_BYTE[c] for c in piece)
    except KeyError:  # not a byte-level piece (e.g. an added token): its text is literal
        return piece.encode("utf-8")


def _sentencepiece_bytes(piece: str) -> bytes:
    m = _BYTE_TOKEN.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace(_SPIECE_SPACE, " ").encode("utf-8")
