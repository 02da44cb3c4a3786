"""A structural tag spec -> grammar rules (`grammar.ebnf.syntax`), for `compile_rules`.

Two shapes are read:

- XGrammar's `{"type": "structural_tag", "format": {...}}` (or a bare format) with the format
  types const_string, json_schema, regex, grammar (EBNF), any_text, sequence, or, tag,
  triggered_tags and tags_with_separator, nested freely, and the token-level ones (`token`,
  `exclude_token`, `any_tokens` with `max_tokens`, `token_triggered_tags`, `token_dispatch`, a
  tag's `begin` / `end` as a `token` format): tokens matched by id, ids or token texts resolved
  in the vocabulary when the rules compile (`grammar.ebnf.token_terminals`); a tag's end token is
  excluded from the token-level formats inside it, as XGrammar does;
- SGLang's older `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`, which is
  `triggered_tags` with one json_schema tag per structure.

Semantics follow XGrammar's: `triggered_tags` is free text that contains no trigger, then a tag
(whose `begin` starts with a trigger), free text again, ...; with `at_least_one` the text starts
with a tag; with `stop_after_first` it ends after the first tag. `any_text` inside a tag stops at
the tag's end string (it cannot contain it). JSON-Schema content is compiled with our semantics
(strict mode by default: only declared properties). A field we cannot honour (`cohere_xml`,
`any_text.max_tokens`, ...) is a GrammarError naming its path, never ignored.

Each JSON Schema's regex tree is built once and cached (by its text and mode), so many tools
share their compiled pieces and a tag list costs one alternation over cached trees, with
the text the tags' begins share written once (`any_tag`).
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass
from typing import Any

from grammar.automata.dfa_ops import DFANode, product
from grammar.automata.fsm import node_to_dfa
from grammar.automata.nfa import parse_regex
from grammar.ebnf.lower import Lowering
from grammar.ebnf.syntax import (
    MAX_REPEAT,
    Alt,
    Grammar,
    Lit,
    Ref,
    Regular,
    Rep,
    Seq,
    TokenSet,
    dispatch,
    free_text,
    parse_gbnf,
    token_dispatch,
)
from grammar.errors import EmptyLanguageError, GrammarError
from grammar.json_schema.schema import json_schema_to_node, load_schema
from grammar.json_schema.strict import apply_mode, check_mode
from grammar.structural.xml_args import REFUSED_STYLES, STYLES, XMLArguments

_NOTHING = Alt(())  # matches no text (an empty `or`, a schema with no instance)
_SCHEMA_NODES: dict[tuple, object] = {}
_SCHEMA_LOCK = threading.Lock()
_MAX_SCHEMA_NODES = 2048


def schema_leaf(schema: Any, mode: str, whitespace: str | None, where: str) -> object:
    """A Regular leaf for a JSON Schema's language (regex tree cached across compiles)."""
    try:
        loaded = apply_mode(load_schema(schema), mode)
        key = ("schema", json.dumps(loaded, sort_keys=True, ensure_ascii=False), mode, whitespace)
    except GrammarError as e:
        raise GrammarError(f"structural tag {where}: {e}") from None
    with _SCHEMA_LOCK:
        node = _SCHEMA_NODES.get(key)
    if node is None:
        try:
            node = json_schema_to_node(loaded, whitespace)
        except EmptyLanguageError:
            return _NOTHING
        except GrammarError as e:
            raise GrammarError(f"structural tag {where}: {e}") from None
        with _SCHEMA_LOCK:
            if len(_SCHEMA_NODES) >= _MAX_SCHEMA_NODES:
                _SCHEMA_NODES.clear()
            node = _SCHEMA_NODES.setdefault(key, node)
    return Regular(node, key)


def clear_schema_leaves() -> None:
    with _SCHEMA_LOCK:
        _SCHEMA_NODES.clear()


@functools.lru_cache(maxsize=512)
def _regex_node(pattern: str) -> object:
    return parse_regex(pattern)


MAX_CHARS_LIMIT = 4096  # any_text.max_chars: the counter is unrolled into the automaton


