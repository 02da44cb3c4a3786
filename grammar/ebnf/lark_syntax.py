"""Lark grammar text as llguidance writes it -> a syntax tree (`parse_lark`).

The dialect is lark's (rules `name: ...`, terminals `NAME: ...`, `"literal"i`, `/regex/flags`,
`"a".."z"`, `[optional]`, `x ~ n..m`, `->` aliases, `?` / `!` / `_` rule prefixes, `.N`
priorities, `%ignore`, `%import common...`) with llguidance's additions:

    x{M,N}  x{N}  x{M,}  x{,N}      repetition, like `x ~ M..N`
    // comment                      beside `# comment`
    my-rule  MY-TOKEN               `-` inside identifiers
    %json { ...schema... }          an inline JSON Schema, used like a rule
    %regex { "substring_words": "..." }   a structured regex (also substring_chunks / _chars)
    %llguidance { ...options... }   grammar options (merged when given several times)
    <|name|>  <name>  <[12]>  <[1-5,9]>  <[^3]>  <[*]>    special tokens
    A & B   ~A                      intersection / negation of regular languages
    name[lazy, max_tokens=5, ...]:  rule attributes

Strings use JSON's escapes (plus `\\xHH`). This module only reads text: what each construct
means is `grammar.ebnf.lark_lower`'s business. Errors are GrammarErrors naming the line and
column (and the construct).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from grammar.errors import GrammarError

# ----- the syntax tree -----


@dataclass(slots=True, frozen=True)
class Literal:
    text: str
    flags: str
    line: int


@dataclass(slots=True, frozen=True)
class RegexLit:
    pattern: str
    flags: str
    line: int


@dataclass(slots=True, frozen=True)
class CharRange:
    lo: str
    hi: str
    line: int


@dataclass(slots=True, frozen=True)
class Name:
    """A rule (lowercase) or terminal (uppercase) reference."""

    name: str
    line: int


@dataclass(slots=True, frozen=True)
class SpecialToken:
    text: str  # as written, with its angle brackets
    line: int


@dataclass(slots=True, frozen=True)
class InlineJson:
    schema: object
    line: int


@dataclass(slots=True, frozen=True)
class RegexExt:
    spec: object
    line: int


@dataclass(slots=True, frozen=True)
class NestedLark:
    """`%lark { ... }`: a whole grammar (its own names, `start`, `%ignore` and options) used as
    one element."""

    file: LarkFile
    line: int


@dataclass(slots=True, frozen=True)
class Refused:
    """A construct read but not supported (named in `what`); refused where it is lowered."""

    what: str
    line: int


@dataclass(slots=True, frozen=True)
class Not:
    item: object
    line: int


@dataclass(slots=True, frozen=True)
class Repeat:
    item: object
    lo: int
    hi: int | None


@dataclass(slots=True, frozen=True)
class Sequence:
    items: tuple


@dataclass(slots=True, frozen=True)
class And:
    parts: tuple  # Sequences
    line: int


@dataclass(slots=True, frozen=True)
class Choice:
    options: tuple


@dataclass(slots=True)
class RuleDef:
    name: str
    body: object
    line: int
    attributes: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class LarkFile:
    rules: dict[str, RuleDef] = field(default_factory=dict)
    terminals: dict[str, RuleDef] = field(default_factory=dict)
    ignore: list[object] = field(default_factory=list)
    imports: list[tuple[str, str, int]] = field(default_factory=list)  # (name, alias, line)
    options: dict[str, object] = field(default_factory=dict)


# ----- the lexer -----

_PUNCT = ["::", "..", "->", ":", "=", ",", ".", "(", ")", "{", "}", "[", "]", "~", "|", "&", "_"]
_KEYWORDS = tuple(
    "ignore import override declare json regex llguidance if lark grammar_options".split()
)
_JSON_KEYWORDS = ("%json", "%regex", "%llguidance", "%grammar_options")
_PATTERNS = [
    ("skip", re.compile(r"(#|//)[^\n]*|[ \t]+|\\\r?\n")),
    ("keyword", re.compile(r"%(" + "|".join(_KEYWORDS) + r")\b")),
    ("op", re.compile(r"[+*?]")),
    ("rule", re.compile(r"!?[_?]?[a-z][_a-z0-9\-]*")),
    ("token", re.compile(r"_?[A-Z][_A-Z0-9\-]*")),
    ("string", re.compile(r'"(\\.|[^"\\\n])*"i?')),
    ("regexp", re.compile(r"/(\\.|[^/\\\n])+/[imslux]*")),
    ("number", re.compile(r"[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")),
    ("newline", re.compile(r"(\r?\n[ \t]*)+")),
    ("special", re.compile(r"<[^<>\s]+>")),
    ("grammar_ref", re.compile(r"@[a-zA-Z0-9_\-]+")),
]


@dataclass(slots=True)
class Tok:
    kind: str  # a punctuation mark itself, or one of _PATTERNS' names
    text: str
    line: int
    col: int
    value: object = None  # the JSON value after %json / %regex / %llguidance


def _error(line: int, col: int, msg: str) -> GrammarError:
    return GrammarError(f"lark grammar error at line {line}, column {col}: {msg}")


def tokenize(text: str) -> list[Tok]:
    """The grammar's lexemes (longest match; white space and comments dropped). A `%lark {...}`
    block is one token whose value is the block's own tokens (ending with "eof")."""
    return _lex(text, 0, 1, 0, 0)[0]


