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

from runtime.attention import AttentionBackend, LayerSpec, make_backend
from runtime.attention.forward_batch import ForwardBatch
from runtime.config import ModelConfig
from runtime.errors import UnsupportedModelError
from runtime.kernels.cpu import quant as cpu_quant
from runtime.kernels.cpu.quant_chain import DecodeChain
from runtime.memory.kv_pool import KVPool
from runtime.models.layers import (
    AddNorm,
    Packed,
    embedding,
    gemv_enabled,
    nbytes,
    packing_enabled,
    rms_norm,
)
from runtime.models.rope import RotaryEmbedding
from runtime.parallel.comm import LOCAL, Comm
from runtime.parallel.shard import SINGLE, Shard, heads_of, vocab_rows


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
    """Weights plus `forward(batch, pool) -> logits`. Stateless between calls.

    With a `shard` (runtime/parallel/shard.py) it holds one rank's part: its query / KV heads
    and MLP columns (all-reduced through `comm` after o and down), its vocabulary rows
    (embedding summed, LM head gathered), and its pipeline stage's layers (a stage after the
    first receives the hidden states, a stage before the last sends them and returns None).
    """

    def __init__(
        self,
        config: ModelConfig,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype,
        shard: Shard = SINGLE,
        comm: Comm = LOCAL,
        attention: AttentionBackend | None = None,
    ):
        self.config = config
        self.attention = attention or make_backend("auto")
        self.dtype = dtype
        self.shard, self.comm = shard, comm
        d = config.head_dim
        self.scale = d**-0.5
        q0, self.num_heads, kv0, self.num_kv_heads = (
            heads_of(config, shard) if shard.tp_size > 1 else (0, config.num_heads, 0,
                                                               config.num_kv_heads)
        )  # fmt: skip
        self.q_size = self.num_heads * d
        self.kv_size = self.num_kv_heads * d
        inter = config.intermediate_size // shard.tp_size
        i0 = shard.tp_rank * inter

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise UnsupportedModelError(f"weight {name!r} missing from the checkpoint")
            return state[name].to(dtype).contiguous()

        def maybe(name: str) -> torch.Tensor | None:
            return take(name) if name in state else None

        def q_rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[q0 * d : q0 * d + self.q_size]

        def kv_rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[kv0 * d : kv0 * d + self.kv_size]

        def mlp_rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[i0 : i0 + inter]

        def cat_bias(parts: list[torch.Tensor | None], sizes: tuple[int, ...]):
            if all(p is None for p in parts):
                return None
            return torch.cat(
                [
                    p if p is not None else torch.zeros(s, dtype=dtype)
                    for p, s in zip(parts, sizes, strict=True)
                ]
            )

        v0, rows, self.vocab_per_rank = vocab_rows(config.vocab_size, shard)
        self.vocab_start, self.vocab_rows = v0, rows
        embed = take("model.embed_tokens.weight")
        self.embed = embed[v0 : v0 + rows].contiguous()
        self.final_norm = take("model.norm.weight")
        head = state.get("lm_head.weight")
        tied = head is None or config.tie_word_embeddings
        self.lm_head = self.embed if tied else take("lm_head.weight")[v0 : v0 + rows].contiguous()
        # pipeline stages keep only what they use: the embedding on the first, the head on the last
        nothing = torch.empty(0, config.hidden_size, dtype=dtype)
        if not shard.last_stage:
            self.lm_head = nothing
        if not shard.first_stage and not (tied and shard.last_stage):
            self.embed = nothing
        self.layers: list[LayerWeights] = []
        for i in shard.layers(config.num_layers):
            p = f"model.layers.{i}."
            att, mlp = p + "self_attn.", p + "mlp."
            q, k, v = (take(att + f"{n}_proj.weight") for n in "qkv")
            qb, kb, vb = (maybe(att + f"{n}_proj.bias") for n in "qkv")
            gate, up = take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")
            down = take(mlp + "down_proj.weight")
            self.layers.append(
                LayerWeights(
                    input_norm=take(p + "input_layernorm.weight"),
                    qkv=torch.cat([q_rows(q), kv_rows(k), kv_rows(v)]).contiguous(),
                    qkv_bias=cat_bias(
                        [q_rows(qb), kv_rows(kb), kv_rows(vb)],
                        (self.q_size, self.kv_size, self.kv_size),
                    ),
                    o=take(att + "o_proj.weight")[:, q0 * d : q0 * d + self.q_size].contiguous(),
                    o_bias=maybe(att + "o_proj.bias"),
                    post_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=torch.cat([mlp_rows(gate), mlp_rows(up)]).contiguous(),
                    gate_up_bias=cat_bias(
                        [
                            mlp_rows(maybe(mlp + "gate_proj.bias")),
                            mlp_rows(maybe(mlp + "up_proj.bias")),
                        ],
                        (inter, inter),
                    ),  # fmt: skip
                    down=down[:, i0 : i0 + inter].contiguous(),
                    down_bias=maybe(mlp + "down_proj.bias"),
                )
            )
        self.rotary = RotaryEmbedding(config, dtype)
        big = [self.lm_head]
        for layer in self.layers:
            big += [layer.qkv, layer.o, layer.gate_up, layer.down]
        device = self.embed.device
        packed = Packed(big, packing_enabled(dtype, device), gemv_enabled(dtype, device))
        self.mm, self.swiglu_mm = packed.linear, packed.swiglu
        # residual add + RMSNorm, fused on CPU where the C kernel is built (models/layers.py)
        self.add_norm = AddNorm(config.rms_norm_eps, dtype, self.embed.device)
        # every layer attends alike: full causal attention at head_dim ** -0.5
        self.layer_specs = [LayerSpec(self.scale) for _ in self.layers]
        # a decode-only step's layers in one C call (quantized weights; None: not yet decided)
        self._chain: DecodeChain | bool | None = None

    def weight_bytes(self) -> int:
        """Bytes of weights read per forward pass (the embedding counted once when tied)."""
        tensors = [self.embed, self.final_norm]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors += [t for t in vars_of(layer) if t is not None]
        return sum(nbytes(t) for t in tensors)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        """Logits (float32) [len(batch.logit_rows), vocab] for the wanted rows."""
        attention = self.attention
        attention.plan(batch, pool)
        hidden = self.embed_tokens(batch.input_ids)
        t = hidden.shape[0]
        residual: tuple[torch.Tensor, torch.Tensor | None] | None = None  # not yet in hidden
        chained = self._chained(hidden, pool)
        if chained is not None:  # the same kernels in the same order, called from C
            residual, layers = (chained, None), []
        else:
            layers = self.layers
        for li, layer in enumerate(layers):
            # attention block (the previous layer's MLP output joins the residual here)
            hidden, x = self.add_norm(hidden, residual, layer.input_norm)
            qkv = self.mm(x, layer.qkv, layer.qkv_bias)
            # the new tokens' K/V go into their slots before attention reads the pages
            attn = attention.rope_attend(li, qkv, self.rotary, self.num_heads,
                                         self.layer_specs[li])  # fmt: skip
            out = self.comm.all_reduce(self.mm(attn.reshape(t, self.q_size), layer.o))
            # SwiGLU MLP block
            hidden, x = self.add_norm(hidden, (out, layer.o_bias), layer.post_norm)
            gate_up = self.mm(x, layer.gate_up, layer.gate_up_bias)
            out = self.comm.all_reduce(self.swiglu_mm(gate_up, layer.down))
            residual = (out, layer.down_bias)
        if residual is not None:
            out, bias = residual
            hidden = hidden + (out if bias is None else out + bias)
        return self.finish(hidden, batch)

    def _chained(self, hidden: torch.Tensor, pool: KVPool) -> torch.Tensor | None:
        """Every layer of a decode-only step through quant_chain.DecodeChain (the last layer's
        MLP output; `hidden` updated in place up to it), or None where it does not apply."""
        chain = self._chain
        if chain is None:
            chain = self._chain = self._decode_chain() or False
        if chain is False or hidden.shape[0] >= cpu_quant.DENSE_ROWS or any(pool.window_layer):
            return None
        decode_rope = getattr(self.attention, "decode_rope", None)
        rope = decode_rope(self.rotary, self.num_heads, hidden.dtype) if decode_rope else None
        if rope is None or not hidden.is_contiguous():
            return None
        return chain.run(hidden, rope, pool.k, pool.v)

    def _decode_chain(self) -> DecodeChain | None:
        shard = self.shard
        if shard.tp_size != 1 or not (shard.first_stage and shard.last_stage):
            return None
        if not self.add_norm.fused or not all(s.plain for s in self.layer_specs):
            return None
        layers = []
        for w in self.layers:
            if any(b is not None for b in (w.qkv_bias, w.o_bias, w.gate_up_bias, w.down_bias)):
                return None
            layers.append((w.input_norm, w.qkv, w.o, w.post_norm, w.gate_up, w.down))
        if not DecodeChain.supported(layers, self.dtype):
            return None
        scales = [s.scale for s in self.layer_specs]
        return DecodeChain(layers, scales, self.config.rms_norm_eps, self.dtype)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The first stage embeds (vocab-parallel: each rank its rows, summed); later stages
        receive the previous stage's hidden states."""
        if not self.shard.first_stage:
            return self.comm.recv_prev((ids.shape[0], self.config.hidden_size), self.dtype)
        if self.shard.tp_size == 1:
            return embedding(ids, self.embed, self.dtype)
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_rows)
        hidden = embedding(local.clamp(0, self.vocab_rows - 1), self.embed, self.dtype)
        return self.comm.all_reduce(hidden * mine[:, None].to(hidden.dtype))

    def finish(self, hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor | None:
        """The last stage's logits (vocab-parallel: gathered); earlier stages send on."""
        if not self.shard.last_stage:
            self.comm.send_next(hidden)
            return None
        hidden = rms_norm(hidden[batch.logit_rows], self.final_norm, self.config.rms_norm_eps)
        logits = self.mm(hidden, self.lm_head, float_out=True)
        if self.shard.tp_size == 1:
            return logits
        pad = self.vocab_per_rank - self.vocab_rows
        if pad:
            logits = F.pad(logits, (0, pad), value=float("-inf"))
        return self.comm.all_gather_last(logits)[:, : self.config.vocab_size]


def vars_of(layer: LayerWeights) -> list[torch.Tensor | None]:
    return [getattr(layer, name) for name in LayerWeights.__slots__]
