"""Code-point ranges to UTF-8 byte-range sequences (so a DFA over bytes can match characters)."""

from __future__ import annotations

import functools

MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)


def chars_to_ranges(chars: frozenset[str], negated: bool) -> list[tuple[int, int]]:
    """Sorted, merged, surrogate-free code-point ranges of a character class."""
    points = sorted(ord(c) for c in chars)
    ranges: list[tuple[int, int]] = []
    for p in points:
        if ranges and ranges[-1][1] + 1 >= p:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], p))
        else:
            ranges.append((p, p))
    if negated:
        comp, nxt = [], 0
        for lo, hi in ranges:
            if lo > nxt:
                comp.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= MAX_CODE_POINT:
            comp.append((nxt, MAX_CODE_POINT))
        ranges = comp
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        # surrogates cannot be encoded in UTF-8: cut them out
        if hi < _SURROGATES[0] or lo > _SURROGATES[1]:
            out.append((lo, hi))
            continue
        if lo < _SURROGATES[0]:
            out.append((lo, _SURROGATES[0] - 1))
        if hi > _SURROGATES[1]:
            out.append((_SURROGATES[1] + 1, hi))
    return out


def utf8_sequences(lo: int, hi: int) -> list[tuple[tuple[int, int], ...]]:
    """Split code points lo..hi into byte-range sequences; their union encodes exactly lo..hi
    (surrogates, which UTF-8 cannot encode, left out)."""
    if lo <= _SURROGATES[1] and hi >= _SURROGATES[0]:
        out = []
        if lo < _SURROGATES[0]:
            out += utf8_sequences(lo, _SURROGATES[0] - 1)
        if hi > _SURROGATES[1]:
            out += utf8_sequences(_SURROGATES[1] + 1, hi)
        return out
    # a range must not straddle an encoded-length boundary
    for boundary in (0x7F, 0x7FF, 0xFFFF):
        if lo <= boundary < hi:
            return utf8_sequences(lo, boundary) + utf8_sequences(boundary + 1, hi)
    if hi < 0x80:
        return [((lo, hi),)]
    n = len(chr(lo).encode())
    # each continuation byte range must be full (0x80..0xBF) below the first differing byte
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if (lo & ~m) != (hi & ~m):
            if lo & m:
                return utf8_sequences(lo, lo | m) + utf8_sequences((lo | m) + 1, hi)
            if (hi & m) != m:
                return utf8_sequences(lo, (hi & ~m) - 1) + utf8_sequences(hi & ~m, hi)
    a, b = chr(lo).encode(), chr(hi).encode()
    return [tuple((a[i], b[i]) for i in range(n))]


@functools.lru_cache(maxsize=4096)
def char_form(chars: frozenset[str], negated: bool) -> tuple[tuple[int, tuple], ...]:
    """A character class as UTF-8 byte paths: (first-byte mask, continuation byte ranges) per
    byte-range sequence (a pure function of the class: shared by every automaton)."""
    return tuple(
        (byte_mask(*seq[0]), seq[1:])
        for lo, hi in chars_to_ranges(chars, negated)
        for seq in utf8_sequences(lo, hi)
    )


def byte_mask(lo: int, hi: int) -> int:
    """A set of bytes lo..hi as a 256-bit integer."""
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)
