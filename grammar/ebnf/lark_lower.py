"""llguidance's lark dialect as a constraint: `compile_llguidance_lark(text, vocab, start)`.

Route. Plain lark goes through `grammar.cfg` (LALR(1), contextual lexer) and keeps its meaning;
`grammar.api.compile_lark` sends a grammar here when it uses one of llguidance's extensions
(`uses_llguidance_syntax`). llguidance parses with Earley and a lexer that reads each lexeme
from the grammar position (lark's `lexer='dynamic'`), so its grammars need not be LALR(1): this
module lowers the syntax tree of `grammar.ebnf.lark_syntax` to the rules of `grammar.ebnf.syntax`
and compiles them with the GBNF compiler (one regex when the start rule is regular, else the
Earley parser of `grammar.ebnf.earley`).

Meaning of each construct, as llguidance's docs/syntax.md states it:

- A *lexeme* is a string literal, a `/regex/`, a range `"a".."z"`, a terminal (an uppercase
  name: a regular expression, never recursive, no white space inside), a `%regex {...}`, an
  `&` / `~` expression, or a rule with lexeme attributes. Lowercase rules are context-free.
- `%ignore X`: X may follow any lexeme (repeatedly; exactly once at most with the option
  `"ignore_once": true`), and precede the first one only with `"allow_initial_skip": true`.
- `A & B` is the intersection of the regular languages, `~A` the complement (within valid
  UTF-8 text: llguidance's may also match invalid UTF-8, which no text output has). Both only
  over lexemes; a rule inside them is a GrammarError.
- `%json {schema}`: the JSON Schema compiler's language (`grammar.json_schema`), with the
  schema's `x-guidance` options and llguidance's default of flexible white space; a schema
  with recursive `$ref`s becomes rules (`json_schema_to_lark`), others one lexeme.
- `%regex {"substring_words" | "substring_chunks" | "substring_chars": ...}`: the runs of
  whole consecutive chunks (`grammar.ebnf.substring`); words are maximal runs of word
  characters, of white space, or of other characters.
- Rule attributes: `capture` / `capture="name"` (spans for the caller: no effect on the
  language) is taken; `lazy` (the lexeme is the shortest match: no proper prefix of it is in
  the language) and `suffix=X` (the lexeme body X, lazily) are honoured; `stop=`,
  `stop_capture=` (the stop text is hidden by backtracking tokens, which a matcher cannot
  do), `max_tokens=` (a token budget per lexeme) and `temperature=` (sampling) are refused
  by name.
- `%llguidance {...}`: `ignore_once` and `allow_initial_skip` are honoured; `no_forcing` and
  `allow_invalid_utf8` are taken when false and refused when true; others are refused by name.
- Priorities (`.N`), `?` / `!` / `_` rule prefixes and `->` aliases shape lark's parse tree or
  lexer choice, not the language: read and dropped.
- Special tokens are matched by token id (`grammar.ebnf.token_terminals`), as llguidance does:
  `<|x|>` / `<x>` name a token by its text (the tokenizer's added and special tokens, or the one
  token with those bytes; a name the vocabulary lacks is a GrammarError naming it), `<[12]>`,
  `<[1-5,9]>` list ids (ranges inclusive), `<[^3]>` is any token but those, `<[*]>` any token
  (a negated set or the wildcard never holds EOS: EOS ends the constraint as usual). Only in
  rules, not inside terminals. Refused by name: nested `%lark`, `@grammar` references,
  templates, parametric rules, `%declare`, `%override`.

Difference kept on purpose: llguidance's lexer is greedy (a lexeme that can go on is not ended
early), so `start: A "a"` with `A: /a+/` matches nothing there; here the grammar's language is
what the rules say ("aa" is a sentence). Every string llguidance accepts, we accept.
"""

from __future__ import annotations

import re
from typing import Any

