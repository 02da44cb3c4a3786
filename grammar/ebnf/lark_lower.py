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
- Rule attributes: `capture` / `capture="name"` and `stop_capture="name"` (spans for the
  caller: no effect on the language) are taken; `lazy` (the lexeme is the shortest match: no
  proper prefix of it is in the language) and `suffix=X` (the lexeme body, then X, lazily) are
  honoured; `stop=X` as XGrammar reads it: the language of `suffix=X` (XGrammar keeps the
  marker in the output and hides it from captures only; llguidance takes the stop text back
  out of the output by backtracking tokens, which a text constraint cannot: the marker stays).
  `suffix` and `stop` together, an empty string marker (llguidance's end-of-sequence `stop=""`)
  and `stop_capture` without a marker are GrammarErrors; XGrammar's `max_chars=N` is honoured
  (`grammar.ebnf.lower.char_budget`); `max_tokens=` (a token budget per lexeme) and
  `temperature=` (sampling) are refused by name.
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

Lazy lexemes commit, as in llguidance's lexer (and XGrammar's tool-call dispatch): a lazy lexeme
is taken where it first matches, so a lexeme that may start at the same place never reads past
one of its matches. `start: tool* tail` with `tool_head[lazy]: TEXT "<tool_call>"` and `tail:
TEXT`: the free text ends at the first trigger, after which the tool's payload is due. This is
done in the lowering: where the rules let a lazy lexeme start beside others (the choices of an
alternation, a repetition's next round, the items a nullable item lets start early), those
lexemes become their text minus "a match of the lazy one, then anything"
(`LarkLowering._unless_lazy`; a rule whose first lexemes need it is copied, `name%unless(...)`).
Two lazy lexemes beside each other: the one that matches first is taken; both when they match at
the same byte (tools sharing a trigger). Only the lexemes at the start of the rules are cut: a
lazy lexeme that a caller's follow text (outside the rule that holds it) competes with is not
seen, nor one that starts beside a `%json` lexeme.

Difference kept on purpose: llguidance's lexer is greedy (a lexeme that can go on is not ended
early), so `start: A "a"` with `A: /a+/` matches nothing there; here the grammar's language is
what the rules say ("aa" is a sentence). XGrammar also accepts text with no trigger for a lone
lazy head (`start: head`, `head[lazy]: TEXT "<end>"`); here the head needs its trigger.
"""

from __future__ import annotations

import re
from typing import Any

from grammar.automata import regex_ast as ra
from grammar.automata.dfa_ops import DFANode, product
from grammar.automata.fsm import START, ByteDFA, node_to_dfa
from grammar.automata.nfa import parse_regex
from grammar.ebnf import lark_syntax as ls
from grammar.ebnf.compiler import compile_rules
from grammar.ebnf.lark_params import expand_parametric
from grammar.ebnf.lower import char_budget, chars_node, shortest_matches
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
    "max_tokens": "a token budget per lexeme is not part of a text constraint",
    "temperature": "it changes sampling, not the language",
}
_LEXEME_ATTRIBUTES = ("lazy", "suffix", "stop")
_DIALECT_KEYWORDS = ("%json", "%regex", "%llguidance", "%lark", "%if", "%grammar_options")
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
        if t.kind == "keyword" and t.text in _DIALECT_KEYWORDS:
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


def _check_markers(d: ls.RuleDef, attrs: dict[str, object]) -> None:
    """`suffix=` / `stop=` take one marker (a non-empty string, a regex or a terminal name),
    not both; `stop_capture=` (a name) needs one of them."""
    at = f"lark grammar error at line {d.line}: rule {d.name!r}"
    if "suffix" in attrs and "stop" in attrs:
        raise GrammarError(f"{at}: suffix= and stop= cannot be used together")
    for key in ("suffix", "stop"):
        marker = attrs.get(key)
        if key in attrs and not isinstance(marker, ls.Literal | ls.RegexLit | ls.Name):
            raise GrammarError(f"{at}: {key}= takes a string, a regex or a terminal name")
        if isinstance(marker, ls.Literal) and not marker.text:
            raise GrammarError(
                f'{at}: {key}="" (end of sequence as the marker) is not supported; '
                "give the marker text"
            )
    if "stop_capture" in attrs:
        if not isinstance(attrs["stop_capture"], ls.Literal):
            raise GrammarError(f"{at}: stop_capture= takes a name in quotes")
        if "suffix" not in attrs and "stop" not in attrs:
            raise GrammarError(f"{at}: stop_capture= needs suffix= or stop=")


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
        self._lazy_names = {
            n for n, d in f.rules.items() if any(k in _LEXEME_ATTRIBUTES for k in d.attributes)
        }
        self._lazy_dfas: dict[str, ByteDFA] = {}
        self._guarded: dict[tuple[str, frozenset[str]], Any] = {}
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
                raise GrammarError(
                    f"grammar option {key!r} (%llguidance / %grammar_options) is not supported"
                )
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
            ls.NestedLark: "%lark",
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

    def expr(self, e: object, rule: str, guard: frozenset[str] = frozenset()) -> object:
        """A rule-level expression as `grammar.ebnf.syntax` nodes. `guard`: the lazy lexemes
        (rule names) that may start where `e` starts; a lazy lexeme commits as soon as it
        matches, so the other lexemes starting there never read past one of its matches."""
        where = f"rule {rule!r}"
        if isinstance(e, ls.Name) and not e.name.lstrip("_")[:1].isupper():
            if e.name not in self.f.rules:
                raise GrammarError(
                    f"lark grammar error at line {e.line}: {where} uses the undefined rule "
                    f"{e.name!r}"
                )
            if e.name in self._lazy_names and guard - {e.name}:
                return self._guarded_lazy(e.name, guard - {e.name}, where)
            if guard and e.name not in self._lazy_names:
                return Ref(self._guarded_rule(e.name, guard), e.line)
            return Ref(self.prefix + e.name, e.line)
        if isinstance(e, ls.Sequence):
            if not e.items:
                return Lit("")
            guards = self._sequence_guards(e.items, guard)
            items = tuple(self.expr(i, rule, g) for i, g in zip(e.items, guards, strict=True))
            return items[0] if len(items) == 1 else Seq(items)
        if isinstance(e, ls.Choice):
            inner = guard.union(*(self._first_lazy(o) for o in e.options))
            return Alt(tuple(self.expr(o, rule, inner) for o in e.options))
        if isinstance(e, ls.Repeat):
            inner = guard if e.hi == 1 else guard | self._first_lazy(e.item)
            return Rep(self.expr(e.item, rule, inner), e.lo, e.hi)
        if isinstance(e, ls.SpecialToken):
            return special_token_set(e, where)
        if isinstance(e, ls.InlineJson):
            return self.lexeme(self._json_schema(e, where))
        if isinstance(e, ls.NestedLark):
            return self._nested_lark(e)
        if isinstance(e, ls.Literal) and not e.flags and not guard:
            return self.lexeme(Lit(e.text))
        node = self.term(e, "user", where)
        if node is None:
            raise GrammarError(f"lark grammar error, {where}: an expression matches nothing")
        if guard:
            node = DFANode(self._unless_lazy(node, guard, where), "lazy", where)
        return self.lexeme(self._leaf(node))

    # ----- lazy lexemes against the lexemes starting beside them -----
    def _first_lazy(self, e: object, seen: frozenset[str] = frozenset()) -> frozenset[str]:
        """The lazy lexemes (rule names) a match of `e` may start with."""
        if isinstance(e, ls.Name) and e.name in self.f.rules:
            if e.name in self._lazy_names:
                return frozenset((e.name,))
            if e.name in seen:
                return frozenset()
            return self._first_lazy(self.f.rules[e.name].body, seen | {e.name})
        if isinstance(e, ls.Sequence):
            out: frozenset[str] = frozenset()
            for item in e.items:
                out |= self._first_lazy(item, seen)
                if not self._nullable(item):
                    break
            return out
        if isinstance(e, ls.Choice):
            return frozenset().union(*(self._first_lazy(o, seen) for o in e.options))
        if isinstance(e, ls.Repeat):
            return self._first_lazy(e.item, seen)
        return frozenset()

    def _nullable(self, e: object, seen: frozenset[str] = frozenset()) -> bool:
        """Whether `e` may match no lexeme at all (a lexeme is counted as read even when its
        text may be empty)."""
        if isinstance(e, ls.Name) and e.name in self.f.rules and e.name not in self._lazy_names:
            return e.name not in seen and self._nullable(
                self.f.rules[e.name].body, seen | {e.name}
            )
        if isinstance(e, ls.Sequence):
            return all(self._nullable(i, seen) for i in e.items)
        if isinstance(e, ls.Choice):
            return any(self._nullable(o, seen) for o in e.options)
        if isinstance(e, ls.Repeat):
            return e.lo == 0 or self._nullable(e.item, seen)
        return isinstance(e, ls.Literal) and not e.text

    def _sequence_guards(self, items: list, guard: frozenset[str]) -> list[frozenset[str]]:
        """For each item, the lazy lexemes that may start where it starts: the sequence's own
        guard up to its first item that must read a lexeme, the lazy starts of nullable items
        before it (and of a repetition's next round), and of the items after it while it may
        be empty."""
        back: list[frozenset[str]] = []
        cur = guard
        for i in range(len(items)):
            if i:
                prev = items[i - 1]
                restart = self._first_lazy(prev) if isinstance(prev, ls.Repeat) else frozenset()
                cur = (cur | self._first_lazy(prev) if self._nullable(prev) else frozenset())
                cur |= restart
            back.append(cur)
        out = []
        for i in range(len(items)):
            g = back[i]
            k = i
            while k + 1 < len(items) and self._nullable(items[k]):
                k += 1
                g |= self._first_lazy(items[k])
            out.append(g)
        return out

    def _guarded_rule(self, name: str, guard: frozenset[str]) -> str:
        """A copy of rule `name` whose first lexemes stop short of the lazy lexemes `guard`."""
        key = (name, guard)
        hit = self._guarded.get(key)
        if hit is None:
            hit = self._guarded[key] = f"{self.prefix}{name}%unless({','.join(sorted(guard))})"
            d = self.f.rules[name]
            self.g.rules[hit] = self.expr(d.body, d.name, guard)
            self.g.lines[hit] = d.line
        return hit

    def _lazy_dfa(self, name: str) -> ByteDFA:
        hit = self._lazy_dfas.get(name)
        if hit is None:
            d = self.f.rules[name]
            attrs = dict(d.attributes)
            where = f"rule {d.name!r} (a lexeme: lazy / suffix / stop)"
            node = self.term(d.body, "user", where)
            marker = attrs.get("suffix", attrs.get("stop"))
            if marker is not None:
                node = ra.seq(node, self.term(marker, "user", where))
            hit = self._lazy_dfas[name] = shortest_matches(self._dfa(node, where, "lazy"))
        return hit

    def _guarded_lazy(self, name: str, guard: frozenset[str], where: str) -> object:
        """Lazy lexeme `name` where the other lazy lexemes `guard` start too: the first one to
        match is taken (two that match the same text both stay: the parser picks)."""
        key = (name, guard)
        hit = self._guarded.get(key)
        if hit is None:
            lazy = DFANode(self._lazy_dfa(name), "lazy", where)
            dfa = self._unless_lazy(lazy, guard, where, proper=True)
            hit = self._guarded[key] = self.lexeme(self._leaf(DFANode(dfa, "lazy", where)))
        return hit

    def _unless_lazy(
        self, node: object, guard: frozenset[str], where: str, proper: bool = False
    ) -> ByteDFA:
        """The texts of `node` none of whose non-empty prefixes (proper prefixes: `proper`) is
        a match of a lazy lexeme in `guard` (that lexeme would have been taken there). A lazy
        lexeme that matches the empty text is left out (it is taken at once, before any other
        lexeme reads)."""
        dfa = self._dfa(node, where, "lazy")
        rest = ra.parsed("(?s:.+)" if proper else "(?s:.*)")
        for name in sorted(guard):
            lazy = self._lazy_dfa(name)
            if lazy.accepting[START]:
                continue
            blocker = node_to_dfa(ra.seq(DFANode(lazy, "lazy", where), rest))
            dfa = self._product(dfa, blocker, False, where, "lazy")
        return dfa

    def rule(self, d: ls.RuleDef) -> object:
        attrs = dict(d.attributes)
        attrs.pop("capture", None)  # spans for the caller; the language is the same
        _check_markers(d, attrs)
        attrs.pop("stop_capture", None)  # the marker's span for the caller, as capture
        budget = self._char_budget(d, attrs.pop("max_chars", None))
        for key in attrs:
            if key in _REFUSED_ATTRIBUTES:
                raise GrammarError(
                    f"lark grammar error at line {d.line}: rule {d.name!r}: attribute {key!r} is "
                    f"not supported ({_REFUSED_ATTRIBUTES[key]})"
                )
            if key not in _LEXEME_ATTRIBUTES:
                raise GrammarError(
                    f"lark grammar error at line {d.line}: rule {d.name!r}: unknown attribute "
                    f"{key!r}"
                )
        if budget is not None:
            where = f"rule {d.name!r} (max_chars={budget})"
            dfa = self._lazy_dfa(d.name) if attrs else self._dfa(self.term(d.body, "user", where),
                                                                  where, "max_chars")
            dfa = char_budget(dfa, budget, f"lark grammar error at line {d.line}, {where}")
            return self.lexeme(self._leaf(DFANode(dfa, "max_chars", where)))
        if not attrs:
            return self.expr(d.body, d.name)
        where = f"rule {d.name!r} (a lexeme: lazy / suffix / stop)"
        return self.lexeme(self._leaf(DFANode(self._lazy_dfa(d.name), "lazy", where)))

    @staticmethod
    def _char_budget(d: ls.RuleDef, value: object) -> int | None:
        """XGrammar's `max_chars=N` (0..2**31-1): the rule is read as one lexeme that ends at
        its first possible end once N characters are read (`grammar.ebnf.lower.char_budget`);
        with `suffix` / `stop` (where the budget would end it without its marker) refused."""
        if value is None:
            return None
        at = f"lark grammar error at line {d.line}: rule {d.name!r}"
        if not isinstance(value, float) or not value.is_integer() or not 0 <= value < 2**31:
            raise GrammarError(f"{at}: max_chars takes a whole number 0..{2**31 - 1}")
        if "suffix" in d.attributes or "stop" in d.attributes:
            raise GrammarError(
                f"{at}: max_chars with suffix= / stop= is not supported (the budget may end the "
                "rule without its marker)"
            )
        return int(value)

    def _json_schema(self, e: ls.InlineJson, where: str) -> object:
        from grammar.json_schema.guidance import read_x_guidance, schema_is_recursive
        from grammar.json_schema.guidance import with_plain_integers as plain
        from grammar.json_schema.schema import json_schema_to_node

        at = f"%json at line {e.line} ({where})"
        try:  # integers written plain (1, not 1.0), as llguidance and XGrammar do
            schema, ws = read_x_guidance(plain(e.schema), default_whitespace=_FLEXIBLE_WS)
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

    def _nested_lark(self, e: ls.NestedLark) -> object:
        """`%lark { ... }`: the inner grammar's rules under their own prefix (its names, its
        `%ignore` after its own lexemes, its options), entered at its `start`."""
        self._json += 1
        inner = LarkLowering(e.file, self.source, f"{self.prefix}%lark{self._json}:")
        if "start" not in e.file.rules:
            raise GrammarError(
                f"lark grammar error at line {e.line}: the %lark {{ ... }} block defines no "
                "start rule"
            )
        inner.lower_rules()
        for d in e.file.terminals.values():
            inner._token(d.name, "user", d.line)
        self.g.rules.update(inner.g.rules)
        self.g.lines.update(inner.g.lines)
        return inner.entry("start")

    def entry(self, start: str) -> object:
        """The start rule, after the %ignore text where `allow_initial_skip` lets it lead."""
        body: object = Ref(self.prefix + start)
        if self.ignore is not None and self.options.get("allow_initial_skip"):
            body = Seq((self.ignore, body))
        return body

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
        self.g.rules[root] = self.entry(start)
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


def build_dialect_fallback(
    text: str, vocab: TokenVocabulary, start: str, plain: GrammarError
) -> Any:
    """A grammar that lark itself refuses (an empty literal, a terminal that matches the empty
    string, a lazy quantifier in a terminal, `\\u{...}` escapes, a lexer past its budget, ...),
    read in llguidance's / XGrammar's dialect, where these are valid: there is no lark meaning to
    keep. When the dialect refuses it too, the GrammarError names both readings."""
    try:
        return build_llguidance_lark(text, vocab, start)
    except GrammarError as dialect:
        raise GrammarError(
            f"{plain} (and in llguidance's / XGrammar's dialect: {dialect})"
        ) from None


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