def bounded_text(free: Regular, limit: int, where: str) -> Regular:
    """Free text (a DFA leaf) of at most `limit` characters: its automaton times a counter."""
    if limit > MAX_CHARS_LIMIT:
        raise GrammarError(f"{where}: {limit} is over the limit of {MAX_CHARS_LIMIT} characters")
    counter = node_to_dfa(parse_regex(f"(?s).{{0,{limit}}}"))
    try:
        dfa = product(free.node.dfa, counter, True, max_states=200_000)  # type: ignore[attr-defined]
    except GrammarError as e:
        raise GrammarError(f"{where}: {e}") from None
    return Regular(DFANode(dfa, "max_chars", where), ("bounded", free.key, limit))


class SpecReader:
    """Turns one spec into rules; nested EBNF grammars get their rules renamed apart."""

    def __init__(self, mode: str, whitespace: str | None) -> None:
        self.mode = check_mode(mode)
        self.whitespace = whitespace
        self.grammar = Grammar()
        self._grammars = 0
        self.triggers: list[str] = []  # every triggered_tags trigger (see compile_structural_tag)

    def read(self, spec: Any) -> Grammar:
        if isinstance(spec, str | bytes):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as e:
                raise GrammarError(f"structural tag: not valid JSON: {e}") from None
        if not isinstance(spec, dict):
            raise GrammarError("structural tag: expected a JSON object")
        if "type" not in spec and ("structures" in spec or "triggers" in spec):
            root = self._sglang(spec)
        elif spec.get("type") == "structural_tag":
            if "format" not in spec:
                raise GrammarError("structural tag: 'format' is missing")
            root = self.format(spec["format"], "format")
        else:
            root = self.format(spec, "format")
        self.grammar.rules["root"] = root
        return self.grammar

    def _sglang(self, spec: dict) -> object:
        structures = _field(spec, "structures", list, "")
        triggers = _field(spec, "triggers", list, "")
        tags = []
        for i, s in enumerate(structures):
            where = f"structures[{i}]"
            if not isinstance(s, dict):
                raise GrammarError(f"structural tag {where}: expected an object")
            tags.append(
                {
                    "type": "tag",
                    "begin": _field(s, "begin", str, where),
                    "content": {"type": "json_schema", "json_schema": s.get("schema", True)},
                    "end": _field(s, "end", str, where),
                }
            )
        return self.format(
            {"type": "triggered_tags", "triggers": triggers, "tags": tags}, "structures"
        )

    def format(self, f: Any, where: str, ends: tuple[str, ...] = ()) -> object:
        """The expression of one format; `ends`: strings that follow it (a tag's end), which
        free text inside it must not contain."""
        if not isinstance(f, dict):
            raise GrammarError(f"structural tag {where}: a format must be an object")
        kind = f.get("type")
        reader = _READERS.get(kind)  # type: ignore[arg-type]
        if reader is None:
            raise GrammarError(
                f"structural tag {where}.type: unsupported format type {kind!r} "
                f"(supported: {', '.join(sorted(_READERS))})"
            )
        return reader(self, f, where, ends)

    # ----- the format types -----
    def _const(self, f: dict, where: str, ends: tuple) -> object:
        return Lit(_field(f, "value", str, where))

    def _schema(self, f: dict, where: str, ends: tuple) -> object:
        _refuse_unless(f, where, any_order=False, excludes=[])
        if "json_schema" not in f:
            raise GrammarError(f"structural tag {where}.json_schema: missing")
        style = f.get("style", "json")
        cap = f.get("max_whitespace_cnt")
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
            raise GrammarError(
                f"structural tag {where}.max_whitespace_cnt: a non-negative integer or null"
            )
        # a cap asks for XGrammar's flexible JSON white space, at most `cap` characters a run
        whitespace = self.whitespace if cap is None else f"[ \\n\\t]{{0,{cap}}}"
        if style == "json":
            return self.schema_value(f["json_schema"], whitespace, f"{where}.json_schema")
        if style in REFUSED_STYLES or style not in STYLES:
            raise GrammarError(
                f"structural tag {where}.style: {style!r} is not supported "
                f"(supported: json, {', '.join(STYLES)})"
            )

        def json_leaf(schema: Any, at: str) -> object:
            return self.schema_value(schema, whitespace, at)

        xml = XMLArguments(style, json_leaf, cap, where)
        xml.strict = self.mode == "strict"
        return xml.root(f["json_schema"])

    def schema_value(self, schema: Any, whitespace: str | None, where: str) -> object:
        """A JSON value of `schema`: a recursive schema (a tree of nodes) as rules of the
        context-free path, exact at any depth (`json_schema_rules`); any other as its regex."""
        from grammar.ebnf.lark_lower import json_schema_rules

        rules = json_schema_rules(
            schema, f"j{len(self.grammar.rules)}::", whitespace=whitespace,
            json_schema_mode=self.mode,
        )  # fmt: skip
        if rules is None:
            return schema_leaf(schema, self.mode, whitespace, where)
        g, start = rules
        self.grammar.rules.update(g.rules)
        self.grammar.lines.update(g.lines)
        return Ref(start)

    def _qwen_xml(self, f: dict, where: str, ends: tuple) -> object:
        """The deprecated `qwen_xml_parameter`: json_schema with style qwen_xml."""
        return self._schema({**f, "type": "json_schema", "style": "qwen_xml"}, where, ends)

    def _regex(self, f: dict, where: str, ends: tuple) -> object:
        pattern = _field(f, "pattern", str, where)
        try:
            return Regular(_regex_node(pattern), ("regex", pattern))
        except GrammarError as e:
            raise GrammarError(f"structural tag {where}.pattern: {e}") from None

    def _grammar(self, f: dict, where: str, ends: tuple) -> object:
        text = _field(f, "grammar", str, where)
        _refuse_unless(f, where, syntax="ebnf")
        try:
            g = parse_gbnf(text)
        except GrammarError as e:
            raise GrammarError(f"structural tag {where}.grammar: {e}") from None
        try:
            Lowering(g, "root")  # undefined rules, a missing root: named with this path
        except GrammarError as e:
            raise GrammarError(f"structural tag {where}.grammar: {e}") from None
        self._grammars += 1
        prefix = f"g{self._grammars}::"
        for name, body in g.rules.items():
            self.grammar.rules[prefix + name] = _renamed(body, prefix)
        return Ref(prefix + "root")

    def _any_text(self, f: dict, where: str, ends: tuple) -> object:
        _refuse_unless(f, where, max_tokens=None)
        excludes = _field(f, "excludes", list, where, [])
        text_ends = [e for e in ends if isinstance(e, str)]  # a token end is no text
        free = free_text(list(excludes) + text_ends, f"structural tag {where}")
        limit = f.get("max_chars")
        if limit is None:
            return free
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise GrammarError(f"structural tag {where}.max_chars: a non-negative integer")
        return bounded_text(free, limit, f"structural tag {where}.max_chars")

    def _repeat(self, f: dict, where: str, ends: tuple) -> object:
        lo = _field(f, "min", int, where)
        hi = _field(f, "max", int, where)
        if isinstance(lo, bool) or isinstance(hi, bool) or lo < 0 or (hi != -1 and hi < lo):
            raise GrammarError(
                f"structural tag {where}: min must be >= 0 and max >= min (or -1: unbounded)"
            )
        if max(lo, hi) > MAX_REPEAT:
            raise GrammarError(f"structural tag {where}: a bound over {MAX_REPEAT}")
        return self._counted(f, where, ends, lo, None if hi == -1 else hi)

    def _counted(self, f: dict, where: str, ends: tuple, lo: int, hi: int | None) -> object:
        if "content" not in f:
            raise GrammarError(f"structural tag {where}.content: missing")
        return Rep(self.format(f["content"], f"{where}.content", ends), lo, hi)

    def _optional(self, f: dict, where: str, ends: tuple) -> object:
        return self._counted(f, where, ends, 0, 1)

    def _plus(self, f: dict, where: str, ends: tuple) -> object:
        return self._counted(f, where, ends, 1, None)

    def _star(self, f: dict, where: str, ends: tuple) -> object:
        return self._counted(f, where, ends, 0, None)

    def _dispatch(self, f: dict, where: str, ends: tuple) -> object:
        """XGrammar's `dispatch` (its TagDispatch): free text until a pattern, then that
        pattern's format, and again while `loop`."""
        rules = _field(f, "rules", list, where)
        if not rules:
            raise GrammarError(f"structural tag {where}.rules: must not be empty")
        pairs = []
        for i, rule in enumerate(rules):
            at = f"{where}.rules[{i}]"
            if not (isinstance(rule, list) and len(rule) == 2 and isinstance(rule[0], str)):
                raise GrammarError(f"structural tag {at}: a [pattern string, format] pair")
            pairs.append((rule[0], self.format(rule[1], f"{at}[1]")))
        excludes = _field(f, "excludes", list, where, [])
        if not all(isinstance(e, str) and e for e in excludes):
            raise GrammarError(f"structural tag {where}.excludes: non-empty strings required")
        loop = _field(f, "loop", bool, where, True)
        self.triggers.extend(p for p, _ in pairs)
        return dispatch(pairs, loop, excludes, f"structural tag {where}")

    # ----- token-level formats: tokens matched by id (grammar.ebnf.token_terminals) -----
    def _token(self, f: dict, where: str, ends: tuple) -> object:
        return TokenSet((_token_item(f.get("token"), f"{where}.token"),), False, _at(where))

    def _excluded(self, f: dict, where: str, ends: tuple) -> TokenSet:
        """Any one token but `exclude_tokens` and the enclosing tag's end tokens."""
        items = _token_list(f, "exclude_tokens", where)
        items += [e.item for e in ends if isinstance(e, TokenEnd)]
        return TokenSet(tuple(items), True, _at(where))

    def _exclude_token(self, f: dict, where: str, ends: tuple) -> object:
        return self._excluded(f, where, ends)

    def _any_tokens(self, f: dict, where: str, ends: tuple) -> object:
        limit = f.get("max_tokens")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            raise GrammarError(f"structural tag {where}.max_tokens: an integer or null")
        if limit is not None and limit > MAX_REPEAT:
            raise GrammarError(
                f"structural tag {where}.max_tokens: {limit} is over the limit of {MAX_REPEAT}"
            )
        hi = None if limit is None or limit < 0 else limit
        return Rep(self._excluded(f, where, ends), 0, hi)

    def _token_triggered(self, f: dict, where: str, ends: tuple) -> object:
        """`triggered_tags` over tokens: any token but the triggers (and the excluded, and the
        enclosing tag's end tokens) until a trigger token begins a tag."""
        items = _token_list(f, "trigger_tokens", where, required=True)
        if not items:
            raise GrammarError(f"structural tag {where}.trigger_tokens: must not be empty")
        for i, t in enumerate(_field(f, "tags", list, where)):
            begin = t.get("begin") if isinstance(t, dict) else None
            if not (isinstance(begin, dict) and begin.get("type") == "token"):
                raise GrammarError(
                    f"structural tag {where}.tags[{i}].begin: a token format is required"
                )
        tags = self._tags(f, where)
        stop = items + _token_list(f, "exclude_tokens", where)
        stop += [e.item for e in ends if isinstance(e, TokenEnd)]
        free = Rep(TokenSet(tuple(stop), True, _at(where)), 0, None)
        return self._tag_loop(f, tags, free)

    def _token_dispatch(self, f: dict, where: str, ends: tuple) -> object:
        rules = _field(f, "rules", list, where)
        if not rules:
            raise GrammarError(f"structural tag {where}.rules: must not be empty")
        pairs = []
        for i, rule in enumerate(rules):
            at = f"{where}.rules[{i}]"
            if not (isinstance(rule, list) and len(rule) == 2):
                raise GrammarError(f"structural tag {at}: a [token, format] pair")
            pairs.append((_token_item(rule[0], f"{at}[0]"), self.format(rule[1], f"{at}[1]")))
        excluded = _token_list(f, "exclude_tokens", where)
        excluded += [e.item for e in ends if isinstance(e, TokenEnd)]
        loop = _field(f, "loop", bool, where, True)
        return token_dispatch(pairs, loop, excluded, _at(where))

    def _sequence(self, f: dict, where: str, ends: tuple) -> object:
        elements = _field(f, "elements", list, where)
        n = len(elements)
        return Seq(
            tuple(
                self.format(e, f"{where}.elements[{i}]", ends if i == n - 1 else ())
                for i, e in enumerate(elements)
            )
        )

    def _or(self, f: dict, where: str, ends: tuple) -> object:
        elements = _field(f, "elements", list, where)
        return Alt(
            tuple(self.format(e, f"{where}.elements[{i}]", ends) for i, e in enumerate(elements))
        )

    def _tag(self, f: dict, where: str, ends: tuple) -> object:
        begin = f.get("begin")
        if isinstance(begin, dict) and begin.get("type") == "token":
            begin_expr: object = self._token(begin, f"{where}.begin", ())
        elif isinstance(begin, str):
            begin_expr = Lit(begin)
        else:
            raise GrammarError(
                f"structural tag {where}.begin: a string or a token format is required"
            )
        end = f.get("end")
        if isinstance(end, dict) and end.get("type") == "token":
            # a token end: token-level contents exclude it (XGrammar's automatic exclusion)
            item = _token_item(end.get("token"), f"{where}.end.token")
            inner: tuple = (TokenEnd(item),)
            end_expr: object = TokenSet((item,), False, _at(f"{where}.end"))
        else:
            end_list = [end] if isinstance(end, str) else end
            if (
                not isinstance(end_list, list)
                or not end_list
                or not all(isinstance(e, str) for e in end_list)
            ):
                raise GrammarError(
                    f"structural tag {where}.end: a string, a list of strings or a token format"
                )
            inner = tuple(e for e in end_list if e)
            end_expr = (
                Lit(end_list[0]) if len(end_list) == 1 else Alt(tuple(Lit(e) for e in end_list))
            )
        if "content" not in f:
            raise GrammarError(f"structural tag {where}.content: missing")
        content = self.format(f["content"], f"{where}.content", inner)
        return Seq((begin_expr, content, end_expr))

    def _tags(self, f: dict, where: str) -> list[object]:
        tags = _field(f, "tags", list, where)
        out = []
        for i, t in enumerate(tags):
            if not isinstance(t, dict) or t.get("type", "tag") != "tag":
                raise GrammarError(f"structural tag {where}.tags[{i}]: expected a tag")
            out.append(self._tag(t, f"{where}.tags[{i}]", ()))
        return out

    def _triggered(self, f: dict, where: str, ends: tuple) -> object:
        triggers = _field(f, "triggers", list, where)
        if not triggers or not all(isinstance(t, str) and t for t in triggers):
            raise GrammarError(f"structural tag {where}.triggers: non-empty strings required")
        self.triggers.extend(triggers)
        tags = self._tags(f, where)
        for i, t in enumerate(f["tags"]):
            if not isinstance(t["begin"], str):
                raise GrammarError(
                    f"structural tag {where}.tags[{i}].begin: a string is required here (a "
                    "token begin goes in token_triggered_tags)"
                )
            if not any(t["begin"].startswith(tr) for tr in triggers):
                raise GrammarError(
                    f"structural tag {where}.tags[{i}].begin: {t['begin']!r} starts with no trigger"
                )
        excludes = _field(f, "excludes", list, where, [])
        text_ends = [e for e in ends if isinstance(e, str)]
        free = free_text(list(triggers) + list(excludes) + text_ends, f"structural tag {where}")
        return self._tag_loop(f, tags, free)

    @staticmethod
    def _tag_loop(f: dict, tags: list[object], free: object) -> object:
        """Free text (or tokens) and tags, as `at_least_one` / `stop_after_first` say."""
        if not tags:
            return free
        one = any_tag(tags)
        at_least_one = bool(f.get("at_least_one", False))
        if f.get("stop_after_first", False):
            return one if at_least_one else Seq((free, Rep(one, 0, 1)))
        if at_least_one:
            return Seq((one, free, Rep(Seq((one, free)), 0, None)))
        return Seq((free, Rep(Seq((one, free)), 0, None)))

    def _separated(self, f: dict, where: str, ends: tuple) -> object:
        tags = self._tags(f, where)
        sep = _field(f, "separator", str, where)
        if not tags:
            return Lit("")
        one = any_tag(tags)
        at_least_one = bool(f.get("at_least_one", False))
        if f.get("stop_after_first", False):
            return one if at_least_one else Rep(one, 0, 1)
        some = Seq((one, Rep(Seq((Lit(sep), one)), 0, None)))
        return some if at_least_one else Rep(some, 0, 1)


