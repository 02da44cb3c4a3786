"""`@function` and running programs: `run`, `run_batch`, `trace`."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from tqdm.auto import tqdm

from .backend import resolve_backend
from .backend.base import Backend
from .compiler import prefix_text
from .errors import ProgramError
from .ir import Program
from .state import ProgramState
from .tracer import TracerState, trace

logger = logging.getLogger(__name__)


class SglFunction:
    """A prompt program: `func(s, *args)` where `s` is the state it appends to."""

    def __init__(self, func: Callable[..., Any]) -> None:
        params = list(inspect.signature(func).parameters)
        if not params:
            raise ProgramError(f"{func.__name__}: a program's first parameter is the state `s`")
        self.func = func
        self.name = func.__name__
        self.arg_names = params[1:]
        self._prefix_cache: weakref.WeakKeyDictionary[Backend, str] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        functools.update_wrapper(self, func)

    def __call__(self, s: Any, *args: Any, **kwargs: Any) -> Any:
        """Called from inside another program with its state: runs inline on that state."""
        if not isinstance(s, ProgramState | TracerState):
            raise ProgramError(
                f"{self.name}() takes a program state first; to run it use {self.name}.run(...)"
            )
        return self.func(s, *args, **kwargs)

    def trace(self, **bound: Any) -> Program:
        """The program's IR; arguments not given in `bound` are traced as references."""
        return trace(self.func, self.name, self.arg_names, bound)

    def prefix(self, backend: Backend | None = None) -> str:
        """The text every run of this program starts with, whatever its arguments."""
        backend = resolve_backend(backend)
        with self._lock:
            if backend not in self._prefix_cache:
                program = trace(self.func, self.name, self.arg_names, {}, partial=True)
                self._prefix_cache[backend] = prefix_text(program, backend)
            return self._prefix_cache[backend]

    def run(
        self,
        *args: Any,
        backend: Backend | None = None,
        stream: bool = False,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        **kwargs: Any,
    ) -> ProgramState:
        """Run once. Without `stream`, returns when done and re-raises the program's error.

        With `stream=True` it returns at once and the program runs on a thread; read it
        with `state.text_iter()` (which raises the program's error at its end, if any).
        `max_new_tokens` / `temperature` / `top_p` are defaults for gens that do not set them.
        """
        defaults = _defaults(max_new_tokens, temperature, top_p)
        state = ProgramState(resolve_backend(backend), defaults, stream=stream)
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
        batch_kwargs: Sequence[dict[str, Any]],
        *,
        backend: Backend | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> list[ProgramState]:
        """Run once per kwargs dict, concurrently; states come back in input order.

        The argument-independent prefix is prefilled once first. A program that raises
        does not stop the others: its state has `.error` set.
        """
        backend = resolve_backend(backend)
        defaults = _defaults(max_new_tokens, temperature, top_p)
        if not batch_kwargs:
            return []
        if len(batch_kwargs) > 1 and backend.has_prefix_cache:
            # hoisting: the text every program starts with is prefilled once, up front
            shared = self.prefix(backend)
            if shared:
                backend.commit_prefix(shared)
        threads = min(len(batch_kwargs), 64) if num_threads == "auto" else int(num_threads)
        states = [ProgramState(backend, defaults) for _ in batch_kwargs]
        with (
            ThreadPoolExecutor(max(threads, 1), thread_name_prefix="sgl-batch") as pool,
            tqdm(total=len(states), disable=not progress_bar, desc=self.name) as bar,
        ):
            futures = [
                pool.submit(self._execute, state, (), kwargs)
                for state, kwargs in zip(states, batch_kwargs, strict=True)
            ]
            for _ in as_completed(futures):
                bar.update(1)
        return states

    def _execute(self, state: ProgramState, args: tuple, kwargs: dict[str, Any]) -> None:
        error = None
        try:
            self.func(state, *args, **kwargs)
        except BaseException as exc:  # reported on the state, never lost
            logger.debug("program %s failed: %r", self.name, exc)
            error = exc
        state._finish(error)


def function(func: Callable[..., Any]) -> SglFunction:
    """Decorator: make `func(s, ...)` a prompt program."""
    return SglFunction(func)


def _defaults(max_new_tokens: Any, temperature: Any, top_p: Any) -> dict[str, Any]:
    given = {"max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p}
    return {k: v for k, v in given.items() if v is not None}
