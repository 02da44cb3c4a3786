"""The regex dialect a user writes (`regex=`, structural tags, lark terminals), on interegular's
parser, for full-match constraints.

Beyond interegular's own syntax:

- escapes: `\\e` (ESC), `\\0` (NUL), `\\cX` (control character X), `\\uXXXX`, `\\u{X...}` and
  `\\UXXXXXXXX` (a code point), inside and outside classes;
- anchors: `^` where only the start of the text can be (the pattern's start, an alternative's
  start, the start of a group that is itself at the start) and `$` where only its end can be are
  no-ops under full-match semantics and are dropped; an anchor anywhere else could match only
  by reading nothing before (after) it, which is refused by name rather than guessed;
- flags, global (`(?i)ab`) or scoped (`(?i:ab)`, `(?-i:...)`): `i` (case-insensitive: a
  character class gains its characters' other cases), `s` (`.` also matches a line break),
  `u` (Unicode matching: already the default for text patterns) and `m` (multiline: the same
  language when every anchor is at an end, which is the only place anchors are taken).
  Other letters (`x`, `a`, `L`) are refused by name. With `ascii_case` (XGrammar's `Regex()`
  macro) `i` folds ASCII letters only;
- named groups `(?P<name>...)` and `(?<name>...)` (ECMAScript's / .NET's spelling): plain
  groups, the name unused.
"""

from __future__ import annotations

from grammar.automata import interegular_adapter as ip
from grammar.errors import GrammarError

_HEX = "0123456789abcdefABCDEF"
_OCTAL = "01234567"
_ANY = ip.CharGroup(frozenset(), True)  # `.` under the s flag: every character


class Anchor:
    """`^` (`start` true) or `$` in the parse tree, until `without_anchors` checks and drops
    it."""

    __slots__ = ("start",)

    def __init__(self, start: bool) -> None:
        self.start = start


class UserPattern(ip.ParsePattern):
    """interegular's parser with the escapes, anchors and flags of the module doc."""

    def __init__(self, data: str) -> None:
        super().__init__(data)
        self.anchors = 0

    def atom(self):
        for text, start in (("^", True), ("$", False)):
            if self.static_b(text):
                self.anchors += 1
                return Anchor(start)
        return super().atom()

    def escaped(self, inner: bool = False) -> ip.CharGroup:
        code = self._code_point()
        if code is not None:
            return ip.CharGroup(frozenset({chr(code)}), False)
        return super().escaped(inner)

    def _code_point(self) -> int | None:
        """The code point of an escape interegular does not read (the index after it), or
        None with the index unchanged."""
        data, at = self.data, self.index
        head = data[at : at + 1]
        if head == "e":
            self.index += 1
            return 0x1B
        if head == "0" and data[at + 1 : at + 2] not in tuple(_OCTAL):
            self.index += 1
            return 0
        if head == "c":
            letter = data[at + 1 : at + 2]
            if not (letter.isascii() and letter.isalpha()):
                raise GrammarError(f"regex escape \\c needs an ASCII letter in {data[:200]!r}")
            self.index += 2
            return ord(letter) % 32
        if head == "u" and data[at + 1 : at + 2] == "{":
            end = data.find("}", at)
            digits = data[at + 2 : end] if end > 0 else ""
            return self._take_hex(digits, end + 1, "\\u{...}")
        if head in ("u", "U"):
            width = 4 if head == "u" else 8
            digits = data[at + 1 : at + 1 + width]
            if len(digits) != width:
                digits = ""
            return self._take_hex(digits, at + 1 + width, f"\\{head} with {width} hex digits")
        return None

    def _take_hex(self, digits: str, after: int, what: str) -> int:
        if not digits or len(digits) > 8 or any(c not in _HEX for c in digits):
            raise GrammarError(f"regex escape {what} is malformed in {self.data[:200]!r}")
        code = int(digits, 16)
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise GrammarError(f"regex escape {what}: no character U+{code:X}")
        self.index = after
        return code


def parse_user_regex(pattern: str, ascii_case: bool = False) -> ip.Pattern:
    """`pattern` parsed (interegular nodes, flags applied, end anchors dropped, simplified);
    interegular's own exceptions for what its parser refuses. `ascii_case`: the `i` flag folds
    ASCII letters only."""
    parser = UserPattern(_without_u_flag(pattern))
    node = parser.parse()
    if "(?" in pattern:
        node = _with_flags(node, _NONE, pattern, ascii_case)
    if parser.anchors:
        node = without_anchors(node, pattern)
    return node.simplify()


