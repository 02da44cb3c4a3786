"""`@function` and running programs: `run`, `run_batch`, `run_async`, `run_batch_async`,
`trace`."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm.auto import tqdm

from . import async_program
from .backend import resolve_backend
from .backend.base import Backend
from .compiler import prefix_text
from .errors import ProgramError
from .ir import Program
from .primitives import SAMPLING_KEYWORDS
from .state import ProgramState
from .tracer import TracerState, holds_placeholders, trace

logger = logging.getLogger(__name__)


class SglFunction:
    """A prompt program: `func(s, *args)` where `s` is the state it appends to.

    Called with a state first (from inside another program) it runs inline on that state;
    called any other way it runs, as in SGLang: `f(a=1)` is `f.run(a=1)`.
    """

    def __init__(
        self,
        func: Callable[..., Any],
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, Any] | None = None,
    ) -> None:
        params = list(inspect.signature(func).parameters)
        if not params:
            raise ProgramError(f"{func.__name__}: a program's first parameter is the state `s`")
        self.func = func
        self.name = func.__name__
        self.arg_names = params[1:]
        # SGLang's speculative API calls for chat-only API backends; a no-op on these backends
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self._prefix_cache: weakref.WeakKeyDictionary[Backend, str] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], ProgramState | TracerState):
            return self.func(args[0], *args[1:], **{**self.bind_arguments, **kwargs})
        if len(args) > len(self.arg_names):
            raise ProgramError(
                f"{self.name}() takes {len(self.arg_names)} program argument(s) but "
                f"{len(args)} were given; outside a program {self.name}(...) is "
                f"{self.name}.run(...), inside one pass the state first"
            )
        return self.run(*args, **kwargs)

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy of this program with some arguments fixed (SGLang's `bind`)."""
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise ProgramError(f"{self.name}.bind(): no argument(s) {unknown}")
        bound = {**self.bind_arguments, **kwargs}
        return SglFunction(self.func, self.num_api_spec_tokens, bound)

    def trace(self, **bound: Any) -> Program:
        """The program's IR; arguments not given in `bound` are traced as references."""
        bound = {**self.bind_arguments, **bound}
        return trace(self.func, self.name, self.arg_names, bound)

    def prefix(self, backend: Backend | None = None) -> str:
        """The text every run of this program starts with, whatever its arguments."""
        backend = resolve_backend(backend)
        with self._lock:
            if backend not in self._prefix_cache:
                program = trace(
                    self.func, self.name, self.arg_names, self.bind_arguments, partial=True
                )
                self._prefix_cache[backend] = prefix_text(program, backend)
            return self._prefix_cache[backend]

    def run(
        self,
        *args: Any,
        max_new_tokens: int | None = None,
        n: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
        ignore_eos: bool | None = None,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        token_healing: bool | None = None,
        stream: bool = False,
        backend: Backend | None = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run once (SGLang's keywords). Without `stream`, returns when done and re-raises
        the program's error.

        With `stream=True` it returns at once and the program runs on a thread; read it
        with `state.text_iter()` (which raises the program's error at its end, if any).
        The sampling keywords are defaults for the gens that do not set them (unset: the
        engine's, which are SGLang's: 128 tokens, temperature 1). `use_thread` is accepted
        for SGLang's signature (a root state always runs in the caller's thread here).
        """
        defaults = _defaults(locals())
        state = ProgramState(resolve_backend(backend), defaults, stream=stream)
        kwargs = {**self.bind_arguments, **kwargs}
        if stream:
            runner = threading.Thread(
                target=self._execute, args=(state, args, kwargs), daemon=True, name="sgl-run"
            )
            runner.start()
            state._runner = runner.ident
            return state
        self._execute(state, args, kwargs)
        if state.error is not None:
            raise state.error
        return state

    def run_batch(
        self,
        batch_kwargs: Sequence[dict[str, Any] | Sequence[Any]],
        *,
        max_new_tokens: int | None = None,
        n: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
        ignore_eos: bool | None = None,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        token_healing: bool | None = None,
        backend: Backend | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per kwargs dict (or per list of positional arguments), concurrently;
        states come back in input order (with `generator_style=True`, as a generator that
        yields each in order as soon as it is done).

        The argument-independent prefix is prefilled once first. A program that raises
        does not stop the others: its state has `.error` set.
        """
        backend = resolve_backend(backend)
        defaults = _defaults(locals())
        batch = [self._batch_kwargs(item) for item in batch_kwargs]
        if generator_style:
            return self._run_batch_iter(backend, defaults, batch, num_threads, progress_bar)
        return list(self._run_batch_iter(backend, defaults, batch, num_threads, progress_bar))

    def _batch_kwargs(self, item: dict[str, Any] | Sequence[Any]) -> dict[str, Any]:
        if isinstance(item, dict):
            return {**self.bind_arguments, **item}
        if not isinstance(item, list | tuple) or len(item) > len(self.arg_names):
            raise ProgramError(
                f"{self.name}.run_batch(): each item is a dict of arguments or a list of at "
                f"most {len(self.arg_names)} positional ones, not {item!r}"
            )
        return {**self.bind_arguments, **dict(zip(self.arg_names, item, strict=False))}

    def _run_batch_iter(
        self,
        backend: Backend,
        defaults: dict[str, Any],
        batch: list[dict[str, Any]],
        num_threads: int | str,
        progress_bar: bool,
    ) -> Iterator[ProgramState]:
        if not batch:
            return
        if len(batch) > 1 and backend.has_prefix_cache:
            # hoisting: the text every program starts with is prefilled once, up front
            shared = self.prefix(backend)
            if shared:
                backend.commit_prefix(shared)
        threads = min(len(batch), 64) if num_threads == "auto" else int(num_threads)
        states = [ProgramState(backend, defaults) for _ in batch]
        with (
            ThreadPoolExecutor(max(threads, 1), thread_name_prefix="sgl-batch") as pool,
            tqdm(total=len(states), disable=not progress_bar, desc=self.name) as bar,
        ):
            futures = [
                pool.submit(self._execute, state, (), kwargs)
                for state, kwargs in zip(states, batch, strict=True)
            ]
            for future in futures:
                future.add_done_callback(lambda _: bar.update(1))
            for state, future in zip(states, futures, strict=True):
                future.result()
                yield state

    # ---- asyncio ---------------------------------------------------------------------------

    async def run_async(
        self,
        *args: Any,
        max_new_tokens: int | None = None,
        n: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
        ignore_eos: bool | None = None,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        token_healing: bool | None = None,
        stream: bool = False,
        backend: Backend | None = None,
        **kwargs: Any,
    ) -> ProgramState:
        """`run` on the running event loop: `state = await f.run_async(...)` (re-raises the
        program's error). With `stream=True` it returns at once while the program runs; read it
        with `async for piece in state` or `state.text_async_iter(name)`, and
        `await state.wait()` for the end.

        The program is traced with its arguments bound and the trace runs on the loop: every
        gen / select awaits the backend, no thread is started. A program that uses a generated
        value as a Python value (`if s["x"] == ...`), which no trace can hold, runs as `run`
        does, on one of `PROGRAM_THREADS` worker threads shared by every async run.
        """
        defaults = _defaults(locals())
        backend = resolve_backend(backend)
        kwargs = {**self.bind_arguments, **kwargs}
        state = await self._start_async(backend, defaults, args, kwargs, stream)
        if not stream:
            await state.wait()
        return state

    async def run_batch_async(
        self,
        batch_kwargs: Sequence[dict[str, Any] | Sequence[Any]],
        *,
        max_new_tokens: int | None = None,
        n: int | None = None,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        frequency_penalty: float | None = None,
        presence_penalty: float | None = None,
        ignore_eos: bool | None = None,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        token_healing: bool | None = None,
        backend: Backend | None = None,
        max_concurrency: int | None = None,
        progress_bar: bool = False,
    ) -> list[ProgramState]:
        """`run_batch` on the running event loop: every program at once (at most
        `max_concurrency` at a time when given), states in input order, a failing program's
        error on its state. The argument-independent prefix is prefilled once first."""
        backend = resolve_backend(backend)
        defaults = _defaults(locals())
        batch = [self._batch_kwargs(item) for item in batch_kwargs]
        if max_concurrency is not None and max_concurrency < 1:
            raise ProgramError(f"{self.name}.run_batch_async(): max_concurrency must be >= 1")
        if not batch:
            return []
        await backend.achat_template()
        if len(batch) > 1 and backend.has_prefix_cache:
            shared = self.prefix(backend)  # the template is cached now: no blocking call
            if shared:
                await backend.acommit_prefix(shared)
        limit = asyncio.Semaphore(max_concurrency or len(batch))
        # tqdm starts a monitor thread even when disabled: make one only when asked for
        bar = tqdm(total=len(batch), desc=self.name) if progress_bar else None

        async def one(kwargs: dict[str, Any]) -> ProgramState:
            async with limit:
                state = await self._start_async(backend, defaults, (), kwargs, False)
                await state._until(lambda: state._finished)
            if bar is not None:
                bar.update(1)
            return state

        try:
            return list(await asyncio.gather(*(one(kwargs) for kwargs in batch)))
        finally:
            if bar is not None:
                bar.close()

    async def _start_async(
        self,
        backend: Backend,
        defaults: dict[str, Any],
        args: tuple,
        kwargs: dict[str, Any],
        stream: bool,
    ) -> ProgramState:
        """A state whose program now runs on this loop (traced) or on a program thread."""
        await backend.achat_template()  # a server's template is fetched once, off the loop
        state = ProgramState(backend, defaults, stream=stream)
        state._loop_thread = threading.get_ident()
        state._runner = 0  # running in the background: readers wait (or, on the loop, await)
        program = self._trace_bound(args, kwargs)
        if program is not None:
            state._task = asyncio.ensure_future(self._execute_traced(state, program))
        else:
            loop = asyncio.get_running_loop()
            state._task = loop.run_in_executor(
                _program_pool(), self._execute_on_thread, state, args, kwargs
            )
        return state

    def _trace_bound(self, args: tuple, kwargs: dict[str, Any]) -> Program | None:
        """The program traced with every argument bound; None when no trace can stand for it
        (it reads a generated value or the text as a Python value, takes *args / **kwargs, or
        fails while tracing: the run on a thread then reports what happens for real)."""
        signature = inspect.signature(self.func)
        kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        if any(p.kind in kinds for p in signature.parameters.values()):
            return None
        try:
            bound = signature.bind(None, *args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        values = dict(list(bound.arguments.items())[1:])
        try:
            program = trace(self.func, self.name, self.arg_names, values)
        except Exception:
            return None
        return None if holds_placeholders(program) else program

    async def _execute_traced(self, state: ProgramState, program: Program) -> None:
        error = None
        try:
            await async_program.execute(program, state)
        except BaseException as exc:  # reported on the state, never lost
            error = exc
            if not isinstance(exc, Exception):
                state._finish(error)
                raise
        state._finish(error)

    def _execute_on_thread(self, state: ProgramState, args: tuple, kwargs: dict) -> None:
        state._runner = threading.get_ident()  # the program's own reads do not wait
        self._execute(state, args, kwargs)

    def _execute(self, state: ProgramState, args: tuple, kwargs: dict[str, Any]) -> None:
        error = None
        try:
            self.func(state, *args, **kwargs)
            state.sync()  # a fork's error, or work still queued, belongs to this run
        except BaseException as exc:  # reported on the state, never lost
            logger.debug("program %s failed: %r", self.name, exc)
            error = exc
        state._finish(error)


PROGRAM_THREADS = 16  # threads for async runs of programs that cannot be traced
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _program_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(PROGRAM_THREADS, thread_name_prefix="sgl-async-program")
        return _pool


def function(func: Callable[..., Any] | None = None, num_api_spec_tokens: int | None = None) -> Any:
    """Decorator: make `func(s, ...)` a prompt program; `@function` or
    `@function(num_api_spec_tokens=N)` (SGLang's speculative API calls: accepted, a no-op on
    these backends, which generate with the whole text as the prompt)."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens)


# run() keyword -> gen() keyword, where they differ
_RUN_NAMES = {"max_new_tokens": "max_tokens"}
_SAMPLING = ("max_new_tokens", *SAMPLING_KEYWORDS, "token_healing")


def _defaults(given: dict[str, Any]) -> dict[str, Any]:
    """The gen() defaults a run's keywords set (normalised as gen() normalises them)."""
    out = {}
    for key in _SAMPLING:
        value = given.get(key)
        if value is None or (key in ("stop", "stop_token_ids", "stop_regex") and not value):
            continue
        if key in ("stop", "stop_regex") and isinstance(value, str):
            value = [value]
        if key == "n" and value == 1:
            continue
        out[_RUN_NAMES.get(key, key)] = value
    return out
