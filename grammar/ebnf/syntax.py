"""GBNF / EBNF text -> rules of expression trees (llama.cpp's GBNF and XGrammar's EBNF dialect).

    name ::= expression          # a rule; any rule may be the root
    "text" 'text'                # literals: \\n \\t \\r \\\\ \\" \\' \\xHH \\uHHHH \\UHHHHHHHH
    [a-z0-9_] [^"\\\\]             # character classes: ranges, negation, the same escapes
    .                            # any character
    ( ... )                      # grouping
    x* x+ x? x{m} x{m,} x{m,n}   # repetition ({,n} too)
    a | b                        # alternation (a `|` may start a continuation line)

XGrammar's additions: white space before a repetition (`rule {2, 3}`); its builtins
`Regex("...", flags=..., json_string=...)`, `Substring("chunk", ...)` and
`TagDispatch(("trigger", rule), ..., loop_after_dispatch=..., excludes=(...))`; a lookahead
assertion `(= ...)` ending a rule's body, which XGrammar uses to prune token masks and which does
not change the strings its parser accepts (so neither does ours: it is parsed and checked, and
the rule's language is its body's); and rule options `name[...] ::=`, of which `capture`
(recording spans, no effect on the language) is taken, `lazy` and `max_chars=N` honoured (the
rule's body must be regular; see `grammar.ebnf.lower.commit_lazy_rules`) and the ones that
steer or bound output otherwise (`max_tokens`, `temperature`, ...) are refused by name. The
token-level builtins `Token(ids)`, `ExcludeToken(ids)` and `TokenTagDispatch((id, rule)...)` become
`TokenSet` nodes: one token matched by id (see `grammar.ebnf.token_terminals`), so a grammar that
uses one always compiles to the Earley form; so do llama.cpp's token references `<[1000]>` (an id),
`<think>` (the token of that text) and `!<...>` (any one token but that one).

A rule's body runs until the next `name ::=` (newlines are white space inside it), so a
continuation line may start with `|` or with any element. `#` starts a comment outside literals
and classes. Errors are `GrammarError`s naming the line (and the rule where there is one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial

from grammar.automata.dfa_ops import DFANode, product
from grammar.automata.fsm import node_to_dfa
from grammar.automata.nfa import parse_regex, parsed_or_refused
from grammar.automata.regex_syntax import parse_user_regex
from grammar.ebnf.free_text import free_text_dfa
from grammar.ebnf.substring import substring_dfa
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


@dataclass(slots=True, frozen=True)
class TokenSet:
    """One token matched by its id, never by its text (XGrammar's `Token(...)` /
    `ExcludeToken(...)`, llguidance's `<|name|>` / `<[ids]>`). `items`: token names (str:
    looked up in the vocabulary's `token_names`, else the one token whose bytes are the name)
    and inclusive id ranges (lo, hi); `negated`: any token but those (EOS ids never: EOS ends a
    constraint where its text is a sentence). `where` names it in errors. Resolved against the
    vocabulary when the grammar compiles (`grammar.ebnf.token_terminals`)."""

    items: tuple
    negated: bool = False
    where: str = ""


ANY_CHAR = Chars((), True)
MAX_REPEAT = 10_000


@dataclass(slots=True)
class Grammar:
    """Rules by name (in order of definition) and the line each was defined on."""

    rules: dict[str, object] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    # `name[lazy, max_chars=N] ::=`: name -> (lazy, N or None); see grammar.ebnf.lower
    lazy: dict[str, tuple[bool, int | None]] = field(default_factory=dict)


_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-.]*")
_RULE_START = re.compile(r"([A-Za-z0-9_][A-Za-z0-9_\-.]*)(\[[^\]\n]*\])?[ \t]*::=")
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
        self.lookaheads: list[object] = []  # parsed `(= ...)` bodies (their references checked)

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
    m = re.fullmatch(r"(\d*)(,(\d*|-1))?", body)  # XGrammar prints {n,-1} for {n,}
    if m is None or (not m.group(1) and not m.group(2)):
        raise r.error(f"bad repetition {{{body}}}", start)
    lo = int(m.group(1)) if m.group(1) else 0
    if m.group(2) is None:
        hi: int | None = lo
    else:
        hi = int(m.group(3)) if m.group(3) not in ("", "-1") else None
    if hi is not None and hi < lo:
        raise r.error(f"repetition {{{body}}}: the maximum is below the minimum", start)
    if max(lo, hi or 0) > MAX_REPEAT:
        raise r.error(f"repetition {{{body}}} exceeds the limit of {MAX_REPEAT}", start)
    return lo, hi


def _postfix(r: _Reader, item: object) -> object:
    while True:
        before = r.pos
        r.skip_space()  # XGrammar and llama.cpp read `x {2, 3}` and `x *` as repetitions
        c = r.peek()
        if c not in ("*", "+", "?", "{") or not c:
            r.pos = before
            return item
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
        elif c == "<" or (c == "!" and r.text.startswith("<", r.pos + 1)):
            item = _token_ref(r)
        elif r.text.startswith("(=", r.pos):
            _lookahead(r, nested)
            break
        elif c == "(":
            open_at = r.pos
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
            r.pos = m.end()
            if m.group(0) in _MACROS and r.peek() == "(":
                item = _macro(r, m.group(0))
            else:
                item = Ref(m.group(0), r.line(m.start()))
        items.append(_postfix(r, item))
    return items[0] if len(items) == 1 else Seq(tuple(items))


_MACROS = ("Regex", "Substring", "TagDispatch", "Token", "ExcludeToken", "TokenTagDispatch")


@dataclass(slots=True, frozen=True)
class _Name:
    """A bare name among a builtin's arguments (a rule, or `true` / `false`)."""

    name: str
    line: int


def _macro_value(r: _Reader) -> object:
    """One argument value: a string, an integer, true / false, a rule name or a tuple."""
    r.skip_space()
    c = r.peek()
    if c == '"':
        return _literal(r).text
    if c == "(":
        r.pos += 1
        items: list[object] = []
        while True:
            r.skip_space()
            if r.peek() == ")":
                r.pos += 1
                return tuple(items)
            items.append(_macro_value(r))
            r.skip_space()
            if r.peek() == ",":
                r.pos += 1
            elif r.peek() != ")":
                raise r.error("expected ',' or ')' in a tuple")
    m = re.compile(r"-?\d+").match(r.text, r.pos)
    if m is not None:
        r.pos = m.end()
        return int(m.group(0))
    m = _NAME.match(r.text, r.pos)
    if m is None:
        raise r.error(f"unexpected {c!r} in a builtin's arguments")
    r.pos = m.end()
    if m.group(0) in ("true", "false"):
        return m.group(0) == "true"
    return _Name(m.group(0), r.line(m.start()))


def _macro_arguments(r: _Reader, name: str) -> tuple[list[object], dict[str, object]]:
    r.pos += 1  # (
    args: list[object] = []
    named: dict[str, object] = {}
    while True:
        r.skip_space()
        if r.peek() == ")" and not args and not named:
            r.pos += 1
            return args, named
        m = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)[ \t]*=(?!=)").match(r.text, r.pos)
        if m is not None:
            if m.group(1) in named:
                raise r.error(f"{name}(): argument {m.group(1)!r} is given twice")
            r.pos = m.end()
            named[m.group(1)] = _macro_value(r)
        elif named:
            raise r.error(f"{name}(): a positional argument follows a named one")
        else:
            args.append(_macro_value(r))
        r.skip_space()
        if r.peek() == ",":
            r.pos += 1
        elif r.peek() == ")":
            r.pos += 1
            return args, named
        else:
            raise r.error(f"{name}(): expected ',' or ')'")


