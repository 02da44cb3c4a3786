"""The parameters of an XML argument style (`grammar.structural.xml_args`) beyond the declared
properties: `additionalProperties`, `patternProperties`, `propertyNames`, and the count bounds
`minProperties` / `maxProperties`.

Extra parameters follow the declared ones (XGrammar's order). Their names are sets of strings
built as byte DFAs, exact with JSON Schema's semantics:

- a name never repeats a declared property's name, and never holds `< > " & \\` or a control
  character (every style writes the name inside a tag or an attribute);
- a `patternProperties` pattern matches a name when it matches somewhere in it (`re.search`,
  as JSON Schema says), and that parameter's value takes the pattern's schema; patterns whose
  names overlap must share one schema (else refused by name);
- `additionalProperties` (a schema or true) covers names `[a-zA-Z_][a-zA-Z0-9_]*` (XGrammar's
  XML names) that no pattern matches;
- `propertyNames` (a `pattern`, `minLength` / `maxLength`) narrows every name, the declared
  ones too: a declared property whose name it refuses can not appear.

A declared property whose name a pattern matches would have to satisfy both schemas; that is
refused by name unless the pattern's schema takes anything. Counts are exact: the declared
part is walked by how many it holds (at most `MAX_OPTIONAL_COUNTED` optional properties).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from grammar.automata import interegular_adapter as ip
from grammar.automata import regex_ast as ra
from grammar.automata.dfa_ops import DFANode, product
from grammar.automata.fsm import ByteDFA, node_to_dfa
from grammar.automata.intersect import dfas_intersect
from grammar.automata.pattern import pattern_to_content
from grammar.ebnf.syntax import Regular
from grammar.errors import GrammarError

EXTRA_KEYWORDS = (
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
)
MAX_OPTIONAL_COUNTED = 8
_NAME_UNSAFE = frozenset('<>"&\\') | frozenset(chr(i) for i in range(0x20))
_SAFE_CHAR = ip.CharGroup(_NAME_UNSAFE, True)
_IDENTIFIER = "[a-zA-Z_][a-zA-Z0-9_]*"
_ANYTHING = ({}, True)


@dataclass(slots=True)
class ExtraKind:
    """One kind of extra parameter: its names (a leaf) and its value's schema."""

    name: Regular
    schema: Any
    at: str


def _searched(pattern: str, where: str) -> ByteDFA | None:
    """Names (safe characters only) in which `pattern` matches somewhere."""
    try:
        re.compile(pattern)
        node = pattern_to_content(pattern, _SAFE_CHAR)
    except (re.error, GrammarError) as e:
        raise GrammarError(f"{where}: {pattern!r}: {e}") from None
    if node is None:
        return None
    return product(node_to_dfa(node), _safe_names(), keep_b=True)


def _safe_names() -> ByteDFA:
    return node_to_dfa(ra.repeat(_SAFE_CHAR, 1, None))


def _literals(names: list[str]) -> ByteDFA | None:
    return node_to_dfa(ra.alt([ra.lit(n) for n in names])) if names else None


def _and(a: ByteDFA | None, b: ByteDFA | None) -> ByteDFA | None:
    """L(a) & L(b); None is the empty language."""
    return None if a is None or b is None else _nonempty(product(a, b, keep_b=True))


def _minus(a: ByteDFA | None, b: ByteDFA | None) -> ByteDFA | None:
    """L(a) - L(b); None is the empty language."""
    return a if a is None or b is None else _nonempty(product(a, b, keep_b=False))


def _nonempty(dfa: ByteDFA) -> ByteDFA | None:
    return dfa if bool(dfa.accepting.any()) else None


