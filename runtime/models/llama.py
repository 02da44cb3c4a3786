"""The engine's own forward pass for the Llama family (Llama, Mistral, Qwen2).

RMSNorm, rotary embeddings with the config's scaling, grouped-query attention through the paged
KV pool, SwiGLU MLP, tied or untied embeddings, optional q/k/v (Qwen2) and o / MLP biases.
q/k/v and gate/up weights are fused into one matrix each at load time: one matmul instead of
three (or two) per layer, which matters on CPU where every op has a fixed cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime import kernels
from runtime.config import ModelConfig
from runtime.errors import UnsupportedModelError
from runtime.kernels.cascade import cascade_decode_attention, plan_cascade
from runtime.kernels.short_extend import plan_short_extend, short_extend_attention
from runtime.memory.kv_pool import KVPool
from runtime.models.forward_batch import ForwardBatch
from runtime.models.layers import rms_norm
from runtime.models.rope import RotaryEmbedding, apply_rotary


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, hidden]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, hidden]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


class LlamaModel:
    """Weights plus `forward(batch, pool) -> logits`. Stateless between calls."""

    def __init__(self, config: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype):
        self.config = config
        self.dtype = dtype
        self.scale = config.head_dim**-0.5
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise UnsupportedModelError(f"weight {name!r} missing from the checkpoint")
            return state[name].to(dtype).contiguous()

        def maybe(name: str) -> torch.Tensor | None:
            return take(name) if name in state else None

        def cat_bias(*names: str, sizes: tuple[int, ...]) -> torch.Tensor | None:
            parts = [maybe(n) for n in names]
            if all(p is None for p in parts):
                return None
            return torch.cat(
                [
                    p if p is not None else torch.zeros(s, dtype=dtype)
                    for p, s in zip(parts, sizes, strict=True)
                ]
            )

        self.embed = take("model.embed_tokens.weight")
        self.final_norm = take("model.norm.weight")
        head = state.get("lm_head.weight")
        self.lm_head = (
            self.embed if head is None or config.tie_word_embeddings else take("lm_head.weight")
        )
        self.layers: list[LayerWeights] = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            att, mlp = p + "self_attn.", p + "mlp."
            self.layers.append(
                LayerWeights(
                    input_norm=take(p + "input_layernorm.weight"),
                    qkv=torch.cat([take(att + f"{n}_proj.weight") for n in "qkv"]).contiguous(),
                    qkv_bias=cat_bias(
                        *(att + f"{n}_proj.bias" for n in "qkv"),
                        sizes=(self.q_size, self.kv_size, self.kv_size),
                    ),
                    o=take(att + "o_proj.weight"),
                    o_bias=maybe(att + "o_proj.bias"),
                    post_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat(
                        [take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")]
                    ).contiguous(),
                    gate_up_bias=cat_bias(
                        mlp + "gate_proj.bias",
                        mlp + "up_proj.bias",
                        sizes=(config.intermediate_size, config.intermediate_size),
                    ),
                    down=take(mlp + "down_proj.weight"),
                    down_bias=maybe(mlp + "down_proj.bias"),
                )
            )
        self.rotary = RotaryEmbedding(config, dtype)

    def weight_bytes(self) -> int:
        """Bytes of weights read per forward pass (the embedding counted once when tied)."""
        tensors = [self.embed, self.final_norm]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors += [t for t in vars_of(layer) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Logits (float32) [len(batch.logit_rows), vocab] for the wanted rows."""
        cfg = self.config
        nd = batch.num_decode
        hidden = F.embedding(batch.input_ids, self.embed)
        cos, sin = self.rotary.cos_sin(batch.positions)
        t = hidden.shape[0]
        cascade = None
        if nd > 1 and not hidden.is_cuda:
            cascade = plan_cascade(batch.decode_page_table, batch.decode_seq_lens, pool.page_size)
            cascade = cascade if cascade.useful else None
        short = None
        if t > nd and not hidden.is_cuda:
            short = plan_short_extend(
                batch.extend_page_table, batch.extend_prefix_lens, batch.extend_lens,
                pool.page_size,
            )  # fmt: skip
        for li, layer in enumerate(self.layers):
            # attention block
            x = rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps)
            qkv = F.linear(x, layer.qkv, layer.qkv_bias)
            q = qkv[:, : self.q_size].view(t, cfg.num_heads, cfg.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(
                t, cfg.num_kv_heads, cfg.head_dim
            )
            v = qkv[:, self.q_size + self.kv_size :].view(t, cfg.num_kv_heads, cfg.head_dim)
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
            k_pool, v_pool = pool.k[li], pool.v[li]
            # the new tokens' K/V go into their slots before attention reads the pages
            k_pool.view(-1, cfg.num_kv_heads, cfg.head_dim).index_copy_(0, batch.out_slots, k)
            v_pool.view(-1, cfg.num_kv_heads, cfg.head_dim).index_copy_(0, batch.out_slots, v)
            parts = []
            if cascade is not None:
                parts.append(
                    cascade_decode_attention(
                        q[:nd],
                        k_pool,
                        v_pool,
                        batch.decode_page_table,
                        batch.decode_seq_lens,
                        self.scale,
                        cascade,
                    )
                )
            elif nd:
                parts.append(
                    kernels.paged_decode_attention(
                        q[:nd],
                        k_pool,
                        v_pool,
                        batch.decode_page_table,
                        batch.decode_seq_lens,
                        self.scale,
                    )
                )
            if short is not None:
                parts.append(short_extend_attention(q[nd:], k_pool, v_pool, self.scale, short))
            elif t > nd:
                parts.append(
                    kernels.paged_extend_attention(
                        q[nd:],
                        k_pool,
                        v_pool,
                        batch.extend_page_table,
                        batch.extend_prefix_lens,
                        batch.extend_lens,
                        self.scale,
                    )
                )
            attn = parts[0] if len(parts) == 1 else torch.cat(parts)
            hidden = hidden + F.linear(attn.reshape(t, self.q_size), layer.o, layer.o_bias)
            # SwiGLU MLP block
            x = rms_norm(hidden, layer.post_norm, cfg.rms_norm_eps)
            gate_up = F.linear(x, layer.gate_up, layer.gate_up_bias)
            gate, up = gate_up.chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.down, layer.down_bias)
        hidden = hidden[batch.logit_rows]
        hidden = rms_norm(hidden, self.final_norm, cfg.rms_norm_eps)
        return F.linear(hidden, self.lm_head).float()


def vars_of(layer: LayerWeights) -> list[torch.Tensor | None]:
    return [getattr(layer, name) for name in LayerWeights.__slots__]