def _macro(r: _Reader, name: str) -> object:
    """A builtin call (the name read, `(` next) as an expression."""
    at = r.pos
    args, named = _macro_arguments(r, name)

    def fail(msg: str) -> GrammarError:
        return r.error(f"{name}(): {msg}", at)

    def option(key: str, kind: type, default: object) -> object:
        value = named.get(key, default)
        if not isinstance(value, kind):
            raise fail(f"{key} must be {'a boolean' if kind is bool else 'a ' + kind.__name__}")
        return value

    if name == "Regex":
        unknown = set(named) - {"flags", "json_string"}
        if unknown or len(args) != 1 or not isinstance(args[0], str):
            raise fail("takes one pattern string and the named flags= / json_string=")
        return _regex_leaf(
            args[0],
            option("flags", str, None) if "flags" in named else None,
            bool(option("json_string", bool, False)),
            fail,
        )
    if name == "Substring":
        if named or not all(isinstance(a, str) for a in args):
            raise fail("takes strings only")
        chunks = tuple(args)
        return Regular(DFANode(substring_dfa(chunks), "Substring", name), ("substring", chunks))
    where = f"line {r.line(at)}: {name}"
    if name in ("Token", "ExcludeToken"):
        if named:
            raise fail(f"takes no named arguments (got {sorted(named)[0]!r})")
        if not args or not all(_is_token_id(a) for a in args):
            raise fail("takes one or more token ids (non-negative integers)")
        ids = tuple((a, a) for a in sorted(set(args)))  # type: ignore[misc]
        return TokenSet(ids, name == "ExcludeToken", f"{where}(...)")
    unknown = set(named) - {"loop_after_dispatch", "excludes"}
    if unknown:
        raise fail(f"unknown argument {sorted(unknown)[0]!r}")
    if name == "TokenTagDispatch":
        return _token_tag_dispatch(args, named, option, fail, where)
    pairs: list[tuple[str, object]] = []
    for a in args:
        if not (isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str) and a[0]):
            raise fail('each trigger is a pair ("non-empty trigger", rule)')
        if not isinstance(a[1], _Name) or isinstance(a[1], bool):
            raise fail(f"the rule of trigger {a[0]!r} must be a rule name")
        pairs.append((a[0], Ref(a[1].name, a[1].line)))
    excludes = option("excludes", tuple, ())
    if not all(isinstance(e, str) and e for e in excludes):  # type: ignore[union-attr]
        raise fail("excludes must be a tuple of non-empty strings")
    for e in excludes:  # type: ignore[union-attr]
        for t, _ in pairs:
            if t.startswith(e):
                raise fail(f"the excluded {e!r} is a prefix of the trigger {t!r}")
    loop = bool(option("loop_after_dispatch", bool, True))
    return dispatch(pairs, loop, list(excludes), f"line {r.line(at)}: TagDispatch")  # type: ignore[arg-type]