def _name_filter(schema: Any, where: str) -> tuple[ByteDFA | None, Any]:
    """`propertyNames` as (the names it takes, None: none; a predicate on one name)."""
    if schema is True or schema == {}:
        return _safe_names(), lambda _n: True
    if schema is False:
        return None, lambda _n: False
    allowed = {"type", "pattern", "minLength", "maxLength", "title", "description", "$comment"}
    if (
        not isinstance(schema, dict)
        or set(schema) - allowed
        or schema.get("type", "string") != "string"
    ):
        raise GrammarError(
            f"{where}: only pattern / minLength / maxLength are supported in propertyNames"
        )
    dfa = _safe_names()
    pattern = schema.get("pattern")
    if pattern is not None:
        dfa = _and(dfa, _searched(pattern, where))
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    if lo or hi is not None:
        sized = ra.repeat(ra.parsed("[\\s\\S]"), lo, None if hi is None else int(hi))
        dfa = _and(dfa, node_to_dfa(sized))

    def keeps(name: str) -> bool:
        if not lo <= len(name) <= (len(name) if hi is None else int(hi)):
            return False
        return pattern is None or re.search(pattern, name) is not None

    return dfa, keeps


def extra_kinds(
    schema: dict, declared: list[str], strict: bool, where: str
) -> tuple[list[ExtraKind], set[str]]:
    """The kinds of extra parameters `schema` allows beside `declared`, and the declared names
    that `propertyNames` refuses (they can not appear)."""
    pp = schema.get("patternProperties", {})
    if not isinstance(pp, dict):
        raise GrammarError(f"{where}/patternProperties: an object of schemas")
    extra = schema.get("additionalProperties")
    if extra is None:
        # XGrammar's reading: propertyNames alone opens the object to named extras
        extra = True if ("propertyNames" in schema and not pp) or not strict else False
    if not pp and extra is False and "propertyNames" not in schema:
        return [], set()  # no extra parameter can appear, no declared name is barred
    names, keeps = _name_filter(schema.get("propertyNames", True), f"{where}/propertyNames")
    barred = {n for n in declared if not keeps(n)}
    for pattern, sub in pp.items():
        for n in declared:
            if sub not in _ANYTHING and re.search(pattern, n) and n not in barred:
                raise GrammarError(
                    f"{where}/patternProperties: the declared property {n!r} also matches "
                    f"{pattern!r} (a value under both schemas is not supported)"
                )
    taken = _literals(declared)
    key = json.dumps([list(pp), declared, schema.get("propertyNames")], default=str)
    kinds: list[ExtraKind] = []
    matched: ByteDFA | None = None
    seen: list[tuple[ByteDFA, Any, str]] = []
    for pattern, sub in pp.items():
        at = f"{where}/patternProperties/{pattern}"
        dfa = _and(_minus(_searched(pattern, at), taken), names)
        if dfa is None:
            continue
        for other, other_sub, other_pattern in seen:
            if other_sub != sub and dfas_intersect(dfa, other):
                raise GrammarError(
                    f"{at}: names matching both {other_pattern!r} and {pattern!r} with "
                    "different schemas are not supported"
                )
        seen.append((dfa, sub, pattern))
        matched = dfa if matched is None else _union(matched, dfa)
        kinds.append(ExtraKind(_leaf(dfa, at, key), sub, at))
    if extra is not False:
        at = f"{where}/additionalProperties"
        identifiers = node_to_dfa(ra.parsed(_IDENTIFIER))
        dfa = _and(_minus(_minus(identifiers, taken), matched), names)
        if dfa is not None:
            kinds.append(ExtraKind(_leaf(dfa, at, key), extra, at))
    return kinds, barred


def _union(a: ByteDFA, b: ByteDFA) -> ByteDFA:
    # L(a) | L(b) = L(a) - (L(a) - L(b)) ... as a difference: all - ((all - a) & (all - b))
    every = _safe_names()
    rest = _minus(_minus(every, a), b)
    return every if rest is None else product(every, rest, keep_b=False)


def _leaf(dfa: ByteDFA, at: str, key: str) -> Regular:
    return Regular(DFANode(dfa, "parameter names", at), ("xml-names", at, key))


def count_bounds(schema: dict, where: str) -> tuple[int, int | None]:
    lo, hi = schema.get("minProperties", 0), schema.get("maxProperties")
    for key, v in (("minProperties", lo), ("maxProperties", hi)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise GrammarError(f"{where}/{key}: a non-negative integer")
    return lo, hi
