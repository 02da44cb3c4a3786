"""One answer generated in phases: free text until a trigger, then a constrained region, ...

Tool calls in a model's own format and reasoning models both need a constraint that starts in
the middle of an answer: free text (or thinking) is free until the model writes the opening of
a call (or `</think>`), and only from there is the output constrained. A `PhasedStream` runs
an answer as a sequence of engine requests, each continuing the token sequence of the ones
before it (the radix cache holds that prefix): a phase generates under its own constraint and
extra stop strings (the trigger), and the `Plan` decides from its result what comes next,
possibly with forced text first (the trigger itself, or `</think>` when a reasoning budget is
spent). The stream looks like one engine request to the endpoints: the chunks of every phase
in order (forced text as chunks of its own), then one result for the whole answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from grammar.constraint import FIELDS as CONSTRAINT_FIELDS
from grammar.constraint import given_kinds
from runtime.scheduling.request import GenerateResult, StreamChunk, Usage


@dataclass(slots=True)
class Phase:
    """One engine request of an answer."""

    forced: str = ""  # text appended to the answer before this phase generates
    constraint: dict[str, Any] = field(default_factory=dict)  # regex / json_schema / ...
    stop: tuple[str, ...] = ()  # stop strings of this phase (a trigger), beside the request's
    max_tokens: int | None = None  # a cap below what the request has left (reasoning budget)
    share: float | None = None  # else a cap as a share of what the request has left


class Plan(Protocol):
    def first(self) -> Phase | None: ...

    def next(self, text: str, result: GenerateResult, capped: bool) -> Phase | None:
        """The phase after one that produced `result` (`text`: the answer so far; `capped`:
        the phase stopped at its own `max_tokens`), or None: the answer is finished."""
        ...


class PhasedStream:
    """An `EngineStream` look-alike running `plan`'s phases one after the other."""

    def __init__(self, bridge: Any, prompt_ids: list[int], kwargs: dict[str, Any], plan: Plan):
        self._bridge = bridge
        self._tokenizer = bridge.engine.tokenizer
        self._prompt_ids = list(prompt_ids)
        # a phase's constraint is its own: the request's constraint keywords are dropped
        self._kwargs = {k: v for k, v in kwargs.items() if k not in CONSTRAINT_FIELDS}
        self._budget = int(kwargs.get("max_new_tokens") or 0)
        self._plan = plan
        self._phase: Phase | None = None
        self._inner: Any = None
        self._pending: list[StreamChunk] = []
        self._started = False
        self._streamed = ""  # the current phase's text streamed so far
        self._phase_capped = False
        self.text = ""
        self.ids: list[int] = []
        self._logprobs: list[float] = []
        self._top: list[dict[int, float]] = []
        self._usage = Usage(prompt_tokens=len(prompt_ids))
        self._first_usage = True
        self.cancelled = False
        self.done = False
        self.constraint_field: str | None = None  # the request field, for errors naming it

    # ---- what the endpoints read ----
    @property
    def constraint_key(self) -> str | None:
        given = given_kinds(self._phase.constraint) if self._phase is not None else []
        return given[0] if given else None

    def cancel(self) -> None:
        self.cancelled = True
        if self._inner is not None:
            self._inner.cancel()
            self._bridge.forget(self._inner)

    def __aiter__(self) -> AsyncIterator[StreamChunk]:
        return self

    async def __anext__(self) -> StreamChunk:
        if self.done:
            raise StopAsyncIteration
        if not self._started:
            self._started = True
            first = self._plan.first()
            if first is None:
                self._finish("stop", None)
            else:
                self._begin(first)
        while True:
            if self._pending:
                chunk = self._pending.pop(0)
                self.done = chunk.finished
                return chunk
            chunk = await anext(self._inner)
            if not chunk.finished:
                self._streamed += chunk.text_delta
                return chunk
            self._end_phase(chunk)

    # ---- phases ----
    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False).input_ids)

    def _append(self, text: str, ids: list[int] | None, lps: list[float] | None,
                tops: list[dict[int, float]] | None) -> None:  # fmt: skip
        """Add a piece of the answer; its ids are re-encoded unless they spell its text."""
        if ids is None or self._tokenizer.decode(ids, skip_special_tokens=False) != text:
            ids, lps, tops = self._encode(text), None, None
        self.ids.extend(ids)
        self._logprobs.extend(lps if lps is not None else [0.0] * len(ids))
        self._top.extend(tops if tops is not None else [{}] * len(ids))

    def _begin(self, phase: Phase) -> None:
        self._phase = phase
        if phase.forced:
            self._append(phase.forced, None, None, None)
            self.text += phase.forced
            self._pending.append(StreamChunk(phase.forced, [], finished=False))
        left = self._budget - len(self.ids)
        if left <= 0:
            self._finish("length", None)
            return
        cap = left if phase.max_tokens is None else min(left, phase.max_tokens)
        if phase.max_tokens is None and phase.share is not None:
            cap = max(1, int(left * phase.share))
        self._phase_capped = cap < left
        kwargs = dict(self._kwargs)
        kwargs["max_new_tokens"] = cap
        kwargs["min_new_tokens"] = min(int(kwargs.get("min_new_tokens") or 0), cap)
        stop = list(kwargs.get("stop") or ())
        kwargs["stop"] = [*stop, *phase.stop] or None
        kwargs.update(phase.constraint)
        self._inner = self._bridge.open(self._prompt_ids + self.ids, kwargs)

    def _end_phase(self, chunk: StreamChunk) -> None:
        result: GenerateResult = chunk.result
        inner, self._inner = self._inner, None
        self._bridge.forget(inner)
        before = self._streamed  # already handed on
        self._streamed = ""
        streamed = before + chunk.text_delta
        if result.text.startswith(streamed):
            streamed = result.text  # what the last chunk did not carry
        if len(streamed) > len(before):
            self._pending.append(StreamChunk(streamed[len(before) :], [], finished=False))
        self.text += streamed
        gen_ids = list(result.token_ids)
        if isinstance(result.matched_stop, int) and gen_ids and gen_ids[-1] == result.matched_stop:
            gen_ids.pop()  # an end-of-sequence token is not part of the text
        self._append(streamed, gen_ids, result.logprobs, result.top_logprobs)
        self._count(result)
        if result.finish_reason == "abort" or self.cancelled:
            self._finish("abort", result)
            return
        capped = result.finish_reason == "length" and self._phase_capped
        nxt = self._plan.next(self.text, result, capped)
        if nxt is None:
            self._finish(result.finish_reason, result)
        elif self._budget - len(self.ids) <= 0 and not nxt.forced:
            self._finish("length", result)
        else:
            self._begin(nxt)

    def _count(self, result: GenerateResult) -> None:
        if self._first_usage:
            self._usage.cached_tokens = result.usage.cached_tokens
            self._first_usage = False
        self._usage.decode_steps += result.usage.decode_steps
        self._usage.compile_time_s += result.usage.compile_time_s

    def _finish(self, reason: str, last: GenerateResult | None) -> None:
        self._usage.completion_tokens = len(self.ids)
        want_lp = bool(self._kwargs.get("logprobs"))
        result = GenerateResult(
            text=self.text,
            token_ids=list(self.ids),
            prompt_token_ids=list(self._prompt_ids),
            finish_reason=reason,
            matched_stop=last.matched_stop if last is not None else None,
            error=last.error if last is not None else None,
            usage=self._usage,
            logprobs=list(self._logprobs) if want_lp else None,
            top_logprobs=list(self._top) if want_lp else None,
        )
        self._pending.append(StreamChunk("", [], finished=True, result=result))
