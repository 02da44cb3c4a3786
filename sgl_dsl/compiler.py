"""Compiling a traced program: the text before its first argument-dependent statement.

That prefix is the same for every input, so `run_batch` prefills it once into the cache
before the batch starts, and every program of the batch then finds it there.
"""

from __future__ import annotations

from .backend.base import Backend
from .ir import Append, Program, RoleBegin, RoleEnd, Text, VarScopeBegin, VarScopeEnd


def constant_prefix_length(program: Program) -> int:
    """How many leading statements touch only constant text of the root state."""
    root = program.statements[0].state if program.statements else "%0"
    for i, st in enumerate(program.statements):
        if isinstance(st, VarScopeBegin | VarScopeEnd) and st.state == root:
            continue  # a scope marks text; it adds none
        if isinstance(st, Append) and st.state == root:
            if isinstance(st.expr, Text | RoleBegin | RoleEnd):
                continue
        return i
    return len(program.statements)


def prefix_text(program: Program, backend: Backend) -> str:
    """The text the constant prefix renders to, exactly as the interpreter would write it."""
    from .state import ProgramState

    scratch = ProgramState(backend)
    for st in program.statements[: constant_prefix_length(program)]:
        if isinstance(st, Append):
            scratch += st.expr
    return scratch._text  # an open role block is still a valid prefix of the text