def _lex(text: str, pos: int, line: int, line_start: int, block: int) -> tuple:
    """Tokens from `pos` to the end, or (`block`: how deep in `%lark {` blocks) to the `}`
    closing the block: (tokens, position after the block, line, line start)."""
    if block > MAX_NESTING:
        raise _error(line, pos - line_start + 1, f"%lark blocks nest deeper than {MAX_NESTING}")
    out: list[Tok] = []
    depth = 0
    decoder = json.JSONDecoder()
    while pos < len(text):
        best_kind, best_end = "", pos
        for p in _PUNCT:
            if text.startswith(p, pos) and pos + len(p) > best_end:
                best_kind, best_end = p, pos + len(p)
        for kind, rx in _PATTERNS:
            m = rx.match(text, pos)
            if m is not None and m.end() > best_end:
                best_kind, best_end = kind, m.end()
        col = pos - line_start + 1
        if not best_kind:
            raise _error(line, col, f"unexpected character {text[pos]!r}")
        tok = Tok(best_kind, text[pos:best_end], line, col)
        if block and best_kind in ("{", "}"):
            depth += 1 if best_kind == "{" else -1
            if depth < 0:
                out.append(Tok("eof", "", line, col))
                return out, best_end, line, line_start
        if best_kind == "keyword" and tok.text == "%lark":
            start = best_end
            while start < len(text) and text[start] in " \t\r\n":
                if text[start] == "\n":
                    line, line_start = line + 1, start + 1
                start += 1
            if not text.startswith("{", start):
                raise _error(line, col, "%lark needs a grammar in braces: %lark { ... }")
            tok.value, pos, line, line_start = _lex(text, start + 1, line, line_start, block + 1)
            out.append(tok)
            continue
        if best_kind == "keyword" and tok.text in _JSON_KEYWORDS:
            start = best_end
            while start < len(text) and text[start] in " \t\r\n":
                start += 1
            try:
                tok.value, best_end = decoder.raw_decode(text, start)
            except json.JSONDecodeError as e:
                raise _error(line, col, f"{tok.text} needs a JSON value: {e}") from None
        for m in re.finditer("\n", text[pos:best_end]):
            line, line_start = line + 1, pos + m.end()
        if best_kind != "skip":
            out.append(tok)
        pos = best_end
    if block:
        raise _error(line, pos - line_start + 1, "a %lark { ... } block is not closed")
    out.append(Tok("eof", "", line, pos - line_start + 1))
    return out, pos, line, line_start


# ----- the parser -----

MAX_NESTING = 50
_STOPS = {"newline", "|", "->", "}", ")", "]", "&", "eof", "keyword:%if"}


