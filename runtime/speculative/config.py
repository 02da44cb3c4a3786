"""The speculative decoding options: SGLang's names (`speculative_algorithm`, ...) and vLLM's
`speculative_config` dict, read into one record."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ALGORITHMS = ("NGRAM", "STANDALONE")
DEFAULT_DRAFT_TOKENS = 8
DEFAULT_DISABLE_BY_BATCH_SIZE = 4

# vLLM's speculative_config keys -> ours (method is read apart)
VLLM_KEYS = {
    "num_speculative_tokens": "num_draft_tokens",
    "prompt_lookup_max": "ngram_max_match_window_size",
    "prompt_lookup_min": "ngram_min_match_window_size",
    "model": "draft_model_path",
    "disable_by_batch_size": "disable_by_batch_size",
}
VLLM_METHODS = {"ngram": "NGRAM", "draft_model": "STANDALONE"}


class SpeculativeConfigError(ValueError):
    """A speculative decoding option that is unknown, out of range or not available."""


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """`algorithm`: "NGRAM" (drafts looked up in the request's own tokens) or "STANDALONE" (a
    draft model at `draft_model_path`, sharing the target's vocabulary). `num_draft_tokens`:
    the longest chain of drafts verified per request and step. `ngram_min_match_window_size` /
    `ngram_max_match_window_size`: the shortest and longest suffix of the request's tokens
    looked up earlier in them. `disable_by_batch_size`: with more decoding requests than this
    in a step, nothing is drafted (verifying a large batch costs more than it saves)."""

    algorithm: str
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS
    ngram_min_match_window_size: int = 1
    ngram_max_match_window_size: int = 12
    draft_model_path: str | None = None
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise SpeculativeConfigError(
                f"speculative_algorithm must be one of {list(ALGORITHMS)}, got {self.algorithm!r}"
            )
        if self.algorithm == "STANDALONE" and not self.draft_model_path:
            raise SpeculativeConfigError(
                "speculative_algorithm 'STANDALONE' needs speculative_draft_model_path (a model "
                "sharing the target's tokenizer)"
            )
        if self.algorithm != "STANDALONE" and self.draft_model_path:
            raise SpeculativeConfigError(
                f"speculative_draft_model_path is for speculative_algorithm 'STANDALONE', not "
                f"{self.algorithm!r}"
            )
        if self.num_draft_tokens < 1:
            raise SpeculativeConfigError(
                f"speculative_num_draft_tokens must be >= 1, got {self.num_draft_tokens}"
            )
        lo, hi = self.ngram_min_match_window_size, self.ngram_max_match_window_size
        if lo < 1 or hi < lo:
            raise SpeculativeConfigError(
                "speculative_ngram_min_match_window_size must be >= 1 and <= "
                f"speculative_ngram_max_match_window_size, got {lo} and {hi}"
            )
        if self.disable_by_batch_size < 1:
            raise SpeculativeConfigError(
                f"speculative_disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}"
            )


def speculative_config(
    algorithm: str | None = None,
    *,
    num_draft_tokens: int | None = None,
    num_steps: int | None = None,
    ngram_min_match_window_size: int | None = None,
    ngram_max_match_window_size: int | None = None,
    draft_model_path: str | None = None,
    disable_by_batch_size: int | None = None,
    vllm_config: str | dict[str, Any] | None = None,
) -> SpeculativeConfig | None:
    """The options as the Engine takes them (SGLang's keywords, vLLM's dict) in one record, or
    None when speculation is off (no algorithm and no vLLM config). A chain proposer's drafts
    per step are `num_draft_tokens`, else `num_steps` (SGLang's depth of a chain), else 8."""
    given = dict(
        num_draft_tokens=num_draft_tokens, ngram_min_match_window_size=ngram_min_match_window_size,
        ngram_max_match_window_size=ngram_max_match_window_size,
        draft_model_path=draft_model_path, disable_by_batch_size=disable_by_batch_size,
    )  # fmt: skip
    if vllm_config is not None:
        method, from_vllm = _read_vllm(vllm_config)
        if algorithm is not None and algorithm.upper() != method:
            raise SpeculativeConfigError(
                f"speculative_algorithm {algorithm!r} and speculative_config's method "
                f"{method!r} disagree"
            )
        algorithm = method
        for key, value in from_vllm.items():
            if given[key] is None:
                given[key] = value
    if algorithm is None:
        if any(v is not None for v in (*given.values(), num_steps)):
            raise SpeculativeConfigError(
                "speculative options were given without speculative_algorithm"
            )
        return None
    if num_steps is not None and num_steps < 1:
        raise SpeculativeConfigError(f"speculative_num_steps must be >= 1, got {num_steps}")
    if given["num_draft_tokens"] is None and num_steps is not None:
        given["num_draft_tokens"] = num_steps
    kwargs = {k: v for k, v in given.items() if v is not None}
    return SpeculativeConfig(str(algorithm).upper(), **kwargs)


def _read_vllm(raw: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """vLLM's `speculative_config` (a dict or its JSON text): the method and our options."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SpeculativeConfigError(f"speculative_config is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise SpeculativeConfigError("speculative_config must be a JSON object")
    method = raw.get("method")
    if method not in VLLM_METHODS:
        raise SpeculativeConfigError(
            f"speculative_config.method must be one of {sorted(VLLM_METHODS)}, got {method!r}"
        )
    unknown = sorted(set(raw) - set(VLLM_KEYS) - {"method"})
    if unknown:
        raise SpeculativeConfigError(f"speculative_config: unsupported key {unknown[0]!r}")
    return VLLM_METHODS[method], {VLLM_KEYS[k]: v for k, v in raw.items() if k != "method"}
