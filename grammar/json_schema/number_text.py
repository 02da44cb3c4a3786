"""Exact regexes for integer ranges and bounded JSON numbers (canonical JSON spelling)."""

from __future__ import annotations

import functools

INTEGER = r"-?(0|[1-9][0-9]*)"
NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
# strict mode's numbers: at most as many digits as a float64 carries (17 significant digits,
# a 3-digit exponent) in the integer part, the fraction and the exponent, so no output can loop
# inside one number; every float64 has such a spelling (d.dddddddddddddddde+ddd)
FLOAT64_INT_DIGITS = 17
FLOAT64_FRACTION_DIGITS = 17
FLOAT64_EXPONENT_DIGITS = 3
FLOAT64_NUMBER = (
    f"-?(0|[1-9][0-9]{{0,{FLOAT64_INT_DIGITS - 1}}})(\\.[0-9]{{1,{FLOAT64_FRACTION_DIGITS}}})?"
    f"([eE][+-]?[0-9]{{1,{FLOAT64_EXPONENT_DIGITS}}})?"
)
# the root keyword strict mode adds to say its numbers are FLOAT64_NUMBER-bounded
FLOAT64_MARK = "_float64_numbers"
# the root keyword that says integers are written plain (no `1.0`), as llguidance and XGrammar
# write them in a lark grammar's `%json`; validation still takes `1.0` where the draft does
PLAIN_INTEGERS_MARK = "_plain_integers"
_NONZERO_FRACTION = r"\.[0-9]*[1-9][0-9]*"


def _digit(lo: str, hi: str) -> str:
    return lo if lo == hi else f"[{lo}-{hi}]"


def _same_length(x: str, y: str) -> str:
    """Digit strings of len(x) == len(y) from x to y inclusive (x <= y)."""
    if x == y:
        return x
    i = 0
    while x[i] == y[i]:
        i += 1
    if i:
        return x[:i] + _same_length(x[i:], y[i:])
    rest = len(x) - 1
    if rest == 0:
        return _digit(x, y)
    tail = f"[0-9]{{{rest}}}" if rest > 1 else "[0-9]"
    zeros, nines = "0" * rest, "9" * rest
    parts = []
    lo, hi = int(x[0]), int(y[0])
    if x[1:] != zeros:
        parts.append(x[0] + _same_length(x[1:], nines))
        lo += 1
    high_part = None
    if y[1:] != nines:
        high_part = y[0] + _same_length(zeros, y[1:])
        hi -= 1
    if lo <= hi:
        parts.append(_digit(str(lo), str(hi)) + tail)
    if high_part:
        parts.append(high_part)
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _natural_range(lo: int, hi: int | None) -> str | None:
    """Non-negative integers lo..hi (hi None: unbounded) without leading zeros; None if empty."""
    if hi is not None and hi < lo:
        return None
    parts = []
    top = len(str(hi)) if hi is not None else len(str(lo))
    for length in range(len(str(lo)), top + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = 10**length - 1 if hi is None else min(hi, 10**length - 1)
        if a <= b:
            parts.append(_same_length(str(a).zfill(length), str(b)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{top},}}")
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


@functools.lru_cache(maxsize=1024)
def integer_range(lo: int | None, hi: int | None) -> str | None:
    """Canonical JSON integers in [lo, hi] (None: unbounded on that side); None if empty.
    Cached: strict mode bounds every integer to the float64-safe range, so a schema set
    asks for the same ~1 kB text once per integer (~0.1 ms each to build)."""
    if lo is None and hi is None:
        return INTEGER
    if lo is not None and hi is not None and lo > hi:
        return None
    parts = []
    if lo is None or lo < 0:  # negatives: -m with m in [max(1, -hi), -lo]
        m_lo = 1 if hi is None or hi >= 0 else -hi
        neg = _natural_range(m_lo, None if lo is None else -lo)
        if neg:
            parts.append("-" + neg)
    if hi is None or hi >= 0:
        pos = _natural_range(max(0, lo) if lo is not None else 0, hi)
        if pos:
            parts.append(pos)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def number_range(
    lo: int | None, hi: int | None, lo_exclusive: bool, hi_exclusive: bool
) -> str | None:
    """JSON numbers x with lo <(=) x <(=) hi for integer-valued bounds, without exponents.

    Integers (optionally written with a zero fraction) in the closed/open interval, plus
    non-integers strictly between two integers of it, positive and negative separately.
    """
    ilo = None if lo is None else lo + lo_exclusive
    ihi = None if hi is None else hi - hi_exclusive
    parts = []
    ints = integer_range(ilo, ihi)
    if ints:
        parts.append(f"{ints}(\\.0+)?")
    # positive fractions n.f with lo < n.f < hi: n in [max(0, lo), hi - 1]
    if hi is None or hi >= 1:
        n = _natural_range(max(0, lo) if lo is not None else 0, None if hi is None else hi - 1)
        if n:
            parts.append(n + _NONZERO_FRACTION)
    # negative fractions -(m.f) with lo < -(m.f) < hi: m in [max(0, -hi), -lo - 1]
    if lo is None or lo <= -1:
        m = _natural_range(max(0, -hi) if hi is not None else 0, None if lo is None else -lo - 1)
        if m:
            parts.append("-" + m + _NONZERO_FRACTION)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"
