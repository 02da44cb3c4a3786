"""Every JSON spelling of a property name, and the exact complement of a set of names.

A string character has several spellings in JSON text: itself (unless it is the quote, the
backslash or a control character), a short escape (`\\"`, `\\\\`, `\\/`, `\\b`, `\\f`, `\\n`,
`\\r`, `\\t`), a `\\uXXXX` escape with hex digits in either case (no surrogate), or, outside
the basic plane, an escaped surrogate pair. These are the spellings of
`scalars.STRING_CHAR_TEXT`; each of its matches decodes to exactly one character, so a key
whose decoded content is one of the names is in `name_spellings`, and every other key is in
`string_except`: the two are disjoint and together every JSON string.
"""

from __future__ import annotations

import functools

from grammar.automata import interegular_adapter as ip
from grammar.automata import regex_ast as ra
from grammar.automata.nfa_keys import Deferred

_CONCAT, _ALT = ip.Concatenation, ip.Pattern

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing

# a character -> the letter of its short escape
SHORT_ESCAPES = dict(zip('"\\/\b\f\n\r\t', '"\\/bfnrt', strict=True))
_NOT_RAW = frozenset('"\\') | frozenset(chr(i) for i in range(0x20))  # never raw in JSON
_HIGH, _LOW = (0xD800, 0xDBFF), (0xDC00, 0xDFFF)  # the halves of a surrogate pair


def _digits(lo: int, hi: int) -> str:
    """A class of the hex digits lo..hi (0..15), letters in either case."""
    chars = "".join(f"{d:x}" for d in range(lo, hi + 1))
    chars += chars[len([d for d in range(lo, hi + 1) if d < 10]) :].upper()
    return ra.escape_char(chars) if len(chars) == 1 else f"[{chars}]"


def _hex_range(lo: int, hi: int, width: int) -> str:
    """Regex text of the `width`-digit hex numbers lo..hi (lo <= hi), either letter case."""
    if width == 0:
        return ""
    top = 16 ** (width - 1)
    (dl, rl), (dh, rh) = divmod(lo, top), divmod(hi, top)
    if dl == dh:
        return _digits(dl, dl) + _hex_range(rl, rh, width - 1)
    parts = []
    if rl:  # the first leading digit, from rl on
        parts.append(_digits(dl, dl) + _hex_range(rl, top - 1, width - 1))
        dl += 1
    last = None
    if rh != top - 1:  # the last leading digit, up to rh
        last = _digits(dh, dh) + _hex_range(0, rh, width - 1)
        dh -= 1
    if dl <= dh:  # whole blocks in between
        parts.append(_digits(dl, dh) + (f"[0-9a-fA-F]{{{width - 1}}}" if width > 1 else ""))
    if last:
        parts.append(last)
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _ranges_except(ranges: tuple[tuple[int, int], ...], points: set[int]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        for p in sorted(x for x in points if lo <= x <= hi):
            if lo < p:
                out.append((lo, p - 1))
            lo = p + 1
        if lo <= hi:
            out.append((lo, hi))
    return out


def _hex_ranges(ranges: list[tuple[int, int]]) -> str | None:
    """Regex text of 4 hex digits in any of `ranges`, or None if they are empty."""
    parts = [_hex_range(lo, hi, 4) for lo, hi in ranges]
    return None if not parts else parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _pair(c: int) -> tuple[int, int]:
    c -= 0x10000
    return 0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF)


_U = ra.lit("\\u")
_ANY_PAIR = ra.parsed(r"\\u" + _hex_range(*_HIGH, 4) + r"\\u" + _hex_range(*_LOW, 4))
_ANY_HEX = [ra.EMPTY, *(ra.parsed(f"[0-9a-fA-F]{{{n}}}") for n in range(1, 4))]  # n digits


def _digit_class(digits: set[int]) -> Node:
    """One hex digit among `digits`, letters in either case; None if there are none."""
    return _digit_group(frozenset(digits)) if digits else None


@functools.cache
def _digit_group(digits: frozenset[int]) -> object:
    lower = "".join(f"{d:x}" for d in digits)
    return ip.CharGroup(frozenset(lower + lower.upper()), False)


@functools.lru_cache(maxsize=4096)
def char_spellings(c: str) -> Node:
    """Every spelling of the character `c` inside a JSON string; None for a lone surrogate
    (no spelling: JSON text cannot hold one)."""
    code = ord(c)
    if 0xD800 <= code <= 0xDFFF:
        return None
    options = [] if c in _NOT_RAW else [ra.char(c)]
    if c in SHORT_ESCAPES:
        options.append(ra.lit("\\" + SHORT_ESCAPES[c]))
    if code <= 0xFFFF:  # \\u and its 4 digits, each in either case
        options.append(ra.seq(_U, *(_digit_class({code >> s & 15}) for s in (12, 8, 4, 0))))
    else:
        high, low = _pair(code)
        text = r"\\u" + _hex_range(high, high, 4) + r"\\u" + _hex_range(low, low, 4)
        options.append(ra.parsed(text))
    return ra.alt(options)


