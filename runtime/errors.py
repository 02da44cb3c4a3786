"""Typed errors raised by the engine."""

from __future__ import annotations


class EngineError(RuntimeError):
    """Base class of every error the engine raises on purpose."""


class ModelNotFoundError(EngineError, FileNotFoundError):
    """The model folder, config or GGUF file that was asked for does not exist."""


class UnsupportedModelError(EngineError):
    """The model's architecture (or one of its config options) is not implemented."""


class PromptTooLongError(EngineError, ValueError):
    """A prompt (plus its generation budget) can never fit in the KV pool or the model."""


class EngineShutdownError(EngineError):
    """A request was made after `Engine.shutdown()`."""


class ParallelConfigError(EngineError, ValueError):
    """`tp_size` / `pp_size` / `ep_size` that the model's shape cannot be split by."""


class WorkerError(EngineError):
    """A worker process of a parallel engine died or failed; the engine cannot run on."""


class KVTransferError(EngineError):
    """A prefill-decode KV hand-off failed: layout mismatch, a peer gone, a room not arriving."""


class DisaggregationConfigError(EngineError, ValueError):
    """A `disaggregation_mode` / bootstrap setting the engine cannot serve."""


class HiCacheConfigError(EngineError, ValueError):
    """A hierarchical-cache setting the engine cannot serve (storage backend, folder, budget,
    or a combination such as no radix cache); the message names the field."""


class UnsupportedAttentionError(EngineError):
    """An attention backend cannot run here (triton missing) or lacks a feature a layer asks
    for (a sliding window, logit soft-capping); the message names it."""


class DeviceUnavailableError(EngineError, ValueError):
    """The engine was asked for a device this machine does not have (`device="cuda"` with no
    CUDA, or a GPU index past the last one); the message names it and what is present."""


class KVPoolTooLargeError(EngineError, ValueError):
    """The KV pool asked for (`--mem-budget-gb`, `--max-total-tokens`) is more than the
    machine has available."""


class UnknownOptionError(EngineError, TypeError):
    """A keyword that is not an engine option (runtime/options.py); `name` is the keyword."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name
