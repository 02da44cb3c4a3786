"""GBNF / EBNF text -> rules of expression trees (llama.cpp's GBNF and XGrammar's EBNF dialect).

    name ::= expression          # a rule; any rule may be the root
    "text" 'text'                # literals: \\n \\t \\r \\\\ \\" \\' \\xHH \\uHHHH \\UHHHHHHHH
    [a-z0-9_] [^"\\\\]             # character classes: ranges, negation, the same escapes
    .                            # any character
    ( ... )                      # grouping
    x* x+ x? x{m} x{m,} x{m,n}   # repetition ({,n} too)
    a | b                        # alternation (a `|` may start a continuation line)

A rule's body runs until the next `name ::=` (newlines are white space inside it), so a
continuation line may start with `|` or with any element. `#` starts a comment outside literals
and classes. Errors are `GrammarError`s naming the line (and the rule where there is one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from grammar.errors import GrammarError


@dataclass(slots=True, frozen=True)
class Lit:
    text: str


@dataclass(slots=True, frozen=True)
class Chars:
    """A character class: the code-point ranges (inclusive), or every other character."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(slots=True, frozen=True)
class Ref:
    name: str
    line: int = 0


@dataclass(slots=True, frozen=True)
class Seq:
    items: tuple


@dataclass(slots=True, frozen=True)
class Alt:
    options: tuple


@dataclass(slots=True, frozen=True)
class Rep:
    item: object
    lo: int
    hi: int | None  # None: unbounded


@dataclass(slots=True, frozen=True, eq=False)
class Regular:
    """A regex-tree leaf (grammar.automata.regex_ast), for front ends that build rules directly
    (structural tags put JSON Schemas, regexes and free text in as these). `key` identifies its
    language for caching (two leaves with the same key are the same language)."""

    node: object
    key: object


ANY_CHAR = Chars((), True)
MAX_REPEAT = 10_000


@dataclass(slots=True)
class Grammar:
    """Rules by name (in order of definition) and the line each was defined on."""

    rules: dict[str, object] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-.]*")
