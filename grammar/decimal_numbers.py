"""Exact JSON numbers under `minimum` / `maximum` / `exclusive*` / `multipleOf`.

Values are compared exactly: a schema number is read as the decimal Python's ``repr`` spells
(the JSON text it came from), an instance by its decimal digits, never through float
arithmetic. Spelling conventions: ``integer`` values are written as integers without ``-0``;
``number`` values may carry a fraction (trailing zeros allowed, ``-0`` / ``-0.0`` allowed
where 0 is valid) but never an exponent, except for a wholly unconstrained number.

A value is ``N / 10**s`` for an integer N (s: the fraction digits the keywords need). With
``multipleOf`` m the N are the multiples of ``M = m * 10**s``; when M divides a power of ten
(m = 0.01, 0.25, 2.5, 10, ...) membership is a rule on N's last digits and the set is regex
text, built from digit blocks. Other m (3, 0.3, 1.5) are a remainder automaton, intersected
with the bounds' regex, returned as a ``DFANode`` (no regex text form).
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from grammar import dfa_ops
from grammar import regex_ast as ra
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.fsm import node_to_dfa
from grammar.numbers import NUMBER, _natural_range, _same_length, integer_range

MAX_RESIDUES = 1000  # last-digit rules larger than this become automata
MAX_GRID_STATES = 12_000
MAX_DIGITS = 100  # schema numbers with more fraction digits are refused
MAX_INTEGER_DIGITS = 400  # ... or with more integer digits (the largest double has 309)


class _TooBig(Exception):
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


def _scale(x: Fraction, cap: int | None = None) -> int:
    """The fraction digits of a decimal (its denominator divides 10**s); past `cap`, cap + 1."""
    s = 0
    while (x * 10**s).denominator != 1:
        s += 1
        if cap is not None and s > cap:
            break
    return s


def _digits(n: int, width: int) -> str:
    """n as exactly `width` digits (leading zeros kept; "" for width 0)."""
    return str(n).zfill(width) if width else ""


def _pow10_exponent(m: int) -> int | None:
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


def _alt(parts: list[str | None]) -> str | None:
    parts = list(dict.fromkeys(p for p in parts if p is not None))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _block(t: int, lo: int, hi: int, mod: int) -> str | None:
    """t-digit strings (leading zeros kept) of value in [lo, hi] divisible by mod | 10**t."""
    lo, hi = max(lo, 0), min(hi, 10**t - 1)
    if lo > hi:
        return None
    j = _pow10_exponent(mod)
    assert j is not None and j <= t
    q = 10**j
    if q // mod > MAX_RESIDUES:
        raise _TooBig
    res = list(range(0, q, mod))

    def suffix(a: int, b: int) -> str | None:
        return _trie([tuple(_digits(r, j)) for r in res if a <= r <= b])

    plo, phi, w = lo // q, hi // q, t - j
    if plo == phi:
        sfx = suffix(lo % q, hi % q)
        return None if sfx is None else _digits(plo, w) + sfx
    parts = []
    full_lo = plo if lo % q == 0 else plo + 1
    full_hi = phi if hi % q == q - 1 else phi - 1
    if full_lo != plo:
        sfx = suffix(lo % q, q - 1)
        if sfx is not None:
            parts.append(_digits(plo, w) + sfx)
    if full_lo <= full_hi:
        parts.append(_same_length(_digits(full_lo, w), _digits(full_hi, w)) + suffix(0, q - 1))
    if full_hi != phi:
        sfx = suffix(0, hi % q)
        if sfx is not None:
            parts.append(_digits(phi, w) + sfx)
    return _alt(parts)


# ----- spelling N / 10**s -----
class _Spelling:
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


def _grid(a: int, b: int | None, m: int, sp: _Spelling) -> str | None:
    """Magnitudes N / 10**s for the multiples N of m in [a, b] (b None: unbounded), a >= 0."""
    if b is not None and b < a:
        return None
    s = sp.s
    j = _pow10_exponent(m)
    assert j is not None
    if 10**j // m > MAX_RESIDUES:
        raise _TooBig
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
            words.append((*lead, sp.single(_digits(f, s))))
        tails = _trie(words)
        if tails is None:
            continue
        if h1 == 0:
            parts.append(tails)
        else:
            head = str(h1) if h1 == h2 else _natural_range(h1, h2)
            parts.append(head + tails)
    return _alt(parts)


def _bounded(lo, lo_ex: bool, hi, hi_ex: bool) -> str | None:
    """Magnitudes x >= 0 with lo <(=) x <(=) hi (hi None: unbounded), any fraction digits."""
    s = max(_scale(lo), 0 if hi is None else _scale(hi))
    sp = _Spelling(s, True, "any")
    lo_n = int(lo * 10**s)
    hi_n = None if hi is None else int(hi * 10**s)
    a = lo_n + 1 if lo_ex else lo_n
    b = None if hi_n is None else hi_n - 1
    parts = [_grid(a, b, 1, sp)]
    if lo_ex and (hi_n is None or lo_n < hi_n):  # just above lo: lo's digits, then a non-zero
        whole, f = divmod(lo_n, 10**s)
        parts.append(str(whole) + sp.nonzero_rest(_digits(f, s)))
    if (
        hi_n is not None and not hi_ex and (hi_n > lo_n or (hi_n == lo_n and not lo_ex))
    ):  # hi itself
        whole, f = divmod(hi_n, 10**s)
        parts.append(str(whole) + _Spelling(s, True, "0").single(_digits(f, s)))
    return _alt(parts)


def _signed(pos: str | None, neg: str | None) -> str | None:
    return _alt([pos, None if neg is None else "-" + neg])


def _sides(lo, lo_ex, hi, hi_ex):
    """(positive side, negative side): magnitude intervals (lo, lo_ex, hi, hi_ex) or None."""
    pos = neg = None
    if hi is None or hi > 0 or (hi == 0 and not hi_ex):
        pos = (Fraction(0), False, hi, hi_ex) if lo is None or lo < 0 else (lo, lo_ex, hi, hi_ex)
    if lo is None or lo < 0:
        nlo = (Fraction(0), False) if hi is None or hi > 0 else (-hi, hi_ex)
        neg = (*nlo, None if lo is None else -lo, lo_ex)
    return pos, neg


def _grid_dfa(kind: str, m: Fraction, pointer: str) -> object:
    """A DFA of the (exponent-free) numbers that are multiples of m."""
    s = _scale(m) if kind == "number" else 0
    mm = int(m * 10**s) if kind == "number" else m.numerator
    if mm * (s + 4) > MAX_GRID_STATES:
        raise UnsupportedSchemaError("multipleOf", f"{pointer}/multipleOf", "automaton too large")

    def ok(r: int, k: int) -> bool:
        return r * 10 ** (s - k) % mm == 0

    def step(st: tuple, byte: int) -> tuple | None:
        phase, r, k = st
        c = chr(byte)
        digit = "0" <= c <= "9"
        if phase == "start" and c == "-":
            return ("sign", 0, 0)
        if phase in ("start", "sign") and digit:
            return ("zero" if c == "0" else "int", int(c) % mm, 0)
        if phase == "int" and digit:
            return ("int", (r * 10 + int(c)) % mm, 0)
        if phase in ("zero", "int") and c == "." and kind == "number":
            return ("dot", r, 0)
        if phase in ("dot", "frac") and digit:
            if k < s:
                return ("frac", (r * 10 + int(c)) % mm, k + 1)
            return ("frac", r, k) if c == "0" else None
        return None

    def accept(st: tuple) -> bool:
        phase, r, k = st
        return phase in ("zero", "int", "frac") and ok(r, k)

    return dfa_ops._explore(("start", 0, 0), step, accept, MAX_GRID_STATES * 4)


def number_node(
    kind: str,
    minimum=None,
    maximum=None,
    exclusive_minimum=None,
    exclusive_maximum=None,
    multiple_of=None,
    pointer: str = "#",
) -> object | None:
    """A regex-tree node for the JSON numbers of `kind` ("integer" / "number") satisfying the
    keywords exactly (see the module doc for spellings); None if no number does.

    Raises UnsupportedSchemaError (keyword, pointer) for a non-positive or non-numeric
    keyword value, and for values with absurdly many digits (MAX_DIGITS, MAX_INTEGER_DIGITS)."""
    given = {
        "minimum": minimum,
        "maximum": maximum,
        "exclusiveMinimum": exclusive_minimum,
        "exclusiveMaximum": exclusive_maximum,
        "multipleOf": multiple_of,
    }
    vals: dict[str, Fraction] = {}
    for key, v in given.items():
        if v is None:
            continue
        try:
            vals[key] = exact(v)
        except (TypeError, ValueError) as e:
            raise UnsupportedSchemaError(key, f"{pointer}/{key}", str(e)) from None
        if _scale(vals[key], MAX_DIGITS) > MAX_DIGITS or abs(vals[key]) >= 10**MAX_INTEGER_DIGITS:
            raise UnsupportedSchemaError(key, f"{pointer}/{key}", "too many digits")
    m = vals.get("multipleOf")
    if m is not None and m <= 0:
        raise UnsupportedSchemaError("multipleOf", f"{pointer}/multipleOf", "not positive")
    lows = [
        (v, ex)
        for k, ex in (("minimum", False), ("exclusiveMinimum", True))
        if (v := vals.get(k)) is not None
    ]
    highs = [
        (v, not ex)
        for k, ex in (("maximum", False), ("exclusiveMaximum", True))
        if (v := vals.get(k)) is not None
    ]
    lo = max(lows, default=(None, False))  # the tighter of equal bounds: the exclusive one
    hi = min(highs, default=(None, True))
    hi = (hi[0], not hi[1])
    if kind == "integer":  # integer bounds; m = p/q: an integer is a multiple iff p divides it
        m = None if m is None or m.numerator == 1 else Fraction(m.numerator)
        if lo[0] is not None:
            lo = (Fraction(math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0])), False)
        if hi[0] is not None:
            hi = (Fraction(math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0])), False)
    if lo[0] is not None and hi[0] is not None:
        if lo[0] > hi[0] or (lo[0] == hi[0] and (lo[1] or hi[1])):
            return None
    culprit = (
        "multipleOf" if m is not None else next((k for k in vals if k != "multipleOf"), "minimum")
    )
    try:
        if m is None:
            return _bounds_only(kind, lo, hi)
        try:
            text = _multiples(kind, m, lo, hi)
        except _TooBig:
            return _multiples_dfa(kind, m, lo, hi, pointer)
        return None if text is None else ra.parsed(text)
    except UnsupportedSchemaError:
        raise
    except GrammarError as e:
        raise UnsupportedSchemaError(culprit, f"{pointer}/{culprit}", str(e)) from None


def _multiples_dfa(kind: str, m: Fraction, lo: tuple, hi: tuple, pointer: str) -> object | None:
    """The bounds' regex intersected with a remainder automaton, as a DFANode."""
    bounds = _bounds_only(kind, lo, hi)
    if bounds is None:
        return None
    dfa = dfa_ops.product(node_to_dfa(bounds), _grid_dfa(kind, m, pointer), keep_b=True)
    if not dfa.accepting.any():
        return None
    return dfa_ops.DFANode(dfa, "multipleOf", f"{pointer}/multipleOf")


