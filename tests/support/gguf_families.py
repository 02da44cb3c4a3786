"""Tiny GGUF files of every architecture the engine runs, written from a random `transformers`
model with `gguf`'s writer as llama.cpp's converter lays them out (its tensor and metadata
names, Llama's q / k rows permuted, Gemma's norms stored as `1 + w`, Phi-3's fused q / k / v and
gate / up, routed experts as one 3-D tensor per projection, DeepSeek's `kv_b` split into
`attn_k_b` / `attn_v_b`), in a mix of block formats: the 32-element ones quantized with `gguf`'s
reference quantizer, and K-quants (which it cannot write) as random blocks with bounded scales,
so that the weights are whatever those blocks decode to.

`written_state` gives the checkpoint the file holds, dequantized and under `transformers`' names,
for the architectures `transformers` cannot read from a GGUF itself (Mixtral's experts,
DeepSeek): the oracle model loads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.peers.gguf_models import _copy_tokenizer, permute_rows

_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",  # Phi-3's gate | up
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
}
_GEMMA_LAYER = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
ARCH = {"llama": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
        "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3", "phi3": "phi3",
        "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2"}  # fmt: skip
K_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def random_kquant(rows: int, cols: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random `kind` blocks [rows, cols / 256 * bytes] whose values stay within ~0.2: quantized
    values and sub-block scales random, super-block scales (fp16) fixed and small."""
    blocks = rng.integers(0, 256, size=(rows, cols // 256, K_BYTES[kind]), dtype=np.uint8)
    if kind == "Q6_K":  # ql 128, qh 64, int8 scales 16, d (fp16)
        blocks[..., 192:208] = (
            rng.integers(-12, 13, size=blocks[..., 192:208].shape).astype(np.int8).view(np.uint8)
        )
        blocks[..., 208:210] = np.array([4e-4], dtype=np.float16).view(np.uint8)
    else:  # d, dmin (fp16), 12 bytes of 6-bit scales and mins, then the quants
        top = 15 if kind == "Q4_K" else 31
        d = np.array([0.2 / (63 * top), 0.1 / 63], dtype=np.float16).view(np.uint8)
        blocks[..., 0:4] = d
    return blocks.reshape(rows, -1)


@dataclass
class Written:
    """What `write_family_gguf` wrote: each tensor dequantized (GGUF name -> float32 array, in
    the file's layout) and its type."""

    path: Path
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)


def _gguf_name(name: str, gemma: bool) -> str | None:
    base, suffix = name.rsplit(".", 1)
    if base in _TOP:
        return f"{_TOP[base]}.{suffix}"
    if name.endswith("gate.e_score_correction_bias"):
        return f"blk.{name.split('.')[2]}.exp_probs_b.bias"
    parts = base.split(".")
    local = ".".join(parts[3:])
    table = {**_LAYER, **_GEMMA_LAYER} if gemma else _LAYER
    return f"blk.{parts[2]}.{table[local]}.{suffix}" if local in table else None


def _pick_type(gname: str, shape: tuple[int, ...], types: dict[str, str]) -> str:
    """F32 vectors and routers; K-quants where whole 256-blocks fit (o, down); else a 32-block
    format by the tensor's role (mixed within a layer, as K-quant files mix them)."""
    if len(shape) == 1 or "ffn_gate_inp" in gname or "exp_probs" in gname:
        return "F32"
    for part, kind in types.items():
        if part in gname:
            return kind
    if shape[-1] % 256 == 0:
        return "Q6_K" if "down" in gname else "Q4_K"
    if shape[-1] % 32:  # narrower than a block (DeepSeek's tiny k_b / q_b)
        return "F32"
    if "_exps" in gname:
        return "Q8_0"
    for part, kind in (("attn_v", "Q5_0"), ("ffn_gate", "Q4_0"), ("ffn_up", "Q4_1"),
                       ("output.", "Q5_1"), ("attn_qkv", "Q5_1")):  # fmt: skip
        if part in gname:
            return kind
    return "Q8_0"


def _tensors(config: Any, state: dict[str, torch.Tensor], arch: str) -> dict[str, np.ndarray]:
    """The file's float tensors (GGUF name -> array in the file's layout)."""
    out: dict[str, np.ndarray] = {}
    gemma = arch == "gemma3"
    for name, tensor in state.items():
        if getattr(config, "tie_word_embeddings", False) and name == "lm_head.weight":
            continue
        w = tensor.detach().to(torch.float32).numpy()
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("experts.gate_up_proj"):
            half = w.shape[1] // 2
            out[f"blk.{layer}.ffn_gate_exps.weight"] = w[:, :half]
            out[f"blk.{layer}.ffn_up_exps.weight"] = w[:, half:]
            continue
        if name.endswith("experts.down_proj"):
            out[f"blk.{layer}.ffn_down_exps.weight"] = w
            continue
        gname = _gguf_name(name, gemma)
        if gname is None:
            continue
        if arch == "llama" and name.endswith("q_proj.weight"):
            w = permute_rows(w, config.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            w = permute_rows(w, config.num_key_value_heads)
        if gemma and name.endswith("norm.weight"):
            w = w + 1.0
        if arch == "deepseek2" and name.endswith("kv_b_proj.weight") and config.q_lora_rank:
            # llama.cpp's MLA layout: k_b [H, R, nope] (transposed), v_b [H, v, R]
            heads, nope = config.num_attention_heads, config.qk_nope_head_dim
            kv_b = w.reshape(heads, nope + config.v_head_dim, -1)
            out[f"blk.{layer}.attn_k_b.weight"] = kv_b[:, :nope].transpose(0, 2, 1).copy()
            out[f"blk.{layer}.attn_v_b.weight"] = kv_b[:, nope:].copy()
            continue
        out[gname] = w
    return out


def _metadata(writer: Any, config: Any, arch: str, experts: bool) -> None:
    def u32(key: str, value: int) -> None:
        writer.add_uint32(f"{arch}.{key}", int(value))

    c = config
    u32("block_count", c.num_hidden_layers)
    u32("context_length", c.max_position_embeddings)
    u32("embedding_length", c.hidden_size)
    u32("feed_forward_length", c.intermediate_size)
    u32("attention.head_count", c.num_attention_heads)
    u32("attention.head_count_kv", c.num_key_value_heads)
    u32("vocab_size", c.vocab_size)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(c.rms_norm_eps))
    theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta")
    if arch == "gemma3":
        theta = c.rope_parameters["full_attention"]["rope_theta"]
        u32("attention.sliding_window", c.sliding_window)
    writer.add_float32(f"{arch}.rope.freq_base", float(theta or 10000.0))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if arch != "deepseek2":
        u32("attention.key_length", head_dim)
        u32("attention.value_length", head_dim)
        u32("rope.dimension_count", head_dim)
    if experts and arch != "deepseek2":
        u32("expert_count", getattr(c, "num_experts", None) or c.num_local_experts)
        u32("expert_used_count", c.num_experts_per_tok)
        if arch == "qwen3moe":
            u32("expert_feed_forward_length", c.moe_intermediate_size)
    if arch == "deepseek2":
        _deepseek_metadata(writer, c, u32)


def _deepseek_metadata(writer: Any, c: Any, u32) -> None:
    v3 = c.model_type == "deepseek_v3"
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    if v3:  # llama.cpp's MLA layout: one KV head of the latent, real sizes under *_mla
        u32("attention.head_count_kv", 1)
        u32("attention.key_length", c.kv_lora_rank + c.qk_rope_head_dim)
        u32("attention.value_length", c.kv_lora_rank)
        u32("attention.key_length_mla", qk)
        u32("attention.value_length_mla", c.v_head_dim)
        u32("attention.q_lora_rank", c.q_lora_rank)
    else:
        u32("attention.key_length", qk)
        u32("attention.value_length", c.v_head_dim)
    u32("attention.kv_lora_rank", c.kv_lora_rank)
    u32("rope.dimension_count", c.qk_rope_head_dim)
    u32("leading_dense_block_count", c.first_k_dense_replace)
    u32("expert_feed_forward_length", c.moe_intermediate_size)
    u32("expert_count", c.n_routed_experts)
    u32("expert_shared_count", c.n_shared_experts)
    u32("expert_used_count", c.num_experts_per_tok)
    u32("expert_gating_func", 2 if v3 else 1)
    u32("expert_group_count", c.n_group or 1)
    u32("expert_group_used_count", c.topk_group or 1)
    writer.add_float32("deepseek2.expert_weights_scale", float(c.routed_scaling_factor))
    writer.add_bool("deepseek2.expert_weights_norm", bool(v3 and c.norm_topk_prob))


def write_family_gguf(
    path: Path,
    config: Any,
    state: dict[str, torch.Tensor],
    types: dict[str, str] | None = None,
    seed: int = 0,
) -> Written:
    """Write `state` (a transformers model of `config.model_type`) as a GGUF; `types` maps a
    part of a GGUF tensor name to its block format (default: by role, see _pick_type)."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    from runtime.default_model import default_gguf_path

    arch = ARCH[config.model_type]
    experts = any("experts" in n for n in state)
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, config, arch, experts)
    _copy_tokenizer(writer, default_gguf_path())
    rng = np.random.default_rng(seed)
    written = Written(path)
    for gname, w in _tensors(config, state, arch).items():
        kind = _pick_type(gname, w.shape, types or {})
        qtype = GGMLQuantizationType[kind]
        if kind == "F32":
            data = np.ascontiguousarray(w, dtype=np.float32)
            writer.add_tensor(gname, data)
            written.arrays[gname] = data
        else:
            rows = int(np.prod(w.shape[:-1]))
            if kind in K_BYTES:
                data = random_kquant(rows, w.shape[-1], kind, rng)
            else:
                data = quants.quantize(np.ascontiguousarray(w.reshape(rows, -1)), qtype)
            data = data.reshape(*w.shape[:-1], -1)
            writer.add_tensor(gname, data, raw_dtype=qtype)
            written.arrays[gname] = quants.dequantize(data, qtype).reshape(w.shape)
        written.types[gname] = kind
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def written_state(config: Any, written: Written, names: list[str]) -> dict[str, torch.Tensor]:
    """The checkpoint (`names`, as the transformers model names its tensors) the file holds,
    dequantized: Llama's q / k rows permuted back, experts and DeepSeek's kv_b joined again."""
    arrays, out = written.arrays, {}
    llama = ARCH[config.model_type] == "llama"
    for name in names:
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("experts.gate_up_proj"):
            gate, up = (arrays[f"blk.{layer}.ffn_{p}_exps.weight"] for p in ("gate", "up"))
            w = np.concatenate([gate, up], axis=1)
        elif name.endswith("experts.down_proj"):
            w = arrays[f"blk.{layer}.ffn_down_exps.weight"]
        elif name.endswith("kv_b_proj.weight") and f"blk.{layer}.attn_k_b.weight" in arrays:
            k_b = arrays[f"blk.{layer}.attn_k_b.weight"].transpose(0, 2, 1)
            v_b = arrays[f"blk.{layer}.attn_v_b.weight"]
            w = np.concatenate([k_b, v_b], axis=1).reshape(-1, k_b.shape[-1])
        else:
            gname = _gguf_name(name, False)
            if gname not in arrays:  # a tied LM head
                gname = "token_embd.weight"
            w = arrays[gname]
            if llama and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = config.num_attention_heads if "q_proj" in name else (
                    config.num_key_value_heads)  # fmt: skip
                w = _unpermute(w, heads)
        out[name] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    return out


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return (
        w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_default_vocab_gguf(path, arch: str, pre: str | None = None) -> None:
    """A GGUF holding only the default model's byte-level BPE vocabulary (merges in the file)
    under `arch` (and `pre` as its pre-tokenizer name, when given): no tensors."""
    import gguf

    from runtime.default_model import default_gguf_path
    from runtime.models.gguf import read_header

    meta = read_header(default_gguf_path())[0]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model(meta["tokenizer.ggml.model"])
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    writer.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
