"""Regex syntax trees (interegular's node classes) built directly, shared as a DAG, and
written back to regex text.

The JSON Schema builder composes these nodes instead of strings: a sub-regex used in many places
(an `additionalProperties` value, the suffix of an object's optional members) is one shared
node, so the NFA builder (which memoises on node identity) does linear work where the regex
text would be quadratic or exponential. `to_text` gives the equivalent regex string.
"""

from __future__ import annotations

import functools

from grammar.automata import interegular_adapter as ip
from grammar.automata.nfa import parse_regex
from grammar.automata.nfa_keys import Deferred
from grammar.automata.utf8 import chars_to_ranges

Node = object  # an interegular pattern node
EMPTY = ip.EMPTY
_CONCAT, _ALT = ip.Concatenation, ip.Pattern

_SPECIAL = set("\\.^$|?*+()[]{}-/")
_CLASS_SPECIAL = set("\\]^-[")


@functools.lru_cache(maxsize=4096)
def parsed(text: str) -> Node:
    """A node for regex text (small fixed pieces: formats, number forms)."""
    return parse_regex(text)


@functools.lru_cache(maxsize=1 << 16)
def char(c: str) -> Node:
    """One character (a shared node: nodes are immutable, the NFA builder keys them by
    structure, and enum literals would otherwise make hundreds of thousands)."""
    return ip.CharGroup(frozenset(c), False)


@functools.lru_cache(maxsize=1 << 14)
def lit(text: str) -> Node:
    if len(text) == 1:
        return char(text)
    return ip.Concatenation(tuple(char(c) for c in text))


def char_class(chars: frozenset[str], negated: bool = False) -> Node:
    """A character class (negated: every character but these). A class is a set of its
    characters: write a large one as the complement of a small one."""
    return ip.CharGroup(chars, negated)


def seq(*parts: Node | None) -> Node | None:
    """Concatenation; None (matches nothing) if any part is None."""
    # (exact type tests: isinstance against interegular's ABC-derived classes is slow, and
    # these two are the hot calls of the tree phase)
    flat: list[Node] = []
    for p in parts:
        if p is None:
            return None
        if type(p) is _CONCAT:
            flat.extend(p.parts)
        elif p is not EMPTY:
            flat.append(p)
    if len(flat) == 1:
        return flat[0]
    return _CONCAT(tuple(flat)) if flat else EMPTY


def alt(options: list[Node | None]) -> Node | None:
    """Alternation of the options that can match (deduplicated by identity)."""
    opts = list({id(o): o for o in options if o is not None}.values())
    if not opts:
        return None
    return opts[0] if len(opts) == 1 else _ALT(tuple(opts))


def repeat(node: Node | None, lo: int, hi: int | None) -> Node | None:
    if node is None:
        return EMPTY if lo == 0 else None
    if hi is not None and hi < lo:
        return None
    if hi == 0:
        return EMPTY
    if lo == hi == 1:
        return node
    return ip.Repeated(node, lo, hi)


def optional(node: Node | None) -> Node:
    return repeat(node, 0, 1)  # type: ignore[return-value]


def escape_char(c: str, in_class: bool = False) -> str:
    o = ord(c)
    if o < 0x20 or o == 0x7F:
        return f"\\x{o:02x}"
    if c in (_CLASS_SPECIAL if in_class else _SPECIAL):
        return "\\" + c
    return c


def regex_escape(text: str) -> str:
    """A regex (interegular dialect) matching exactly `text`."""
    return "".join(escape_char(c) for c in text)


def _class_text(group: ip.CharGroup) -> str:
    if not group.negated and len(group.chars) == 1:
        return escape_char(next(iter(group.chars)))
    body = []
    for lo, hi in chars_to_ranges(group.chars, False):
        if lo == hi:
            body.append(escape_char(chr(lo), True))
        else:
            body.append(f"{escape_char(chr(lo), True)}-{escape_char(chr(hi), True)}")
    return ("[^" if group.negated else "[") + "".join(body) + "]"


def to_text(node: Node | None) -> str:
    """Regex text for a node."""
    memo: dict[int, str] = {}

    def write(n: Node) -> str:
        hit = memo.get(id(n))
        if hit is not None:
            return hit
        if isinstance(n, ip.CharGroup):
            out = _class_text(n)
        elif n is ip.DOT:
            out = "."
        elif n is EMPTY:
            out = ""
        elif isinstance(n, ip.Concatenation):
            out = "".join(write(p) for p in n.parts)
        elif isinstance(n, ip.Pattern):
            out = "(" + "|".join(write(o) for o in n.options) + ")"
        elif isinstance(n, ip.Repeated):
            inner = write(n.base)
            if not (isinstance(n.base, ip.CharGroup | ip.Pattern) or n.base is ip.DOT):
                inner = f"({inner})"
            if (n.min, n.max) == (0, None):
                out = inner + "*"
            elif (n.min, n.max) == (1, None):
                out = inner + "+"
            elif (n.min, n.max) == (0, 1):
                out = inner + "?"
            else:
                out = f"{inner}{{{n.min},{'' if n.max is None else n.max}}}"
        elif type(n) is Deferred:
            out = write(n.build())
        elif type(n).__name__ == "DFANode" and n.text is not None:
            out = f"({n.text})"
        elif type(n).__name__ == "DFANode":
            from grammar.errors import UnsupportedSchemaError

            raise UnsupportedSchemaError(
                n.keyword, n.pointer, "exact only as an automaton (compile_json_schema)"
            )
        else:
            raise TypeError(f"not a regex node: {type(n).__name__}")
        memo[id(n)] = out
        return out

    if node is None:
        raise ValueError("no regex matches nothing in interegular's dialect")
    return write(node)
