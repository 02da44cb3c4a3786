"""ECMA-262 regex semantics for JSON Schema patterns, on interegular's parser: Unicode
property escapes `\\p{...}` / `\\P{...}` for the General_Category values (`\\p{L}`,
`\\p{Letter}`, `\\p{Lu}`, `\\p{gc=Nd}`, `\\p{General_Category=Decimal_Number}`), their code
points read from this Python's `unicodedata` (so its Unicode version,
`unicodedata.unidata_version`, decides); `\\s` / `\\S` with ECMA-262's Unicode white space
(interegular's are ASCII); classes of several negated items (`[\\D\\S]`) united exactly; no
`{,n}` quantifier (Python's {0,n}).

Scripts (`\\p{Script=Greek}`, `\\p{sc=...}`, `\\p{scx=...}`) and binary properties
(`\\p{Alphabetic}`, `\\p{Emoji}`, ...) raise GrammarError naming them.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

import numpy as np

from grammar.automata import interegular_adapter as ip
from grammar.automata.nfa import parsed_or_refused
from grammar.errors import GrammarError

# PropertyValueAliases.txt for General_Category: short name -> the other names ECMA-262 takes
_ALIASES: dict[str, tuple[str, ...]] = {
    "L": ("Letter",),
    "LC": ("Cased_Letter",),
    "Lu": ("Uppercase_Letter",),
    "Ll": ("Lowercase_Letter",),
    "Lt": ("Titlecase_Letter",),
    "Lm": ("Modifier_Letter",),
    "Lo": ("Other_Letter",),
    "M": ("Mark", "Combining_Mark"),
    "Mn": ("Nonspacing_Mark",),
    "Mc": ("Spacing_Mark",),
    "Me": ("Enclosing_Mark",),
    "N": ("Number",),
    "Nd": ("Decimal_Number", "digit"),
    "Nl": ("Letter_Number",),
    "No": ("Other_Number",),
    "P": ("Punctuation", "punct"),
    "Pc": ("Connector_Punctuation",),
    "Pd": ("Dash_Punctuation",),
    "Ps": ("Open_Punctuation",),
    "Pe": ("Close_Punctuation",),
    "Pi": ("Initial_Punctuation",),
    "Pf": ("Final_Punctuation",),
    "Po": ("Other_Punctuation",),
    "S": ("Symbol",),
    "Sm": ("Math_Symbol",),
    "Sc": ("Currency_Symbol",),
    "Sk": ("Modifier_Symbol",),
    "So": ("Other_Symbol",),
    "Z": ("Separator",),
    "Zs": ("Space_Separator",),
    "Zl": ("Line_Separator",),
    "Zp": ("Paragraph_Separator",),
    "C": ("Other",),
    "Cc": ("Control", "cntrl"),
    "Cf": ("Format",),
    "Cs": ("Surrogate",),
    "Co": ("Private_Use",),
    "Cn": ("Unassigned",),
}
_SHORT = {alias: short for short, names in _ALIASES.items() for alias in (short, *names)}
_SCRIPT_KEYS = ("Script", "sc", "Script_Extensions", "scx")
_END = sys.maxunicode + 1


@functools.cache
def _runs() -> dict[str, list[tuple[int, int]]]:
    """Two-letter category -> its runs of code points (unassigned ones are Cn)."""
    out: dict[str, list[tuple[int, int]]] = {}
    start, current = 0, unicodedata.category("\x00")
    for cp in range(1, _END):
        category = unicodedata.category(chr(cp))
        if category != current:
            out.setdefault(current, []).append((start, cp - 1))
            start, current = cp, category
    out.setdefault(current, []).append((start, _END - 1))
    return out


def category_ranges(short: str) -> list[tuple[int, int]]:
    """The code-point ranges of a General_Category value by its short name (`L` is every
    `L?`, `LC` is Lu, Ll and Lt), sorted."""
    runs = _runs()
    if short == "LC":
        parts = ["Lu", "Ll", "Lt"]
    elif len(short) == 1:
        parts = [c for c in runs if c[0] == short]
    else:
        parts = [short]
    return sorted(r for c in parts for r in runs.get(c, []))


def category_short_name(name: str) -> str:
    """The short name of a `\\p{...}` body naming a General_Category value; GrammarError for
    any other property."""
    key, eq, value = name.partition("=")
    if eq and key in ("General_Category", "gc") and value in _SHORT:
        return _SHORT[value]
    if not eq and name in _SHORT:
        return _SHORT[name]
    if eq and key in ("General_Category", "gc"):
        kind = "an unknown General_Category value"
    elif eq and key in _SCRIPT_KEYS:
        kind = "a script property"
    elif eq:
        kind = "an unknown property"
    else:
        kind = "a binary property or an unknown value"
    raise GrammarError(
        f"regex construct not supported: \\p{{{name}}} is {kind}; only General_Category values "
        f"are (\\p{{L}}, \\p{{Letter}}, \\p{{gc=Lu}}, ...)"
    )


def property_class(name: str, negated: bool) -> ip.CharGroup:
    """`\\p{name}` (or `\\P{name}` if negated) as a character class."""
    chars, complemented = _category_chars(category_short_name(name))
    return ip.CharGroup(chars, negated != complemented)


@functools.cache
def _category_chars(short: str) -> tuple[frozenset[str], bool]:
    """A category's characters, or those of its complement (then True) where that is the
    smaller set: a class is a set of its characters. One set per category, whatever its
    name or negation (L, Lo and C hold over 100,000 characters)."""
    ranges = category_ranges(short)
    complemented = 2 * sum(hi - lo + 1 for lo, hi in ranges) > _END
    if complemented:
        ranges = _complement(ranges)
    return frozenset(chr(c) for lo, hi in ranges for c in range(lo, hi + 1)), complemented


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    return out + ([(start, _END - 1)] if start < _END else [])


def _union(groups: list[ip.CharGroup], negate: bool) -> ip.CharGroup:
    """The class of a `[...]` (`[^...]` if negate) holding these items: everything but what
    every negated item leaves out and no plain item holds (interegular unites the negated
    items' sets instead, which narrows `[\\D\\S]`)."""
    plain = frozenset().union(*(g.chars for g in groups if not g.negated))
    excluded = [g.chars for g in groups if g.negated]
    if not excluded:
        return ip.CharGroup(plain, negate)
    return ip.CharGroup(frozenset.intersection(*excluded) - plain, not negate)


@functools.cache
def ecma_space() -> frozenset[str]:
    """ECMA-262's `\\s`: WhiteSpace (tab, VT, FF, space, NBSP, ZWNBSP, every Zs) and
    LineTerminator (LF, CR, LS, PS); Python's `\\s` in interegular is ASCII only. Zs is read
    from the BMP alone (a fifteenth of the full table's time; no Zs lies beyond it, which
    tests/grammar/json_schema/test_pattern_escapes.py checks against the full table), and only
    among the characters Python's `\\s` matches (every Zs is one), found by one C-level search
    over the plane's text (surrogates left out: they are Cs), not by a category lookup per code
    point (~8 ms, paid by each schema with a `\\s`)."""
    codes = np.concatenate([np.arange(0xD800), np.arange(0xE000, 0x10000)]).astype("<u4")
    spaces = re.findall(r"\s", codes.tobytes().decode("utf-32-le"))
    zs = (c for c in spaces if unicodedata.category(c) == "Zs")
    return frozenset("\t\n\v\f\r \u00a0\ufeff\u2028\u2029").union(zs)


class _EcmaPattern(ip.ParsePattern):
    """interegular's parser with ECMA-262's `\\s` / `\\S`, `\\p{...}` / `\\P{...}`, exact
    classes of several negated items, and no `{,n}` quantifier."""

    def escaped(self, inner: bool = False) -> ip.CharGroup:
        if self.static_b("s"):
            return ip.CharGroup(ecma_space(), False)
        if self.static_b("S"):
            return ip.CharGroup(ecma_space(), True)
        for letter, negated in (("p", False), ("P", True)):
            if self.static_b(letter):
                end = self.data.find("}", self.index)
                if not self.data.startswith("{", self.index) or end < 0:
                    raise GrammarError(
                        f"regex construct not supported: \\{letter} without a braced property "
                        f"name (write \\{letter}{{L}}) in {self.data[:200]!r}"
                    )
                name, self.index = self.data[self.index + 1 : end], end + 1
                return property_class(name, negated)
        return super().escaped(inner)

    def repetition(self, base: object) -> object:
        if self.data.startswith("{,", self.index):  # Python's {0,n}; no quantifier in ECMA 262
            raise GrammarError(
                f"regex construct not supported: {{,n}} (ECMA 262 has no such quantifier; "
                f"write {{0,n}}) in {self.data[:200]!r}"
            )
        return super().repetition(base)

    def chargroup(self) -> ip.CharGroup:
        negate = self.static_b("^")
        groups = []
        while True:
            try:
                groups.append(self.chargroup_inner())
            except ip.nomatch:
                break
        self.static("]")
        return _union(groups, negate)


@functools.lru_cache(maxsize=1024)
def parse_pattern_regex(pattern: str) -> object:
    """A `pattern`'s regex as interegular nodes, with property escapes (as
    grammar.automata.nfa.parse_regex otherwise; GrammarError naming what is refused).
    Nodes are immutable: one parse per text (a schema repeats its patterns)."""
    return parsed_or_refused(lambda text: _EcmaPattern(text).parse().simplify(), pattern)