class _Parser:
    def __init__(self, toks: list[Tok]) -> None:
        self.toks = toks
        self.i = 0
        self.depth = 0

    def peek(self, k: int = 0) -> Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def at(self, kind: str) -> bool:
        return self.peek().kind == kind

    def take(self, kind: str) -> Tok:
        t = self.peek()
        if t.kind != kind:
            raise self.error(f"expected {kind!r}, found {t.text or t.kind!r}")
        self.i += 1
        return t

    def error(self, msg: str, tok: Tok | None = None) -> GrammarError:
        t = tok or self.peek()
        return _error(t.line, t.col, msg)

    def skip_newlines(self) -> None:
        while self.at("newline"):
            self.i += 1

    def kind_of_next(self) -> str:
        t = self.peek()
        return f"keyword:{t.text}" if t.kind == "keyword" else t.kind

    # ----- items -----
    def file(self) -> LarkFile:
        f = LarkFile()
        while True:
            self.skip_newlines()
            t = self.peek()
            if t.kind == "eof":
                return f
            if t.kind == "rule":
                self.rule(f)
            elif t.kind == "token":
                self.terminal(f)
            elif t.kind == "keyword":
                self.statement(f)
            else:
                raise self.error(f"expected a rule, a terminal or a statement, found {t.text!r}")
            if not self.at("eof"):
                self.take("newline")

    def _priority(self) -> None:
        if self.at("."):
            self.i += 1
            self.take("number")  # no effect on the language (see lark_lower)

    def rule(self, f: LarkFile) -> None:
        t = self.take("rule")
        name = t.text.lstrip("!?")
        if self.at("::"):
            raise self.error(f"rule {name!r}: parametric rules (name::_) are not supported")
        if self.at("{"):
            raise self.error(f"rule {name!r}: templates (rule{{params}}) are not supported")
        self._priority()
        attributes = self.attributes(name) if self.at("[") else {}
        self.take(":")
        if name in f.rules:
            raise self.error(f"rule {name!r} is defined twice", t)
        f.rules[name] = RuleDef(name, self.choice(), t.line, attributes)

    def terminal(self, f: LarkFile) -> None:
        t = self.take("token")
        if self.at("{"):
            raise self.error(f"terminal {t.text}: templates are not supported")
        self._priority()
        self.take(":")
        if t.text in f.terminals:
            raise self.error(f"terminal {t.text} is defined twice", t)
        f.terminals[t.text] = RuleDef(t.text, self.choice(), t.line)

    def attributes(self, rule: str) -> dict[str, object]:
        """`[key, key=value, ...]`: values are strings, numbers, regexes or terminal names."""
        self.take("[")
        out: dict[str, object] = {}
        while not self.at("]"):
            key = self.take("rule").text
            if key in out:
                raise self.error(f"rule {rule!r}: attribute {key!r} is given twice")
            if self.at("="):
                self.i += 1
                v = self.peek()
                if v.kind in ("string", "regexp", "token", "special"):
                    out[key] = self.atom()
                elif v.kind == "number":
                    self.i += 1
                    out[key] = float(v.text)
                else:
                    raise self.error(f"rule {rule!r}: bad value for attribute {key!r}")
            else:
                out[key] = True
            if not self.at(","):
                break
            self.i += 1
        self.take("]")
        return out

    def statement(self, f: LarkFile) -> None:
        t = self.take("keyword")
        if t.text == "%ignore":
            f.ignore.append(self.choice())
        elif t.text == "%import":
            self.import_(f, t)
        elif t.text in ("%llguidance", "%grammar_options"):
            if not isinstance(t.value, dict):
                raise self.error(f"{t.text} takes a JSON object of options", t)
            f.options.update(t.value)
        else:
            raise self.error(f"{t.text} is not supported", t)

    def import_(self, f: LarkFile, t: Tok) -> None:
        path = [self.name_text()]
        while self.at("."):
            self.i += 1
            path.append(self.name_text())
        if path[0] != "common":
            raise self.error(f"%import {'.'.join(path)}: only lark's `common` is available", t)
        if len(path) == 1 and self.at("("):
            self.i += 1
            while not self.at(")"):
                name = self.name_text()
                f.imports.append((name, name, t.line))
                if self.at(","):
                    self.i += 1
            self.take(")")
            return
        if len(path) != 2:
            raise self.error(f"%import {'.'.join(path)}: expected common.NAME", t)
        alias = path[1]
        if self.at("->"):
            self.i += 1
            alias = self.name_text()
        f.imports.append((path[1], alias, t.line))

    def name_text(self) -> str:
        if self.at("rule") or self.at("token"):
            return self.take(self.peek().kind).text
        raise self.error(f"expected a name, found {self.peek().text!r}")

    # ----- expressions -----
    def choice(self) -> object:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"the grammar nests deeper than {MAX_NESTING}")
        options = [self.conjunction()]
        while True:
            if self.at("|"):
                self.i += 1
            elif self.at("newline") and self.peek(1).kind == "|":
                self.i += 2
            else:
                break
            options.append(self.conjunction())
        self.depth -= 1
        return options[0] if len(options) == 1 else Choice(tuple(options))

    def conjunction(self) -> object:
        line = self.peek().line
        parts = [self.sequence()]
        while self.at("&"):
            self.i += 1
            parts.append(self.sequence())
        if self.at("->"):  # an alias names the tree node: no effect on the language
            self.i += 1
            self.name_text()
        if self.kind_of_next() == "keyword:%if":
            raise self.error("%if conditions (parametric grammars) are not supported")
        return parts[0] if len(parts) == 1 else And(tuple(parts), line)

    def sequence(self) -> Sequence:
        items = []
        while True:
            if self.depth > 1:  # inside brackets, line breaks are white space
                self.skip_newlines()
            if self.kind_of_next() in _STOPS:
                return Sequence(tuple(items))
            items.append(self.postfix())

    def postfix(self) -> object:
        item = self.atom()
        t = self.peek()
        if t.kind == "op":
            self.i += 1
            return Repeat(item, 0 if t.text != "+" else 1, None if t.text != "?" else 1)
        if t.kind == "~" and self.peek(1).kind == "number":
            self.i += 1
            lo = self.count()
            hi = lo
            if self.at(".."):
                self.i += 1
                hi = self.count()
            if hi < lo:
                raise self.error(f"repetition ~ {lo}..{hi}: the maximum is below the minimum", t)
            return Repeat(item, lo, hi)
        if t.kind == "{":
            return self.braces(item)
        return item

    def count(self) -> int:
        t = self.take("number")
        if not re.fullmatch(r"\+?[0-9]+", t.text):
            raise self.error(f"a repetition count must be a whole number, got {t.text!r}", t)
        return int(t.text)

    def braces(self, item: object) -> Repeat:
        t = self.take("{")
        lo = 0 if self.at(",") else self.count()
        hi: int | None = lo
        if self.at(","):
            self.i += 1
            hi = None if self.at("}") else self.count()
        self.take("}")
        if hi is not None and hi < lo:
            raise self.error(f"repetition {{{lo},{hi}}}: the maximum is below the minimum", t)
        return Repeat(item, lo, hi)

    def atom(self) -> object:
        t = self.peek()
        if t.kind == "~":
            self.i += 1
            return Not(self.atom(), t.line)
        self.i += 1
        if t.kind in ("(", "["):
            close = ")" if t.kind == "(" else "]"
            self.depth += 1
            self.skip_newlines()
            body = self.choice()
            self.skip_newlines()
            self.depth -= 1
            self.take(close)
            return body if close == ")" else Repeat(body, 0, 1)
        if t.kind == "string":
            text = self.string(t)
            if self.at(".."):
                self.i += 1
                t2 = self.take("string")
                return CharRange(text, self.string(t2), t.line)
            return Literal(text, "i" if t.text.endswith("i") else "", t.line)
        if t.kind == "regexp":
            end = t.text.rfind("/")
            return RegexLit(t.text[1:end], t.text[end + 1 :], t.line)
        if t.kind in ("rule", "token"):
            if self.at("{") and self.peek(1).kind not in ("number", ","):
                raise self.error(f"template usage {t.text}{{...}} is not supported", t)
            if self.at("::"):
                raise self.error(f"parametric reference {t.text}::... is not supported", t)
            return Name(t.text, t.line)
        if t.kind == "special":
            return SpecialToken(t.text, t.line)
        if t.kind == "keyword" and t.text == "%json":
            return InlineJson(t.value, t.line)
        if t.kind == "keyword" and t.text == "%regex":
            return RegexExt(t.value, t.line)
        if t.kind == "keyword" and t.text == "%lark":
            return NestedLark(_Parser(t.value).file(), t.line)
        if t.kind == "grammar_ref":
            raise self.error(
                f"grammar reference {t.text}: no grammar of that name was given (named grammars "
                "are passed to compile_lark as named_grammars)",
                t,
            )
        self.i -= 1
        raise self.error(f"expected an expression, found {t.text or t.kind!r}")

    def string(self, t: Tok) -> str:
        body = t.text[:-1] if t.text.endswith("i") else t.text
        # \xHH is not JSON: spell it \u00HH first
        body = re.sub(r"\\\\|\\x([0-9a-fA-F]{2})", _hex_escape, body)
        try:
            return json.loads(body)
        except json.JSONDecodeError as e:
            raise self.error(f"bad string literal {t.text}: {e}", t) from None


