"""Phi-3 (`Phi3ForCausalLM`) on the shared decoder: the Llama shape with q/k/v in one
`qkv_proj` and gate/up in one `gate_up_proj` (split into the shared names at load, so tensor
parallel shards them as any other), LongRoPE (`longrope`, formerly `su`) where the config sets
it, partial rotary where `partial_rotary_factor` < 1, and a sliding window on every layer where
`sliding_window` is set.
"""

from __future__ import annotations

import torch

from runtime.config import ModelConfig
from runtime.models.decoder import DecoderModel, Family


class Phi3Model(DecoderModel):
    family = Family()

    @staticmethod
    def checkpoint_names(
        state: dict[str, torch.Tensor], config: ModelConfig
    ) -> dict[str, torch.Tensor]:
        q = config.num_heads * config.head_dim
        kv = config.num_kv_heads * config.head_dim
        out: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            if name.endswith(".self_attn.qkv_proj.weight"):
                base = name[: -len("qkv_proj.weight")]
                out[base + "q_proj.weight"] = tensor[:q]
                out[base + "k_proj.weight"] = tensor[q : q + kv]
                out[base + "v_proj.weight"] = tensor[q + kv :]
            elif name.endswith(".mlp.gate_up_proj.weight"):
                base = name[: -len("gate_up_proj.weight")]
                half = tensor.shape[0] // 2  # row slices: a quantized (GGUF) weight too
                out[base + "gate_proj.weight"] = tensor[:half]
                out[base + "up_proj.weight"] = tensor[half:]
            else:
                out[name] = tensor
        return out