def _without_u_flag(pattern: str) -> str:
    """`pattern` with the `u` flag left out of its flag groups (`(?u)`, `(?iu:`): Unicode
    matching is what a text pattern has anyway; interegular does not know the letter."""
    if "(?" not in pattern:
        return pattern
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":  # a leading ] is a member
                out.append("[]")
                i += 2
                continue
        elif pattern.startswith("(?<", i) and pattern[i + 3 : i + 4] not in ("=", "!"):
            out.append("(?P<")  # a named group in ECMAScript's spelling
            i += 3
            continue
        elif pattern.startswith("(?", i):
            j = i + 2
            while j < len(pattern) and pattern[j] in "aiLmsux-":
                j += 1
            if j > i + 2 and pattern[j : j + 1] in (":", ")"):
                letters = pattern[i + 2 : j].replace("u", "")
                if letters or pattern[j] == ":":
                    out.append("(?" + letters + pattern[j])
                i = j + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


# ---- flags --------------------------------------------------------------------------------------

_I = ip.REFlags.CASE_INSENSITIVE
_S = ip.REFlags.SINGLE_LINE
_NONE = ip.REFlags(0)


def _with_flags(node, flags, pattern: str, ascii_case: bool = False):
    """`node` with the i / s flags in force applied to its characters, and no flags left
    (interegular knows i, s and m; it refuses the other letters by name)."""
    tp = type(node)
    if tp is ip.Pattern:
        inner = (flags | node.added_flags) & ~node.removed_flags
        return ip.Pattern(tuple(_with_flags(o, inner, pattern, ascii_case) for o in node.options))
    if tp is ip.Concatenation:
        return ip.Concatenation(
            tuple(_with_flags(p, flags, pattern, ascii_case) for p in node.parts)
        )
    if tp is ip.Repeated:
        return ip.Repeated(_with_flags(node.base, flags, pattern, ascii_case), node.min, node.max)
    if tp is ip.CharGroup and flags & _I:
        return ip.CharGroup(_other_cases(node.chars, ascii_case), node.negated)
    if node is ip.DOT and flags & _S:
        return _ANY
    return node


def _other_cases(chars: frozenset[str], ascii_only: bool = False) -> frozenset[str]:
    out = set(chars)
    for c in chars:
        if ascii_only and not ("a" <= c <= "z" or "A" <= c <= "Z"):
            continue
        for other in (c.lower(), c.upper(), c.swapcase()):
            if len(other) == 1:
                out.add(other)
    return frozenset(out)


# ---- anchors ------------------------------------------------------------------------------------


def without_anchors(node, pattern: str):
    """`node` with its anchors dropped, each checked to stand where only the text's start
    (`^`) or end (`$`) can be; GrammarError naming the first that does not."""
    return _drop(node, True, True, pattern)


def _drop(node, at_start: bool, at_end: bool, pattern: str):
    tp = type(node)
    if tp is Anchor:
        if not (at_start if node.start else at_end):
            where = "start" if node.start else "end"
            sign = "^" if node.start else "$"
            raise GrammarError(
                f"regex anchor {sign!r} is not at the {where} of the text (only anchors at the "
                f"pattern's {where}s are supported) in {pattern[:200]!r}"
            )
        return ip.EMPTY
    if tp is ip.Pattern:
        options = tuple(_drop(o, at_start, at_end, pattern) for o in node.options)
        return ip.Pattern(options, node.added_flags, node.removed_flags)
    if tp is ip.Concatenation:
        parts = node.parts
        out = []
        for i, part in enumerate(parts):
            start = at_start and all(map(_reads_nothing, parts[:i]))
            end = at_end and all(map(_reads_nothing, parts[i + 1 :]))
            out.append(_drop(part, start, end, pattern))
        return ip.Concatenation(tuple(out))
    if tp is ip.Repeated:
        once = node.max is not None and node.max <= 1
        return ip.Repeated(
            _drop(node.base, at_start and once, at_end and once, pattern), node.min, node.max
        )
    return node


def _reads_nothing(node) -> bool:
    """An anchor, or the empty piece a global flag group (`(?m)`) leaves."""
    return type(node) is Anchor or node is ip.EMPTY