def _hex_escape(m: re.Match) -> str:
    return m.group(0) if m.group(1) is None else "\\u00" + m.group(1)


def parse_lark(text: str) -> LarkFile:
    """The syntax tree of a grammar; GrammarError with line and column on a syntax error."""
    if not isinstance(text, str):
        raise GrammarError(f"a lark grammar must be text, got {type(text).__name__}")
    return _Parser(tokenize(text)).file()


# ----- named grammars (`@name`) -----

MAX_INLINED_CHARS = 1_000_000
_GRAMMAR_NAME = re.compile(r"[A-Za-z0-9_\-]+")


def inline_named_grammars(text: str, named: object) -> str:
    """`text` with each `@name` reference (XGrammar's `named_grammars`, llguidance's grammar
    list) replaced by `%lark { <that grammar's text> }`: a whole grammar with its own names,
    `start` and `%ignore`, used as one element. References inside the named texts are expanded
    too; a cycle, an unknown name, a bad name or value, or an expansion past
    MAX_INLINED_CHARS is a GrammarError naming it."""
    if not isinstance(named, dict):
        raise GrammarError(f"named_grammars must be a dict of name -> lark text, got {named!r}")
    for name, value in named.items():
        if not isinstance(name, str) or not _GRAMMAR_NAME.fullmatch(name):
            raise GrammarError(f"named_grammars: invalid grammar name {name!r}")
        if not isinstance(value, str):
            raise GrammarError(f"named_grammars[{name!r}] must be lark text, got {value!r}")
    return _inline(text, named, (), {})


