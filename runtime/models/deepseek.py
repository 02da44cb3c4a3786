"""DeepSeek V2 / V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`) on the shared decoder
(decoder.py): plain pre-norm layers with RMSNorm and a SwiGLU MLP, whose attention is Multi-head
Latent Attention over a latent KV cache (mla.py: the low-rank q / kv projections, the rope split,
interleaved rotary pairs where `rope_interleave`, YaRN's mscale in the softmax scale), and whose
layers after the first `first_k_dense_replace` run routed plus shared experts with the family's
gating (moe.py: softmax with greedy or group-limited top-k for V2, sigmoid with the score
correction bias and `noaux_tc` for V3). What sets it apart is the config's `mla` and `moe`, not a
`Family` trait: the family is the default `Family()`. The `deepseek2` GGUF architecture loads onto
the same names (gguf_arch.py, gguf.py).
"""

from __future__ import annotations

from runtime.models.decoder import DecoderModel, Family


class DeepseekModel(DecoderModel):
    family = Family()