_TOKEN_REF = re.compile(r"<([^<>\s]+)>")


def _token_ref(r: _Reader) -> TokenSet:
    """llama.cpp's token syntax: `<[1000]>` (a token id), `<think>` (the token of that text),
    `!<...>` (any one token but that one)."""
    at = r.pos
    negated = r.peek() == "!"
    m = _TOKEN_REF.match(r.text, r.pos + int(negated))
    if m is None:
        raise r.error("expected a token <[id]> or <text>", at)
    r.pos = m.end()
    where = f"line {r.line(at)}: token {r.text[at : m.end()]}"
    body = m.group(1)
    if body.startswith("[") and body.endswith("]"):
        if not body[1:-1].isdigit():
            raise r.error(f"token {m.group(0)}: an id is a non-negative integer", at)
        item: object = (int(body[1:-1]), int(body[1:-1]))
    else:
        item = m.group(0)
    return TokenSet((item,), negated, where)


def _is_token_id(a: object) -> bool:
    return isinstance(a, int) and not isinstance(a, bool) and a >= 0


def _token_tag_dispatch(args: list, named: dict, option, fail, where: str) -> object:
    """`TokenTagDispatch((id, rule)..., loop_after_dispatch=, excludes=(ids))`: any token but
    the triggers and the excluded, until a trigger token; then its rule; then (with the loop)
    free tokens again."""
    pairs: list[tuple[int, object]] = []
    for a in args:
        if not (isinstance(a, tuple) and len(a) == 2 and _is_token_id(a[0])):
            raise fail("each trigger is a pair (token id, rule)")
        if not isinstance(a[1], _Name):
            raise fail(f"the rule of trigger token {a[0]} must be a rule name")
        pairs.append((a[0], Ref(a[1].name, a[1].line)))
    excludes = option("excludes", tuple, ())
    if not all(_is_token_id(e) for e in excludes):
        raise fail("excludes must be a tuple of token ids")
    overlap = set(excludes) & {t for t, _ in pairs}
    if overlap:
        raise fail(f"the trigger token {min(overlap)} is also excluded")
    loop = bool(option("loop_after_dispatch", bool, True))
    return token_dispatch(pairs, loop, list(excludes), where)


def token_dispatch(
    pairs: list[tuple[object, object]], loop: bool, excluded: list[object], where: str
) -> object:
    """The token-level dispatch (XGrammar's TokenTagDispatch / `token_dispatch`): free tokens
    (any token but the triggers and `excluded`), then a trigger token and its expression, then
    (with `loop`) free tokens again; it may end wherever the free tokens may. Triggers and
    excluded tokens are ids or names."""

    def item(t: object) -> object:
        return (t, t) if isinstance(t, int) else t

    stop = tuple(item(t) for t, _ in pairs) + tuple(item(e) for e in excluded)
    free = Rep(TokenSet(stop, True, f"{where} (free tokens)"), 0, None)
    if not pairs:
        return free
    options = tuple(Seq((TokenSet((item(t),), False, f"{where} trigger"), e)) for t, e in pairs)
    one = options[0] if len(options) == 1 else Alt(options)
    if loop:
        return Seq((free, Rep(Seq((one, free)), 0, None)))
    return Seq((free, Rep(one, 0, 1)))


_REGEX_FLAGS = frozenset("isu")
_JSON_SAFE = '[^"\\\\\x00-\x1f]*'  # characters a JSON string holds unescaped