def _ref_offsets(toks: list[Tok], starts: list[int], out: list[tuple[int, str, Tok]]) -> None:
    for t in toks:
        if t.kind == "grammar_ref":
            out.append((starts[t.line - 1] + t.col - 1, t.text[1:], t))
        elif t.kind == "keyword" and t.text == "%lark":
            _ref_offsets(t.value, starts, out)


def _inline(text: str, named: dict, chain: tuple[str, ...], done: dict[str, str]) -> str:
    if "@" not in text:
        return text
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    refs: list[tuple[int, str, Tok]] = []
    _ref_offsets(tokenize(text), starts, refs)
    for offset, name, t in sorted(refs, key=lambda r: r[0], reverse=True):
        if name not in named:
            raise _error(
                t.line, t.col,
                f"grammar reference @{name}: no grammar of that name was given "
                f"(named_grammars: {', '.join(sorted(named)) or 'none'})",
            )  # fmt: skip
        if name in chain:
            cycle = " -> ".join(f"@{n}" for n in (*chain[chain.index(name) :], name))
            raise GrammarError(f"lark grammar error: circular named grammar reference: {cycle}")
        inner = done.get(name)
        if inner is None:  # the same text wherever it is used (a cycle shows the first time)
            inner = done[name] = _inline(named[name], named, (*chain, name), done)
        text = f"{text[:offset]}%lark {{\n{inner}\n}}{text[offset + len(name) + 1 :]}"
        if len(text) > MAX_INLINED_CHARS:
            raise GrammarError(
                f"lark grammar error: named grammars expand past {MAX_INLINED_CHARS} characters "
                f"(at @{name})"
            )
    return text
