"""What every endpoint shares: the engine bridge, the counters, the served model's names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from runtime.server.bridge import EngineBridge
from runtime.server.errors import APIError
from runtime.server.metrics import ServerMetrics
from runtime.server.response_store import ResponseStore

# the SGLang Model Gateway (runtime.cluster) fills a request's missing "model" with this
GATEWAY_NO_MODEL = "unknown"


@dataclass(slots=True)
class ServerState:
    bridge: EngineBridge
    model_name: str
    api_key: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    # the Responses API's stored responses (`store`, `previous_response_id`)
    responses: ResponseStore = field(default_factory=ResponseStore)
    tool_parser: str | None = None  # --tool-call-parser (None: chosen from the chat template)
    reasoning_parser: str | None = None  # --reasoning-parser
    # the engine's constraint compile pool (`Engine.compile_pool`), handed over by
    # `app.build_state`: request checks compile schemas there (None: checked in-process)
    compile_pool: Any = None

    @property
    def engine(self) -> Any:
        return self.bridge.engine

    @property
    def tokenizer(self) -> Any:
        return self.bridge.engine.tokenizer

    def record_usage(self, results: list[Any], per_prompt: int) -> None:
        if results:
            self.metrics.record_usage(*token_counts(results, per_prompt))

    def metrics_abort(self) -> None:
        self.metrics.client_aborts += 1

    def model_names(self) -> set[str]:
        return {self.model_name, str(self.engine.model_path)}

    def check_model(self, model: str | None) -> None:
        """404 unless `model` is the served model (its name or path; None means it, and so
        does `GATEWAY_NO_MODEL`, what the gateway sends for a request that named none)."""
        if model not in (None, GATEWAY_NO_MODEL) and model not in self.model_names():
            raise APIError(
                404,
                f"model {model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )


def token_counts(results: list[Any], per_prompt: int) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens of `results` (`GenerateResult`s), where each run of
    `per_prompt` results shares one prompt (n > 1): that prompt is counted once, with the
    smallest cached count among its choices."""
    prompt = cached = completion = 0
    for start in range(0, len(results), per_prompt):
        group = results[start : start + per_prompt]
        prompt += group[0].usage.prompt_tokens
        cached += min(r.usage.cached_tokens for r in group)
        completion += sum(r.usage.completion_tokens for r in group)
    return prompt, cached, completion


def get_state(request: Request) -> ServerState:
    return request.app.state.server
