"""Gemma 3 text (`Gemma3ForCausalLM`, model_type `gemma3_text`) on the shared decoder.

Embeddings scaled by sqrt(hidden_size); every RMSNorm scales by `(1 + w)` in float32; four norms
per layer (input, post-attention, pre- and post-feedforward); GeGLU MLP (GELU-tanh gate); an
RMSNorm over each query and key head; softmax scale `query_pre_attn_scalar ** -0.5`; local
layers attend to the last `sliding_window` tokens with their own RoPE base, global layers to
everything with theirs (`layer_types`, or one global layer in six on older configs); attention
and final logits soft-capped where the config sets `attn_logit_softcapping` /
`final_logit_softcapping`.
"""

from __future__ import annotations

from runtime.models.decoder import DecoderModel, Family


class Gemma3Model(DecoderModel):
    family = Family(norm_offset=True, sandwich_norms=True, scaled_embeddings=True)
