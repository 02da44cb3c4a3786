"""The interface every backend implements: in-process engine now, HTTP endpoint later.

A backend sees text only: the interpreter keeps each program's text and sends the whole of
it with every call, and the backend's prefix cache makes the repeated part free.
Generation parameters arrive as the `gen()` keywords (`max_tokens`, `min_tokens`, `stop`,
`stop_token_ids`, `temperature`, `top_p`, `top_k`, `min_p`, `frequency_penalty`,
`presence_penalty`, `ignore_eos`, `seed`, `return_logprob`, `regex`, `json_schema` as JSON text,
`choices`, `dtype` as "int" | "float" | "bool" | "str", `grammar` as lark text, `ebnf` as GBNF
text, `structural_tag` as JSON text, SGLang's
`logprob_start_len`, `top_logprobs_num`, `return_text_in_logprobs`); absent keys take the
backend's defaults. `n` and `stop_regex` never arrive: the interpreter runs them on top (n
calls; a stream closed where the regex matches). Every method must be safe to call from many
threads at once.

The async methods (`agenerate`, `agenerate_stream`, `ascore`, `acommit_prefix`,
`achat_template`) serve `run_async` / `run_batch_async`: the built-in backends await the engine
or the server directly, so one event loop drives any number of programs without a thread each.
A backend that has only the blocking methods still works there: its calls then run on one small
thread pool shared by every program (`ASYNC_FALLBACK_THREADS` threads).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ..chat_template import ChatTemplate
from ..errors import BackendError


class FinishReason(dict):
    """SGLang's `finish_reason`: `{"type": "stop" | "length" | "abort", "matched": ...}`.

    It also compares equal to its type, so `meta["finish_reason"] == "stop"` (this DSL's
    older string) keeps working beside SGLang's `meta["finish_reason"]["type"]`."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.get("type") == other
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]


class NoPromptLogprobs(BackendError):
    """The server returned no log-probs of the given text (it cannot score it): `select` is
    then a constrained choice, and the backend says `scores_text = False` from then on."""


@dataclass(slots=True)
class GenOutput:
    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache
    completion_tokens: int = 0
    logprobs: list[float] | None = None
    matched_stop: Any = None
    # SGLang's logprob fields, when asked for: [logprob, token_id, text or None] triples
    output_token_logprobs: list[list[Any]] | None = None
    output_top_logprobs: list[list[list[Any]]] | None = None
    input_token_logprobs: list[list[Any]] | None = None
    id: str | None = None
    # a gen with tools (`Backend.chat`): the answer's text part and its calls, OpenAI-shaped
    # ({"id", "type", "function": {"name", "arguments": JSON text}}); `text` is what the model
    # wrote (the calls in its own format), or the calls as JSON where the server returns them
    # parsed only
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def meta(self) -> dict[str, Any]:
        """What `state.get_meta_info(name)` returns for a gen: SGLang's fields (`id`,
        `prompt_tokens`, `completion_tokens`, `cached_tokens`, `finish_reason`, logprobs when
        asked) plus ours (`matched_stop`, `logprobs` as plain floats)."""
        reason = FinishReason(type=self.finish_reason, matched=self.matched_stop)
        if self.finish_reason == "length":
            reason["length"] = self.completion_tokens
        meta: dict[str, Any] = {
            "id": self.id,
            "finish_reason": reason,
            "matched_stop": self.matched_stop,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "logprobs": self.logprobs,
        }
        for key in ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs"):
            if getattr(self, key) is not None:
                meta[key] = getattr(self, key)
        return meta


def logprob_triples(lps: list[float | None], ids: list[int], decode: Any = None) -> list[list[Any]]:
    """SGLang's `[logprob, token_id, text]` entries (text None unless `decode` is given)."""
    return [[lp, t, decode([t]) if decode else None] for lp, t in zip(lps, ids, strict=False)]