def name_spellings(name: str) -> Node:
    """Every JSON spelling of the string `name`, quotes included; None if it has none."""
    return ra.seq(ra.char('"'), *[char_spellings(c) for c in name], ra.char('"'))


@functools.cache
def _short_escapes(letters: frozenset[str]) -> Node:
    """A backslash and one of these short-escape letters (most sets exclude none of them)."""
    return ra.seq(ra.char("\\"), ip.CharGroup(letters, False))


@functools.lru_cache(maxsize=4096)
def char_except(chars: frozenset[str]) -> Node:
    """One string character, in any spelling, that decodes to none of `chars`."""
    options: list[Node] = [ip.CharGroup(_NOT_RAW | chars, True)]
    short = frozenset(e for c, e in SHORT_ESCAPES.items() if c not in chars)
    if short:
        options.append(_short_escapes(short))
    codes = {ord(c) for c in chars}
    options.append(ra.seq(_U, _bmp_except(frozenset(c for c in codes if c <= 0xFFFF))))
    # surrogate pairs: the high halves with no excluded character take any low half
    lows: dict[int, set[int]] = {}
    for code in codes:
        if code > 0xFFFF:
            high, low = _pair(code)
            lows.setdefault(high, set()).add(low)
    if not lows:
        options.append(_ANY_PAIR)
        return ra.alt(options)
    any_low = _hex_range(*_LOW, 4)
    free = _hex_ranges(_ranges_except((_HIGH,), set(lows)))
    if free:
        options.append(ra.parsed(r"\\u" + free + r"\\u" + any_low))
    for high, excluded in lows.items():
        rest = _hex_ranges(_ranges_except((_LOW,), excluded))
        if rest:
            options.append(ra.parsed(r"\\u" + _hex_range(high, high, 4) + r"\\u" + rest))
    return ra.alt(options)


@functools.lru_cache(maxsize=4096)
def _bmp_except(codes: frozenset[int]) -> Node:
    """4 hex digits (after `\\u`) of a basic-plane character that is no surrogate and none of
    `codes`: digit by digit, the digits no excluded code starts with take any tail."""
    if codes and max(codes) < 0x100:
        # the common case (names are mostly ASCII): every code from 0x100 on (one shared
        # node), or `00` and two digits spelling none of `codes`
        zero = _digit_class({0})
        return ra.alt([_bmp_from_100(), ra.seq(zero, zero, _hex_tail(2, _ALL_DIGITS, codes))])
    return _bmp_digits(codes)


def _bmp_digits(codes: frozenset[int]) -> Node:
    plain = frozenset(c for c in codes if not 0xD000 <= c <= 0xDFFF)
    in_d = frozenset(c - 0xD000 for c in codes if 0xD000 <= c <= 0xD7FF)
    # first digit d: only d0-d7 (d8-df start surrogates)
    return ra.alt(
        [
            _hex_tail(4, frozenset(range(16)) - {0xD}, plain),
            ra.seq(_digit_class({0xD}), _hex_tail(3, frozenset(range(8)), in_d)),
        ]
    )


@functools.cache
def _bmp_from_100() -> Node:
    """4 hex digits of a basic-plane character from U+0100 on that is no surrogate."""
    return _bmp_digits(frozenset(range(0x100)))


