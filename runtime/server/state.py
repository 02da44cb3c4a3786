"""What every endpoint shares: the engine bridge, the counters, the served model's names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from runtime.server import responses as R
from runtime.server.bridge import EngineBridge
from runtime.server.errors import APIError
from runtime.server.metrics import ServerMetrics


@dataclass(slots=True)
class ServerState:
    bridge: EngineBridge
    model_name: str
    api_key: str | None = None
    metrics: ServerMetrics = field(default_factory=ServerMetrics)

    @property
    def engine(self) -> Any:
        return self.bridge.engine

    @property
    def tokenizer(self) -> Any:
        return self.bridge.engine.tokenizer

    def record_usage(self, results: list[Any], per_prompt: int) -> None:
        usage = R.usage_of(results, per_prompt) if results else None
        if usage is not None:
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            self.metrics.record_usage(usage["prompt_tokens"], cached, usage["completion_tokens"])

    def metrics_abort(self) -> None:
        self.metrics.client_aborts += 1

    def model_names(self) -> set[str]:
        return {self.model_name, str(self.engine.model_path)}

    def check_model(self, model: str | None) -> None:
        """404 unless `model` is the served model (its name or path; None means it)."""
        if model is not None and model not in self.model_names():
            raise APIError(
                404,
                f"model {model!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )


def get_state(request: Request) -> ServerState:
    return request.app.state.server
