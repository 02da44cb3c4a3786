"""Qwen3 (`Qwen3ForCausalLM`) and Qwen3-MoE (`Qwen3MoeForCausalLM`) on the shared decoder.

Qwen3 is the Llama shape with an RMSNorm over each query and key head before RoPE and no q/k/v
bias. Qwen3-MoE replaces the MLP of its sparse layers (every `decoder_sparse_step`-th, except
`mlp_only_layers`) with routed experts: softmax over all experts, top-k, renormalised when
`norm_topk_prob`; no shared experts. Sliding windows apply where `layer_types` asks for them
(`use_sliding_window`).
"""

from __future__ import annotations

from runtime.models.decoder import DecoderModel, Family


class Qwen3Model(DecoderModel):
    family = Family()