_READERS = {
    "const_string": SpecReader._const,
    "json_schema": SpecReader._schema,
    "regex": SpecReader._regex,
    "grammar": SpecReader._grammar,
    "any_text": SpecReader._any_text,
    "sequence": SpecReader._sequence,
    "or": SpecReader._or,
    "tag": SpecReader._tag,
    "triggered_tags": SpecReader._triggered,
    "tags_with_separator": SpecReader._separated,
    "optional": SpecReader._optional,
    "plus": SpecReader._plus,
    "star": SpecReader._star,
    "repeat": SpecReader._repeat,
    "dispatch": SpecReader._dispatch,
    "qwen_xml_parameter": SpecReader._qwen_xml,
    "token": SpecReader._token,
    "exclude_token": SpecReader._exclude_token,
    "any_tokens": SpecReader._any_tokens,
    "token_triggered_tags": SpecReader._token_triggered,
    "token_dispatch": SpecReader._token_dispatch,
}

_MISSING = object()


def any_tag(tags: list[object]) -> object:
    """One of `tags` (each `Seq((begin, content, end))` from `SpecReader._tag`), as an
    expression of the same language with the text the tags share written once: when every
    begin is a string and every end the same, the begins become a trie (a common prefix once,
    then the options by their next character) and the end follows the alternation once. A
    tool list's tags share their opening up to the name (`<|channel|>commentary
    to=functions.`) and their end (`<|call|>`): written once, the automaton has one path
    through that text instead of one per tool, and its states after the trigger hold one
    position instead of one per tool (cheaper to build, to mask and to warm)."""
    if len(tags) == 1:
        return tags[0]
    shaped = all(isinstance(t, Seq) and len(t.items) == 3 for t in tags)
    if not shaped or not all(isinstance(t.items[0], Lit) for t in tags):
        return Alt(tuple(tags))
    end = tags[0].items[2]
    if any(t.items[2] != end for t in tags):
        return Alt(tuple(tags))
    return Seq((_begin_trie([(t.items[0].text, t.items[1]) for t in tags]), end))


