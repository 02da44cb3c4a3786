"""llguidance's parametric lark rules (its docs/parametric.md), expanded ahead of compiling.

A rule defined as `name::_` takes one 64-bit unsigned parameter `p`; a reference writes
`name::ARG`, ARG a number (decimal or `0x` hexadecimal), `_` (the caller's own `p`) or one of
`set_bit(k)`, `clear_bit(k)`, `bit_and(v)`, `bit_or(v)`, `incr([x:y])`, `decr([x:y])` (the
saturating counters of bits x..y-1; `_` stands for `[0:64]`). An alternative may end with
`%if COND`: `true`, `bit_clear(k)`, `bit_set(k)`, `is_ones(R)`, `is_zeros(R)`, `eq|ne|lt|le|
gt|ge(R, v)`, `bit_count_eq|ne|lt|le|gt|ge(R, k)`, `and(c, c)`, `or(c, c)`, `not(c)`.

`expand_parametric(text)` returns plain llguidance lark: starting from the constant
parameters the non-parametric rules pass, every reachable (rule, parameter) pair becomes one
rule `name__param_<hex>` holding the alternatives whose condition holds. An instance left
with no alternative that can finish matches nothing, and alternatives naming it are dropped.
llguidance materialises instances lazily while parsing; expanding them all up front is
exact but bounded: more than `MAX_INSTANCES` reachable pairs is a GrammarError naming the
rule and the limit (e.g. several counters of 8 bits each). Attributes on a parametric rule,
a parameter in a terminal and the other misuses are GrammarErrors naming the rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from grammar.ebnf import lark_syntax as ls
from grammar.errors import GrammarError

MAX_INSTANCES = 20_000  # (rule, parameter) pairs expanded up front
_MASK = (1 << 64) - 1
_HEX = re.compile(r"0[xX]([0-9a-fA-F]+)")


def _err(t: ls.Tok, msg: str) -> GrammarError:
    return GrammarError(f"lark grammar error at line {t.line}, column {t.col}: {msg}")


@dataclass
class _Ref:
    """`name::ARG` at [start, end) of the text: its parameter from the caller's."""

    name: str
    start: int
    end: int
    arg: Callable[[int], int]
    uses_param: bool


@dataclass
class _Alt:
    start: int  # the alternative's text, without its `%if`
    end: int
    refs: list[_Ref]
    cond: Callable[[int], bool] | None


@dataclass
class _Stmt:
    name: str | None  # a rule's name (None: a terminal or directive)
    parametric: bool
    head: ls.Tok
    start: int  # the whole statement
    end: int
    alts: list[_Alt]


class _Reader:
    def __init__(self, text: str, toks: list[ls.Tok], offsets: list[int]) -> None:
        self.text, self.toks, self.offsets, self.i = text, toks, offsets, 0

    def peek(self, k: int = 0) -> ls.Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self, kind: str) -> ls.Tok:
        t = self.peek()
        if t.kind != kind:
            raise _err(t, f"expected {kind!r} in a parametric expression, got {t.text!r}")
        self.i += 1
        return t

    def number(self) -> int:
        t = self.take("number")
        at = self.offsets[self.i - 1]
        hexa = _HEX.match(self.text, at)
        if hexa:  # `0x1F` lexes as 0, x1, F: skip what the hex number covers
            while self.offsets[self.i] < hexa.end() and self.peek().kind != "eof":
                self.i += 1
            return int(hexa.group(1), 16) & _MASK
        if not t.text.isdigit():
            raise _err(t, f"expected a non-negative integer, got {t.text!r}")
        value = int(t.text)
        if value > _MASK:
            raise _err(t, f"number {value} does not fit 64 bits")
        return value

    def bit(self, limit: int = 63) -> int:
        t = self.peek()
        k = self.number()
        if k > limit:
            raise _err(t, f"number {k} is too large; must be <= {limit}")
        return k

    def range_(self) -> tuple[int, int]:
        """`[x:y]` or `_` (all 64 bits)."""
        if self.peek().kind == "_":
            self.i += 1
            return 0, 64
        self.take("[")
        start = self.peek()
        x = self.bit(63)
        self.take(":")
        y = self.bit(64)
        self.take("]")
        if y <= x:
            raise _err(start, f"end bit index {y} must be > start bit index {x}")
        return x, y


def _bits(p: int, r: tuple[int, int]) -> int:
    return (p >> r[0]) & ((1 << (r[1] - r[0])) - 1)


_COMPARE = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}