def _regex_leaf(pattern: str, flags: str | None, json_string: bool, fail) -> Regular:
    """`Regex(pattern)`: without `flags` the pattern as written, `.` matching every character;
    with them, `.` stops at a line break unless `s` is given. `i` (a flag or `(?i)`) folds
    ASCII letters only, as XGrammar does."""
    if flags is not None and not set(flags) <= _REGEX_FLAGS:
        raise fail(
            f"unsupported flags {''.join(sorted(set(flags) - _REGEX_FLAGS))!r} (supported: i, s, u)"
        )
    prefix = "(?s)" if flags is None else (f"(?{flags})" if flags else "")
    try:  # XGrammar's `i` folds ASCII letters only
        node = parsed_or_refused(partial(parse_user_regex, ascii_case=True), prefix + pattern)
    except GrammarError as e:
        raise fail(str(e)) from None
    key = ("Regex", pattern, flags, json_string)
    if not json_string:
        return Regular(node, key)
    safe = node_to_dfa(parse_regex(_JSON_SAFE))
    return Regular(DFANode(product(node_to_dfa(node), safe, True), "Regex", "json_string"), key)


def _lookahead(r: _Reader, nested: int) -> None:
    """`(= ...)` at the end of a rule's body: parsed (its rules must exist like any other), and
    dropped from the language, as XGrammar's parser does (see the module doc)."""
    if nested:
        raise r.error("a lookahead assertion `(= ...)` may only end a rule's body")
    open_at = r.pos
    r.pos += 2
    body = _alternation(r, 1)
    if r.peek() != ")":
        raise r.error("unclosed lookahead assertion", open_at)
    r.pos += 1
    r.skip_space()
    if r.pos < len(r.text) and not r.at_rule_start():
        raise r.error("a lookahead assertion `(= ...)` may only end a rule's body")
    r.lookaheads.append(body)


_TAKEN_OPTIONS = {"capture"}  # spans recorded by XGrammar's matcher: no effect on the language


MAX_CHARS_LIMIT = 2**31 - 1


def _rule_options(r: _Reader, text: str, g: Grammar, name: str) -> None:
    """Read `[...]`'s options into `g` (`lazy`, `max_chars=N`; `capture` taken)."""
    for option in (o.strip() for o in text.split(",")):
        key, _, value = (p.strip() for p in option.partition("="))
        if key in _TAKEN_OPTIONS:
            continue
        lazy, budget = g.lazy.get(name, (False, None))
        if option == "lazy":
            g.lazy[name] = (True, budget)
            continue
        if key == "max_chars":
            if not value.isdigit() or int(value) > MAX_CHARS_LIMIT:
                raise r.error(f"max_chars takes a whole number 0..{MAX_CHARS_LIMIT}, got {value!r}")
            g.lazy[name] = (lazy, int(value))
            continue
        raise r.error(
            f"rule option {key!r} is not supported (it bounds or steers the rule's output; "
            f"taken: {', '.join(sorted(_TAKEN_OPTIONS | {'lazy', 'max_chars'}))})"
        )


def free_text(excluded: list[str] | tuple[str, ...], where: str) -> Regular:
    """A leaf for free text that contains none of `excluded`; `where` names its place."""
    if not all(isinstance(w, str) for w in excluded):
        raise GrammarError(f"{where}: excluded strings must be strings")
    key = tuple(sorted(set(excluded)))
    return Regular(DFANode(free_text_dfa(key), "any_text", where, None), ("free", key))


def dispatch(
    pairs: list[tuple[str, object]], loop: bool, excluded: list[str], where: str
) -> object:
    """XGrammar's TagDispatch: free text holding no trigger (nor an excluded string), then a
    trigger and its expression, then (with `loop`) free text again, and so on; it may end
    wherever the free text may."""
    free = free_text([t for t, _ in pairs] + list(excluded), where)
    if not pairs:
        return free
    options = tuple(Seq((Lit(t), e)) for t, e in pairs)
    one = options[0] if len(options) == 1 else Alt(options)
    if loop:
        return Seq((free, Rep(Seq((one, free)), 0, None)))
    return Seq((free, Rep(one, 0, 1)))


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
        if m.group(2):
            _rule_options(r, m.group(2)[1:-1], g, name)
        r.pos = m.end()
        body = _alternation(r, 0)
        r.skip_space()
        if r.peek() == ")":
            raise r.error("unbalanced ')'")
        g.rules[name] = body
        for i, assertion in enumerate(r.lookaheads):
            # kept as an unreachable rule, so that its references are checked like the others
            g.rules[f"{name}(={i})"] = assertion
            g.lines[f"{name}(={i})"] = g.lines[name]
        r.lookaheads.clear()
        r.rule = ""
    if not g.rules:
        raise GrammarError("GBNF grammar error: the grammar defines no rule")
    return g
