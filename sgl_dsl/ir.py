"""The intermediate representation a traced program becomes.

Expressions (what `s += ...` appends) are `Expr` nodes; they concatenate with `+` so
`"Q: " + question + gen("a")` is one `Concat`. A traced program is a flat list of
statements, each acting on one state: the root state is `%0`, forks get their own ids.
The tracer flattens `Concat` and role blocks, so statements hold only leaf expressions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant")


class Expr:
    """Something that can be appended to a state; `+` builds a `Concat`."""

    def __add__(self, other: Any) -> Concat:
        return Concat.of(self, other)

    def __radd__(self, other: Any) -> Concat:
        return Concat.of(other, self)


def as_expr(value: Any) -> Expr:
    """Wrap a plain value (str, int, ...) as constant text; pass expressions through."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    if isinstance(value, int | float | bool):
        return Text(str(value))
    raise TypeError(f"cannot append a {type(value).__name__} to a program state: {value!r}")


@dataclass(slots=True)
class Text(Expr):
    text: str


@dataclass(slots=True)
class ArgRef(Expr):
    """A program argument, only seen while tracing."""

    name: str


@dataclass(slots=True)
class VarRef(Expr):
    """The value of a variable (`s[name]`) read back into the text, only seen while tracing."""

    name: str


@dataclass(slots=True)
class RoleBegin(Expr):
    role: str


@dataclass(slots=True)
class RoleEnd(Expr):
    role: str


@dataclass(slots=True)
class RoleBlock(Expr):
    """`system(...)` / `user(...)` / `assistant(...)`: begin, content, end."""

    role: str
    content: Expr


@dataclass(slots=True)
class Gen(Expr):
    """Generate text into variable `name`; `params` are the sampling and constraint options;
    `result` (a `typed.ResultType`, from `gen(type=T)`) parses the text into the variable."""

    name: str | None
    params: dict[str, Any] = field(default_factory=dict)
    result: Any = None


@dataclass(slots=True)
class Select(Expr):
    """Choose one of `choices` by scoring them; the chosen string is appended."""

    name: str | None
    choices: list[str]
    method: Any = "token_length_normalized"


@dataclass(slots=True)
class ToolLoop(Expr):
    """`tool_loop(tools, max_turns)`: assistant turns with tools, the calls run and their results
    fed back, until a text answer (`sgl_dsl.tools`); `gens`: the first, later and last turn's."""

    name: str
    calls: str
    max_turns: int
    on_max_turns: str
    gens: tuple[Any, Any, Any]


@dataclass(slots=True)
class Concat(Expr):
    parts: list[Expr]

    @staticmethod
    def of(*values: Any) -> Concat:
        parts: list[Expr] = []
        for value in values:
            expr = as_expr(value)
            parts.extend(expr.parts if isinstance(expr, Concat) else [expr])
        return Concat(parts)


def flatten(expr: Expr) -> Iterable[Expr]:
    """Leaf expressions in order: concatenations opened, role blocks as begin/content/end."""
    if isinstance(expr, Concat):
        for part in expr.parts:
            yield from flatten(part)
    elif isinstance(expr, RoleBlock):
        yield RoleBegin(expr.role)
        yield from flatten(expr.content)
        yield RoleEnd(expr.role)
    else:
        yield expr


# ---- statements of a traced program -------------------------------------------------------


@dataclass(slots=True)
class Append:
    state: str
    expr: Expr


@dataclass(slots=True)
class Fork:
    state: str
    fork: str
    n: int


@dataclass(slots=True)
class GetForkItem:
    fork: str
    index: int
    state: str


@dataclass(slots=True)
class Join:
    fork: str
    state: str
    mode: str = "gather_variable"


@dataclass(slots=True)
class VarScopeBegin:
    state: str
    name: str


@dataclass(slots=True)
class VarScopeEnd:
    state: str
    name: str


Statement = Append | Fork | GetForkItem | Join | VarScopeBegin | VarScopeEnd


@dataclass(slots=True)
class Program:
    """A traced program: its argument names and statements; `str()` prints it."""

    name: str
    arg_names: list[str]
    statements: list[Statement]

    def __str__(self) -> str:
        lines = [f"program {self.name}({', '.join(self.arg_names)})"]
        lines += ["  " + format_statement(st) for st in self.statements]
        return "\n".join(lines)


def format_expr(expr: Expr) -> str:
    match expr:
        case Text(text):
            return f"text {text!r}"
        case ArgRef(name):
            return f"arg {name}"
        case VarRef(name):
            return f"var {name}"
        case RoleBegin(role):
            return f"role_begin {role}"
        case RoleEnd(role):
            return f"role_end {role}"
        case Gen(name, params, result):
            shown = [f"{k}={_short(v)}" for k, v in params.items() if v is not None]
            if "tools" in params:  # the tools by name (`result` is their ToolSet)
                shown = [s for s in shown if not s.startswith("tools=")] + [result.name]
            elif result is not None:
                shown.append(f"type={result.name}")
            return f"gen {name}({', '.join(shown)})"
        case Select(name, choices, method):
            return f"select {name}({choices!r}, method={_method_name(method)})"
        case ToolLoop(name, _, max_turns, _, gens):
            return f"tool_loop {name}({gens[0].result.name}, max_turns={max_turns})"
        case _:
            return " + ".join(format_expr(e) for e in flatten(expr))


def format_statement(st: Statement) -> str:
    match st:
        case Append(state, expr):
            return f"{state} += {format_expr(expr)}"
        case Fork(state, fork, n):
            return f"{fork} = fork {state} n={n}"
        case GetForkItem(fork, index, state):
            return f"{state} = get_fork_item {fork}[{index}]"
        case Join(fork, state, mode):
            shown = "" if mode == "gather_variable" else f" mode={mode}"
            return f"join {fork} into {state}{shown}"
        case VarScopeBegin(state, name):
            return f"{state} var_scope_begin {name}"
        case VarScopeEnd(state, name):
            return f"{state} var_scope_end {name}"
    raise TypeError(f"not a statement: {st!r}")


def _short(value: Any) -> str:
    text = value.__name__ if isinstance(value, type) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _method_name(method: Any) -> str:
    if isinstance(method, str):
        return method
    return getattr(method, "name", None) or type(method).__name__