def _condition(r: _Reader) -> Callable[[int], bool]:
    t = r.take("rule")
    name = t.text
    if name == "true":
        if r.peek().kind == "(":
            r.take("(")
            r.take(")")
        return lambda p: True
    r.take("(")
    out: Callable[[int], bool]
    if name in ("and", "or"):
        a = _condition(r)
        r.take(",")
        b = _condition(r)
        out = (lambda p: a(p) and b(p)) if name == "and" else (lambda p: a(p) or b(p))
    elif name == "not":
        a = _condition(r)
        out = lambda p: not a(p)  # noqa: E731
    elif name in ("bit_clear", "bit_set"):
        k, want = r.bit(), int(name == "bit_set")
        out = lambda p: (p >> k) & 1 == want  # noqa: E731
    elif name in ("is_ones", "is_zeros"):
        rng = r.range_()
        full = 0 if name == "is_zeros" else (1 << (rng[1] - rng[0])) - 1
        out = lambda p: _bits(p, rng) == full  # noqa: E731
    elif name in _COMPARE or (name.startswith("bit_count_") and name[10:] in _COMPARE):
        rng = r.range_()
        r.take(",")
        v = r.number()
        cmp = _COMPARE[name[-2:]]
        if name.startswith("bit_count_"):
            out = lambda p: cmp(bin(_bits(p, rng)).count("1"), v)  # noqa: E731
        else:
            out = lambda p: cmp(_bits(p, rng), v)  # noqa: E731
    else:
        raise _err(t, f"unknown %if condition {name!r}")
    r.take(")")
    return out


def _argument(r: _Reader) -> tuple[Callable[[int], int], bool]:
    """A reference's parameter as a function of the caller's, and whether it reads it."""
    t = r.peek()
    if t.kind == "_":
        r.i += 1
        return (lambda p: p), True
    if t.kind == "number":
        v = r.number()
        return (lambda p: v), False
    if t.kind != "rule":
        raise _err(t, f"expected a parameter after '::', got {t.text!r}")
    name = r.take("rule").text
    r.take("(")
    f: Callable[[int], int]
    if name in ("set_bit", "clear_bit"):
        k = r.bit()
        f = (lambda p: p | 1 << k) if name == "set_bit" else (lambda p: p & ~(1 << k) & _MASK)
    elif name in ("bit_and", "bit_or"):
        v = r.number()
        f = (lambda p: p & v) if name == "bit_and" else (lambda p: p | v)
    elif name in ("incr", "decr"):
        rng = r.range_()
        top, unit = (1 << (rng[1] - rng[0])) - 1, 1 << rng[0]
        if name == "incr":
            f = lambda p: p if _bits(p, rng) == top else (p + unit) & _MASK  # noqa: E731
        else:
            f = lambda p: p if _bits(p, rng) == 0 else p - unit  # noqa: E731
    else:
        raise _err(t, f"unknown parameter function {name!r}")
    r.take(")")
    return f, True


def _line_offsets(text: str) -> list[int]:
    out = [0]
    for i, c in enumerate(text):
        if c == "\n":
            out.append(i + 1)
    return out


def _statements(text: str) -> list[_Stmt]:
    toks = ls.tokenize(text)
    lines = _line_offsets(text)
    offsets = [lines[t.line - 1] + t.col - 1 for t in toks]
    r = _Reader(text, toks, offsets)
    out: list[_Stmt] = []
    while r.peek().kind != "eof":
        if r.peek().kind == "newline":
            r.i += 1
            continue
        out.append(_statement(r))
    return out


def _statement(r: _Reader) -> _Stmt:
    head = r.peek()
    start = r.offsets[r.i]
    parametric, name = False, None
    if head.kind == "rule":
        name = head.text.lstrip("!?")
        if r.peek(1).kind == "::":
            if r.peek(2).kind != "_":
                raise _err(r.peek(2), f"rule {name!r}: expected token '_' after '::'")
            parametric = True
    alts: list[_Alt] = []
    refs: list[_Ref] = []
    alt_start, cond, depth, body = None, None, 0, False
    alt_end = start
    while True:
        t = r.peek()
        if t.kind == "eof" or (t.kind == "newline" and r.peek(1).kind != "|" and depth == 0):
            break
        if not body:  # the head, up to the first ':' outside brackets
            if name is None and t.kind in ("rule", "token") and r.peek(1).kind == "::":
                raise _err(t, "name::param cannot be used in terminals")
            if t.kind == "[" and parametric:
                raise _err(t, f"rule {name!r}: attributes are not supported on parametric rules")
            body = t.kind == ":" and name is not None
            r.i += 1
            if body:
                alt_start = r.offsets[r.i]
            elif t.kind in (":", "keyword") and name is None:
                pass
            continue
        if t.kind in "([{":
            depth += 1
        elif t.kind in ")]}":
            depth -= 1
        if depth == 0 and t.kind == "|":
            alts.append(_Alt(alt_start, alt_end, refs, cond))
            refs, cond = [], None
            r.i += 1
            alt_start = r.offsets[r.i]
            continue
        if t.kind == "keyword" and t.text == "%if":
            alt_end = r.offsets[r.i]
            r.i += 1
            if not parametric:
                raise _err(t, f"rule {name!r}: %if needs a parametric rule (name::_)")
            cond = _condition(r)
            continue
        if t.kind in ("rule", "token") and r.peek(1).kind == "::":
            if t.kind == "token" or name is None:
                raise _err(t, "name::param cannot be used in terminals")
            ref_start = r.offsets[r.i]
            r.i += 2
            arg, uses = _argument(r)
            if uses and not parametric:
                raise _err(t, f"rule {name!r} is not parametric, but its body requires parameters")
            last = r.toks[r.i - 1]
            end = r.offsets[r.i - 1] + len(last.text)
            refs.append(_Ref(t.text.lstrip("!?"), ref_start, end, arg, uses))
            if cond is None:
                alt_end = r.offsets[r.i]
            continue
        r.i += 1
        if cond is None:
            alt_end = r.offsets[r.i]
    if body:
        alts.append(_Alt(alt_start, alt_end, refs, cond))
    return _Stmt(name, parametric, head, start, r.offsets[r.i], alts)