def _bounds_only(kind: str, lo: tuple, hi: tuple) -> object | None:
    if kind == "integer":
        text = integer_range(
            None if lo[0] is None else int(lo[0]), None if hi[0] is None else int(hi[0])
        )
        return None if text is None else ra.parsed(text)
    if lo[0] is None and hi[0] is None:
        return ra.parsed(NUMBER)
    pos, neg = _sides(lo[0], lo[1], hi[0], hi[1])
    text = _signed(
        None if pos is None else _bounded(*pos),
        None if neg is None else _bounded(*neg),
    )
    if text is not None and neg is None and lo[0] == 0 and not lo[1]:
        text = _alt([text, r"-0(\.0+)?"])  # -0 == 0, and 0 is the inclusive minimum
    return None if text is None else ra.parsed(text)


def _multiples(kind: str, m: Fraction, lo: tuple, hi: tuple) -> str | None:
    """Regex text of the multiples of m within the bounds; _TooBig if no last-digit rule."""
    s = _scale(m)
    mm = int(m * 10**s)
    if _pow10_exponent(mm) is None:
        raise _TooBig
    sp = _Spelling(s, kind == "number", "0")
    pos, neg = _sides(lo[0], lo[1], hi[0], hi[1])

    def side(iv: tuple | None, strictly_positive: bool) -> str | None:
        if iv is None:
            return None
        a_val, a_ex, b_val, b_ex = iv
        a = a_val * 10**s / mm  # in units of the grid step
        ka = math.floor(a) + 1 if a_ex else math.ceil(a)
        if strictly_positive:
            ka = max(ka, 1)
        kb = None
        if b_val is not None:
            b = b_val * 10**s / mm
            kb = math.ceil(b) - 1 if b_ex else math.floor(b)
        return _grid(ka * mm, None if kb is None else kb * mm, mm, sp)

    # integers spell no -0; numbers do (as -0, -0.0) where 0 is valid
    text = _signed(side(pos, False), side(neg, kind == "integer"))
    if kind == "number" and text is not None and neg is None and lo[0] == 0 and not lo[1]:
        text = _alt([text, r"-0(\.0+)?"])  # 0 is the inclusive minimum, and -0 == 0
    return text
