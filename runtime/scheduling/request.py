"""A request's parameters, state and results, as records the scheduler thread owns."""

from __future__ import annotations

import enum
import itertools
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from runtime.memory.kv_pool import KVPool
from runtime.memory.radix_cache import TreeNode

_ids = itertools.count()


class Constraint(Protocol):
    """What the scheduler reads of a request's constraint (constrained.ConstraintState)."""

    jump_forward: bool
    compile_time_s: float


class Handoff(Protocol):
    """A prefill server's room for this request's KV (disaggregation.modes.Ticket)."""

    keeps_pages: bool  # staged in place: the pages stay held until `when_sent` calls back

    def stage(self, pool: KVPool, req: Request) -> None:
        """Hand the request's KV to the room (on the scheduler thread)."""
        ...

    def when_sent(self, callback: Callable[[], None]) -> None:
        """`callback()` once the room has ended (from any thread)."""
        ...


class Landing(Protocol):
    """Where a transfer reads a request's pages into the pool (disaggregation.modes.Landing)."""

    state: str
    error: Exception | None
    pending: bool

    def place(self, first: int, pages: list[int]) -> bool: ...

    def end(self, error: Exception | None) -> None: ...


class ImportedKV(Protocol):
    """KV that arrived from a prefill server (disaggregation.receiver.ReceivedKV)."""

    kv_tokens: int  # positions 0 .. kv_tokens - 1 have K/V in `data` (or in the pool)
    data: torch.Tensor | None  # [num_pages, page_bytes] uint8; None: read into the pool
    logprobs: list[float] | None
    top_logprobs: list[dict[int, float]] | None
    landing: Landing | None  # mooncake: the pages are read into the pool once placed
    note_copy: Callable[[float], None] | None  # seconds the copy into the pool took


@dataclass(slots=True)
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    # OpenAI's: token id -> bias in [-100, 100], added to that token's logit before sampling
    logit_bias: dict[int, float] | None = None
    # marker texts (detokenize.MARKER_TOKENS) spelled in the text where the tokenizer has them
    # as special tokens: the call / reasoning markers the server's parsers read
    keep_markers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias: {token!r} is not a token id")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias[{token}] must be in [-100, 100], got {bias}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    decode_steps: int = 0
    compile_time_s: float = 0.0  # grammar compilation, when the request has a constraint
    # speculative decoding (SGLang's meta_info names): verify forwards, and the tokens each
    # produced on average (accepted drafts plus the one the target chose); 0 without it
    spec_verify_ct: int = 0
    spec_accept_length: float = 0.0


@dataclass(slots=True)
class GenerateResult:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    matched_stop: str | int | None = None
    error: str | None = None
    error_kind: str | None = None  # the error's class name ("KVTransferError", ...)
    usage: Usage = field(default_factory=Usage)
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[float] | None = None  # set for score requests


@dataclass(slots=True)
class StreamChunk:
    text_delta: str
    token_ids: list[int]  # the tokens added since the previous chunk
    finished: bool
    result: GenerateResult | None = None  # set on the last chunk


@dataclass(slots=True)
class SpecState:
    """A request's speculative decoding state (runtime/speculative writes it)."""

    draft_len: int = 0  # drafts to ask for next (0: the configured number)
    skip: int = 0  # decode steps left without drafts (back-off after a miss)
    misses: int = 0  # the current back-off length
    verify_ct: int = 0  # verify forwards
    accepted: int = 0  # drafts accepted
    verify_tokens: int = 0  # tokens the verify forwards appended (accepted + chosen)
    accept_w: float = 0.0  # drafts kept, decayed per verify (runtime/speculative/policy.py)
    reject_w: float = 0.0  # verifies that rejected a draft, decayed the same way
    shadow: list[int] = field(default_factory=list)  # n-gram drafts not verified, and
    shadow_at: int = 0  # the position of the first: checked against the output later


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """One sequence in the engine. `seq = prompt_ids + output_ids`; `computed` of its first
    tokens have K/V in the pool at the slots given by `pages`; the first `cached` of those are
    tree pages (shared, locked through `node`), the rest are owned by this request."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        stream: bool = False,
        logprob_start: int | None = None,
        constraint: Constraint | None = None,
    ) -> None:
        self.rid = next(_ids)
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.stream = stream
        self.status = Status.WAITING
        self.pages: list[int] = []
        self.computed = 0
        self.cached = 0
        self.node: TreeNode | None = None  # the locked radix tree node
        self.finish_reason: str | None = None
        self.matched_stop: str | int | None = None
        self.error: BaseException | None = None
        self.logprobs: list[float] | None = [] if params.logprobs else None
        self.top_logprobs: list[dict[int, float]] | None = [] if params.top_logprobs else None
        # score requests: log-probs of seq[logprob_start:] given what precedes each token
        self.logprob_start = logprob_start
        self.prompt_logprobs: list[float] = []
        self.cached_tokens_at_admission: int | None = None
        self.decode_steps = 0
        self.prefill_done = False
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.text = ""
        # token healing (healing.py): the prompt text the first output tokens spell again, left
        # out of `text` (the caller's prompt has it)
        self.heal_text = ""
        self.streamed_text_len = 0
        self.streamed_token_len = 0
        self.aborted = False
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.constraint: Constraint | None = constraint
        self.cache_limit: int | None = None  # cache at most this many tokens while running
        self.admit_order = 0
        self.rank_failures = 0  # steps of it that failed because a parallel rank died
        # prefill-decode disaggregation (runtime/disaggregation): on a prefill server, the room
        # this request's KV goes to; on a decode server, the KV it arrived with
        self.handoff: Handoff | None = None
        self.imported: ImportedKV | None = None
        self.spec = SpecState()

    @property
    def seq(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def to_result(self) -> GenerateResult:
        return GenerateResult(
            text=self.text,
            token_ids=list(self.output_ids),
            prompt_token_ids=list(self.prompt_ids),
            finish_reason=self.finish_reason or "abort",
            matched_stop=self.matched_stop,
            error=None if self.error is None else str(self.error),
            error_kind=None if self.error is None else type(self.error).__name__,
            usage=Usage(
                prompt_tokens=len(self.prompt_ids),
                cached_tokens=self.cached_tokens_at_admission or 0,
                completion_tokens=len(self.output_ids),
                decode_steps=self.decode_steps,
                compile_time_s=self.constraint.compile_time_s if self.constraint else 0.0,
                spec_verify_ct=self.spec.verify_ct,
                spec_accept_length=(
                    self.spec.verify_tokens / self.spec.verify_ct if self.spec.verify_ct else 0.0
                ),
            ),
            logprobs=self.logprobs,
            top_logprobs=self.top_logprobs,
            prompt_logprobs=self.prompt_logprobs if self.logprob_start is not None else None,
        )
