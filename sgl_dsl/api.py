"""`@function` and running programs: `run`, `run_batch`, `trace`."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm.auto import tqdm

from .backend import resolve_backend
from .backend.base import Backend
from .compiler import prefix_text
from .errors import ProgramError
from .ir import Program
from .primitives import SAMPLING_KEYWORDS
from .state import ProgramState
from .tracer import TracerState, trace

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

    def _execute(self, state: ProgramState, args: tuple, kwargs: dict[str, Any]) -> None:
        error = None
        try:
            self.func(state, *args, **kwargs)
            state.sync()  # a fork's error, or work still queued, belongs to this run
        except BaseException as exc:  # reported on the state, never lost
            logger.debug("program %s failed: %r", self.name, exc)
            error = exc
        state._finish(error)


def function(func: Callable[..., Any] | None = None, num_api_spec_tokens: int | None = None) -> Any:
    """Decorator: make `func(s, ...)` a prompt program; `@function` or
    `@function(num_api_spec_tokens=N)` (SGLang's speculative API calls: accepted, a no-op on
    these backends, which generate with the whole text as the prompt)."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens)


# run() keyword -> gen() keyword, where they differ
_RUN_NAMES = {"max_new_tokens": "max_tokens"}
_SAMPLING = ("max_new_tokens", *SAMPLING_KEYWORDS)


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
