"""Running a traced program on an event loop: `run_async` and `run_batch_async`.

A program traced with all its arguments bound is a flat list of statements, each on one state
(the root `%0`, or a fork). Each state's statements run in order as a chain of asyncio tasks;
different states' chains run at once, so the forks of one `fork(n)` decode together, and a
join waits for its forks' chains. No thread is started: a gen or select awaits the backend's
async calls (`interpreter.append_async`).

A state whose step fails stops its chain (its later steps are skipped) and keeps the error;
the root's error is the program's, a fork's is raised where it is joined.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from . import interpreter
from .errors import ProgramError
from .ir import Append, Fork, GetForkItem, Join, Program, VarScopeBegin, VarScopeEnd
from .state import ProgramState, join_into

Step = Callable[[ProgramState], Awaitable[None]]


async def execute(program: Program, root: ProgramState) -> None:
    """Run every statement of `program` on `root` (and the forks it makes); the root's error,
    if any, is left in `root.error`."""
    chains = _Chains(root)
    for st in program.statements:
        chains.dispatch(st)
    await chains.finished()


class _Chains:
    """Per state id: the state (once it exists) and the task of its last step."""

    def __init__(self, root: ProgramState) -> None:
        self.states: dict[str, ProgramState] = {"%0": root}
        self.tails: dict[str, asyncio.Future[None]] = {}
        self.members: dict[str, list[str]] = {}  # fork id -> its states' ids, in fork order
        self.fork_steps: dict[str, asyncio.Future[None]] = {}  # fork id -> the step making it

    def dispatch(self, st: Any) -> None:
        match st:
            case Append(sid, expr):
                self.then(sid, lambda s: interpreter.append_async(s, expr))
            case VarScopeBegin(sid, name):
                self.then(sid, _sync(lambda s: s._scopes.__setitem__(name, len(s._text))))
            case VarScopeEnd(sid, name):
                self.then(sid, _sync(lambda s: s.set_var(name, s._text[s._scopes.pop(name) :])))
            case Fork(sid, fid, _n):
                self.members[fid] = []
                self.then(sid, lambda s: self._fork(s, fid))
                self.fork_steps[fid] = self.tails[sid]
            case GetForkItem(fid, _index, sid):
                self.members[fid].append(sid)
                # a fork's first step waits for the fork itself (which creates its state)
                self.tails[sid] = self.fork_steps[fid]
            case Join(fid, sid, mode):
                waits = [self.tails[m] for m in self.members[fid]]
                self.then(sid, lambda s: self._join(s, fid, waits, mode))
            case _:
                raise ProgramError(f"cannot run statement {st!r} asynchronously")

    def then(self, sid: str, step: Step) -> None:
        """Run `step` on state `sid` after that state's previous step."""
        previous = self.tails.get(sid)
        self.tails[sid] = asyncio.ensure_future(self._after(previous, sid, step))

    async def _after(self, previous: asyncio.Future | None, sid: str, step: Step) -> None:
        if previous is not None:
            await previous  # never raises: a step's error is kept on its state
        state = self.states.get(sid)
        if state is None or state.error is not None:
            return  # this state stopped at its first error (or its parent did, before forking)
        try:
            await step(state)
        except Exception as exc:
            state.error = exc

    async def _fork(self, parent: ProgramState, fid: str) -> None:
        if parent.backend.has_prefix_cache:
            await parent.backend.acommit_prefix(parent._text)
        for sid in self.members[fid]:
            self.states[sid] = parent._copy_for_fork(worker=False)

    async def _join(
        self, parent: ProgramState, fid: str, waits: list[asyncio.Future], mode: str
    ) -> None:
        await asyncio.gather(*waits)
        forks = [self.states[m] for m in self.members[fid]]
        failed = next((f.error for f in forks if f.error is not None), None)
        if failed is not None:
            raise failed
        join_into(parent, forks, mode)

    async def finished(self) -> None:
        """Wait for every chain (the root's last step comes after any join it made)."""
        await asyncio.gather(*self.tails.values())


def _sync(fn: Callable[[ProgramState], Any]) -> Step:
    async def step(state: ProgramState) -> None:
        fn(state)

    return step
