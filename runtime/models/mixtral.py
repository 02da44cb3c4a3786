"""Mixtral (`MixtralForCausalLM`) on the shared decoder: Mistral's attention with every MLP
replaced by routed experts (softmax over all experts, top-2 by default, renormalised).

Its checkpoints name a layer's experts `block_sparse_moe.experts.{e}.w1 / w3 / w2` (gate, up,
down) and the router `block_sparse_moe.gate`; they are read under the shared names
(`mlp.experts.{e}.gate_proj` ...).
"""

from __future__ import annotations

import re

import torch

from runtime.config import ModelConfig
from runtime.models.decoder import DecoderModel, Family

_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_NAME = re.compile(r"\.block_sparse_moe\.(?:experts\.(\d+)\.(w[123])|(gate))\.")


def _shared_name(name: str) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(3):
            return ".mlp.gate."
        return f".mlp.experts.{m.group(1)}.{_EXPERT[m.group(2)]}."

    return _NAME.sub(sub, name)


class MixtralModel(DecoderModel):
    family = Family()

    @staticmethod
    def checkpoint_names(
        state: dict[str, torch.Tensor], config: ModelConfig
    ) -> dict[str, torch.Tensor]:
        return {_shared_name(k): v for k, v in state.items()}
