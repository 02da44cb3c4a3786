"""runtime: the engine (model, paged KV pool, radix cache, scheduler); see docs/INTERFACES.md."""

from runtime.engine import Engine
from runtime.scheduling.request import GenerateResult, StreamChunk, Usage

__all__ = ["Engine", "GenerateResult", "StreamChunk", "Usage"]
