"""`ProgramState`: the `s` a running program appends to, and what `run` returns.

A state holds the program's text, its variables with their meta info, the chat messages
closed so far, and a log of text pieces that `text_iter` reads while the program runs.
The root state executes each `+=` in the caller's thread; a fork executes its `+=` in order
on its own worker thread, so the forks of one `fork(n)` decode at the same time, and any
read (`s[name]`, `text()`, `join`) first waits for the queued work. Under `run_async` the
event loop runs the program instead (`async_program`); `await state.wait()` and `async for`
wait for it there without a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from . import interpreter
from .backend.base import Backend
from .chat_template import ChatTemplate
from .errors import ProgramError
from .fork_group import ForkSequence, check_join_mode
from .ir import as_expr
from .role_blocks import RoleBlocks


class ProgramState(RoleBlocks):
    def __init__(
        self,
        backend: Backend,
        defaults: dict[str, Any] | None = None,
        stream: bool = False,
        template: ChatTemplate | None = None,
    ) -> None:
        self.backend = backend
        self.template = template if template is not None else backend.chat_template()
        self.defaults = dict(defaults or {})  # gen() options a gen does not set itself
        self.stream = stream
        self.error: BaseException | None = None
        self._text = ""
        self._vars: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}
        self._messages: list[dict[str, str]] = []
        self._open_role: tuple[str, int] | None = None  # (role, text offset of its content)
        self._scopes: dict[str, int] = {}
        self._new_vars: list[str] = []  # set since this state was forked, for join
        self._fork_start = 0  # length of the text when this state was forked
        # text pieces (variable name or None, text) for text_iter; guarded by _changed
        self._pieces: list[tuple[str | None, str]] = []
        self._closed_vars: set[str] = set()
        self._finished = False
        self._changed = threading.Condition()
        self._worker: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        # the thread running the program when it runs in the background (stream=True; 0 when
        # an event loop runs it, run_async), and that loop's thread
        self._runner: int | None = None
        self._loop_thread: int | None = None
        self._task: Any = None  # the asyncio task (or future) running it, under run_async
        # (loop, future) of each `await` on this state, woken whenever it changes
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    # ---- what a program writes ---------------------------------------------------------

    def __iadd__(self, other: Any) -> ProgramState:
        expr = as_expr(other)
        self._submit(lambda: interpreter.append(self, expr))
        return self

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self._vars

    def get_var(self, name: str) -> Any:
        """The variable's value; a program running in the background is waited for."""
        self._wait_background(lambda: name in self._vars)
        self._drain()
        if name not in self._vars:
            known = ", ".join(sorted(self._vars)) or "none"
            raise KeyError(f"no variable {name!r} in this state (variables: {known})")
        return self._vars[name]

    def set_var(self, name: str, value: Any, meta: Any = None) -> None:
        with self._changed:
            self._vars[name] = value
            self._meta[name] = meta
            if name not in self._new_vars:
                self._new_vars.append(name)
            self._notify()

    def get_meta_info(self, name: str) -> Any:
        """Per gen: finish_reason, prompt/cached/completion tokens; per select: the scores."""
        self._wait_background(lambda: name in self._meta)
        self._drain()
        return self._meta.get(name)

    def fork(self, size: int = 1, position_ids_offset: Any = None) -> ForkGroup:
        """`size` copies of this state; the shared prefix goes into the cache first.
        (`position_ids_offset` is SGLang's; only None is supported.)"""
        if position_ids_offset is not None:
            raise ProgramError("fork(position_ids_offset=...) is not supported")
        n = int(size)
        self.sync()
        if self.backend.has_prefix_cache:
            self.backend.commit_prefix(self._text)
        return ForkGroup(self, [self._copy_for_fork() for _ in range(n)])

    @contextmanager
    def copy(self, position_ids_offset: Any = None) -> Iterator[ProgramState]:
        """SGLang's `with s.copy() as c:` one fork, joined (gathering variables) at the end."""
        group = self.fork(1, position_ids_offset)
        try:
            yield group[0]
        finally:
            group.join()

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """The text appended inside the block becomes variable `name`."""
        self._submit(lambda: self._scopes.__setitem__(name, len(self._text)))
        yield
        self._submit(lambda: self.set_var(name, self._text[self._scopes.pop(name) :]))

    # ---- what a caller reads -----------------------------------------------------------

    def text(self) -> str:
        self.sync()
        return self._text

    def messages(self) -> list[dict[str, str]]:
        """Closed role blocks as chat messages (with the template's default system prompt)."""
        self.sync()
        return [dict(m) for m in self._messages]

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is produced: all of it, or only what variable `var_name` generates.

        Without `stream=True` the pieces come once the program has produced them (SGLang
        then yields the whole text, or the variable's value, in one piece)."""
        name, seen = var_name, 0
        while True:
            with self._changed:
                while seen == len(self._pieces) and not self._iter_done(name):
                    self._changed.wait()
                pieces, seen = self._pieces[seen:], len(self._pieces)
                done = self._iter_done(name)
            for var, piece in pieces:
                if piece and (name is None or var == name):
                    yield piece
            if done and seen == len(self._pieces):
                break
        if self.error is not None and (name is None or name not in self._vars):
            raise self.error

    async def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio code (SGLang's); with `return_meta_data`, pairs of (piece,
        the variable's meta info so far: None until its gen has finished here). It waits on
        the loop, without a thread, whether the program runs there (`run_async`) or on one."""
        name, seen = var_name, 0
        while True:
            await self._until(lambda n=seen: n < len(self._pieces) or self._iter_done(name))
            with self._changed:
                pieces, seen = self._pieces[seen:], len(self._pieces)
                done = self._iter_done(name)
            for var, piece in pieces:
                if piece and (name is None or var == name):
                    yield (piece, self._meta.get(name)) if return_meta_data else piece
            if done and seen == len(self._pieces):
                break
        if self.error is not None and (name is None or name not in self._vars):
            raise self.error

    def __aiter__(self) -> AsyncIterator[str]:
        """`async for piece in state`: the whole text as it is produced."""
        return self.text_async_iter()

    async def wait(self) -> ProgramState:
        """Wait, on the event loop, until the program has finished; raise its error if it
        failed. Returns the state (`state = await (await f.run_async(..., stream=True)).wait()`).
        """
        await self._until(lambda: self._finished or self._runner is None)
        if self.error is not None:
            raise self.error
        return self

    async def _until(self, ready: Any) -> None:
        """Await until `ready()` (checked under the lock each time the state changes)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._changed:
                if ready():
                    return
                waiter = loop.create_future()
                self._async_waiters.append((loop, waiter))
            await waiter

    def sync(self) -> None:
        """Wait for queued work (a fork's, or a background program); re-raise a fork's error."""
        self._wait_background(lambda: False)
        self._drain()

    def _wait_background(self, ready: Any) -> None:
        """From outside a background program's thread: wait until `ready()` or the end."""
        me = threading.get_ident()
        if self._runner is None or me == self._runner or self._finished:
            return
        if me == self._loop_thread:
            raise ProgramError(
                "this program is still running on this event loop; `await state.wait()` (or "
                "`async for` over it) before reading it"
            )
        with self._changed:
            while not (ready() or self._finished):
                self._changed.wait()

    def _drain(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()
        if self.error is not None and self._worker is not None:
            raise self.error

    def __repr__(self) -> str:
        return f"ProgramState(vars={sorted(self._vars)}, text={self._text[-60:]!r})"

    # ---- used by the interpreter and the runner ----------------------------------------

    def _notify(self) -> None:
        """Wake every reader; call with `_changed` held."""
        self._changed.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_wake, waiter)

    def _emit(self, text: str, var: str | None = None) -> None:
        with self._changed:
            self._text += text
            self._pieces.append((var, text))
            self._notify()

    def _close_var(self, name: str) -> None:
        with self._changed:
            self._closed_vars.add(name)
            self._notify()

    def _finish(self, error: BaseException | None = None) -> None:
        with self._changed:
            self.error = self.error or error
            self._finished = True
            self._notify()

    def _iter_done(self, name: str | None) -> bool:
        return self._finished or (name is not None and name in self._closed_vars)

    def _submit(self, op: Any) -> None:
        if self._worker is None:
            op()
            return
        self._pending.append(self._worker.submit(self._guarded, op))

    def _guarded(self, op: Any) -> None:
        if self.error is not None:
            return  # a fork stops at its first error; sync() reports it
        try:
            op()
        except BaseException as exc:
            self.error = exc

    def _copy_for_fork(self, worker: bool = True) -> ProgramState:
        """A fork of this state; with `worker` its `+=` run in order on a thread of its own
        (the async runner orders them on the event loop instead)."""
        child = ProgramState(self.backend, self.defaults, self.stream, self.template)
        child._text = self._text
        child._vars = dict(self._vars)
        child._meta = dict(self._meta)
        child._messages = [dict(m) for m in self._messages]
        child._open_role = self._open_role
        child._scopes = dict(self._scopes)
        child._fork_start = len(self._text)
        if worker:
            child._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sgl-fork")
        return child


class ForkGroup(ForkSequence[ProgramState]):
    """The forks of one `s.fork(n)`: index or iterate them, then `join()`."""

    def __init__(self, parent: ProgramState, forks: list[ProgramState]) -> None:
        self.parent = parent
        self.forks = forks
        self._joined = False

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every fork. "gather_variable": each variable a fork set becomes a list on
        the parent; "concate_and_append": each fork's new text is appended to the parent, in
        fork order (SGLang's parallel encoding; the prefix cache makes it cheap here)."""
        check_join_mode(mode)
        if self._joined:
            raise ProgramError("these forks were already joined")
        self._joined = True
        try:
            for fork in self.forks:
                fork.sync()
        finally:
            for fork in self.forks:
                fork._worker.shutdown(wait=False)
        join_into(self.parent, self.forks, mode)


def join_into(parent: ProgramState, forks: list[ProgramState], mode: str) -> None:
    """Put finished forks' results into `parent` (see `ForkGroup.join`)."""
    if mode == "concate_and_append":
        text = "".join(fork._text[fork._fork_start :] for fork in forks)
        parent._submit(lambda: parent._emit(text))
        parent._drain()  # the parent's queued work (a fork's), not a wait for its own program
        return
    names: list[str] = []
    for fork in forks:
        names += [n for n in fork._new_vars if n not in names]
    for name in names:
        values = [fork._vars.get(name) for fork in forks]
        metas = [fork._meta.get(name) for fork in forks]
        parent._submit(lambda n=name, v=values, m=metas: parent.set_var(n, v, m))


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
