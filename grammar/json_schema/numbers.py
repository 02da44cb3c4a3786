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
from fractions import Fraction

from grammar.automata import dfa_ops
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import node_to_dfa
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.json_schema.number_grid import (
    Spelling,
    TooBig,
    alt,
    exact,
    fixed_digits,
    grid,
    pow10_exponent,
    scale,
)
from grammar.json_schema.number_text import NUMBER, integer_range

MAX_GRID_STATES = 12_000
# a bounded multipleOf: the bounds' automaton times the grid's (an unbounded integer in strict
# mode has I-JSON's bounds: ~100 states times `multipleOf: 1024`'s ~1,000, 35 ms)
MAX_MULTIPLES_STATES = 250_000
MAX_DIGITS = 100  # schema numbers with more fraction digits are refused
MAX_INTEGER_DIGITS = 400  # ... or with more integer digits (the largest double has 309)


def _bounded(lo, lo_ex: bool, hi, hi_ex: bool) -> str | None:
    """Magnitudes x >= 0 with lo <(=) x <(=) hi (hi None: unbounded), any fraction digits."""
    s = max(scale(lo), 0 if hi is None else scale(hi))
    sp = Spelling(s, True, "any")
    lo_n = int(lo * 10**s)
    hi_n = None if hi is None else int(hi * 10**s)
    a = lo_n + 1 if lo_ex else lo_n
    b = None if hi_n is None else hi_n - 1
    parts = [grid(a, b, 1, sp)]
    if lo_ex and (hi_n is None or lo_n < hi_n):  # just above lo: lo's digits, then a non-zero
        whole, f = divmod(lo_n, 10**s)
        parts.append(str(whole) + sp.nonzero_rest(fixed_digits(f, s)))
    if (
        hi_n is not None and not hi_ex and (hi_n > lo_n or (hi_n == lo_n and not lo_ex))
    ):  # hi itself
        whole, f = divmod(hi_n, 10**s)
        parts.append(str(whole) + Spelling(s, True, "0").single(fixed_digits(f, s)))
    return alt(parts)


def _signed(pos: str | None, neg: str | None) -> str | None:
    return alt([pos, None if neg is None else "-" + neg])


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
    s = scale(m) if kind == "number" else 0
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
        if scale(vals[key], MAX_DIGITS) > MAX_DIGITS or abs(vals[key]) >= 10**MAX_INTEGER_DIGITS:
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
        except TooBig:
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
    grid = _grid_dfa(kind, m, pointer)
    dfa = dfa_ops.product(node_to_dfa(bounds), grid, True, MAX_MULTIPLES_STATES)
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
        text = alt([text, r"-0(\.0+)?"])  # -0 == 0, and 0 is the inclusive minimum
    return None if text is None else ra.parsed(text)


def _multiples(kind: str, m: Fraction, lo: tuple, hi: tuple) -> str | None:
    """Regex text of the multiples of m within the bounds; TooBig if no last-digit rule."""
    s = scale(m)
    mm = int(m * 10**s)
    if pow10_exponent(mm) is None:
        raise TooBig
    sp = Spelling(s, kind == "number", "0")
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
        return grid(ka * mm, None if kb is None else kb * mm, mm, sp)

    # integers spell no -0; numbers do (as -0, -0.0) where 0 is valid
    text = _signed(side(pos, False), side(neg, kind == "integer"))
    if kind == "number" and text is not None and neg is None and lo[0] == 0 and not lo[1]:
        text = alt([text, r"-0(\.0+)?"])  # 0 is the inclusive minimum, and -0 == 0
    return text
