"""The interface every backend implements: in-process engine now, HTTP endpoint later.

A backend sees text only: the interpreter keeps each program's text and sends the whole of
it with every call, and the backend's prefix cache makes the repeated part free.
Generation parameters arrive as the `gen()` keywords (`max_tokens`, `min_tokens`, `stop`,
`stop_token_ids`, `temperature`, `top_p`, `top_k`, `min_p`, `frequency_penalty`,
`presence_penalty`, `ignore_eos`, `seed`, `return_logprob`, `regex`, `json_schema` as JSON text,
`choices`, `dtype` as "int" | "float" | "bool" | "str", `grammar` as lark text); absent keys
take the backend's defaults. Every method must be safe to call from many threads at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..chat_template import ChatTemplate


@dataclass(slots=True)
class GenOutput:
    text: str
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache
    completion_tokens: int = 0
    logprobs: list[float] | None = None
    matched_stop: Any = None

    def meta(self) -> dict[str, Any]:
        """What `state.get_meta_info(name)` returns for a gen."""
        return {
            "finish_reason": self.finish_reason,
            "matched_stop": self.matched_stop,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "logprobs": self.logprobs,
        }


@dataclass(slots=True)
class GenChunk:
    """One piece of a streamed generation; the last one has `output` set."""

    text_delta: str
    output: GenOutput | None = None


class Backend(ABC):
    # False when the backend keeps no prefix cache: committing a prefix would be wasted work
    has_prefix_cache: bool = True

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

    def unconditional_prompt(self) -> str:
        """The context for scoring "with no context" (a BOS token where there is one)."""
        return ""

    def stats(self) -> dict[str, Any]:
        return {}

    def shutdown(self) -> None:
        """Free what the backend holds; it is not used afterwards."""
        return None
