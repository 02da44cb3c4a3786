"""Tracing: run a program with placeholder arguments and record its statements.

Placeholders may be appended and concatenated (`"Q: " + question`), nothing else: using one
as a Python value (f-string, `str()`, a comparison, `if`, `len`, a method call) raises
`TraceError` naming it, because its value is not known until the program runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .errors import TraceError
from .fork_group import ForkSequence, check_join_mode
from .ir import (
    Append,
    ArgRef,
    Expr,
    Fork,
    GetForkItem,
    Join,
    Program,
    VarRef,
    VarScopeBegin,
    VarScopeEnd,
    as_expr,
    flatten,
)
from .role_blocks import RoleBlocks


class _Placeholder(Expr):
    """An argument or variable whose value exists only when the program runs."""

    __slots__ = ("_ref", "_what")

    def __init__(self, ref: ArgRef | VarRef, what: str) -> None:
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_what", what)

    def _misuse(self, how: str) -> TraceError:
        return TraceError(
            f"{self._what} was used {how} while tracing; its value is unknown until the "
            "program runs. Append it (s += ...) or concatenate it with + instead."
        )

    def __repr__(self) -> str:
        return f"<traced {self._what}>"

    def __hash__(self) -> int:
        return id(self)

    def __str__(self) -> str:
        raise self._misuse("as a string (str())")

    def __format__(self, spec: str) -> str:
        raise self._misuse("in an f-string or format()")

    def __bool__(self) -> bool:
        raise self._misuse("as a condition (if / and / or / not)")

    def __eq__(self, other: object) -> bool:
        raise self._misuse("in a comparison (==)")

    def __ne__(self, other: object) -> bool:
        raise self._misuse("in a comparison (!=)")

    def __lt__(self, other: object) -> bool:
        raise self._misuse("in a comparison (<)")

    def __le__(self, other: object) -> bool:
        raise self._misuse("in a comparison (<=)")

    def __gt__(self, other: object) -> bool:
        raise self._misuse("in a comparison (>)")

    def __ge__(self, other: object) -> bool:
        raise self._misuse("in a comparison (>=)")

    def __len__(self) -> int:
        raise self._misuse("with len()")

    def __iter__(self) -> Iterator[Any]:
        raise self._misuse("as an iterable")

    def __contains__(self, item: object) -> bool:
        raise self._misuse("with `in`")

    def __getitem__(self, key: Any) -> Any:
        raise self._misuse("with [] indexing")

    def __int__(self) -> int:
        raise self._misuse("as a number (int())")

    def __float__(self) -> float:
        raise self._misuse("as a number (float())")

    def __index__(self) -> int:
        raise self._misuse("as an index")

    def __mod__(self, other: Any) -> Any:
        raise self._misuse("with the % operator")

    def __rmod__(self, other: Any) -> Any:
        raise self._misuse("in a %-format")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # protocol probes (copy, numpy, pickle) are not misuse
        raise self._misuse(f"through .{attr}")

    def __setattr__(self, attr: str, value: Any) -> None:
        raise self._misuse(f"by setting .{attr}")


def argument(name: str) -> _Placeholder:
    return _Placeholder(ArgRef(name), f"argument {name!r}")


class Recorder:
    """The statement list shared by the root tracer state and its forks."""

    def __init__(self) -> None:
        self.statements: list[Any] = []
        self._state_ids = itertools.count()
        self._fork_ids = itertools.count()

    def new_state(self) -> str:
        return f"%{next(self._state_ids)}"

    def new_fork(self) -> str:
        return f"%fork{next(self._fork_ids)}"


class TracerState(RoleBlocks):
    """Stands in for `s` while tracing; mirrors `ProgramState`'s surface."""

    def __init__(self, recorder: Recorder, state_id: str | None = None) -> None:
        self.recorder = recorder
        self.id = state_id or recorder.new_state()

    def __iadd__(self, other: Any) -> TracerState:
        for leaf in flatten(as_expr(other)):
            if isinstance(leaf, _Placeholder):
                leaf = leaf._ref
            self.recorder.statements.append(Append(self.id, leaf))
        return self

    def __getitem__(self, name: str) -> _Placeholder:
        return _Placeholder(VarRef(name), f"variable {name!r} (s[{name!r}])")

    def get_var(self, name: str) -> _Placeholder:
        return self[name]

    def __setitem__(self, name: str, value: Any) -> None:
        raise TraceError(f"setting variable {name!r} from Python is not traceable")

    def set_var(self, name: str, value: Any, meta: Any = None) -> None:
        self[name] = value

    def get_meta_info(self, name: str) -> Any:
        raise TraceError(f"meta info of {name!r} is unknown while tracing")

    def text(self) -> str:
        raise TraceError("the state's text is unknown while tracing")

    def messages(self) -> list[dict[str, str]]:
        raise TraceError("the state's messages are unknown while tracing")

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> TracerForkGroup:
        n = size
        fork_id = self.recorder.new_fork()
        self.recorder.statements.append(Fork(self.id, fork_id, n))
        items = []
        for i in range(n):
            item = TracerState(self.recorder)
            self.recorder.statements.append(GetForkItem(fork_id, i, item.id))
            items.append(item)
        return TracerForkGroup(self, fork_id, items)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        self.recorder.statements.append(VarScopeBegin(self.id, name))
        yield
        self.recorder.statements.append(VarScopeEnd(self.id, name))


class TracerForkGroup(ForkSequence[TracerState]):
    def __init__(self, parent: TracerState, fork_id: str, forks: list[TracerState]) -> None:
        self.parent = parent
        self.id = fork_id
        self.forks = forks

    def join(self, mode: str = "gather_variable") -> None:
        check_join_mode(mode)
        self.parent.recorder.statements.append(Join(self.id, self.parent.id, mode))


def trace(
    func: Callable[..., Any],
    name: str,
    arg_names: list[str],
    bound: dict[str, Any],
    partial: bool = False,
) -> Program:
    """Trace `func(s, **args)`; arguments not in `bound` become placeholders.

    With `partial=True` a `TraceError` ends the trace quietly and the statements recorded
    before it are returned (enough to find the constant prefix).
    """
    recorder = Recorder()
    args = {n: bound[n] if n in bound else argument(n) for n in arg_names}
    try:
        func(TracerState(recorder), **args)
    except Exception:
        if not partial:
            raise
    return Program(name, [n for n in arg_names if n not in bound], recorder.statements)


def holds_placeholders(program: Program) -> bool:
    """Whether a gen's or select's options hold a traced value (`gen(max_tokens=s["n"])`):
    such a program has no trace that can run without it."""
    for st in program.statements:
        expr = getattr(st, "expr", None)
        options = getattr(expr, "params", None) or {}
        values = [*options.values(), *(getattr(expr, "choices", None) or [])]
        for value in values:
            items = value if isinstance(value, list | tuple) else [value]
            if any(isinstance(item, _Placeholder) for item in items):
                return True
    return False
