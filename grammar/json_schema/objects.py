"""JSON Schema objects -> regex nodes: the member rules of the schema builder. Members in the
schema's property order, then additional / pattern members; minProperties / maxProperties by
counting members; `propertyNames` as a key filter; `patternProperties` as exact key regions
(DFA products); name-list `dependencies` as a split over which trigger names are present.

Functions of the schema builder (`builder.Builder`, passed as `b`).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from decimal import Decimal
from typing import Any

from grammar.automata import dfa_ops
from grammar.automata import interegular_adapter as ip
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import node_to_dfa
from grammar.automata.pattern import losses, note_loss, pattern_to_content
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.json_schema import oneof as json_oneof
from grammar.json_schema.builder import Builder
from grammar.json_schema.exact import names as key_names
from grammar.json_schema.refs.local import ptr_escape

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing
MAX_PATTERNS = 32  # patternProperties patterns of one object
MAX_KEY_REGIONS = 64  # non-empty sets of patterns a key can match


def literal(value: Any, fractions: bool | str = True, punct: tuple | None = None) -> object:
    """The text of `value`; a number also in the other spellings of the same number
    without an exponent (JSON Schema compares numbers by value: 2 == 2.0 == 2.00). An
    integral number is spelled with a fraction part too if `fractions`, only so if it is
    "only" (draft 4: 2.0 is no integer, so the schema may accept one spelling only).
    `punct` is (white space, item separator, key separator) as regex nodes, what the
    schema's other values take between their tokens (a builder's `ws`, `comma`, `colon`);
    None: compact."""
    ws, comma, colon = punct or (ra.EMPTY, ra.char(","), ra.char(":"))
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return ra.lit(json.dumps(value, ensure_ascii=False))
    if isinstance(value, int | float):
        return _number_literal(value, fractions)
    if isinstance(value, list):
        parts: list[object] = [ra.char("["), ws]
        for i, v in enumerate(value):
            parts += [comma] if i else []
            parts.append(literal(v, fractions, punct))
        return ra.seq(*parts, ws, ra.char("]"))
    if isinstance(value, dict):
        return _object_literal(value, fractions, (ws, comma, colon), punct is None)
    return ra.lit(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


MAX_ORDERED_MEMBERS = 10  # an object value's members in every order: 2**n shared suffixes


def _object_literal(value: dict, fractions: bool | str, punct: tuple, compact: bool) -> object:
    """An object value with its members in any order (JSON objects are unordered): the
    suffix after each set of members written is one node, so n members take 2**n of them."""
    ws, comma, colon = punct
    members = [
        ra.seq(ra.lit(json.dumps(k, ensure_ascii=False)), colon,
               literal(v, fractions, None if compact else punct))
        for k, v in value.items()
    ]  # fmt: skip
    n = len(members)
    if n > MAX_ORDERED_MEMBERS:
        raise UnsupportedSchemaError(
            "enum",
            "#",
            f"an object value of {n} members (over {MAX_ORDERED_MEMBERS}: too many member orders)",
        )
    full = (1 << n) - 1
    memo: dict[int, object] = {}

    def rest(done: int) -> object:  # the members not yet written, each after a comma
        if done == full:
            return ra.seq(ws, ra.char("}"))
        if done not in memo:
            memo[done] = ra.alt(
                [
                    ra.seq(comma, m, rest(done | 1 << i))
                    for i, m in enumerate(members)
                    if not done >> i & 1
                ]
            )
        return memo[done]

    if not members:
        return ra.seq(ra.char("{"), ws, ra.char("}"))
    first = ra.alt([ra.seq(m, rest(1 << i)) for i, m in enumerate(members)])
    return ra.seq(ra.char("{"), ws, first)


def _number_literal(value: int | float, fractions: bool | str) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return ra.lit(json.dumps(value))
    d = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    sign = "-" if d < 0 else ""
    if d == d.to_integral_value():  # 2, 2.0, 2.00, ...; zero also as -0
        whole = "-?0" if d == 0 else re.escape(sign + str(abs(int(d))))
        tail = r"\.0+" if fractions == "only" else r"(\.0+)?" if fractions else ""
        plain = ra.parsed(rf"({whole}){tail}")
        exponent = bool(fractions)
    else:
        text = format(abs(d).normalize(), "f")  # 0.5, 12.25: no exponent, no trailing zeros
        plain = ra.seq(ra.lit(sign + text), ra.repeat(ra.char("0"), 0, None))
        exponent = True
    dumped = json.dumps(value)
    if exponent and "e" in dumped:  # 1e+20, 1e-05: a float's own spelling
        return ra.alt([plain, ra.lit(dumped)])
    return plain


def integral_as(value: Any, kind: type) -> Any:
    """`value` with every integral number (booleans aside) made `kind` (int or float)."""
    if isinstance(value, list):
        return [integral_as(v, kind) for v in value]
    if isinstance(value, dict):
        return {k: integral_as(v, kind) for k, v in value.items()}
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, int) or value.is_integer():
            return kind(value)
    return value


def string_except(names: list[str], string_char: Node, ptr: str) -> Node:
    """A JSON string (with its quotes) whose decoded content is none of `names`, in any
    spelling (escapes included: a key spelled `\\u0061` is the name "a"), each content
    character being `string_char`; see `grammar.json_schema.exact.names` (a `Deferred` node:
    built when first read). The regex path and the lark path share it."""
    return key_names.deferred_string_except(names, string_char)


_NOT_CONTENT = frozenset('"\\') | frozenset(chr(i) for i in range(0x20))  # never raw in JSON


def ip_char_not(excluded: list[str]) -> object:
    """One raw JSON string character that is none of `excluded`."""
    return ip.CharGroup(_NOT_CONTENT | frozenset(excluded), True)


def search_name(pattern: str, name: str, ptr: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error as e:
        raise UnsupportedSchemaError("patternProperties", ptr, f"{pattern!r}: {e}") from None


DEPENDENCY_KEYS = ("dependencies", "dependentRequired")


def name_lists(value: Any) -> bool:
    """`dependencies` in its name-list form (the schema form is not supported)."""
    return isinstance(value, dict) and all(
        isinstance(v, list) and all(isinstance(n, str) for n in v) for v in value.values()
    )


MAX_OBJECT_COPIES = 4096  # member-count states of one object with minProperties / maxProperties


# ----- objects and arrays -----
def object_value(b: Builder, s: dict, ptr: str) -> Node:
    deps: dict[str, list[str]] = {}
    for key in DEPENDENCY_KEYS:
        deps.update(s.get(key, {}))
    if deps:
        return object_with_dependencies(b, s, deps, ptr)
    props: dict[str, Any] = dict(s.get("properties", {}))
    required = list(dict.fromkeys(s.get("required", [])))
    extra = s.get("additionalProperties", True)
    names_ok = property_names(b, s, ptr)
    for name in dict.fromkeys([*props, *required]):
        # a member's value: its property schema and every patternProperty it matches;
        # a required name that is no property: the schema any member of that name meets
        if name not in props:
            props[name] = json_oneof.member_schema(s, name)
            continue
        sub = props[name]
        pp = s.get("patternProperties", {})
        matching = [v for p, v in pp.items() if search_name(p, name, f"{ptr}/patternProperties")]
        if sub is not False and matching:
            sub = {"allOf": [sub, *matching]}
        props[name] = sub
    for name in props if names_ok is not None else ():
        if not names_ok(name):
            props[name] = False
    extra_members: list[tuple[Node, Node]] = []  # (quoted key, value) of other members
    if s.get("patternProperties"):
        extra_members = pattern_member(b, s, props, ptr)
    elif extra is not False:
        extra_value = b.value(extra, f"{ptr}/additionalProperties")
        extra_members = [(key_except(b, list(props), ptr), extra_value)]
    if names_ok is not None:
        extra_members = [(names_ok.keys(k), v) for k, v in extra_members]
    extra_item = ra.alt([ra.seq(k, b.colon, v) for k, v in extra_members])
    items: list[tuple[object, bool]] = []  # (node of '"key":value', required)
    for name, sub in props.items():
        v = b.value(sub, f"{ptr}/properties/{ptr_escape(name)}")
        if v is None:
            if name in required:
                return None
            continue
        items.append((ra.seq(literal(name), b.colon, v), name in required))
    lo, hi = s.get("minProperties", 0), s.get("maxProperties")
    return b.wrap("{", members(b, items, extra_item, lo, hi, ptr), "}")


def members(
    b: Builder, items: list[tuple[object, bool]], extra: Node, lo: int, hi: int | None, ptr: str
) -> Node:
    """The members of an object: `items` in order (required or optional), then any number
    of `extra` members, with lo..hi members in all (minProperties / maxProperties). The
    count matters only up to `top`; past it members are free. Extra members may repeat a
    key (JSON text allows it; the object then has fewer members), so they count at most
    once towards `lo`: where more are needed the object is not generated."""
    top = max(lo, 1 if hi is None else hi + 1)
    memo: dict[tuple[int, int], Node] = {}
    budget = [MAX_OBJECT_COPIES]

    def rest(i: int, c: int) -> Node:  # c members written so far (capped at top)
        if (i, c) in memo:
            return memo[(i, c)]
        budget[0] -= 1
        if budget[0] < 0:
            key = "maxProperties" if hi is not None else "minProperties"
            raise UnsupportedSchemaError(key, f"{ptr}/{key}", "too many optional members")
        sep = b.comma if c else ra.EMPTY
        if i == len(items):
            need = max(0, lo - c)
            room = None if hi is None else hi - c
            if need > 1:  # other members may repeat a key: they count once at most
                out_: Node = None
                memo[(i, c)] = out_
                return out_
            if extra is None or room == 0:
                out: Node = ra.EMPTY if need == 0 else None
            elif c:
                out = ra.repeat(ra.seq(b.comma, extra), need, room)
            else:
                more = ra.repeat(
                    ra.seq(b.comma, extra),
                    max(0, need - 1),
                    None if room is None else room - 1,
                )
                many = ra.seq(extra, more)
                out = many if need else ra.optional(many)
        else:
            node, req = items[i]
            nxt = min(c + 1, top)
            if hi is not None and c >= hi:
                take = None
            else:
                after = rest(i + 1, nxt)
                take = None if after is None else ra.seq(sep, node, after)
            if req:
                out = take
            elif nxt == c and take is not None:  # the count no longer matters
                out = ra.seq(ra.optional(ra.seq(sep, node)), rest(i + 1, c))
            else:
                out = ra.alt([take, rest(i + 1, c)])
        memo[(i, c)] = out
        return out

    try:
        return rest(0, 0)
    finally:
        # a recursive closure is a cycle through its cell: emptied, it is freed now
        rest = None  # type: ignore[assignment]  # noqa: F841


def property_names(b: Builder, s: dict, ptr: str) -> Any:
    """`propertyNames` as a filter: names_ok(name) and names_ok.keys(quoted key node)."""
    pn = s.get("propertyNames")
    if pn is None or pn is True or pn == {}:
        return None
    where = f"{ptr}/propertyNames"
    if pn is False:
        names = None
    else:
        names = b.value({"allOf": [pn, {"type": "string"}]}, where)

    class _Names:
        def __call__(_, name: str) -> bool:
            return pn is not False and b.accepts(pn, name)

        def keys(_, key: Node) -> Node:
            if names is None or key is None:
                return None
            both = dfa_ops.product(b.dfa(key), b.dfa(names), True)
            return dfa_ops.DFANode(both, "propertyNames", where) if both.accepting.any() else None

    return _Names()


def object_with_dependencies(b: Builder, s: dict, deps: dict, ptr: str) -> Node:
    """`dependencies` / `dependentRequired` with name lists: one object per choice of which
    trigger names are present (present: it and its names required; absent: forbidden).
    The choices are disjoint and together exactly the instances the keyword allows."""
    if len(deps) > 3:
        raise UnsupportedSchemaError("dependencies", ptr, "more than 3 trigger names")
    base = {k: v for k, v in s.items() if k not in DEPENDENCY_KEYS}
    options: list[Node] = []
    for present in itertools.product((True, False), repeat=len(deps)):
        props = dict(base.get("properties", {}))
        for (trigger, _), here in zip(deps.items(), present, strict=True):
            if not here:
                props[trigger] = False
        # names outside `properties` follow them in required order: the trigger before
        # or after its names (either order is an instance); each order once
        here_deps = [(t, n) for (t, n), h in zip(deps.items(), present, strict=True) if h]
        seen: set[tuple[str, ...]] = set()
        for firsts in itertools.product((True, False), repeat=len(here_deps)):
            required = list(base.get("required", []))
            for (trigger, names), first in zip(here_deps, firsts, strict=True):
                required += [trigger, *names] if first else [*names, trigger]
            required = list(dict.fromkeys(required))
            if any(props.get(name) is False for name in required):
                break
            key = tuple(n for n in required if n not in props)
            if key in seen:
                continue
            seen.add(key)
            options.append(
                object_value(b, {**base, "properties": props, "required": required}, ptr)
            )
    return ra.alt(options)


def pattern_member(b: Builder, s: dict, props: dict, ptr: str) -> list[tuple[Node, Node]]:
    """`patternProperties` (up to MAX_PATTERNS): the members other than `properties`.

    Each key (not a property name) falls in one region, the set of patterns it matches;
    its value must satisfy all of their schemas, or `additionalProperties` when it matches
    none. Regions are exact DFA products; a region that excludes some pattern holds only
    escape-free keys (where the pattern DFA is exact), so keys needing escapes there are
    valid but never generated. Returns (quoted key, value) pairs, [] if no member fits."""
    pp = s.get("patternProperties")
    where = f"{ptr}/patternProperties"
    extra = s.get("additionalProperties", True)
    if len(pp) > MAX_PATTERNS:
        raise UnsupportedSchemaError("patternProperties", where, f"over {MAX_PATTERNS} patterns")
    required = [n for n in s.get("required", []) if n not in props]
    try:
        members: list[tuple[Node, Node]] = []
        regions = key_regions(b, list(pp), list(props), required, where, extra is not False)
        for key, inside in regions:
            subs = [sub for sub, keep in zip(pp.values(), inside, strict=True) if keep]
            if not subs:
                if extra is False:
                    continue
                value = b.value(extra, f"{ptr}/additionalProperties")
            elif len(subs) == 1:
                (pat,) = [p for p, k in zip(pp, inside, strict=True) if k]
                value = b.value(subs[0], f"{where}/{ptr_escape(pat)}")
            else:
                value = b.value({"allOf": subs}, where)
            members.append((key, value))
    except (re.error, GrammarError) as e:
        if isinstance(e, UnsupportedSchemaError):
            raise
        raise UnsupportedSchemaError("patternProperties", where, str(e)) from None
    return members


def key_regions(
    b: Builder,
    pp: list[str],
    props: list[str],
    required: list[str],
    where: str,
    outside: bool = True,
) -> list[tuple[Node, tuple[bool, ...]]]:
    """(quoted key, which patterns it matches) for each region of the keys that are not
    property names (see pattern_member). A function of the names and patterns only,
    built once per schema for each (an object's copies and dependency cases share it).
    `outside` False: the keys in no pattern are not wanted (`additionalProperties: false`),
    and one pattern with no names is its whole language, with no split at all."""
    if not outside and len(pp) == 1 and not props and not required:
        content = pattern_to_content(pp[0], b.string_char)
        return [] if content is None else [(ra.seq(ra.char('"'), content, ra.char('"')), (True,))]
    memo_key = (tuple(pp), tuple(props), tuple(required))
    hit = b.key_region_memo.get(memo_key)
    if hit is not None:
        for _ in range(hit[1]):  # the narrowings of the pattern nodes, replayed
            note_loss()
        return hit[0]
    before = losses()
    literal = ip_char_not(['"', "\\", *map(chr, range(0x20))])
    contents = [pattern_to_content(pattern, b.string_char) for pattern in pp]
    # the split below asks only about escape-free keys: the pattern's escape-free
    # spellings are the same regions, with a smaller automaton (`.{1,256}`: no
    # escape states per position); a pattern with none of them keeps its full automaton
    frees = [pattern_to_content(pattern, literal, escape_free=True) for pattern in pp]
    named_inside = any(all(search_name(p, n, where) for p in pp) for n in props)
    names = [n for n in [*props, *required] if not any(ord(c) < 0x20 or c in '"\\' for c in n)]
    texts = literal_sets(contents, frees)
    if texts is not None:
        regions: list = literal_regions(b, texts, [*props, *required], where)
    else:
        pats = [b.dfa(c if f is None else f) for c, f in zip(contents, frees, strict=True)]
        keys = node_to_dfa(ra.repeat(literal, 0, None))
        if names:
            keys = dfa_ops.product(keys, node_to_dfa(ra.alt([ra.lit(n) for n in names])), False)
        # split the escape-free keys by each pattern in turn, keeping non-empty regions
        regions = dfa_ops.split_regions(keys, pats)
    if len(regions) > MAX_KEY_REGIONS:
        raise UnsupportedSchemaError("patternProperties", where, "too many key regions")
    out: list[tuple[Node, tuple[bool, ...]]] = []
    for region, inside in regions:
        key: Node
        if isinstance(region, Quoted) and not (all(inside) and not named_inside):
            out.append((region.node, inside))  # a literal set, or the strings outside them
            continue
        if inside == (True,) and not named_inside:
            key = contents[0]  # the pattern's whole language, and it has a regex text form
        elif all(inside) and not named_inside:
            # a key in every pattern may use escapes (pattern_to_content is sound)
            # unless a property name matches them all (it must stay out in every
            # spelling); "matches none of" needs exactness: escape-free keys
            region = node_to_dfa(ra.repeat(b.string_char, 0, None))
            for content in contents:
                region = dfa_ops.product(region, b.dfa(content), True)
            key = dfa_ops.DFANode(region, "patternProperties", where)
        else:
            key = dfa_ops.DFANode(region, "patternProperties", where)
        out.append((ra.seq(ra.char('"'), key, ra.char('"')), inside))
    b.key_region_memo[memo_key] = (out, losses() - before)
    return out


MAX_LITERAL_KEYS = 512  # the most keys all patterns spell, for the literal split


class Quoted:
    """A key region already written as a quoted JSON string node (see literal_regions)."""

    __slots__ = ("node",)

    def __init__(self, node: Node) -> None:
        self.node = node


def finite_texts(node: object, limit: int = MAX_LITERAL_KEYS) -> set[str] | None:
    """Every string of a regex node's language when it is finite and at most `limit`
    strings (character classes of listed characters, concatenation, alternation, bounded
    repetition); None otherwise."""
    if node is ra.EMPTY:
        return {""}
    if isinstance(node, ip.CharGroup):
        return None if node.negated or len(node.chars) > limit else set(node.chars)
    if isinstance(node, ip.Concatenation):
        out = {""}
        for part in node.parts:
            got = finite_texts(part, limit)
            if got is None or len(out) * len(got) > limit:
                return None
            out = {a + c for a in out for c in got}
        return out
    if isinstance(node, ip.Pattern) and not (node.added_flags or node.removed_flags):
        alts: set[str] = set()
        for option in node.options:
            got = finite_texts(option, limit)
            if got is None or len(alts | got) > limit:
                return None
            alts |= got
        return alts
    if isinstance(node, ip.Repeated) and node.max is not None and node.max <= limit:
        base = finite_texts(node.base, limit)
        if base is None:
            return None
        cur, every = {""}, set()
        for count in range(node.max + 1):
            if count >= node.min:
                every |= cur
            if len(every) > limit or len(cur) * len(base) > limit:
                return None
            cur = {a + c for a in cur for c in base}
        return every
    return None


def literal_sets(contents: list, frees: list) -> list[set[str]] | None:
    """Each pattern's keys as a finite set, when every pattern matches only finitely many
    escape-free keys and no key that needs an escape (its full and escape-free languages
    are the same set, so a key outside all the sets matches no pattern in any spelling)."""
    texts: list[set[str]] = []
    total = 0
    for content, free in zip(contents, frees, strict=True):
        if content is None or free is None:
            return None
        got = finite_texts(free)
        if got is None or finite_texts(content) != got:
            return None
        total += len(got)
        if total > MAX_LITERAL_KEYS:
            return None
        texts.append(got)
    return texts


def literal_regions(
    b: Builder, texts: list[set[str]], names: list[str], where: str
) -> list[tuple[Quoted, tuple[bool, ...]]]:
    """split_regions for patterns that are finite sets of keys, with no automata: each
    region is the keys (not names) with one signature, written as literals; the keys in no
    pattern are the complement of all of them (a trie). Same order as split_regions."""
    by_sig: dict[tuple[bool, ...], list[str]] = {}
    named = set(names)
    for text in sorted(set().union(*texts) - named):
        by_sig.setdefault(tuple(text in t for t in texts), []).append(text)
    quote = ra.char('"')
    regions = [
        (Quoted(ra.seq(quote, ra.alt([ra.lit(t) if t else ra.EMPTY for t in keys]), quote)), sig)
        for sig, keys in sorted(by_sig.items(), key=lambda kv: [not x for x in kv[0]])
    ]
    rest = string_except(sorted(set().union(*texts) | named), b.string_char, where)
    return [*regions, (Quoted(rest), (False,) * len(texts))]


def key_except(b: Builder, names: list[str], ptr: str) -> object:
    """A JSON string whose content is none of `names` (the complement of a trie)."""
    if not names:
        return b.any_string
    return string_except(names, b.string_char, ptr)
