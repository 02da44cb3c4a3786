"""`Model`: what the scheduler and the engine call on a model, whichever runs it.

Satisfied by every family in this folder (`DecoderModel` with its family classes,
DeepSeek's included) and by `workers.driver.ParallelModel`, which runs the forward on worker ranks;
the engine runs either through `device.runner.ModelRunner`. The KV layout a model needs is
`config.kv_layout()`: the pool allocates what it lists (K and V per KV head, or one MLA latent
per token) and the memory and scheduling code deal in pages only.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.config import ModelConfig
from runtime.memory.kv_pool import KVPool


@runtime_checkable
class Model(Protocol):
    config: ModelConfig

    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor | None:
        """Logits (float32) [len(batch.logit_rows), vocab] for the batch's wanted rows (None on
        a pipeline stage that is not the last); the batch's new K/V are written into `pool`."""
        ...

    def weight_bytes(self) -> int:
        """Bytes of weights a forward pass reads."""
        ...