_RULE_START = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_\-.]*)[ \t]*::=")
MAX_NESTING = 200  # parenthesis depth
_SIMPLE_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "[": "[",
    "]": "]",
    "-": "-",
    "^": "^",
    "/": "/",
    "0": "\0",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "a": "\a",
    "e": "\x1b",
    "`": "`",
    ".": ".",
    "|": "|",
    "(": "(",
    ")": ")",
    "*": "*",
    "+": "+",
    "?": "?",
    "{": "{",
    "}": "}",
    " ": " ",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class _Reader:
    """A cursor over the grammar text that knows line numbers."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.rule = ""

    def line(self, pos: int | None = None) -> int:
        return self.text.count("\n", 0, self.pos if pos is None else pos) + 1

    def error(self, msg: str, pos: int | None = None) -> GrammarError:
        where = f"line {self.line(pos)}"
        if self.rule:
            where += f", rule {self.rule!r}"
        return GrammarError(f"GBNF grammar error at {where}: {msg}")

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_space(self) -> None:
        """Skip white space (newlines included) and comments."""
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif c == "#":
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            else:
                return

    def at_rule_start(self) -> re.Match | None:
        return _RULE_START.match(self.text, self.pos)

    def escape(self) -> str:
        """The character of the escape at pos (just after the backslash)."""
        c = self.peek()
        if not c:
            raise self.error("the text ends inside an escape")
        if c in _HEX_ESCAPES:
            width = _HEX_ESCAPES[c]
            digits = self.text[self.pos + 1 : self.pos + 1 + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.error(f"\\{c} needs {width} hex digits")
            self.pos += 1 + width
            code = int(digits, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise self.error(f"\\{c}{digits} is not a Unicode scalar value")
            return chr(code)
        if c in _SIMPLE_ESCAPES:
            self.pos += 1
            return _SIMPLE_ESCAPES[c]
        raise self.error(f"unknown escape \\{c}")


def _literal(r: _Reader) -> Lit:
    quote = r.peek()
    start = r.pos
    r.pos += 1
    out = []
    while True:
        c = r.peek()
        if not c:
            raise r.error("unterminated string literal", start)
        r.pos += 1
        if c == quote:
            return Lit("".join(out))
        if c == "\\":
            out.append(r.escape())
        else:
            out.append(c)


def _class(r: _Reader) -> Chars:
    start = r.pos
    r.pos += 1
    negated = r.peek() == "^"
    if negated:
        r.pos += 1
    ranges: list[tuple[int, int]] = []

    def one() -> str:
        c = r.peek()
        if not c:
            raise r.error("unterminated character class", start)
        r.pos += 1
        return r.escape() if c == "\\" else c

    while True:
        if not r.peek():
            raise r.error("unterminated character class", start)
        if r.peek() == "]":
            r.pos += 1
            break
        lo = one()
        hi = lo
        if r.peek() == "-" and r.text[r.pos + 1 : r.pos + 2] not in ("]", ""):
            r.pos += 1
            hi = one()
            if ord(hi) < ord(lo):
                raise r.error(f"character range {lo!r}-{hi!r} is reversed")
        ranges.append((ord(lo), ord(hi)))
    return Chars(tuple(sorted(set(ranges))), negated)


def _braces(r: _Reader) -> tuple[int, int | None]:
    start = r.pos
    end = r.text.find("}", r.pos)
    if end < 0:
        raise r.error("unterminated {m,n} repetition", start)
    body = r.text[r.pos + 1 : end].replace(" ", "")
    r.pos = end + 1
    m = re.fullmatch(r"(\d*)(,(\d*))?", body)
    if m is None or (not m.group(1) and not m.group(2)):
        raise r.error(f"bad repetition {{{body}}}", start)
    lo = int(m.group(1)) if m.group(1) else 0
    if m.group(2) is None:
        hi: int | None = lo
    else:
        hi = int(m.group(3)) if m.group(3) else None
    if hi is not None and hi < lo:
        raise r.error(f"repetition {{{body}}}: the maximum is below the minimum", start)
    if max(lo, hi or 0) > MAX_REPEAT:
        raise r.error(f"repetition {{{body}}} exceeds the limit of {MAX_REPEAT}", start)
    return lo, hi


def _postfix(r: _Reader, item: object) -> object:
    while True:
        c = r.peek()
        if c == "*":
            r.pos += 1
            item = Rep(item, 0, None)
        elif c == "+":
            r.pos += 1
            item = Rep(item, 1, None)
        elif c == "?":
            r.pos += 1
            item = Rep(item, 0, 1)
        elif c == "{":
            lo, hi = _braces(r)
            item = Rep(item, lo, hi)
        else:
            return item


def _sequence(r: _Reader, nested: int) -> object:
    items: list[object] = []
    while True:
        r.skip_space()
        c = r.peek()
        if not c or c == "|" or (c == ")" and nested):
            break
        if not nested and r.at_rule_start():
            break
        if c in "\"'":
            item: object = _literal(r)
        elif c == "[":
            item = _class(r)
        elif c == ".":
            r.pos += 1
            item = ANY_CHAR
        elif c == "(":
            open_at = r.pos
            if r.text.startswith("(=", r.pos):
                raise r.error("lookahead assertions `(= ...)` are not supported")
            if nested >= MAX_NESTING:
                raise r.error(f"parentheses nest deeper than {MAX_NESTING}")
            r.pos += 1
            item = _alternation(r, nested + 1)
            if r.peek() != ")":
                raise r.error("unclosed parenthesis", open_at)
            r.pos += 1
        else:
            m = _NAME.match(r.text, r.pos)
            if m is None:
                raise r.error(f"unexpected character {c!r}")
            item = Ref(m.group(0), r.line())
            r.pos = m.end()
        items.append(_postfix(r, item))
    return items[0] if len(items) == 1 else Seq(tuple(items))


def _alternation(r: _Reader, nested: int) -> object:
    options = [_sequence(r, nested)]
    while r.peek() == "|":
        r.pos += 1
        options.append(_sequence(r, nested))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def parse_gbnf(text: str) -> Grammar:
    """Parse GBNF / EBNF text into rules. GrammarError (with the line) on a syntax error or a
    rule defined twice."""
    if not isinstance(text, str):
        raise GrammarError(f"a GBNF grammar must be text, got {type(text).__name__}")
    r = _Reader(text)
    g = Grammar()
    while True:
        r.skip_space()
        if r.pos >= len(text):
            break
        m = r.at_rule_start()
        if m is None:
            raise r.error("expected a rule `name ::= ...`")
        name = m.group(1)
        if name in g.rules:
            raise r.error(f"rule {name!r} is defined twice (first on line {g.lines[name]})")
        g.lines[name] = r.line()
        r.rule = name
        r.pos = m.end()
        body = _alternation(r, 0)
        r.skip_space()
        if r.peek() == ")":
            raise r.error("unbalanced ')'")
        g.rules[name] = body
        r.rule = ""
    if not g.rules:
        raise GrammarError("GBNF grammar error: the grammar defines no rule")
    return g
