"""Strings (lengths, patterns, formats, both at once), integers and numbers (delegated to
`grammar.json_schema.numbers`), and the any-JSON-value automaton, as regex nodes or prebuilt
automata shared by every schema.

Functions of the schema builder (`builder.Builder`, passed as `b`).
"""

from __future__ import annotations

import re

from grammar.automata import dfa_ops
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import ByteDFA, node_to_dfa
from grammar.automata.pattern import losses, note_loss, pattern_to_content
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.json_schema import number_text, numbers
from grammar.json_schema.builder import Builder
from grammar.json_schema.formats import (
    FORMAT_REGEXES,
    INEXACT_FORMATS,
    UNSUPPORTED_FORMATS,
    format_node,
)
from grammar.json_schema.number_grid import exact, scale
from grammar.json_schema.objects import ip_char_not

# one decoded character: a literal one, a short escape, a \uXXXX escape that is no surrogate,
# or an escaped surrogate pair (one character, as JSON Schema lengths count it)
STRING_CHAR_TEXT = (
    r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u([0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})'
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
STRING_TEXT = f'"{STRING_CHAR_TEXT}*"'
_ZERO_FRACTION = r"(\.0+)?"
_FRACTIONAL = r"-?(0|[1-9][0-9]*)\.[0-9]*[1-9][0-9]*"

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing


def any_value(b: Builder, depth: int) -> object:
    note_loss()  # values nested deeper than any_depth are left out
    if depth not in b.any_memo:
        options = [b.any_string, ra.parsed(b.number_text)]
        options += [ra.lit("true"), ra.lit("false"), ra.lit("null")]
        if depth > 0:
            inner = any_value(b, depth - 1)
            member = ra.seq(b.any_string, b.colon, inner)
            members = ra.seq(member, ra.repeat(ra.seq(b.comma, member), 0, None))
            options.append(b.wrap("{", ra.optional(members), "}"))
            elems = ra.seq(inner, ra.repeat(ra.seq(b.comma, inner), 0, None))
            options.append(b.wrap("[", ra.optional(elems), "]"))
        spacing = (b.ws_text, b.separators)
        b.any_memo[depth] = _any_automaton(ra.alt(options), spacing, depth, b.float64_numbers)
    return b.any_memo[depth]


# ----- strings and numbers -----
def string_value(b: Builder, s: dict, ptr: str) -> Node:
    """A JSON string: a function of four keywords only, so built once per schema for
    each spelling of them (a pattern and its automata recur in every copy of an object:
    unrolled recursion, oneOf cases); the narrowings it records are replayed."""
    key = tuple(
        repr(s.get(k)) for k in ("minLength", "maxLength", "format", "pattern", "_patterns")
    )
    hit = b.string_memo.get(key)
    if hit is not None:
        for _ in range(hit[1]):
            note_loss()
        return hit[0]
    before = losses()
    node = _string_value(b, s, ptr)
    b.string_memo[key] = (node, losses() - before)
    return node


def _string_value(b: Builder, s: dict, ptr: str) -> Node:
    lo, hi = s.get("minLength", 0), s.get("maxLength")
    fmt, pattern = s.get("format"), s.get("pattern")
    if fmt in UNSUPPORTED_FORMATS:
        raise UnsupportedSchemaError("format", f"{ptr}/format", repr(fmt))
    if fmt in INEXACT_FORMATS:
        note_loss()
    if hi is not None and hi < lo:
        return None
    if fmt in FORMAT_REGEXES:
        fmt_node, hi = format_node(fmt, hi)
    content: Node
    if pattern is not None and s.get("_patterns"):
        fmt_part = fmt_node if fmt in FORMAT_REGEXES else None
        return _several_patterns(b, [pattern, *s["_patterns"]], fmt_part, lo, hi, ptr)
    if pattern is not None:
        try:
            if fmt in FORMAT_REGEXES:  # both: the product of the two automata
                fmt_dfa = b.dfa(fmt_node)
                both = dfa_ops.product(b.dfa(_content_beside(b, pattern, fmt_dfa)), fmt_dfa, True)
                content = dfa_ops.DFANode(both, "pattern", f"{ptr}/pattern")
                if lo or hi is not None:
                    content = length_bounded(b, content, lo, hi, ptr)
            elif lo or hi is not None:
                content = _bounded_class_pattern(pattern, lo, hi, b.string_char)
                if content is False:
                    content = length_bounded(
                        b, pattern_to_content(pattern, b.string_char), lo, hi, ptr
                    )
            else:
                content = pattern_to_content(pattern, b.string_char)
        except GrammarError as e:
            if isinstance(e, UnsupportedSchemaError):
                raise
            raise UnsupportedSchemaError("pattern", f"{ptr}/pattern", str(e)) from None
    elif fmt in FORMAT_REGEXES:
        content = fmt_node
        if lo or hi is not None:
            content = length_bounded(b, content, lo, hi, ptr)
    elif not lo and hi is None:
        return b.any_string
    else:
        content = ra.repeat(b.string_char, lo, hi)
    return ra.seq(ra.char('"'), content, ra.char('"'))


_BACKSLASH = ord("\\")


def _content_beside(b: Builder, pattern: str, fmt_dfa: ByteDFA) -> Node:
    """`pattern`'s string content, to be intersected with a format's automaton: only its
    escape-free spellings when the format's spells none with a backslash (the URI family,
    dates...: every character literal), the same intersection from a smaller automaton (no
    escape states: `.*` in a URL pattern ~2.0 -> ~1.3 ms with the product)."""
    content = pattern_to_content(pattern, b.string_char)  # (records its narrowings)
    column = fmt_dfa.table[:, fmt_dfa.classes[_BACKSLASH]]
    if content is None or column.any():  # (DEAD is 0: no state reads a backslash)
        return content
    free = pattern_to_content(pattern, _RAW_CHAR, escape_free=True)
    return content if free is None else free


_RAW_CHAR = ip_char_not([])  # a character JSON writes as itself


def _several_patterns(
    b: Builder, patterns: list[str], fmt_node: Node, lo: int, hi: int | None, ptr: str
) -> Node:
    """A string matching every pattern (`allOf` branches with different ones) and the format
    when there is one: the product of their automata."""
    try:
        dfa = b.dfa(pattern_to_content(patterns[0], b.string_char))
        for p in patterns[1:]:
            dfa = dfa_ops.product(dfa, b.dfa(pattern_to_content(p, b.string_char)), True)
        if fmt_node is not None:
            dfa = dfa_ops.product(dfa, b.dfa(fmt_node), True)
    except GrammarError as e:
        raise UnsupportedSchemaError("allOf", ptr, f"patterns {patterns!r}: {e}") from None
    content: Node = dfa_ops.DFANode(dfa, "pattern", f"{ptr}/pattern")
    if lo or hi is not None:
        content = length_bounded(b, content, lo, hi, ptr)
    return ra.seq(ra.char('"'), content, ra.char('"'))


def length_bounded(b: Builder, content: Node, lo: int, hi: int | None, ptr: str) -> Node:
    """String content `content` restricted to lo..hi decoded characters (exact, via a
    product of its DFA with a character counter)."""
    if content is None:
        return None
    key = "maxLength" if hi is not None else "minLength"
    try:
        dfa = dfa_ops.with_length(b.dfa(content), lo, hi)
    except GrammarError as e:
        raise UnsupportedSchemaError(key, ptr, f"with a pattern / format: {e}") from None
    return dfa_ops.DFANode(dfa, key, ptr)


def integer_value(b: Builder, s: dict, ptr: str) -> Node:
    """Integers; from draft 6 on also spelled with a zero fraction (1.0, -3.00): the
    same values, so bounds and multipleOf hold for them as for the integer. Strict mode
    (generation) writes plain integers only, as XGrammar and vLLM do: a zero fraction has no
    bound on its zeros (`"population":1.0000...` to max_tokens); so does a lark `%json`
    (`PLAIN_INTEGERS_MARK`), as llguidance and XGrammar read it."""
    bounds = _bounds(s)
    zeros = b.integral_floats and not b.float64_numbers and not b.plain_integers
    if bounds == (None,) * 4 and s.get("multipleOf") is None:
        text = number_text.INTEGER + (_ZERO_FRACTION if zeros else "")
        return shared_leaf(text, "integer")
    node = numbers.number_node("integer", *bounds, s.get("multipleOf"), ptr)
    if node is None or not zeros:
        return node
    return ra.seq(node, ra.parsed(_ZERO_FRACTION))


def number_value(b: Builder, s: dict, ptr: str) -> Node:
    bounds = _bounds(s)
    if bounds == (None,) * 4 and s.get("multipleOf") is None:
        node = shared_leaf(b.number_text, "number")
    else:
        node = numbers.number_node("number", *bounds, s.get("multipleOf"), ptr)
        if b.float64_numbers and node is not None:
            node = float64_digits(b, node, bounds, ptr)
    if not s.get("_fractional") or node is None:
        return node
    # `not` of integer: the numbers spelled with a non-zero fraction digit, no exponent
    dfa = dfa_ops.product(b.dfa(node), b.dfa(ra.parsed(_FRACTIONAL)), True)
    return dfa_ops.DFANode(dfa, "not", ptr) if dfa.accepting.any() else None


def float64_digits(b: Builder, node: object, bounds: tuple, ptr: str) -> Node:
    """`node` (exponent-free numbers within bounds) cut to the digits a float64 carries:
    17 in the integer part and in the fraction, or one more than a bound has there (so a
    bound past them keeps the numbers near it)."""
    given = [exact(x) for x in bounds if x is not None and not isinstance(x, bool)]
    whole = max([len(str(abs(int(x)))) + 1 for x in given], default=0)
    frac = max([scale(x, numbers.MAX_DIGITS) + 1 for x in given], default=0)
    whole = max(whole, number_text.FLOAT64_INT_DIGITS)
    frac = max(frac, number_text.FLOAT64_FRACTION_DIGITS)
    limit = ra.parsed(f"-?[0-9]{{1,{whole}}}(\\.[0-9]{{1,{frac}}})?")
    dfa = dfa_ops.product(b.dfa(node), b.dfa(limit), True)
    return dfa_ops.DFANode(dfa, "number", ptr) if dfa.accepting.any() else None


def _bounds(s: dict) -> tuple:
    mn, mx = s.get("minimum"), s.get("maximum")
    emn, emx = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if isinstance(emn, bool):  # draft 4: a flag on minimum
        emn, mn = (mn, None) if emn else (None, mn)
    if isinstance(emx, bool):
        emx, mx = (mx, None) if emx else (None, mx)
    return mn, mx, emn, emx


_LITERAL_UNIT = r"(?:[^\\^$.|?*+()\[\]{}]|\\[^A-Za-z0-9])"  # a char that is itself
_PREFIXED_CLASS = re.compile(
    rf"\^((?:{_LITERAL_UNIT})*)(?:(\[(?:[^\]\\]|\\.)+\]|\\[dw]|\.)([+*]))?(\$?)"
)


def _bounded_class_pattern(pattern: str, lo: int, hi: int | None, any_char: object) -> Node | bool:
    """Patterns a length bound counts through as a repetition, not a counted automaton: a
    literal prefix (maybe empty), then `[class]+` / `*` to the end (`^[a-z]+$`, `^ab\\d*$`),
    or, with no `$`, anything (`^/.*`, `^/`): the prefix, then the class (any character) as
    often as the bounds leave. False for other patterns."""
    m = _PREFIXED_CLASS.fullmatch(pattern)
    if not m:
        return False
    prefix, cls, op, end = m.groups()
    if end:
        if cls is None:  # a whole literal: the counted automaton is as small
            return False
        one = pattern_to_content(f"^{cls}$", any_char)
        low = 1 if op == "+" else 0
    elif cls is None or (cls == "." and op == "*"):  # no `$`: anything may follow the prefix
        one, low = any_char, 0
    else:
        return False
    n = len(re.sub(r"\\(.)", r"\1", prefix))  # decoded: an escaped punctuation is itself
    rest_lo, rest_hi = max(lo - n, low), None if hi is None else hi - n
    if rest_hi is not None and rest_hi < rest_lo:
        return None
    head = pattern_to_content(f"^{prefix}$", any_char) if prefix else ra.EMPTY
    return ra.seq(head, ra.repeat(one, rest_lo, rest_hi))


_ANY_DFAS: dict[tuple[tuple, int, bool], object] = {}
_LEAVES: dict[str, object] = {}


def shared_leaf(text: str, keyword: str) -> object:
    """A piece most schemas hold many times (a plain string, a number), as a prebuilt
    automaton shared by every schema: the NFA embeds it without building its states, and the
    lazy DFA reads only those walks reach. Keeps its regex text for json_schema_to_regex."""
    node = _LEAVES.get(text)
    if node is None:
        node = _LEAVES.setdefault(
            text, dfa_ops.DFANode(node_to_dfa(ra.parsed(text)), keyword, "#", text)
        )
    return node


def _any_automaton(node: object, spacing: tuple, depth: int, float64: bool) -> object:
    """Any JSON value nested at most `depth` deep, as a prebuilt automaton shared by every
    schema (built once per white space and separators (`spacing`) and depth: most schemas hold
    it, as additional members' values), keeping its regex text for json_schema_to_regex."""
    key = (spacing, depth, float64)
    if key not in _ANY_DFAS:
        _ANY_DFAS[key] = dfa_ops.DFANode(node_to_dfa(node), "any", "#", ra.to_text(node))
    return _ANY_DFAS[key]


# ----- outlines' digit-count keywords -----
DIGIT_KEYWORDS = (
    "minDigits",
    "maxDigits",
    "minDigitsInteger",
    "maxDigitsInteger",
    "minDigitsFraction",
    "maxDigitsFraction",
    "minDigitsExponent",
    "maxDigitsExponent",
)


def _digit_count(s: dict, key: str, ptr: str) -> int | None:
    v = s.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise UnsupportedSchemaError(key, f"{ptr}/{key}", "must be a non-negative integer")
    return v


def _digits(lo: int | None, hi: int | None, first: str = "[0-9]") -> str | None:
    """`first` then digits, lo..hi of them in all (None: 1 / unbounded); None if no count
    fits."""
    lo = max(lo or 1, 1)
    if hi is not None and hi < lo:
        return None
    return f"{first}[0-9]{{{lo - 1},{'' if hi is None else hi - 1}}}"


def with_digit_counts(b: Builder, node: Node, t: str, s: dict, ptr: str) -> Node:
    """outlines-core's digit counts on a number or integer (`minDigits` / `maxDigits` for an
    integer, `min|maxDigitsInteger|Fraction|Exponent` for a number; the integer part's count
    holds for a non-zero integer part, a fraction's and an exponent's where there is one):
    the node's language narrowed to those spellings."""
    n = {k: _digit_count(s, k, ptr) for k in DIGIT_KEYWORDS}
    int_lo = n["minDigits"] if t == "integer" else n["minDigitsInteger"]
    int_hi = n["maxDigits"] if t == "integer" else n["maxDigitsInteger"]
    parts = [
        _digits(int_lo, int_hi, "[1-9]"),
        _digits(n["minDigitsFraction"], n["maxDigitsFraction"]),
        _digits(n["minDigitsExponent"], n["maxDigitsExponent"]),
    ]
    if node is None or None in parts:
        return None
    whole, frac, exp = parts
    shape = f"-?(0|{whole})"
    if t == "number":
        shape += rf"(\.{frac})?([eE][+-]?{exp})?"
    dfa = dfa_ops.product(b.dfa(node), node_to_dfa(ra.parsed(shape)), True)
    return dfa_ops.DFANode(dfa, "digits", ptr) if dfa.accepting.any() else None
