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
from runtime.kernels import cpu_fused
from runtime.kernels.cascade import cascade_decode_attention, plan_cascade
from runtime.kernels.decode_plan import plan_decode, planned_decode_attention
from runtime.kernels.prefix_extend import enabled as prefix_extend_enabled
from runtime.kernels.prefix_extend import plan_prefix_extend, prefix_extend_attention
from runtime.kernels.short_extend import plan_short_extend, short_extend_attention
from runtime.memory.kv_pool import KVPool
from runtime.models.forward_batch import ForwardBatch
from runtime.models.layers import Packed, gemv_enabled, packing_enabled, rms_norm
from runtime.models.rope import RotaryEmbedding, apply_rotary
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
    ):
        self.config = config
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
        self.mm = Packed(big, packing_enabled(dtype, device), gemv_enabled(dtype, device)).linear
        # fused CPU kernels (runtime/kernels/cpu_fused.py): residual add + RMSNorm, rotary +
        # K/V write, decode attention (float32: within an ulp or so of torch's ops, greedy tokens
        # unchanged; bf16: the norm and rotary bit-equal, attention rounding-level)
        self.fused = (
            self.embed.device.type == "cpu" and config.rope_dim == d and cpu_fused.available(dtype)
        )

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
        nd = batch.num_decode
        hidden = self.embed_tokens(batch.input_ids)
        t = hidden.shape[0]
        fused = self.fused  # decided at load time from the weights' device (packed for it)
        if fused:  # the kernel reads the tables at each token's position
            cos, sin = self.rotary.tables(batch.positions)
        else:
            cos, sin = self.rotary.cos_sin(batch.positions)
        cascade = None
        if nd > 1 and not hidden.is_cuda:
            cascade = plan_cascade(batch.decode_page_table, batch.decode_seq_lens, pool.page_size)
            cascade = cascade if cascade.useful else None
        torch_path = nd and cascade is None and kernels.kernel_backend(hidden) == "torch"
        fused_decode = None  # the fused kernel's int32 page table and lengths, for all layers
        if fused and torch_path:
            fused_decode = cpu_fused.DecodeRows.of(batch.decode_page_table, batch.decode_seq_lens)
        decode_plan = None  # the torch path's per-step gather indices and mask, for all layers
        if torch_path and fused_decode is None:
            decode_plan = plan_decode(
                batch.decode_page_table, batch.decode_seq_lens, pool.page_size,
                pool.k[0].shape[0],
            )  # fmt: skip
        short = split = None  # the CPU's extend paths, planned once for all layers
        if t > nd and not hidden.is_cuda:
            split = self._plan_extend(batch, pool.page_size, shared_only=True)
            if split is None:
                short = plan_short_extend(
                    batch.extend_page_table, batch.extend_prefix_lens, batch.extend_lens,
                    pool.page_size,
                )  # fmt: skip
            if split is None and short is None:
                split = self._plan_extend(batch, pool.page_size)
        add_norm = self._add_norm
        residual: tuple[torch.Tensor, torch.Tensor | None] | None = None  # not yet in hidden
        for li, layer in enumerate(self.layers):
            # attention block (the previous layer's MLP output joins the residual here)
            hidden, x = add_norm(hidden, residual, layer.input_norm)
            qkv = self.mm(x, layer.qkv, layer.qkv_bias)
            k_pool, v_pool = pool.k[li], pool.v[li]
            # the new tokens' K/V go into their slots before attention reads the pages
            if fused:
                q = cpu_fused.rotary_kv(qkv, cos, sin, batch.positions, batch.out_slots, k_pool,
                                        v_pool, self.num_heads)  # fmt: skip
            else:
                q = self._rotary_kv(qkv, cos, sin, batch.out_slots, k_pool, v_pool)
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
            elif fused_decode is not None:
                parts.append(
                    cpu_fused.decode_attention(q[:nd], k_pool, v_pool, fused_decode, self.scale)
                )
            elif decode_plan is not None:
                parts.append(
                    planned_decode_attention(q[:nd], k_pool, v_pool, decode_plan, self.scale)
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
            if split is not None:
                parts.append(prefix_extend_attention(q[nd:], k_pool, v_pool, self.scale, split))
            elif short is not None:
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
            out = self.comm.all_reduce(self.mm(attn.reshape(t, self.q_size), layer.o))
            # SwiGLU MLP block
            hidden, x = add_norm(hidden, (out, layer.o_bias), layer.post_norm)
            gate_up = self.mm(x, layer.gate_up, layer.gate_up_bias)
            gate, up = gate_up.chunk(2, dim=-1)
            out = self.comm.all_reduce(self.mm(F.silu(gate) * up, layer.down))
            residual = (out, layer.down_bias)
        if residual is not None:
            out, bias = residual
            hidden = hidden + (out if bias is None else out + bias)
        return self.finish(hidden, batch)

    def _plan_extend(self, batch: ForwardBatch, page_size: int, shared_only: bool = False):
        if not prefix_extend_enabled():
            return None
        return plan_prefix_extend(
            batch.extend_page_table, batch.extend_prefix_lens, batch.extend_lens, page_size,
            self.num_heads // self.num_kv_heads, shared_only=shared_only,
        )  # fmt: skip

    def _add_norm(
        self,
        hidden: torch.Tensor,
        residual: tuple[torch.Tensor, torch.Tensor | None] | None,
        weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden + residual, RMSNorm of it): `hidden + (out + bias)` then the norm, as
        torch rounds them; the fused kernel adds in place into `hidden` (a tensor this
        forward pass allocated)."""
        eps = self.config.rms_norm_eps
        if self.fused:
            out, bias = residual if residual is not None else (None, None)
            return hidden, cpu_fused.add_rms_norm(hidden, out, bias, weight, eps)
        if residual is not None:
            out, bias = residual
            hidden = hidden + (out if bias is None else out + bias)
        return hidden, rms_norm(hidden, weight, eps)

    def _rotary_kv(self, qkv, cos, sin, slots, k_pool, v_pool) -> torch.Tensor:
        """Torch ops: q rotated [T, Hq, D]; the rotated k and the v written into the pools."""
        t, d = qkv.shape[0], self.config.head_dim
        # q and k sit side by side in the projection: rotated as one [T, Hq + Hkv, D] block
        qk = apply_rotary(qkv[:, : self.q_size + self.kv_size].view(t, -1, d), cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, d)
        k_pool.view(-1, self.num_kv_heads, d).index_copy_(0, slots, k)
        v_pool.view(-1, self.num_kv_heads, d).index_copy_(0, slots, v)
        return q

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The first stage embeds (vocab-parallel: each rank its rows, summed); later stages
        receive the previous stage's hidden states."""
        if not self.shard.first_stage:
            return self.comm.recv_prev((ids.shape[0], self.config.hidden_size), self.dtype)
        if self.shard.tp_size == 1:
            return F.embedding(ids, self.embed)
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_rows)
        hidden = F.embedding(local.clamp(0, self.vocab_rows - 1), self.embed)
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