@dataclass(slots=True)
class GenChunk:
    """One piece of a streamed generation; the last one has `output` set."""

    text_delta: str
    output: GenOutput | None = None


class Backend(ABC):
    # False when the backend keeps no prefix cache: committing a prefix would be wasted work
    has_prefix_cache: bool = True
    # False when the backend cannot score a given text (no prompt log-probs): `select` is then
    # answered by a constrained choice (`gen(choices=..., temperature=0)`)
    scores_text: bool = True

    @abstractmethod
    def chat_template(self) -> ChatTemplate:
        """Role begin / end strings (derived once from the model's tokenizer)."""

    @abstractmethod
    def generate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        """Continue `prompt`; raise `BackendError` when the request fails."""

    @abstractmethod
    def generate_stream(self, prompt: str, params: dict[str, Any]) -> Iterator[GenChunk]:
        """Like `generate`, yielding text as it is decoded. Closing the iterator aborts."""

    @abstractmethod
    def score(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        """Per-token log-probs of each continuation after `prompt`, in ONE batched request."""

    @abstractmethod
    def commit_prefix(self, prefix: str) -> None:
        """Put `prefix`'s KV into the prefix cache (a prefill with no decoding).

        Must accept the empty string (then it does nothing useful, but must not fail).
        """

    def chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        """A gen with tools (`params["tools"]`, OpenAI function entries, and `tool_choice`):
        the assistant's next turn after the OpenAI-shaped `messages`, with the calls in the
        model's own format, strict, read back into `GenOutput.tool_calls`. A backend that
        cannot do tools raises `BackendError` naming itself."""
        raise BackendError(f"{type(self).__name__} backend cannot run a gen with tools")

    async def achat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> GenOutput:
        """`chat`, awaited."""
        return await in_fallback_pool(self.chat, messages, params)

    def unconditional_prompt(self) -> str:
        """The context for scoring "with no context" (a BOS token where there is one)."""
        return ""

    # ---- asyncio: override to await natively; these run the blocking method on the pool ------
    async def agenerate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        """`generate`, awaited."""
        return await in_fallback_pool(self.generate, prompt, params)

    async def agenerate_stream(
        self, prompt: str, params: dict[str, Any]
    ) -> AsyncIterator[GenChunk]:
        """`generate_stream`, as an async generator; `aclose()` aborts."""
        chunks = self.generate_stream(prompt, params)
        end = object()
        try:
            while (chunk := await in_fallback_pool(next, chunks, end)) is not end:
                yield chunk
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                await in_fallback_pool(close)

    async def ascore(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        """`score`, awaited."""
        return await in_fallback_pool(self.score, prompt, continuations)

    async def acommit_prefix(self, prefix: str) -> None:
        """`commit_prefix`, awaited."""
        await in_fallback_pool(self.commit_prefix, prefix)

    async def achat_template(self) -> ChatTemplate:
        """`chat_template`, awaited; a backend that must ask a server for it overrides this."""
        return self.chat_template()

    def stats(self) -> dict[str, Any]:
        return {}

    def flush_cache(self) -> bool:
        """Drop the unused cached prefixes (`sgl.flush_cache()`); False where there are none."""
        return False

    def get_server_info(self) -> dict[str, Any]:
        """What `sgl.get_server_info()` returns."""
        return {}

    def shutdown(self) -> None:
        """Free what the backend holds; it is not used afterwards."""
        return None


ASYNC_FALLBACK_THREADS = 8
_fallback_pool: ThreadPoolExecutor | None = None
T = TypeVar("T")


async def in_fallback_pool(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the one small pool the async path keeps for blocking work."""
    global _fallback_pool
    if _fallback_pool is None:
        _fallback_pool = ThreadPoolExecutor(ASYNC_FALLBACK_THREADS, thread_name_prefix="sgl-async")
    return await asyncio.get_running_loop().run_in_executor(_fallback_pool, fn, *args)
