"""The one pre-norm decoder behind every dense and MoE family: Llama, Mistral, Qwen2, Qwen3 (dense
and MoE), Gemma 3 text, Mixtral, Phi-3 and DeepSeek V2 / V3. A family file names its `Family`
traits and maps its checkpoint onto the names read here; this file loads, shards and runs them
all, with the same CPU fast paths for every family (below).

Per layer: RMSNorm -> q/k/v projections (fused into one matrix at load) -> optional RMSNorm of
each query and key head (Qwen3, Gemma 3) -> RoPE of the layer's kind (Gemma 3's sliding layers
have their own base; Phi-3's LongRoPE switches to its long factors past the original context;
partial rotary rotates the first `rope_dim` values of a head) -> attention through the engine's
backend with the layer's `LayerSpec` (scale, sliding window, logit soft-cap) -> o -> optional
post-attention norm (Gemma's sandwich) -> residual; then norm -> gated MLP (SiLU or GELU-tanh)
or routed experts (with shared experts, DeepSeek's) -> optional post-MLP norm -> residual.
Embeddings may be scaled (Gemma), the final logits soft-capped. A config with `mla` (DeepSeek)
attends through Multi-head Latent Attention instead of q/k/v (mla.py: its low-rank projections,
the rope split, the latent cache), softmax scale `qk_head_dim ** -0.5` (times YaRN's mscale
squared where `mscale_all_dim` is set); its first `first_k_dense_replace` layers are dense.

Gemma's RMSNorm scales by `(1 + w)` in float32 before casting back; its weights are stored as
`1 + w` at load time, so one norm function serves both styles (`Family.norm_offset` picks the
cast order). Norms and routers stay in float32 where transformers computes them so.

Weights in a GGUF block format (a `.gguf` file read as it is) stay in it: the projections, the
LM head and the embedding go through the shared layers of layers.py (`Packed.linear` /
`Packed.swiglu` / `Packed.geglu` multiply a quantized weight with the quantized kernels,
`embedding` dequantizes the rows it gathers); experts through moe.py. q/k/v (and gate/up) are
fused into one matrix each at load: one product instead of three (or two) per layer.

The fast paths every family gets where its traits allow: the residual add fused with the next
RMSNorm (`AddNorm`; Gemma's (1 + w) sandwich norms through `offset_add_rms_norm`), the gated MLP's
activation in the quantized product's input stage (SwiGLU, GeGLU), rotary + K/V write (+ decode
attention) through the backend's `rope_attend` for layers on the full rotary tables (after the
q / k head norms, written back into the projection), and a decode-only step's layers in one C call
(`quant_chain.DecodeChain`). `decode_path` says which a model takes, and why not. MLA layers get
the fused add-norm and the packed / quantized products; not rope_attend nor the chain (their
attention reads the latent cache).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from runtime.attention import AttentionBackend, LayerSpec, make_backend
from runtime.attention.forward_batch import ForwardBatch
from runtime.config import FULL, SLIDING, ModelConfig
from runtime.errors import UnsupportedModelError
from runtime.kernels.cpu import fused as cpu_fused
from runtime.kernels.cpu import quant as cpu_quant
from runtime.kernels.cpu.quant_chain import (
    ACTIVATIONS,
    ChainExtras,
    ChainFamily,
    DecodeChain,
)
from runtime.memory.kv_pool import KVPool
from runtime.models.layers import (
    AddNorm,
    Packed,
    gemv_enabled,
    nbytes,
    packing_enabled,
    rms_norm,
)
from runtime.models.mla import MLAWeights, latent_attention, load_mla
from runtime.models.mla import chain_hook as mla_chain_hook
from runtime.models.mla import chain_supported as mla_chain_supported
from runtime.models.moe import MoEKernel, MoEWeights, load_moe, moe_forward, moe_kernel
from runtime.models.rope import (
    DecodeTables,
    RotaryEmbedding,
    longrope_frequencies,
    softmax_scale,
)
from runtime.models.sharded import TensorParallel
from runtime.parallel.comm import LOCAL, Comm
from runtime.parallel.shard import SINGLE, Shard

logger = logging.getLogger(__name__)
GATE_UP = ("gate", "up")


@dataclass(slots=True, frozen=True)
class Family:
    """What sets a family apart from the plain Llama shape."""

    norm_offset: bool = False  # RMSNorm scales by (1 + w), multiplied in float32 (Gemma)
    sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma)
    scaled_embeddings: bool = False  # embeddings times sqrt(hidden_size) (Gemma)


@dataclass(slots=True)
class DecoderLayer:
    spec: LayerSpec
    kind: str  # FULL or SLIDING: which rotary tables the layer reads
    input_norm: torch.Tensor
    qkv: torch.Tensor | None  # [(Hq + 2 Hkv) D, hidden], this rank's heads (None with mla)
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [D]
    k_norm: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_attn_norm: torch.Tensor | None  # Gemma's post_attention_layernorm
    pre_mlp_norm: torch.Tensor  # Llama's post_attention_layernorm, Gemma's pre_feedforward
    post_mlp_norm: torch.Tensor | None
    gate_up: torch.Tensor | None  # dense MLP [2 I, hidden] (None in a sparse layer)
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor | None
    down_bias: torch.Tensor | None
    moe: MoEWeights | None
    mla: MLAWeights | None = None  # latent attention in place of q/k/v (DeepSeek)
    # rotary, K/V write and attention through the backend's rope_attend (its own rotary
    # tables, window and pages; not with LongRoPE); else rotated here, then attend
    rope_attend: bool = False

    def tensors(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for name in DecoderLayer.__slots__:
            value = getattr(self, name)
            if isinstance(value, MoEWeights | MLAWeights):
                out += value.tensors()
            elif isinstance(value, torch.Tensor) or cpu_quant.is_quantized(value):
                out.append(value)
        return out


class DecoderModel:
    """Weights plus `forward(batch, pool) -> logits`, stateless between calls. A subclass sets
    `family` and may override `checkpoint_names` (renaming its checkpoint's keys to the Llama
    names read here). With a `shard` it holds one rank's heads, MLP columns, experts (split over
    the stage's tensor or expert ranks), its vocabulary rows (embedding summed, LM head gathered)
    and its pipeline stage's layers (a stage after the first receives the hidden states, a stage
    before the last sends them and returns None)."""

    family: ClassVar[Family] = Family()

    def __init__(
        self,
        config: ModelConfig,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype,
        shard: Shard = SINGLE,
        comm: Comm = LOCAL,
        attention: AttentionBackend | None = None,
    ) -> None:
        self.config, self.dtype, self.shard, self.comm = config, dtype, shard, comm
        self.attention = attention or make_backend("auto")
        if config.mla is not None:
            # MLA's attention over the latents: absorbed (the default) or, False, decompressed
            # to per-head K/V at every step (the same numbers; for checks and the benchmark)
            self.absorb = True
        state = self.checkpoint_names(dict(state), config)
        # this rank's heads, MLP columns and vocabulary rows, and the sums that complete them
        self.tp = TensorParallel(config, shard, comm)
        self.num_heads, self.num_kv_heads = self.tp.num_heads, self.tp.num_kv_heads
        self._state, vocab = state, self.tp.vocab
        self.embed = vocab.rows(self._take("model.embed_tokens.weight"))
        self.final_norm = self._norm_weight("model.norm.weight")
        tied = "lm_head.weight" not in state or config.tie_word_embeddings
        head = self.embed if tied else vocab.rows(self._take("lm_head.weight"))
        nothing = torch.empty(0, config.hidden_size, dtype=dtype)
        self.lm_head = head if shard.last_stage else nothing
        if not shard.first_stage and not (tied and shard.last_stage):
            self.embed = nothing
        self.layers = [self._load_layer(i) for i in shard.layers(config.num_layers)]
        del self._state
        for layer in self.layers:  # every kind: the backends keep each rotary's tables apart
            layer.rope_attend = layer.mla is None and config.rope_type != "longrope"
        self._explicit_rope = not all(layer.rope_attend for layer in self.layers)
        self.embed_scale = (
            torch.tensor(config.hidden_size**0.5).to(dtype)
            if self.family.scaled_embeddings
            else None
        )
        self.rotary = {FULL: RotaryEmbedding(config, dtype)}
        if config.local_rope is not None:
            local = dict(config.local_rope)
            theta = float(local.pop("rope_theta", config.rope_theta))
            local_config = dataclasses.replace(config, rope_theta=theta, rope_scaling=local)
            self.rotary[SLIDING] = RotaryEmbedding(local_config, dtype)
        else:
            self.rotary[SLIDING] = self.rotary[FULL]
        self.long_rotary = None  # LongRoPE: the tables past the original context
        # LongRoPE's decode-only steps through rope_attend on rope.DecodeTables (False: rotated
        # in torch per token, as its extends are; for checks)
        self.longrope_decode = config.rope_type == "longrope"
        self._chain_rotary = self.rotary[FULL]  # the decode chain's (decode-only steps)
        if config.rope_type == "longrope":
            self.long_rotary = RotaryEmbedding(config, dtype)
            inv_freq, scaling = longrope_frequencies(config, long=True)
            self.long_rotary.inv_freq, self.long_rotary.attention_scaling = inv_freq, scaling
            original = int(config.rope_scaling["original_max_position_embeddings"])
            self._chain_rotary = DecodeTables(self.rotary[FULL], self.long_rotary, original)
        # (rotary, window, soft cap) per layer: what the chain's attention steps differ by
        self._chain_layers = [
            (self._chain_rotary if self.rotary[w.kind] is self.rotary[FULL]
             else self.rotary[w.kind], w.spec.window, w.spec.soft_cap) for w in self.layers
        ]  # fmt: skip
        big = [self.lm_head] + [
            t for layer in self.layers for t in (layer.qkv, layer.o, layer.gate_up, layer.down)
            if t is not None
        ] + [t for layer in self.layers if layer.mla for t in layer.mla.projections()]  # fmt: skip
        device = self.embed.device
        packed = Packed(big, packing_enabled(dtype, device), gemv_enabled(dtype, device))
        self.mm, self.swiglu_mm, self.geglu_mm = packed.linear, packed.swiglu, packed.geglu
        # residual add + RMSNorm in one C pass (plain norms; models/layers.py)
        self.add_norm = AddNorm(config.rms_norm_eps, dtype, device)
        moe_layers = sum(layer.moe is not None for layer in self.layers)
        experts = config.moe.n_routed_experts if config.moe else 0
        self.expert_load = torch.zeros(moe_layers, experts, dtype=torch.int64)
        self.expert_load_total = torch.zeros(moe_layers, experts, dtype=torch.int64)
        # Gemma's sandwich norms through one C call per residual add (fused.offset_add_rms_norm)
        self._fused_sandwich = (
            self.family.norm_offset and self.family.sandwich_norms and moe_layers == 0
            and all(w.o_bias is None and w.down_bias is None for w in self.layers)
            and device.type == "cpu" and dtype in cpu_fused.MODEL_TYPES
            and cpu_fused.available(dtype)
        )  # fmt: skip
        # a decode-only step's layers in one C call (quant_chain.py), where the family and the
        # weights allow it; `why` what keeps the model off it
        self._chain, why = self._decode_chain(device)
        self.decode_path = self._decode_path(why)
        logger.info("%s: %s", type(self).__name__, self.decode_path)

    def _decode_path(self, why: list[str]) -> str:
        """What a decode step of this model runs, in words: the one-C-call decode chain with
        the family's parts it runs, or this file's per-layer loop and what keeps the model off
        the chain. Logged once at load; docs/models.md."""
        if self._chain is None:
            return "per-layer decode, no one-call decode chain (" + ", ".join(why) + ")"
        cfg, fam = self.config, self.family
        parts = []
        if fam.norm_offset:
            parts.append("(1 + w) norms multiplied in float32")
        if fam.sandwich_norms:
            parts.append("post-attention and post-MLP norms")
        if cfg.qk_norm:
            parts.append("q / k head norms")
        named = ("q / k / v", "o", "gate / up", "down")
        biased = [name for k, name in enumerate(named)
                  if any(_biases(layer)[k] is not None for layer in self.layers)]  # fmt: skip
        if biased:
            parts.append(", ".join(biased) + " biases")
        parts.append(f"{cfg.hidden_act} gate")
        if any(layer.moe is not None for layer in self.layers):
            parts.append("routed experts in one C call a layer (moe.py)")
        if cfg.mla is not None:
            parts.append("latent attention (MLA) in one C call a layer (mla.py)")
        if cfg.rope_dim != cfg.head_dim and cfg.mla is None:  # (MLA's: its rope split)
            parts.append(f"partial rotary ({cfg.rope_dim} of {cfg.head_dim})")
        if cfg.rope_type == "longrope":
            parts.append("LongRoPE (a decode token past the original context: long factors)")
        if cfg.attn_logit_softcapping is not None:
            parts.append("attention logit soft-capping")
        if any(layer.kind == SLIDING for layer in self.layers):
            parts.append("sliding-window layers with their own rotary tables")
        if fam.scaled_embeddings:
            parts.append("scaled embeddings")
        return ("one-call decode chain (" + ", ".join(parts) + "); per-layer for extends and "
                "for steps the chain does not take (a quantized KV pool, another attention "
                f"backend, {cpu_quant.DENSE_ROWS} or more requests)")  # fmt: skip

    def _decode_chain(self, device: torch.device) -> tuple[DecodeChain | None, list[str]]:
        """The model's DecodeChain, or None and what of the family, the weights or the
        placement keeps it off the chain."""
        cfg, fam, shard = self.config, self.family, self.shard
        why = []
        if any(w.mla is not None and not mla_chain_supported(w.mla, w.o, self.dtype)
               for w in self.layers):  # fmt: skip
            why.append("latent attention (MLA) not in integer-kernel block formats")
        if shard.tp_size != 1 or not (shard.first_stage and shard.last_stage):
            why.append("tensor or pipeline parallel")
        if device.type != "cpu" or self.dtype not in cpu_fused.MODEL_TYPES:
            why.append(f"{device.type} {self.dtype}")
        if fam.norm_offset != fam.sandwich_norms:
            why.append("(1 + w) norms without sandwich norms, or the reverse")
        if cfg.hidden_act not in ACTIVATIONS:
            why.append(f"{cfg.hidden_act} gate")
        if any(w.moe is not None and not MoEKernel.supported(w.moe, cfg.moe) for w in self.layers):
            why.append("routed experts not all in integer-kernel block formats")
        if fam.sandwich_norms and any(b is not None for layer in self.layers
                                      for b in _biases(layer)):  # fmt: skip
            why.append("biases with sandwich norms")
        if why:
            return None, why
        family = ChainFamily(offset_norms=fam.norm_offset, sandwich=fam.sandwich_norms,
                             head_norms=cfg.qk_norm, activation=cfg.hidden_act,
                             heads=(self.num_heads, self.num_kv_heads, cfg.head_dim))  # fmt: skip
        layers = [(w.input_norm, w.qkv, None if w.mla else w.o, w.pre_mlp_norm, w.gate_up,
                   w.down) for w in self.layers]  # fmt: skip
        mla = [w.mla and mla_chain_hook(w.mla, w.o, cfg, w.spec.scale, self.dtype)
               for w in self.layers]  # an MLA layer's attention half in C (mla.py)
        loads = iter(self.expert_load)  # a MoE layer's MLP half: its experts in C (moe.py)
        moe = [None if w.moe is None else moe_kernel(w.moe, cfg.moe).chain_hook(next(loads))
               for w in self.layers]  # fmt: skip
        extras = [ChainExtras(w.q_norm, w.k_norm, w.post_attn_norm, w.post_mlp_norm,
                              qkv_bias=w.qkv_bias, o_bias=w.o_bias, gate_up_bias=w.gate_up_bias,
                              down_bias=w.down_bias, mlp_half=hook, attn_half=attn)
                  for w, hook, attn in zip(self.layers, moe, mla, strict=True)]  # fmt: skip
        if not DecodeChain.supported(layers, self.dtype, family, extras):
            return None, ["weights not all in integer-kernel block formats (dense or float "
                          "GGUF tensors), or the C kernels not built"]  # fmt: skip
        scales = [layer.spec.scale for layer in self.layers]
        return DecodeChain(layers, scales, cfg.rms_norm_eps, self.dtype, family, extras), []

    # ---- loading -----------------------------------------------------------------------------
    @staticmethod
    def checkpoint_names(
        state: dict[str, torch.Tensor], config: ModelConfig
    ) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors under the names this file reads (identity by default)."""
        return state

    def _take(self, name: str, as_dtype: torch.dtype | None = None) -> torch.Tensor:
        if name not in self._state:
            raise UnsupportedModelError(f"weight {name!r} missing from the checkpoint")
        return self._state[name].to(as_dtype or self.dtype).contiguous()

    def _maybe(self, name: str, as_dtype: torch.dtype | None = None) -> torch.Tensor | None:
        return self._take(name, as_dtype) if name in self._state else None

    def _norm_weight(self, name: str) -> torch.Tensor:
        if self.family.norm_offset:  # (1 + w), kept in float32 as Gemma multiplies it
            return 1.0 + self._take(name, torch.float32)
        return self._take(name)

    def _load_layer(self, i: int) -> DecoderLayer:
        cfg, tp = self.config, self.tp
        p = f"model.layers.{i}."
        att, mlp = p + "self_attn.", p + "mlp."
        qkv = qkv_bias = mla = None
        window = cfg.layer_window(i)
        scale = (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        if cfg.mla is not None:  # this rank's heads (the latent projection: every rank's)
            mla = load_mla(self._take, self._maybe, att, cfg, self.dtype, tp.heads)
            scale = softmax_scale(cfg, cfg.mla.qk_head_dim)
        else:
            qkv = tp.qkv.weight([self._take(att + f"{n}_proj.weight") for n in "qkv"])
            qkv_bias = tp.qkv.bias([self._maybe(att + f"{n}_proj.bias") for n in "qkv"],
                                   self.dtype)  # fmt: skip
        sparse = cfg.moe is not None and cfg.moe.sparse_layer(i)
        gate_up = down = moe = gate_up_bias = None
        if sparse:  # shared experts (DeepSeek's) on one rank: the ranks' outputs are summed
            shared = self.shard.ep_rank == 0 and self.shard.tp_rank == 0
            moe = load_moe(self._take, self._maybe, mlp, cfg.moe, tp.experts, shared=shared)
        else:
            gate_up = tp.gate_up.weight([self._take(mlp + f"{n}_proj.weight") for n in GATE_UP])
            gate_up_bias = tp.gate_up.bias([self._maybe(mlp + f"{n}_proj.bias") for n in GATE_UP],
                                           self.dtype)  # fmt: skip
            down = tp.down.weight(self._take(mlp + "down_proj.weight"))
        sandwich = self.family.sandwich_norms
        o = self._take(att + "o_proj.weight")
        return DecoderLayer(
            spec=LayerSpec(scale=scale, window=window, soft_cap=cfg.attn_logit_softcapping),
            kind=SLIDING if window is not None else FULL,
            input_norm=self._norm_weight(p + "input_layernorm.weight"),
            qkv=qkv,
            qkv_bias=qkv_bias,
            q_norm=self._norm_weight(att + "q_norm.weight") if cfg.qk_norm else None,
            k_norm=self._norm_weight(att + "k_norm.weight") if cfg.qk_norm else None,
            o=tp.o.weight(o),
            o_bias=self._maybe(att + "o_proj.bias"),
            post_attn_norm=self._norm_weight(p + "post_attention_layernorm.weight")
            if sandwich else None,
            pre_mlp_norm=self._norm_weight(
                p + ("pre_feedforward_layernorm.weight" if sandwich
                     else "post_attention_layernorm.weight")
            ),
            post_mlp_norm=self._norm_weight(p + "post_feedforward_layernorm.weight")
            if sandwich else None,
            gate_up=gate_up,
            gate_up_bias=gate_up_bias,
            down=down,
            down_bias=None if sparse else self._maybe(mlp + "down_proj.bias"),
            moe=moe,
            mla=mla,
        )  # fmt: skip

    def weight_bytes(self) -> int:
        """Bytes of weights a forward pass may read (the embedding counted once when tied)."""
        tensors = [self.embed, self.final_norm]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors += layer.tensors()
        return sum(nbytes(t) for t in tensors)

    # ---- the forward pass ----------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        eps = self.config.rms_norm_eps
        if self.family.norm_offset:  # Gemma: (normalised x * (1 + w)) in float32, then cast
            return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)
        return rms_norm(x, weight, eps)

    def _activation(self, gate: torch.Tensor) -> torch.Tensor:
        act = self.config.hidden_act
        if act == "silu":
            return F.silu(gate)
        return F.gelu(gate, approximate="tanh" if act == "gelu_pytorch_tanh" else "none")

    def _rope_tables(self, batch: ForwardBatch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """cos, sin [T, 1, rope_dim] per layer kind for the step's positions."""
        pos = batch.positions
        tables = {kind: rot.cos_sin(pos) for kind, rot in self.rotary.items()}
        if self.long_rotary is not None:
            # as transformers decides per forward call: a sequence whose chunk reaches past the
            # original context rotates that chunk with the long factors
            long = _chunk_reaches(
                batch, int(self.config.rope_scaling["original_max_position_embeddings"])
            )
            if bool(long.any()):
                cos_l, sin_l = self.long_rotary.cos_sin(pos)
                cos, sin = tables[FULL]
                pick = long[:, None, None]
                tables[FULL] = (torch.where(pick, cos_l, cos), torch.where(pick, sin_l, sin))
                if self.rotary[SLIDING] is self.rotary[FULL]:
                    tables[SLIDING] = tables[FULL]
        return tables

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.rotary[FULL].rotate(x, cos, sin)  # partial rotary: the first rope_dim

    def _attention_block(
        self, li: int, layer: DecoderLayer, x: torch.Tensor, tables
    ) -> torch.Tensor:
        """The attention block's output before its o bias (summed over the tensor ranks)."""
        t, d = x.shape[0], self.config.head_dim
        hq, hkv = self.num_heads, self.num_kv_heads
        if layer.mla is not None:
            out = latent_attention(layer.mla, x, self.mm, self.config, self.attention, li,
                                   layer.spec, tables[FULL], self.absorb)  # fmt: skip
            return self.tp.o.reduce(self.mm(out, layer.o))
        qkv = self.mm(x, layer.qkv, layer.qkv_bias)
        if layer.rope_attend or not tables:  # (no tables: a LongRoPE model's decode-only step)
            if layer.q_norm is not None:  # the normed heads back into the projection
                qk = qkv[:, : (hq + hkv) * d]
                qk[:, : hq * d].view(t, hq, d).copy_(
                    self._norm(qk[:, : hq * d].view(t, hq, d), layer.q_norm))
                qk[:, hq * d :].view(t, hkv, d).copy_(
                    self._norm(qk[:, hq * d :].view(t, hkv, d), layer.k_norm))  # fmt: skip
            rotary = self._chain_layers[li][0]  # LongRoPE: rope.DecodeTables, else the kind's
            out = self.attention.rope_attend(li, qkv, rotary, hq, layer.spec)
        else:
            q = qkv[:, : hq * d].view(t, hq, d)
            k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
            v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
            if layer.q_norm is not None:
                q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
            cos, sin = tables[layer.kind]
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            self.attention.store_kv(li, k, v)
            out = self.attention.attend(li, q, layer.spec)
        return self.tp.o.reduce(self.mm(out.reshape(t, hq * d), layer.o))

    def _mlp_block(self, layer: DecoderLayer, x: torch.Tensor, load: torch.Tensor | None):
        """The MLP block's output before its down bias (summed over the tensor ranks)."""
        if layer.moe is not None:
            # each rank runs its experts; the sum over the stage's ranks is the layer's output
            return self.tp.experts_reduce(moe_forward(x, layer.moe, self.config.moe, load))
        gate_up = self.mm(x, layer.gate_up, layer.gate_up_bias)
        reduce = self.tp.down.reduce
        if self.config.hidden_act == "silu":  # a quantized down: SiLU in its input stage
            return reduce(self.swiglu_mm(gate_up, layer.down))
        if self.config.hidden_act == "gelu_pytorch_tanh":  # Gemma's GeGLU, likewise
            return reduce(self.geglu_mm(gate_up, layer.down))
        gate, up = gate_up.chunk(2, dim=-1)
        return reduce(self.mm(self._activation(gate) * up, layer.down))

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor | None:
        """Logits (float32) [len(batch.logit_rows), vocab] for the wanted rows."""
        self.attention.plan(batch, pool)
        hidden = self.embed_tokens(batch.input_ids)
        moe = self.expert_load.numel() > 0
        if moe:
            self.expert_load.zero_()
        if self._chain is not None:
            out = self._chained(hidden, pool)
            if out is not None:  # the same kernels, called from C
                if moe:
                    self.expert_load_total += self.expert_load
                last, bias = self.layers[-1].post_mlp_norm, self.layers[-1].down_bias
                out = out if bias is None else out + bias
                return self.finish(hidden + (out if last is None else self._norm(out, last)),
                                   batch)  # fmt: skip
        # a LongRoPE model's decode-only step: every layer through rope_attend on the
        # DecodeTables (each token's own short or long rows, the chain's), no torch rotation
        decode_only = self.longrope_decode and batch.num_decode == batch.num_tokens
        tables = self._rope_tables(batch) if self._explicit_rope and not decode_only else {}
        if not self.layers:
            pass
        elif not (self.family.norm_offset or self.family.sandwich_norms):
            hidden = self._plain_layers(hidden, tables)
        elif self._fused_sandwich:
            hidden = self._sandwich_layers(hidden.contiguous(), tables)
        else:
            hidden = self._norm_layers(hidden, tables)
        if moe:
            self.expert_load_total += self.expert_load
        return self.finish(hidden, batch)

    def _norm_layers(self, hidden: torch.Tensor, tables) -> torch.Tensor:
        """forward's layer loop in torch ops, each norm where the family has one (Gemma's
        (1 + w) norms where the fused C norm is not built)."""
        loads = iter(self.expert_load)
        for li, layer in enumerate(self.layers):  # li: the index in this rank's pool
            out = self._attention_block(li, layer, self._norm(hidden, layer.input_norm), tables)
            out = out if layer.o_bias is None else out + layer.o_bias
            if layer.post_attn_norm is not None:
                out = self._norm(out, layer.post_attn_norm)
            hidden = hidden + out
            load = next(loads) if layer.moe is not None else None
            out = self._mlp_block(layer, self._norm(hidden, layer.pre_mlp_norm), load)
            out = out if layer.down_bias is None else out + layer.down_bias
            if layer.post_mlp_norm is not None:
                out = self._norm(out, layer.post_mlp_norm)
            hidden = hidden + out
        return hidden

    def _plain_layers(self, hidden: torch.Tensor, tables) -> torch.Tensor:
        """forward's layer loop for plain pre-norm layers (no (1 + w), no sandwich norms): each
        residual add with the next RMSNorm through `AddNorm` (one C pass, in place into
        `hidden`, a tensor this step made), the o and down biases added in it."""
        add_norm, residual, loads = self.add_norm, None, iter(self.expert_load)
        for li, layer in enumerate(self.layers):  # li: the index in this rank's pool
            hidden, x = add_norm(hidden, residual, layer.input_norm)
            out = self._attention_block(li, layer, x, tables)
            hidden, x = add_norm(hidden, (out, layer.o_bias), layer.pre_mlp_norm)
            load = next(loads) if layer.moe is not None else None
            residual = (self._mlp_block(layer, x, load), layer.down_bias)
        out, bias = residual
        return hidden + (out if bias is None else out + bias)

    def _chained(self, hidden: torch.Tensor, pool: KVPool) -> torch.Tensor | None:
        """Every layer of a decode-only step through the DecodeChain (the last layer's MLP
        output; `hidden` updated in place up to it), or None where the step is not one the
        chain takes. The chain's attention is the backend's (`chain_attention`: its fused
        decode steps, a layer with other rotary tables, pages or window its own)."""
        if hidden.shape[0] >= cpu_quant.DENSE_ROWS or not hidden.is_contiguous():
            return None
        served = self.attention.chain_attention(
            self._chain_rotary, self._chain_layers, self.num_heads, self.dtype
        )
        if served is None:  # not a step the backend's fused decode attention takes
            return None
        rope, steps = served  # MLA: no shared step; each layer's hook reads its latent pages
        return self._chain.run(hidden, rope, pool.k or pool.latent, pool.v or None, steps)

    def _sandwich_layers(self, hidden: torch.Tensor, tables) -> torch.Tensor:
        """forward's layer loop for Gemma's four norms a layer with the fused C norm: each
        residual add, the norm of what is added before it and the next norm after it in one
        call (`hidden`, a tensor this step made, is updated in place), the same arithmetic as
        the loop's `_norm` and `+` (bf16: the same bits but for rare last-bit differences of
        the sum of squares' order; float32: within an ulp). No experts, no biases (Gemma has
        none)."""
        norm, eps, layers = cpu_fused.offset_add_rms_norm, self.config.rms_norm_eps, self.layers
        x = norm(hidden, None, None, layers[0].input_norm, eps)
        for li, layer in enumerate(layers):
            out = self._attention_block(li, layer, x, tables).contiguous()
            x = norm(hidden, out, layer.post_attn_norm, layer.pre_mlp_norm, eps)
            out = self._mlp_block(layer, x, None).contiguous()
            if li + 1 < len(layers):
                x = norm(hidden, out, layer.post_mlp_norm, layers[li + 1].input_norm, eps)
            else:
                hidden = hidden + self._norm(out, layer.post_mlp_norm)
        return hidden

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The first stage embeds (vocab-parallel: each rank its rows, summed), scaled where the
        family scales; later stages receive the previous stage's hidden states."""
        if not self.shard.first_stage:
            return self.comm.recv_prev((ids.shape[0], self.config.hidden_size), self.dtype)
        hidden = self.tp.vocab.embed(ids, self.embed, self.dtype)
        return hidden if self.embed_scale is None else hidden * self.embed_scale

    def finish(self, hidden: torch.Tensor, batch: ForwardBatch) -> torch.Tensor | None:
        """The last stage's logits (vocab-parallel: gathered, soft-capped where configured);
        earlier stages send on."""
        if not self.shard.last_stage:
            self.comm.send_next(hidden)
            return None
        hidden = self._norm(hidden[batch.logit_rows], self.final_norm)
        logits = self.tp.vocab.gather(self.mm(hidden, self.lm_head, float_out=True))
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


def _biases(layer: DecoderLayer) -> tuple:
    return (layer.qkv_bias, layer.o_bias, layer.gate_up_bias, layer.down_bias)


def _chunk_reaches(batch: ForwardBatch, original: int) -> torch.Tensor:
    """[T] bool: whether the token's request reaches a position >= `original` in this step (its
    decode token, or the last token of its extend chunk)."""
    pos = batch.positions
    nd = batch.num_decode
    reach = torch.empty_like(pos)
    reach[:nd] = pos[:nd]
    lens = batch.extend_lens.to(torch.long)
    if lens.numel():
        ends = torch.cumsum(lens, 0) - 1 + nd
        reach[nd:] = torch.repeat_interleave(pos[ends], lens)
    return reach + 1 > original