def _begin_trie(items: list[tuple[str, object]]) -> object:
    """The alternation of `Seq((Lit(text), tail))` over `items`, with shared text once."""
    if len(items) == 1:
        text, tail = items[0]
        return Seq((Lit(text), tail)) if text else tail
    prefix = os.path.commonprefix([text for text, _ in items])
    if prefix:
        rest = _begin_trie([(text[len(prefix) :], tail) for text, tail in items])
        return Seq((Lit(prefix), rest))
    groups: dict[str, list[tuple[str, object]]] = {}
    for text, tail in items:
        groups.setdefault(text[:1], []).append((text, tail))
    options: list[object] = []
    for first, group in groups.items():
        if first:
            options.append(_begin_trie(group))
        else:  # the tags whose begin ends here: their contents, each an option
            options.extend(tail for _, tail in group)
    return options[0] if len(options) == 1 else Alt(tuple(options))


@dataclass(slots=True, frozen=True)
class TokenEnd:
    """In `ends`: an enclosing tag's end token (a `TokenSet` item), which token-level
    contents exclude; text contents pass it by."""

    item: object


def _token_item(value: Any, where: str) -> object:
    """A token-level field's value (a token id or a token's text) as a `TokenSet` item."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return (value, value)
    if isinstance(value, str) and value:
        return value
    raise GrammarError(
        f"structural tag {where}: a token id (a non-negative integer) or a token's text"
    )


def _token_list(f: dict, name: str, where: str, required: bool = False) -> list[object]:
    values = _field(f, name, list, where) if required else _field(f, name, list, where, [])
    return [_token_item(v, f"{where}.{name}[{i}]") for i, v in enumerate(values)]


def _at(where: str) -> str:
    return f"structural tag {where}"


def _field(f: dict, name: str, kind: type, where: str, default: Any = _MISSING) -> Any:
    value = f.get(name, default)
    path = f"{where}.{name}" if where else name
    if value is _MISSING:
        raise GrammarError(f"structural tag {path}: missing")
    if not isinstance(value, kind):
        raise GrammarError(f"structural tag {path}: expected {kind.__name__}")
    return value


def _refuse_unless(f: dict, where: str, **defaults: Any) -> None:
    """A field set to anything but its default constrains output in a way we do not
    implement: refuse it by name."""
    for name, default in defaults.items():
        if name in f and f[name] != default:
            raise GrammarError(
                f"structural tag {where}.{name}: {f[name]!r} is not supported (only {default!r})"
            )


def _renamed(e: object, prefix: str) -> object:
    if isinstance(e, Ref):
        return Ref(prefix + e.name, e.line)
    if isinstance(e, Seq):
        return Seq(tuple(_renamed(i, prefix) for i in e.items))
    if isinstance(e, Alt):
        return Alt(tuple(_renamed(i, prefix) for i in e.options))
    if isinstance(e, Rep):
        return Rep(_renamed(e.item, prefix), e.lo, e.hi)
    return e
