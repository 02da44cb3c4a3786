"""Llama (`LlamaForCausalLM`), Mistral (`MistralForCausalLM`) and Qwen2 (`Qwen2ForCausalLM`) on
the shared decoder (decoder.py): the plain pre-norm shape with RMSNorm, rotary embeddings with the
config's scaling (default, linear, llama3, yarn), grouped-query attention, a SwiGLU MLP, tied or
untied embeddings, and the biases the config sets (q/k/v for Qwen2 and `attention_bias`, o with
`attention_bias`, the MLP's with `mlp_bias`). These families' layers are all full attention
(config.py gives them no `layer_types`). The family is the default `Family()`: no traits.
"""

from __future__ import annotations

from runtime.models.decoder import DecoderModel, Family


class LlamaModel(DecoderModel):
    family = Family()