from grammar.automata import regex_ast as ra
from grammar.automata.dfa_ops import DFANode, from_rows, product
from grammar.automata.fsm import DEAD, ByteDFA, node_to_dfa
from grammar.automata.nfa import parse_regex
from grammar.ebnf import lark_syntax as ls
from grammar.ebnf.compiler import compile_rules
from grammar.ebnf.lark_params import expand_parametric
from grammar.ebnf.lower import chars_node
from grammar.ebnf.substring import substring_dfa
from grammar.ebnf.syntax import Alt, Chars, Grammar, Lit, Ref, Regular, Rep, Seq, TokenSet
from grammar.errors import EmptyLanguageError, GrammarError
from grammar.tokens.cache import CompileCache
from grammar.tokens.vocab import TokenVocabulary

_CACHE: CompileCache = CompileCache(max_entries=128)

# lark's `common` library, written out as this dialect reads it (the same languages)
COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: "\"" (/[^"\\\n]/ | /\\[^\n]/)* "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" (/(?s:.*)/ & ~/(?s:.*)\*\/(?s:.*)/) "*/"
SQL_COMMENT: /--[^\n]*/
"""

_REFUSED_ATTRIBUTES = {
    "stop": "the stop text is hidden from the output by backtracking tokens",
    "stop_capture": "it names the text of `stop`, which is refused",
    "max_tokens": "a token budget per lexeme is not part of a text constraint",
    "temperature": "it changes sampling, not the language",
}
_OPTIONS = {"ignore_once", "allow_initial_skip", "no_forcing", "allow_invalid_utf8"}
_REGEX_FLAGS = set("imsu")
_FLEXIBLE_WS = r"[ \t\n\r]*"


_ID_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def special_token_set(e: ls.SpecialToken, where: str) -> TokenSet:
    """`<|name|>` / `<name>` (a token by its text), `<[12]>`, `<[1-5,9]>`, `<[^3]>`, `<[*]>`
    (token ids, ranges inclusive, `^` negating the list, `*` any token) as a token terminal."""
    at = f"lark grammar error at line {e.line}, {where}: special token {e.text}"
    body = e.text[1:-1]
    if not (body.startswith("[") and body.endswith("]")):
        return TokenSet((e.text,), False, at)
    inner = body[1:-1].strip()
    if inner == "*":
        return TokenSet((), True, at)
    negated = inner.startswith("^")
    items: list[tuple[int, int]] = []
    for part in (inner[1:] if negated else inner).split(","):
        m = _ID_RANGE.fullmatch(part)
        if m is None:
            raise GrammarError(f"{at}: expected token ids or ranges like 1-5, got {part!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo:
            raise GrammarError(f"{at}: the range {lo}-{hi} is reversed")
        items.append((lo, hi))
    return TokenSet(tuple(items), negated, at)


def uses_llguidance_syntax(text: str) -> bool:
    """Whether a lark grammar uses an llguidance extension (the route to this module): `%json`,
    `%regex`, `%llguidance`, special tokens, `&` / `~` operators, `{M,N}` repetition,
    rule attributes, parametric rules (`name::_`), `//` comments or `-` in names. False when
    the text does not lex."""
    try:
        toks = ls.tokenize(text)
    except GrammarError:
        return False
    for i, t in enumerate(toks):
        nxt = toks[i + 1].kind if i + 1 < len(toks) else "eof"
        if t.kind == "keyword" and t.text in ("%json", "%regex", "%llguidance", "%lark", "%if"):
            return True
        if t.kind in ("special", "&", "{", "grammar_ref", "::"):
            return True
        if t.kind == "~" and nxt != "number":
            return True
        if t.kind in ("rule", "token") and "-" in t.text:
            return True
        if t.kind == "rule" and nxt == "[" and i + 2 < len(toks) and toks[i + 2].kind == "rule":
            prev = toks[i - 1].kind if i else "newline"
            if prev == "newline":  # `name[attr...]:` at a rule's start
                return True
    return "//" in re.sub(r'"(\\.|[^"\\\n])*"|/(\\.|[^/\\\n])+/', "", text)


_COMMON_FILE: list[ls.LarkFile] = []


def _common() -> ls.LarkFile:
    if not _COMMON_FILE:
        _COMMON_FILE.append(ls.parse_lark(COMMON))
    return _COMMON_FILE[0]


def _lazy(dfa: ByteDFA) -> ByteDFA:
    """The shortest matches: strings of the language none of whose proper prefixes is in it
    (no transitions out of accepting states)."""
    rows = dfa.byte_table().copy()
    rows[dfa.accepting] = DEAD
    return from_rows(rows.tolist(), list(dfa.accepting))


def chunk_words(text: str) -> list[str]:
    """llguidance's words: maximal runs of white space, of word characters (alphanumeric or
    `_`), or of other characters."""

    def kind(c: str) -> int:
        return 0 if c.isspace() else 1 if (c.isalnum() or c == "_") else 2

    out: list[str] = []
    for c in text:
        if out and kind(out[-1][-1]) == kind(c):
            out[-1] += c
        else:
            out.append(c)
    return out


class LarkLowering:
    """One grammar's lowering to `grammar.ebnf.syntax` rules (prefix: for nested grammars)."""

    def __init__(self, f: ls.LarkFile, source: str, prefix: str = "") -> None:
        self.f = f
        self.source = source
        self.prefix = prefix
        self.g = Grammar()
        self._tokens: dict[tuple[str, str], object] = {}
        self._resolving: set[tuple[str, str]] = set()
        self._leaves = 0
        self._json = 0
        self.options = self._read_options(f.options)
        self.imports = {alias: (name, line) for name, alias, line in f.imports}
        self.ignore: object | None = None
        if f.ignore:
            node = ra.alt([self.term(e, "user", "%ignore") for e in f.ignore])
            if node is None:
                raise GrammarError("lark grammar error: %ignore matches nothing")
            one = self._leaf(node)
            self.ignore = Rep(one, 0, 1 if self.options.get("ignore_once") else None)

    # ----- options -----
    @staticmethod
    def _read_options(options: dict[str, Any]) -> dict[str, Any]:
        for key, value in options.items():
            if key not in _OPTIONS:
                raise GrammarError(f"%llguidance option {key!r} is not supported")
            if not isinstance(value, bool):
                raise GrammarError(f"%llguidance option {key!r} must be true or false")
            if key in ("no_forcing", "allow_invalid_utf8") and value:
                raise GrammarError(
                    f"%llguidance option {key!r}: true is not supported "
                    "(forced text is always forced; text is always valid UTF-8)"
                )
        return options

    # ----- terminals: regex trees -----
    def _leaf(self, node: object) -> Regular:
        self._leaves += 1
        return Regular(node, ("llguidance-lark", self.source, self.prefix, self._leaves))

    def _token(self, name: str, scope: str, line: int) -> object:
        if scope == "user" and name in self.f.terminals:
            key, d = (scope, name), self.f.terminals[name]
        elif scope == "user" and name in self.imports:
            common_name = self.imports[name][0]
            if common_name not in _common().terminals:
                raise GrammarError(f"lark grammar error: common.{common_name} does not exist")
            key, d, scope = ("common", common_name), _common().terminals[common_name], "common"
        elif scope == "common" and name in _common().terminals:
            key, d = (scope, name), _common().terminals[name]
        else:
            raise GrammarError(f"lark grammar error at line {line}: undefined terminal {name}")
        hit = self._tokens.get(key)
        if hit is not None:
            return hit
        if key in self._resolving:
            raise GrammarError(f"lark grammar error: terminal {name} refers to itself")
        self._resolving.add(key)
        node = self.term(d.body, scope, f"terminal {name}")
        self._resolving.discard(key)
        self._tokens[key] = node
        return node

    def term(self, e: object, scope: str, where: str) -> object:
        """The regex tree of a terminal-level expression."""
        if isinstance(e, ls.Literal):
            if "i" in e.flags:
                return parse_regex("(?i)" + ra.regex_escape(e.text)) if e.text else ra.EMPTY
            return ra.lit(e.text) if e.text else ra.EMPTY
        if isinstance(e, ls.RegexLit):
            return self._regex(e, where)
        if isinstance(e, ls.CharRange):
            if len(e.lo) != 1 or len(e.hi) != 1 or e.lo > e.hi:
                raise GrammarError(
                    f"lark grammar error at line {e.line}, {where}: bad range {e.lo!r}..{e.hi!r}"
                )
            return chars_node(Chars(((ord(e.lo), ord(e.hi)),)))
        if isinstance(e, ls.Name):
            if e.name.lstrip("_")[:1].isupper():
                return self._token(e.name, scope, e.line)
            raise GrammarError(
                f"lark grammar error at line {e.line}, {where}: the rule {e.name!r} cannot be "
                "used inside a terminal (or an & / ~ expression, or a lexeme attribute's rule)"
            )
        if isinstance(e, ls.Sequence):
            return ra.seq(*(self.term(i, scope, where) for i in e.items)) if e.items else ra.EMPTY
        if isinstance(e, ls.Choice):
            return ra.alt([self.term(o, scope, where) for o in e.options])
        if isinstance(e, ls.Repeat):
            return ra.repeat(self.term(e.item, scope, where), e.lo, e.hi)
        if isinstance(e, ls.Not):
            inner = self._dfa(self.term(e.item, scope, where), where, "~")
            universe = node_to_dfa(ra.parsed("(?s:.*)"))
            return DFANode(self._product(universe, inner, False, where, "~"), "~", where)
        if isinstance(e, ls.And):
            parts = [self._dfa(self.term(p, scope, where), where, "&") for p in e.parts]
            dfa = parts[0]
            for p in parts[1:]:
                dfa = self._product(dfa, p, True, where, "&")
            return DFANode(dfa, "&", where)
        if isinstance(e, ls.RegexExt):
            return self._regex_ext(e, where)
        return self._refuse_in_terminal(e, where)

    @staticmethod
    def _refuse_in_terminal(e: object, where: str) -> object:
        what = {
            ls.SpecialToken: "a special token",
            ls.InlineJson: "%json",
        }.get(type(e), type(e).__name__)
        raise GrammarError(
            f"lark grammar error at line {getattr(e, 'line', '?')}, {where}: "
            f"{what} cannot be used inside a terminal"
        )

    @staticmethod
    def _dfa(node: object, where: str, op: str) -> ByteDFA:
        if node is None:
            return node_to_dfa(ra.parsed("[^\\s\\S]"))
        try:
            return node_to_dfa(node)
        except GrammarError as e:
            raise GrammarError(f"lark grammar error, {where}: operand of {op!r}: {e}") from None

    @staticmethod
    def _product(a: ByteDFA, b: ByteDFA, keep: bool, where: str, op: str) -> ByteDFA:
        try:
            return product(a, b, keep)
        except GrammarError as e:
            raise GrammarError(f"lark grammar error, {where}: {op!r}: {e}") from None

    @staticmethod
    def _regex(e: ls.RegexLit, where: str) -> object:
        bad = set(e.flags) - _REGEX_FLAGS
        if bad:
            raise GrammarError(
                f"lark grammar error at line {e.line}, {where}: regex flag(s) "
                f"{''.join(sorted(bad))!r} not supported (supported: i, m, s, u)"
            )
        flags = e.flags.replace("u", "")
        try:
            return parse_regex((f"(?{flags})" if flags else "") + e.pattern)
        except GrammarError as err:
            raise GrammarError(f"lark grammar error at line {e.line}, {where}: {err}") from None

    @staticmethod
    def _regex_ext(e: ls.RegexExt, where: str) -> object:
        spec = e.spec
        kinds = ("substring_words", "substring_chunks", "substring_chars")
        given = [k for k in kinds if isinstance(spec, dict) and k in spec]
        if not isinstance(spec, dict) or len(given) != 1 or len(spec) != 1:
            raise GrammarError(
                f"lark grammar error at line {e.line}, {where}: %regex takes exactly one of "
                f"{', '.join(kinds)} (got {sorted(spec) if isinstance(spec, dict) else spec!r})"
            )
        value = spec[given[0]]
        if given[0] == "substring_chunks":
            ok = isinstance(value, list) and all(isinstance(c, str) for c in value)
            chunks = tuple(value) if ok else ()
        else:
            ok = isinstance(value, str)
            words = given[0] == "substring_words"
            chunks = tuple(chunk_words(value) if words else value) if ok else ()
        if not ok:
            raise GrammarError(
                f"lark grammar error at line {e.line}, {where}: %regex {given[0]} takes "
                + ("a list of strings" if given[0] == "substring_chunks" else "a string")
            )
        return DFANode(substring_dfa(chunks), "%regex", where)

    # ----- rules -----
    def lexeme(self, leaf: object) -> object:
        """A lexeme in a rule: the %ignore text may follow it."""
        return leaf if self.ignore is None else Seq((leaf, self.ignore))

    def expr(self, e: object, rule: str) -> object:
        """A rule-level expression as `grammar.ebnf.syntax` nodes."""
        where = f"rule {rule!r}"
        if isinstance(e, ls.Literal) and not e.flags:
            return self.lexeme(Lit(e.text))
        if isinstance(e, ls.Name) and not e.name.lstrip("_")[:1].isupper():
            if e.name not in self.f.rules:
                raise GrammarError(
                    f"lark grammar error at line {e.line}: {where} uses the undefined rule "
                    f"{e.name!r}"
                )
            return Ref(self.prefix + e.name, e.line)
        if isinstance(e, ls.Sequence):
            if not e.items:
                return Lit("")
            items = tuple(self.expr(i, rule) for i in e.items)
            return items[0] if len(items) == 1 else Seq(items)
        if isinstance(e, ls.Choice):
            return Alt(tuple(self.expr(o, rule) for o in e.options))
        if isinstance(e, ls.Repeat):
            return Rep(self.expr(e.item, rule), e.lo, e.hi)
        if isinstance(e, ls.SpecialToken):
            return special_token_set(e, where)
        if isinstance(e, ls.InlineJson):
            return self.lexeme(self._json_schema(e, where))
        node = self.term(e, "user", where)
        if node is None:
            raise GrammarError(f"lark grammar error, {where}: an expression matches nothing")
        return self.lexeme(self._leaf(node))

    def rule(self, d: ls.RuleDef) -> object:
        attrs = dict(d.attributes)
        attrs.pop("capture", None)  # spans for the caller; the language is the same
        for key in attrs:
            if key in _REFUSED_ATTRIBUTES:
                raise GrammarError(
                    f"lark grammar error at line {d.line}: rule {d.name!r}: attribute {key!r} is "
                    f"not supported ({_REFUSED_ATTRIBUTES[key]})"
                )
            if key not in ("lazy", "suffix"):
                raise GrammarError(
                    f"lark grammar error at line {d.line}: rule {d.name!r}: unknown attribute "
                    f"{key!r}"
                )
        if not attrs:
            return self.expr(d.body, d.name)
        where = f"rule {d.name!r} (a lexeme: lazy / suffix)"
        node = self.term(d.body, "user", where)
        if "suffix" in attrs:
            if not isinstance(attrs["suffix"], ls.Literal | ls.RegexLit | ls.Name):
                raise GrammarError(
                    f"lark grammar error at line {d.line}: rule {d.name!r}: suffix= takes a "
                    "string, a regex or a terminal name"
                )
            node = ra.seq(node, self.term(attrs["suffix"], "user", where))
        lazy = _lazy(self._dfa(node, where, "lazy"))
        return self.lexeme(self._leaf(DFANode(lazy, "lazy", where)))

    def _json_schema(self, e: ls.InlineJson, where: str) -> object:
        from grammar.json_schema.guidance import read_x_guidance, schema_is_recursive
        from grammar.json_schema.schema import json_schema_to_node

        at = f"%json at line {e.line} ({where})"
        try:
            schema, ws = read_x_guidance(e.schema, default_whitespace=_FLEXIBLE_WS)
            if not schema_is_recursive(schema):
                node = json_schema_to_node(schema, ws)
                return self._leaf(node)
            return self._recursive_json(schema, ws, at)
        except EmptyLanguageError:
            raise GrammarError(f"lark grammar error: {at}: the schema admits no instance") from None
        except GrammarError as err:
            raise GrammarError(f"lark grammar error: {at}: {err}") from None

    def _recursive_json(self, schema: Any, ws: str | None, at: str) -> object:
        from grammar.json_schema.lark import json_schema_to_lark

        if ws not in (None, "", _FLEXIBLE_WS):
            raise GrammarError(
                "x-guidance whitespace_pattern (a custom pattern) with a recursive schema is "
                "not supported"
            )
        text = json_schema_to_lark(schema, whitespace=bool(ws))
        self._json += 1
        inner = LarkLowering(ls.parse_lark(text), text, f"{self.prefix}%json{self._json}:")
        inner.lower_rules()
        self.g.rules.update(inner.g.rules)
        self.g.lines.update(inner.g.lines)
        return Ref(inner.prefix + "start")

    def lower_rules(self) -> None:
        for d in self.f.rules.values():
            self.g.rules[self.prefix + d.name] = self.rule(d)
            self.g.lines[self.prefix + d.name] = d.line

    def grammar(self, start: str) -> tuple[Grammar, str]:
        """The rules, and the root rule's name."""
        if start not in self.f.rules:
            raise GrammarError(f"lark grammar error: the start rule {start!r} is not defined")
        self.lower_rules()
        for d in self.f.terminals.values():  # every terminal must compile, used or not
            self._token(d.name, "user", d.line)
        root = "%root"
        body: object = Ref(start)
        if self.ignore is not None and self.options.get("allow_initial_skip"):
            body = Seq((self.ignore, body))
        self.g.rules[root] = body
        self.g.lines[root] = 0
        return self.g, root


def compile_llguidance_lark(text: str, vocab: TokenVocabulary, start: str = "start") -> Any:
    """A constraint from a lark grammar in llguidance's dialect (see the module docstring);
    the matcher interface of every compiled constraint. Cached by (text, start, vocab.hash).
    GrammarError naming the construct and its line for anything not supported."""

    return _CACHE.get_or_build(
        ("llguidance-lark", text, start, vocab.hash),
        lambda: build_llguidance_lark(text, vocab, start),
    )


def build_llguidance_lark(text: str, vocab: TokenVocabulary, start: str = "start") -> Any:
    """`compile_llguidance_lark` without its cache, for `grammar.compile` (which caches)."""
    text = expand_parametric(text)
    g, root = LarkLowering(ls.parse_lark(text), text).grammar(start)
    return compile_rules(g, vocab, root, text)


def clear_llguidance_lark_cache() -> None:
    _CACHE.clear()


def json_schema_rules(
    schema: Any, prefix: str, *, whitespace: str | None = None, json_schema_mode: str = "exact"
) -> tuple[Any, str] | None:
    """A recursive schema's language as grammar rules (`grammar.ebnf.syntax`, each name
    starting with `prefix`) and the name of its start rule, for a larger grammar (a
    structural tag's `json_schema` content): exact, with no depth limit. None when the schema
    is not recursive (its regex is exact) or when the context-free path cannot say one of its
    keywords (the regex path, which unrolls recursion to its depth, then says it)."""
    from grammar.json_schema.guidance import schema_is_recursive
    from grammar.json_schema.lark import json_schema_to_lark
    from grammar.json_schema.schema import load_schema

    try:
        if not schema_is_recursive(load_schema(schema)):
            return None
        text = json_schema_to_lark(
            schema, whitespace=whitespace or "", json_schema_mode=json_schema_mode
        )
    except (GrammarError, LookupError, ValueError, TypeError):
        return None
    low = LarkLowering(ls.parse_lark(text), text, prefix)
    low.lower_rules()
    return low.g, prefix + "start"
