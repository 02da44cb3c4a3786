"""Regex text for the decimals N / 10**s whose N are the multiples of m in a range, when
membership is a rule on N's last digits (m divides a power of ten): digit blocks, tries of
digit strings, and the spellings of a fraction (`Spelling`). Used by
`grammar.json_schema.numbers`, which also holds the exact-value rules.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from grammar.json_schema.number_text import _natural_range, _same_length

MAX_RESIDUES = 1000  # last-digit rules larger than this become automata


class TooBig(Exception):
    """The last-digit rule is too large for regex text."""


def exact(x: object) -> Fraction:
    """The exact value of a schema number (a float as the decimal its repr spells)."""
    if isinstance(x, bool) or not isinstance(x, int | float | Decimal | Fraction):
        raise TypeError(f"not a number: {x!r}")
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError(f"not finite: {x!r}")
        return Fraction(Decimal(repr(x)))
    return Fraction(x)


def scale(x: Fraction, cap: int | None = None) -> int:
    """The fraction digits of a decimal (its denominator divides 10**s); past `cap`, cap + 1."""
    s = 0
    while (x * 10**s).denominator != 1:
        s += 1
        if cap is not None and s > cap:
            break
    return s


def fixed_digits(n: int, width: int) -> str:
    """n as exactly `width` digits (leading zeros kept; "" for width 0)."""
    return str(n).zfill(width) if width else ""


def pow10_exponent(m: int) -> int | None:
    """The least j with m | 10**j, or None (m has a prime factor other than 2 and 5)."""
    a = b = 0
    while m % 2 == 0:
        m //= 2
        a += 1
    while m % 5 == 0:
        m //= 5
        b += 1
    return max(a, b) if m == 1 else None


# ----- regex text from digit-string sets -----
def _class(digits: list[str]) -> str:
    if len(digits) == 1:
        return digits[0]
    ds = sorted(int(d) for d in digits)
    runs: list[list[int]] = []
    for d in ds:
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    body = "".join(f"{a}" if a == b else f"{a}{b}" if b == a + 1 else f"{a}-{b}" for a, b in runs)
    return f"[{body}]"


def _trie(words: list[tuple[str, ...]]) -> str | None:
    """Alternation of token sequences (tokens: single digits or regex atoms), prefix-shared;
    siblings with the same continuation merge into a character class. None if no words."""
    if not words:
        return None
    root: dict = {}
    for w in words:
        node = root
        for tok in filter(None, w):
            node = node.setdefault(tok, {})
        node[None] = {}

    def emit(node: dict) -> str:
        end = None in node
        groups: dict[str, list[str]] = {}
        for tok, sub in node.items():
            if tok is not None:
                groups.setdefault(emit(sub), []).append(tok)
        alts = []
        for cont, toks in groups.items():
            digits = [t for t in toks if len(t) == 1 and t.isdigit()]
            others = [t for t in toks if t not in digits]
            if digits:
                alts.append(_class(digits) + cont)
            alts += [t + cont for t in others]
        if not alts:
            return ""
        if len(alts) == 1 and not end:
            return alts[0]
        return "(" + "|".join(alts) + ")" + ("?" if end else "")

    return emit(root)


def alt(parts: list[str | None]) -> str | None:
    parts = list(dict.fromkeys(p for p in parts if p is not None))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _block(t: int, lo: int, hi: int, mod: int) -> str | None:
    """t-digit strings (leading zeros kept) of value in [lo, hi] divisible by mod | 10**t."""
    lo, hi = max(lo, 0), min(hi, 10**t - 1)
    if lo > hi:
        return None
    j = pow10_exponent(mod)
    assert j is not None and j <= t
    q = 10**j
    if q // mod > MAX_RESIDUES:
        raise TooBig
    res = list(range(0, q, mod))

    def suffix(a: int, b: int) -> str | None:
        return _trie([tuple(fixed_digits(r, j)) for r in res if a <= r <= b])

    plo, phi, w = lo // q, hi // q, t - j
    if plo == phi:
        sfx = suffix(lo % q, hi % q)
        return None if sfx is None else fixed_digits(plo, w) + sfx
    parts = []
    full_lo = plo if lo % q == 0 else plo + 1
    full_hi = phi if hi % q == q - 1 else phi - 1
    if full_lo != plo:
        sfx = suffix(lo % q, q - 1)
        if sfx is not None:
            parts.append(fixed_digits(plo, w) + sfx)
    if full_lo <= full_hi:
        parts.append(
            _same_length(fixed_digits(full_lo, w), fixed_digits(full_hi, w)) + suffix(0, q - 1)
        )
    if full_hi != phi:
        sfx = suffix(0, hi % q)
        if sfx is not None:
            parts.append(fixed_digits(phi, w) + sfx)
    return alt(parts)


# ----- spelling N / 10**s -----
class Spelling:
    """How a magnitude N / 10**s is written: `frac` (number kind: a fraction may follow) and
    `rest` (the digits past the s-th: "0" must be zeros, "any" anything)."""

    def __init__(self, s: int, frac: bool, rest: str) -> None:
        self.s, self.frac, self.rest = s, frac, rest

    def single(self, f: str) -> str:
        """The fraction forms of one s-digit fraction f (rest zero)."""
        if not self.frac:
            return ""
        f = f.rstrip("0")
        return r"(\.0+)?" if not f else r"\." + f + "0*"

    def nonzero_rest(self, f: str) -> str:
        return r"\." + f + "[0-9]*[1-9][0-9]*"

    def fractions(self, flo: int, fhi: int, mod: int) -> str | None:
        """Fraction forms of the s-digit fractions in [flo, fhi] divisible by mod | 10**s."""
        if flo > fhi:
            return None
        if not self.frac:
            return ""
        s, tail = self.s, "0*" if self.rest == "0" else "[0-9]*"
        if s == 0:
            return r"(\.0+)?" if self.rest == "0" else r"(\.[0-9]+)?"
        alts = []
        for t in range(1, s):  # written with t < s digits: the rest are zeros
            p = 10 ** (s - t)
            b = _block(t, -(-flo // p), fhi // p, mod // math.gcd(mod, p))
            if b is not None:
                alts.append(r"\." + b)
        b = _block(s, flo, fhi, mod)
        if b is not None:
            alts.append(r"\." + b + tail)
        if not alts:
            return "" if flo == 0 else None
        body = alts[0] if len(alts) == 1 else "(" + "|".join(alts) + ")"
        if flo == 0:
            return body + "?" if body.startswith("(") and len(alts) > 1 else f"({body})?"
        return body


def grid(a: int, b: int | None, m: int, sp: Spelling) -> str | None:
    """Magnitudes N / 10**s for the multiples N of m in [a, b] (b None: unbounded), a >= 0."""
    if b is not None and b < a:
        return None
    s = sp.s
    j = pow10_exponent(m)
    assert j is not None
    if 10**j // m > MAX_RESIDUES:
        raise TooBig
    big = max(j, s)
    p = 10**big
    hlo, hhi = a // p, None if b is None else b // p
    blocks = []  # (head lo, head hi, tail lo, tail hi); head 0 alone (no leading zeros)
    if hhi is not None and hlo == hhi:
        blocks.append((hlo, hlo, a % p, b % p))
    else:
        start = hlo
        if hlo == 0 or a % p:
            blocks.append((hlo, hlo, a % p, p - 1))
            start += 1
        full_hi = None if hhi is None else hhi if b % p == p - 1 else hhi - 1
        if full_hi is None or start <= full_hi:
            blocks.append((start, full_hi, 0, p - 1))
        if hhi is not None and full_hi != hhi:
            blocks.append((hhi, hhi, 0, b % p))
    parts = []
    for h1, h2, tlo, thi in blocks:
        if big == s:  # the tail is the fraction; the head the integer part
            head = "0" if h1 == 0 else str(h1) if h1 == h2 else _natural_range(h1, h2)
            fr = sp.fractions(tlo, thi, m)
            if fr is not None and head is not None:
                parts.append(head + fr)
            continue
        # the tail holds big - s integer digits too: list its values (few: 10**j // m)
        first = -(-tlo // m) * m
        words = []
        for n in range(first, thi + 1, m):
            whole, f = divmod(n, 10**s)
            lead = str(whole) if h1 == 0 else str(whole).zfill(big - s)
            words.append((*lead, sp.single(fixed_digits(f, s))))
        tails = _trie(words)
        if tails is None:
            continue
        if h1 == 0:
            parts.append(tails)
        else:
            head = str(h1) if h1 == h2 else _natural_range(h1, h2)
            parts.append(head + tails)
    return alt(parts)