def _expand(stmts: list[_Stmt]) -> tuple[dict[tuple[str, int], list[list]], dict]:
    """Every reachable (rule, parameter) pair with its alternatives (each the alternative and
    the parameters its references get)."""
    params = {s.name: s for s in stmts if s.parametric}
    for s in stmts:
        for a in s.alts:
            for ref in a.refs:
                if ref.name not in params:
                    raise _err(s.head, f"rule {ref.name!r} is not parametric")
    for s in params.values():
        if not any(a.cond or any(ref.uses_param for ref in a.refs) for a in s.alts):
            raise _err(s.head, f"rule {s.name!r} is parametric, but its body doesn't need "
                       "parameters")  # fmt: skip
    todo = [(ref.name, ref.arg(0)) for s in stmts if not s.parametric for a in s.alts
            for ref in a.refs]  # fmt: skip
    instances: dict[tuple[str, int], list[list]] = {}
    while todo:
        key = todo.pop()
        if key in instances:
            continue
        if len(instances) >= MAX_INSTANCES:
            raise GrammarError(
                f"lark grammar error: parametric rule {key[0]!r}: over {MAX_INSTANCES} "
                "(rule, parameter) pairs are reachable (they are expanded up front here)"
            )
        name, p = key
        alts = []
        for a in params[name].alts:
            if a.cond is None or a.cond(p):
                args = [ref.arg(p) for ref in a.refs]
                alts.append([a, args])
                todo += [(ref.name, v) for ref, v in zip(a.refs, args, strict=True)]
        instances[key] = alts
    return instances, params


def _productive(instances: dict[tuple[str, int], list[list]]) -> set[tuple[str, int]]:
    done: set[tuple[str, int]] = set()
    changed = True
    while changed:
        changed = False
        for key, alts in instances.items():
            if key in done:
                continue
            for a, args in alts:
                if all((ref.name, v) in done for ref, v in zip(a.refs, args, strict=True)):
                    done.add(key)
                    changed = True
                    break
    return done


def _instance_name(name: str, p: int) -> str:
    return f"{name}__param_{p:x}"


def _alt_text(text: str, a: _Alt, args: list[int]) -> str:
    out, pos = [], a.start
    for ref, v in zip(a.refs, args, strict=True):
        out += [text[pos : ref.start], _instance_name(ref.name, v)]
        pos = ref.end
    out.append(text[pos : a.end])
    return "".join(out).strip() or '""'


def expand_parametric(text: str) -> str:
    """`text` with its parametric rules expanded (module doc); unchanged without them."""
    if "::" not in text and "%if" not in text:
        return text
    stmts = _statements(text)
    if not any(s.parametric or any(a.refs for a in s.alts) for s in stmts):
        return text
    instances, _ = _expand(stmts)
    live = _productive(instances)
    out, pos = [], 0
    for s in stmts:
        out.append(text[pos : s.start])
        pos = s.end
        if s.parametric:
            continue
        if not any(a.refs for a in s.alts):
            out.append(text[s.start : s.end])
            continue
        kept = [
            _alt_text(text, a, [ref.arg(0) for ref in a.refs])
            for a in s.alts
            if all((ref.name, ref.arg(0)) in live for ref in a.refs)
        ]
        if not kept:
            raise _err(s.head, f"rule {s.name!r}: its parametric references match nothing")
        out.append(text[s.start : s.alts[0].start] + "\n    | ".join(kept))
    out.append(text[pos:])
    for (name, p), alts in sorted(instances.items()):
        if (name, p) not in live:
            continue
        kept = [
            _alt_text(text, a, args)
            for a, args in alts
            if all((ref.name, v) in live for ref, v in zip(a.refs, args, strict=True))
        ]
        out.append(f"\n{_instance_name(name, p)}: " + "\n    | ".join(kept) + "\n")
    return "".join(out)