@functools.lru_cache(maxsize=4096)
def _hex_tail(width: int, allowed: frozenset[int], points: frozenset[int]) -> Node:
    """`width` hex digits, the first among `allowed`, spelling none of `points` (shared by
    every character set with the same excluded tails: most names are ASCII)."""
    if width == 0:
        return ra.EMPTY if not points else None
    top = 16 ** (width - 1)
    firsts: dict[int, set[int]] = {}
    for p in points:
        firsts.setdefault(p // top, set()).add(p % top)
    options = [ra.seq(_digit_class(set(allowed) - set(firsts)), _ANY_HEX[width - 1])]
    for d, rest in sorted(firsts.items()):
        options.append(
            ra.seq(_digit_class({d}), _hex_tail(width - 1, _ALL_DIGITS, frozenset(rest)))
        )
    return ra.alt(options)


_ALL_DIGITS = frozenset(range(16))


_BUILT: dict[tuple, tuple[Node, Node]] = {}  # (names, id(string_char)) -> (string_char, node)
MAX_BUILT = 256
# id(string_char) -> (string_char, {frozenset of name suffixes: their complement node}):
# the subtries of one schema's name lists recur across its objects (`apiVersion`, `kind`,
# `metadata` in every Kubernetes resource), so each is built once and shared
_SUBTRIES: dict[int, tuple[Node, dict[frozenset[str], Node]]] = {}
MAX_SUBTRIES = 1 << 16


MAX_DEFERRED_NAME = 64  # a complement with a longer name is built at once (see deferred_...)


def deferred_string_except(names: list[str], string_char: Node) -> Node:
    """`string_except(names, string_char)` as a `Deferred` node (names not empty): the NFA
    builds the trie when a walk first reaches the object's other keys. Most objects of a
    large schema are not reached by its first masks, and their complements are most of its
    tree. With a name over MAX_DEFERRED_NAME characters it is built now: the trie nests as
    deep as its longest name, and a deferred one is keyed inside a walk's own stack."""
    names = list(names)
    if max(map(len, names)) > MAX_DEFERRED_NAME:
        return string_except(names, string_char)
    return Deferred(
        ("names", frozenset(names)),
        (string_char,),
        lambda: string_except(names, string_char),
        2 * (sum(map(len, names)) + len(names)) + 16,  # ~ its structures, rounded up
    )


def string_except(names: list[str], string_char: Node) -> Node:
    """A JSON string (quotes included) whose decoded content is none of `names`: the
    complement of the names' trie over decoded characters, `string_char` (a regex node
    of one character in any spelling) after the first character off the trie. Built once
    per name list (an object's copies share it: unrolled recursion, alternatives)."""
    key = (tuple(names), id(string_char))
    hit = _BUILT.get(key)
    if hit is not None and hit[0] is string_char:
        return hit[1]
    if len(_BUILT) >= MAX_BUILT:
        _BUILT.clear()
    node = _string_except(names, string_char)
    _BUILT[key] = (string_char, node)  # holding string_char keeps its id from being reused
    return node


class _Built:
    """The pieces of name complements built so far for one `string_char`: complements by
    set of name suffixes (`chains` for a single suffix, by that suffix), and the ways off
    the trie by set of next characters (`off`; `off1` by the one next character)."""

    def __init__(self, string_char: Node) -> None:
        self.string_char = string_char  # holding it keeps its id from being reused
        self.rest = ra.repeat(string_char, 0, None)
        self.tries: dict[frozenset[str], Node] = {}
        self.chains: dict[str, Node] = {}
        self.off: dict[frozenset[str], Node] = {}
        self.off1: dict[str, Node] = {}

    def size(self) -> int:
        return len(self.tries) + len(self.chains)


def _subtries(string_char: Node) -> _Built:
    held = _SUBTRIES.get(id(string_char))
    if held is None or held.string_char is not string_char or held.size() > MAX_SUBTRIES:
        held = _SUBTRIES[id(string_char)] = _Built(string_char)
    return held


def _string_except(names: list[str], string_char: Node) -> Node:
    b = _subtries(string_char)
    built, off, chains, off1, rest = b.tries, b.off, b.chains, b.off1, b.rest

    def leave(nexts: frozenset[str]) -> Node:
        """A character no suffix goes on with, then anything."""
        node = off.get(nexts)
        if node is None:
            node = off[nexts] = ra.seq(char_except(nexts), rest)
        return node

    def chain(suffix: str) -> Node:
        """complement([suffix]) (one name's rest: most of a trie's nodes), built from its
        end without recursion, into the nodes complement's general case would make: for
        each character c, alt(off the trie at c, stop here, c then the rest's complement)."""
        node = chains.get(suffix)
        if node is not None:
            return node
        node = chains.get("")
        if node is None:
            node = chains[""] = leave(frozenset())
        for i in range(len(suffix) - 1, -1, -1):
            tail = suffix[i:]
            hit = chains.get(tail)
            if hit is None:
                c = tail[0]
                away = off1.get(c)
                if away is None:
                    away = off1[c] = leave(frozenset(c))
                spelt = char_spellings(c)
                if spelt is None:  # a lone surrogate: no spelling goes on
                    hit = _ALT((away, ra.EMPTY))
                elif type(spelt) is _CONCAT or type(node) is _CONCAT:  # seq flattens them
                    hit = _ALT((away, ra.EMPTY, ra.seq(spelt, node)))
                else:
                    hit = _ALT((away, ra.EMPTY, _CONCAT((spelt, node))))
                chains[tail] = hit
            node = hit
        return node

    def complement(suffixes: list[str]) -> Node:
        """Strings that, read from this trie node (the names' remaining `suffixes`), spell
        none of the suffixes: leave the trie on a character no suffix goes on with, stop
        here unless a name ends here, or go on in a child."""
        if len(suffixes) == 1:
            return chain(suffixes[0])
        key = frozenset(suffixes)
        hit = built.get(key)
        if hit is not None:
            return hit
        children: dict[str, list[str]] = {}
        ends = False
        for suffix in suffixes:
            if suffix:
                children.setdefault(suffix[0], []).append(suffix[1:])
            else:
                ends = True
        first = leave(frozenset(children))
        options = [first] if ends else [first, ra.EMPTY]
        options += [ra.seq(char_spellings(c), complement(sub)) for c, sub in children.items()]
        node = built[key] = ra.alt(options)
        return node

    try:
        return ra.seq(ra.char('"'), complement(list(dict.fromkeys(names))), ra.char('"'))
    finally:
        # recursive closures are cycles through their cells: emptied, they are freed now
        leave = chain = complement = None  # type: ignore[assignment]  # noqa: F841
