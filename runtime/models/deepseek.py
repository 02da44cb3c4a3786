"""The engine's forward pass for DeepSeek V2 / V3 (`DeepseekV2ForCausalLM`,
`DeepseekV3ForCausalLM`): Multi-head Latent Attention over a latent KV cache (`mla.py`), dense
SwiGLU MLPs in the first `first_k_dense_replace` layers and mixture-of-experts after
(`moe.py`).

Attention per layer: the query comes from `q_proj`, or from `q_a_proj` -> RMSNorm -> `q_b_proj`
when `q_lora_rank` is set; `kv_a_proj_with_mqa` gives the latent `c` (RMSNorm'd) and the shared
rope key; RoPE (with YaRN where configured) rotates only the rope parts; the pool stores
`[c, k_rope]` per token. The softmax scale is `qk_head_dim ** -0.5`, times YaRN's mscale squared
where `mscale_all_dim` is set.

Weights in a GGUF block format stay in it: the projections and the LM head multiply through
layers.py's shared `Packed` layer (the quantized kernels; dense weights as `F.linear`), the
embedding dequantizes the rows it gathers, experts run as moe.py runs them; `kv_b_proj`, which
MLA multiplies densely per head, is dequantized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.attention import AttentionBackend, LayerSpec, make_backend
from runtime.attention.forward_batch import ForwardBatch
from runtime.config import ModelConfig
from runtime.errors import UnsupportedModelError
from runtime.memory.kv_pool import KVPool
from runtime.models.layers import Packed, dense_weight, embedding, nbytes, rms_norm
from runtime.models.mla import absorbed_attention, decompressed_attention
from runtime.models.moe import MoEWeights, load_moe, moe_forward
from runtime.models.rope import (
    RotaryEmbedding,
    apply_rotary,
    apply_rotary_interleaved,
    softmax_scale,
)
from runtime.parallel.comm import LOCAL, Comm
from runtime.parallel.shard import SINGLE, Shard, expert_block


@dataclass(slots=True)
class MLALayer:
    input_norm: torch.Tensor
    q: torch.Tensor | None  # q_proj, or None with q_lora_rank
    q_a: torch.Tensor | None
    q_a_bias: torch.Tensor | None
    q_a_norm: torch.Tensor | None
    q_b: torch.Tensor | None
    kv_a: torch.Tensor  # [R + Dr, hidden]
    kv_a_bias: torch.Tensor | None
    kv_a_norm: torch.Tensor
    w_uk: torch.Tensor  # [H, nope, R]
    w_uv: torch.Tensor  # [H, v, R]
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor | None  # the dense MLP (first_k_dense_replace layers)
    down: torch.Tensor | None
    moe: MoEWeights | None


class DeepseekModel:
    """Weights plus `forward(batch, pool) -> logits`. `absorb=False` decompresses the cache
    at every step instead (the same numbers; for checks and the benchmark)."""

    def __init__(
        self,
        config: ModelConfig,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype,
        shard: Shard = SINGLE,
        comm: Comm = LOCAL,
        attention: AttentionBackend | None = None,
    ):
        if config.mla is None:
            raise UnsupportedModelError(f"{config.architecture} needs an MLA config")
        self.config = config
        self.attention = attention or make_backend("auto")
        self.shard, self.comm = shard, comm
        self.dtype = dtype
        self.absorb = True
        mla, moe = config.mla, config.moe
        self.scale = softmax_scale(config, mla.qk_head_dim)
        self.spec = LayerSpec(self.scale)  # every layer: full causal attention
        rotate = apply_rotary_interleaved if mla.rope_interleave else apply_rotary
        self._rotate = rotate

        def take(name: str, as_dtype: torch.dtype | None = dtype) -> torch.Tensor:
            if name not in state:
                raise UnsupportedModelError(f"weight {name!r} missing from the checkpoint")
            return state[name].to(as_dtype).contiguous()

        def maybe(name: str, as_dtype: torch.dtype | None = dtype) -> torch.Tensor | None:
            return take(name, as_dtype) if name in state else None

        self.embed = take("model.embed_tokens.weight")
        self.final_norm = take("model.norm.weight")
        head = state.get("lm_head.weight")
        tied = head is None or config.tie_word_embeddings
        self.lm_head = self.embed if tied else take("lm_head.weight")
        nothing = torch.empty(0, config.hidden_size, dtype=dtype)  # what a stage does not use
        if not shard.last_stage:
            self.lm_head = nothing
        if not shard.first_stage and not (tied and shard.last_stage):
            self.embed = nothing
        heads, nope, vdim = config.num_heads, mla.qk_nope_head_dim, mla.v_head_dim
        self.layers: list[MLALayer] = []
        experts = expert_block(moe.n_routed_experts, shard) if moe else None
        for i in shard.layers(config.num_layers):
            p = f"model.layers.{i}."
            att, mlp = p + "self_attn.", p + "mlp."
            kv_b = dense_weight(take(att + "kv_b_proj.weight"), dtype)
            kv_b = kv_b.view(heads, nope + vdim, mla.kv_lora_rank)
            dense = moe is None or i < moe.first_k_dense_replace
            lora = mla.q_lora_rank is not None
            self.layers.append(
                MLALayer(
                    input_norm=take(p + "input_layernorm.weight"),
                    q=None if lora else take(att + "q_proj.weight"),
                    q_a=take(att + "q_a_proj.weight") if lora else None,
                    q_a_bias=maybe(att + "q_a_proj.bias"),
                    q_a_norm=take(att + "q_a_layernorm.weight") if lora else None,
                    q_b=take(att + "q_b_proj.weight") if lora else None,
                    kv_a=take(att + "kv_a_proj_with_mqa.weight"),
                    kv_a_bias=maybe(att + "kv_a_proj_with_mqa.bias"),
                    kv_a_norm=take(att + "kv_a_layernorm.weight"),
                    w_uk=kv_b[:, :nope].contiguous(),
                    w_uv=kv_b[:, nope:].contiguous(),
                    o=take(att + "o_proj.weight"),
                    o_bias=maybe(att + "o_proj.bias"),
                    post_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat(
                        [take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")]
                    )
                    if dense
                    else None,
                    down=take(mlp + "down_proj.weight") if dense else None,
                    moe=None
                    if dense
                    else load_moe(take, maybe, mlp, moe, experts, shared=shard.ep_rank == 0),
                )  # fmt: skip
            )
        self.rotary = RotaryEmbedding(config, dtype)
        # quantized weights through the quantized kernels; dense ones as F.linear (not reordered)
        packed = Packed([], enabled=False)
        self.mm, self.swiglu_mm = packed.linear, packed.swiglu
        moe_layers = sum(layer.moe is not None for layer in self.layers)
        n_experts = moe.n_routed_experts if moe else 0
        # routed (token, expert) pairs per MoE layer and expert: the last step's and in total
        self.expert_load = torch.zeros(moe_layers, n_experts, dtype=torch.int64)
        self.expert_load_total = torch.zeros(moe_layers, n_experts, dtype=torch.int64)

    def expert_bytes(self) -> int:
        """Bytes of the routed experts this rank holds."""
        return sum(layer.moe.expert_bytes() for layer in self.layers if layer.moe is not None)

    def weight_bytes(self) -> int:
        """Bytes of weights a forward pass may read (every expert counted)."""
        tensors = [self.embed, self.final_norm]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            for name in MLALayer.__slots__:
                value = getattr(layer, name)
                if isinstance(value, MoEWeights):
                    tensors += value.tensors()
                elif value is not None:
                    tensors.append(value)
        return sum(nbytes(t) for t in tensors)

    def _attention(self, li: int, layer: MLALayer, x: torch.Tensor, cos, sin) -> torch.Tensor:
        mla, cfg, t = self.config.mla, self.config, x.shape[0]
        if layer.q is not None:
            q = self.mm(x, layer.q)
        else:
            q_a = rms_norm(self.mm(x, layer.q_a, layer.q_a_bias), layer.q_a_norm, cfg.rms_norm_eps)
            q = self.mm(q_a, layer.q_b)
        q = q.view(t, cfg.num_heads, mla.qk_head_dim)
        q_nope, q_rope = q[..., : mla.qk_nope_head_dim], q[..., mla.qk_nope_head_dim :]
        kv = self.mm(x, layer.kv_a, layer.kv_a_bias)
        c = rms_norm(kv[:, : mla.kv_lora_rank], layer.kv_a_norm, cfg.rms_norm_eps)
        k_rope = self._rotate(kv[:, None, mla.kv_lora_rank :], cos, sin)
        q_rope = self._rotate(q_rope, cos, sin)
        # the new tokens' latents go into their slots before attention reads the pages
        self.attention.store_latent(li, torch.cat((c, k_rope[:, 0]), dim=-1))
        attend = absorbed_attention if self.absorb else decompressed_attention
        out = attend(q_nope, q_rope, layer.w_uk, layer.w_uv, self.attention, li, self.spec)
        return self.mm(out.reshape(t, -1), layer.o, layer.o_bias)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Logits (float32) [len(batch.logit_rows), vocab] for the wanted rows."""
        cfg = self.config
        self.attention.plan(batch, pool)
        if self.shard.first_stage:
            hidden = embedding(batch.input_ids, self.embed, self.dtype)
        else:
            hidden = self.comm.recv_prev((batch.num_tokens, cfg.hidden_size), self.dtype)
        cos, sin = self.rotary.cos_sin(batch.positions)
        self.expert_load.zero_()
        moe_index = 0
        for li, layer in enumerate(self.layers):  # li: the index in this stage's pool
            x = rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps)
            hidden = hidden + self._attention(li, layer, x, cos, sin)
            x = rms_norm(hidden, layer.post_norm, cfg.rms_norm_eps)
            if layer.moe is not None:
                load = self.expert_load[moe_index]
                # expert parallel: each rank adds its experts' share (and rank 0 the shared ones)
                hidden = hidden + self.comm.all_reduce(moe_forward(x, layer.moe, cfg.moe, load))
                moe_index += 1
            else:
                hidden = hidden + self.swiglu_mm(self.mm(x, layer.gate_up), layer.down)
        self.expert_load_total += self.expert_load
        if not self.shard.last_stage:
            self.comm.send_next(hidden)
            return None
        hidden = hidden[batch.logit_rows]
        hidden = rms_norm(hidden, self.final_norm, cfg.rms_norm_eps)
        return self.mm(hidden, self.lm_head, float_out=True)
